// Kernel table formatting (contract: kernel_table.h).
#include "runtime/kernel_table.h"

#include <fmt/format.h>

namespace moefold {
namespace {

/// Rate of `amount` over the calls' own time (0 when untimed).
double rate(double amount, double seconds) { return seconds > 0 ? amount / seconds : 0; }

std::string fixed_or_dash(double v, int precision, bool show) {
  return show ? fmt::format("{:.{}f}", v, precision) : std::string("-");
}

}  // namespace

std::vector<CategoryTime> category_times(const prof::WindowProfile& p) {
  std::vector<CategoryTime> out(size_t(prof::kNumCategories));
  for (int c = 0; c < prof::kNumCategories; ++c) out[size_t(c)].category = prof::Category(c);
  for (const prof::KernelTime& k : p.kernels) {
    CategoryTime& c = out[size_t(k.category)];
    c.exclusive_s += k.exclusive_s;
    c.time_s += k.time_s;
    c.calls += k.calls;
  }
  return out;
}

std::string format_kernel_table(const prof::WindowProfile& p, const Roofline& roof, const std::string& idle_label) {
  std::string s;
  const double wall = p.wall_s;
  auto pct = [&](double sec) { return wall > 0 ? 100.0 * sec / wall : 0.0; };
  s += fmt::format("{:<34} {:>8} {:>12} {:>9}\n", "category", "share", "time ms", "calls");
  double total = 0;
  for (const CategoryTime& c : category_times(p)) {
    s += fmt::format("{:<34} {:>7.2f}% {:>12.3f} {:>9}\n", prof::category_label(c.category), pct(c.exclusive_s),
                     c.exclusive_s * 1e3, c.calls);
    total += c.exclusive_s;
  }
  s += fmt::format("{:<34} {:>7.2f}% {:>12.3f} {:>9}\n", idle_label, pct(p.idle_s), p.idle_s * 1e3, "-");
  total += p.idle_s;
  s += fmt::format("{:<34} {:>7.2f}% {:>12.3f}\n\n", "total (wall)", pct(total), wall * 1e3);

  const bool has_roof = roof.copy_bytes_per_s > 0 && roof.gemm_flops_per_s > 0;
  s += fmt::format("{:<36} {:<28} {:>7} {:>8} {:>11} {:>9} {:>6} {:>9} {:>6}\n", "kernel", "category", "share",
                   "calls", "mean us", "GB/s", "%copy", "TFLOP/s", "%gemm");
  int64_t untimed = 0;
  for (const prof::KernelTime& k : p.kernels) {
    const int64_t timed = k.calls - k.untimed_calls;
    untimed += k.untimed_calls;
    const double gbs = rate(k.work.bytes, k.time_s), tfs = rate(k.work.flops, k.time_s);
    s += fmt::format("{:<36} {:<28} {:>6.2f}% {:>8} {:>11} {:>9} {:>6} {:>9} {:>6}\n", k.name,
                     prof::category_label(k.category), pct(k.exclusive_s), k.calls,
                     fixed_or_dash(timed > 0 ? k.time_s / double(timed) * 1e6 : 0, 2, timed > 0),
                     fixed_or_dash(gbs / 1e9, 1, gbs > 0),
                     fixed_or_dash(100.0 * gbs / roof.copy_bytes_per_s, 1, gbs > 0 && has_roof),
                     fixed_or_dash(tfs / 1e12, 3, tfs > 0),
                     fixed_or_dash(100.0 * tfs / roof.gemm_flops_per_s, 1, tfs > 0 && has_roof));
  }
  s += fmt::format("{:<36} {:<28} {:>6.2f}%\n", "(idle)", idle_label, pct(p.idle_s));
  if (untimed > 0)
    s += fmt::format("note: {} calls ran without a timer (no device timer installed): counted, not timed\n", untimed);
  return s;
}

nlohmann::json kernel_table_json(const prof::WindowProfile& p, const Roofline& roof) {
  using json = nlohmann::json;
  const double wall = p.wall_s;
  auto share = [&](double sec) { return wall > 0 ? sec / wall : 0.0; };
  json cats = json::array();
  for (const CategoryTime& c : category_times(p))
    cats.push_back({{"category", prof::category_name(c.category)},
                    {"label", prof::category_label(c.category)},
                    {"time_s", c.time_s},
                    {"exclusive_s", c.exclusive_s},
                    {"share", share(c.exclusive_s)},
                    {"calls", c.calls}});
  json kernels = json::array();
  for (const prof::KernelTime& k : p.kernels) {
    const int64_t timed = k.calls - k.untimed_calls;
    const double bps = rate(k.work.bytes, k.time_s), fps = rate(k.work.flops, k.time_s);
    kernels.push_back({{"name", k.name},
                       {"category", prof::category_name(k.category)},
                       {"calls", k.calls},
                       {"untimed_calls", k.untimed_calls},
                       {"time_s", k.time_s},
                       {"exclusive_s", k.exclusive_s},
                       {"share", share(k.exclusive_s)},
                       {"mean_us", timed > 0 ? k.time_s / double(timed) * 1e6 : 0.0},
                       {"bytes", k.work.bytes},
                       {"flops", k.work.flops},
                       {"gb_per_s", bps / 1e9},
                       {"tflop_per_s", fps / 1e12},
                       {"copy_fraction", roof.copy_bytes_per_s > 0 ? bps / roof.copy_bytes_per_s : 0.0},
                       {"gemm_fraction", roof.gemm_flops_per_s > 0 ? fps / roof.gemm_flops_per_s : 0.0}});
  }
  return json{{"timer", p.timer},
              {"wall_s", wall},
              {"profiler_flush_excluded_s", p.excluded_s},
              {"busy_s", p.busy_s},
              {"idle", {{"time_s", p.idle_s}, {"share", share(p.idle_s)}}},
              {"categories", cats},
              {"kernels", kernels}};
}

}  // namespace moefold
