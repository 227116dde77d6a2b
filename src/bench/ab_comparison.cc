// A/B comparison of two serving targets (contract: ab_comparison.h).
#include "bench/ab_comparison.h"

#include <fmt/format.h>

#include <algorithm>

#include "bench/serve_report.h"

namespace moefold::bench {

namespace {

std::vector<double> ratios(const AbRow& r) {
  std::vector<double> v;
  if (r.pair1) v.push_back(*r.pair1);
  if (r.pair2) v.push_back(*r.pair2);
  return v;
}

std::optional<double> ratio(double b, double a) {
  if (a == 0) return std::nullopt;
  return b / a;
}

nlohmann::ordered_json opt_json(const std::optional<double>& v) { return v ? nlohmann::ordered_json(*v) : nullptr; }

std::string opt_text(const std::optional<double>& v) { return v ? fmt::format("{:.3f}", *v) : "n/a"; }

}  // namespace

std::optional<double> AbRow::mean() const {
  const auto v = ratios(*this);
  if (v.empty()) return std::nullopt;
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

std::optional<double> AbRow::min() const {
  const auto v = ratios(*this);
  if (v.empty()) return std::nullopt;
  return *std::min_element(v.begin(), v.end());
}

std::optional<double> AbRow::max() const {
  const auto v = ratios(*this);
  if (v.empty()) return std::nullopt;
  return *std::max_element(v.begin(), v.end());
}

std::vector<AbRow> compare_ab(const BenchmarkMetrics& a1, const BenchmarkMetrics& b1, const BenchmarkMetrics& b2,
                              const BenchmarkMetrics& a2, const std::vector<std::string>& metrics) {
  const auto va1 = headline_values(a1, metrics), vb1 = headline_values(b1, metrics);
  const auto vb2 = headline_values(b2, metrics), va2 = headline_values(a2, metrics);
  std::vector<AbRow> rows;
  for (size_t i = 0; i < va1.size(); ++i) {
    AbRow r;
    r.key = va1[i].key;
    r.label = va1[i].label;
    r.a1 = va1[i].value;
    r.b1 = vb1[i].value;
    r.b2 = vb2[i].value;
    r.a2 = va2[i].value;
    r.pair1 = ratio(r.b1, r.a1);
    r.pair2 = ratio(r.b2, r.a2);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string format_ab(const std::vector<AbRow>& rows, const std::string& a_name, const std::string& b_name) {
  std::string s = fmt::format("{:=^118}\n", " A/B comparison: ratio B / A ");
  s += fmt::format("A: {}\nB: {}\n", a_name, b_name);
  s += "runs in the order A1 B1 B2 A2; pair 1 = B1 / A1, pair 2 = B2 / A2; spread = max - min of the two ratios\n";
  s += "(throughput: above 1 means B is faster; latency: below 1 means B is faster)\n";
  s += fmt::format("{:<40}{:>10}{:>10}{:>10}{:>10}{:>9}{:>9}{:>9}{:>9}\n", "metric", "A1", "B1", "B2", "A2", "pair 1",
                   "pair 2", "mean", "spread");
  for (const AbRow& r : rows) {
    const auto lo = r.min(), hi = r.max();
    const std::optional<double> spread = lo && hi ? std::optional<double>(*hi - *lo) : std::nullopt;
    s += fmt::format("{:<40}{:>10.2f}{:>10.2f}{:>10.2f}{:>10.2f}{:>9}{:>9}{:>9}{:>9}\n", r.label, r.a1, r.b1, r.b2, r.a2,
                     opt_text(r.pair1), opt_text(r.pair2), opt_text(r.mean()), opt_text(spread));
  }
  s += std::string(118, '=') + "\n";
  return s;
}

nlohmann::ordered_json ab_json(const std::vector<AbRow>& rows) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const AbRow& r : rows) {
    j[r.key] = {{"label", r.label},       {"a1", r.a1},
                {"b1", r.b1},             {"b2", r.b2},
                {"a2", r.a2},             {"ratio_pair1", opt_json(r.pair1)},
                {"ratio_pair2", opt_json(r.pair2)}, {"ratio_mean", opt_json(r.mean())},
                {"ratio_min", opt_json(r.min())},   {"ratio_max", opt_json(r.max())}};
  }
  return j;
}

}  // namespace moefold::bench
