// A minimal parallel loop for host-side bulk work (dummy weights, dtype conversion at load).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>

namespace moefold {

/// Runs fn(lo, hi) over [0, n) split into contiguous ranges across the machine's cores, at least
/// `grain` items per thread (serially when n <= grain). fn must be safe to run concurrently on
/// disjoint ranges.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = int64_t(1) << 20);

/// parallel_for over `rows` rows of `row_size` elements each (e.g. logits rows of a vocabulary), with
/// about half a million elements of work per thread at least.
inline void parallel_for_rows(int64_t rows, int64_t row_size, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_for(rows, fn, std::max<int64_t>(1, (int64_t(1) << 19) / std::max<int64_t>(row_size, 1)));
}

}  // namespace moefold
