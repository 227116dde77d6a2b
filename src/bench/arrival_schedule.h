// When each request of a serving benchmark is sent: the arrival process of `vllm bench serve`
// (--request-rate, --burstiness).
#pragma once
#include <cstdint>
#include <vector>

namespace moefold::bench {

/// Send times, in seconds from the start of the run, of `n` (>= 0) requests: request 0 at 0, then
/// independent gaps drawn from a gamma distribution with shape `burstiness` and mean
/// 1 / `request_rate` (burstiness 1: exponential gaps, a Poisson process; below 1 burstier, above 1
/// more regular; the gaps' coefficient of variation is 1 / sqrt(burstiness)). An infinite
/// `request_rate` sends everything at 0. Deterministic for a given `seed`. Throws moefold::Error
/// unless request_rate > 0 and burstiness > 0.
std::vector<double> arrival_times(int64_t n, double request_rate, double burstiness, uint64_t seed);

}  // namespace moefold::bench
