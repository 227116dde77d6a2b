// The kernel table: one profile window (core/profiler.h) as text for people and JSON for tools. Per
// category and per kernel: share of the window's wall time, calls, mean microseconds per call, achieved
// GB/s and TFLOP/s and their fractions of the measured roofline (ops/cpu/roofline.h); plus the idle
// row (time no kernel covered, measured). All shares, idle included, sum to 100%.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/profiler.h"
#include "ops/cpu/roofline.h"

namespace moefold {

/// One category's totals in a window.
struct CategoryTime {
  prof::Category category = prof::Category::Other;
  double exclusive_s = 0;  ///< wall time attributed to its kernels
  double time_s = 0;       ///< sum of its calls' durations
  int64_t calls = 0;
};

/// Totals of every category (all kNumCategories, in enum order, zero ones included).
std::vector<CategoryTime> category_times(const prof::WindowProfile& p);

/// The two tables (categories, then kernels by share) as aligned text. idle_label names the idle
/// row, e.g. "GPU idle between kernels". Fractions of the roofline are left out when it is zero.
std::string format_kernel_table(const prof::WindowProfile& p, const Roofline& roofline, const std::string& idle_label);

/// The same as JSON: {"timer", "wall_s", "profiler_flush_excluded_s", "busy_s", "idle": {"time_s", "share"}, "timer",
/// "categories": [{"category", "label", "time_s", "exclusive_s", "share", "calls"}],
/// "kernels": [{"name", "category", "calls", "untimed_calls", "time_s", "exclusive_s", "share", "mean_us",
/// "bytes", "flops", "gb_per_s", "tflop_per_s", "copy_fraction", "gemm_fraction"}]}.
nlohmann::json kernel_table_json(const prof::WindowProfile& p, const Roofline& roofline);

}  // namespace moefold
