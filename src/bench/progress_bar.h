// A tqdm-style progress bar on stderr for long benchmark runs:
//   "A1 37%|███████████               | 37/100 [00:05<00:08, 7.20 req/s]"
// redrawn in place (carriage return) at most ten times a second and on the last step.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace moefold::bench {

/// True if stderr is a terminal (a bar is only drawn there).
bool stderr_is_terminal();

class ProgressBar {
 public:
  /// A bar for `total` steps; draws nothing unless `enabled`. `label` prefixes the line.
  ProgressBar(int64_t total, bool enabled, std::string label = "");
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// One more step done. Thread-safe.
  void tick();
  /// Ends the line (once; also done by the destructor). Thread-safe.
  void close();

  /// The bar's text after `done` of `total` steps in `elapsed_s` seconds (no carriage return).
  static std::string render(const std::string& label, int64_t done, int64_t total, double elapsed_s);

 private:
  std::mutex mu_;
  int64_t total_, done_ = 0;
  bool enabled_, closed_ = false;
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace moefold::bench
