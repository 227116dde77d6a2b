// A/B comparison of two serving targets (`moefold bench serve --ab URL_B`). The same requests run
// four times in the order A, B, B, A, so that a drift over time (warm-up, thermal, other load)
// affects both sides alike; pair 1 is the first A with the first B, pair 2 the second B with the
// second A. Each number is reported per run and as the ratio B / A of each pair; the two ratios'
// mean, min and max show how far the comparison is to be trusted.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/serve_metrics.h"

namespace moefold::bench {

/// One number of the four runs and its ratios.
struct AbRow {
  std::string key, label;  ///< as in headline_values()
  double a1 = 0, b1 = 0, b2 = 0, a2 = 0;
  std::optional<double> pair1, pair2;  ///< b1 / a1 and b2 / a2; none when the A value is 0

  /// Mean, min and max of the pair ratios that exist (none if neither does).
  std::optional<double> mean() const;
  std::optional<double> min() const;
  std::optional<double> max() const;
};

/// The rows for headline_values(·, metrics) of the runs A1, B1, B2, A2.
std::vector<AbRow> compare_ab(const BenchmarkMetrics& a1, const BenchmarkMetrics& b1, const BenchmarkMetrics& b2,
                              const BenchmarkMetrics& a2, const std::vector<std::string>& metrics);

/// The comparison table: one line per row with A1, B1, B2, A2, the two ratios, their mean and
/// spread (max - min); `a_name` / `b_name` describe the targets in the heading.
std::string format_ab(const std::vector<AbRow>& rows, const std::string& a_name, const std::string& b_name);

/// {key: {label, a1, b1, b2, a2, ratio_pair1, ratio_pair2, ratio_mean, ratio_min, ratio_max}}
/// (null for a ratio that does not exist).
nlohmann::ordered_json ab_json(const std::vector<AbRow>& rows);

}  // namespace moefold::bench
