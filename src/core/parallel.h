// A minimal parallel loop for host-side bulk work (dummy weights, dtype conversion at load).
#pragma once
#include <cstdint>
#include <functional>

namespace moefold {

/// Runs fn(lo, hi) over [0, n) split into contiguous ranges across the machine's cores, at least
/// `grain` items per thread (serially when n <= grain). fn must be safe to run concurrently on
/// disjoint ranges.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = int64_t(1) << 20);

}  // namespace moefold
