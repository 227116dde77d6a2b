// Progress bar on stderr (contract: progress_bar.h).
#include "bench/progress_bar.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace moefold::bench {

bool stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

ProgressBar::ProgressBar(int64_t total, bool enabled, std::string label)
    : total_(total), enabled_(enabled && total > 0), label_(std::move(label)),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {
  if (enabled_) std::fprintf(stderr, "%s", render(label_, 0, total_, 0).c_str());
}

ProgressBar::~ProgressBar() { close(); }

namespace {

std::string clock_text(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

}  // namespace

std::string ProgressBar::render(const std::string& label, int64_t done, int64_t total, double elapsed_s) {
  const int width = 25;
  const double frac = total > 0 ? std::clamp(double(done) / double(total), 0.0, 1.0) : 0.0;
  const int full = int(frac * width);
  std::string bar;
  for (int i = 0; i < width; ++i) bar += i < full ? "\u2588" : " ";
  const double rate = elapsed_s > 0 ? double(done) / elapsed_s : 0;
  const double eta = rate > 0 ? double(total - done) / rate : NAN;
  return fmt::format("{}{:3.0f}%|{}| {}/{} [{}<{}, {:.2f} req/s]", label.empty() ? "" : label + " ", frac * 100, bar,
                     done, total, clock_text(elapsed_s), clock_text(eta), rate);
}

void ProgressBar::tick() {
  std::lock_guard<std::mutex> lock(mu_);
  ++done_;
  if (!enabled_ || closed_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done_ < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r%s", render(label_, done_, total_, elapsed).c_str());
  std::fflush(stderr);
}

void ProgressBar::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_ || closed_) return;
  closed_ = true;
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace moefold::bench
