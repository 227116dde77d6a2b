// The arrival process of a serving benchmark (contract: arrival_schedule.h).
#include "bench/arrival_schedule.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace moefold::bench {

std::vector<double> arrival_times(int64_t n, double request_rate, double burstiness, uint64_t seed) {
  MOEFOLD_CHECK(n >= 0, "number of requests must be >= 0 (got {})", n);
  MOEFOLD_CHECK(request_rate > 0, "--request-rate must be > 0 requests/s (got {})", request_rate);
  MOEFOLD_CHECK(burstiness > 0 && std::isfinite(burstiness), "--burstiness must be > 0 (got {})", burstiness);
  std::vector<double> times(size_t(n), 0.0);
  if (std::isinf(request_rate)) return times;
  std::mt19937_64 rng(seed);
  // Gamma(shape k, scale theta) has mean k * theta: theta = 1 / (rate * k) gives mean 1 / rate.
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  for (size_t i = 1; i < times.size(); ++i) times[i] = times[i - 1] + gap(rng);
  return times;
}

}  // namespace moefold::bench
