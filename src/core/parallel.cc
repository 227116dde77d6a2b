#include "core/parallel.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace moefold {

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  const int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::min<int64_t>(hw, n / std::max<int64_t>(grain, 1) + 1);
  if (threads <= 1) return fn(0, n);
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back(fn, t * chunk, std::min(n, (t + 1) * chunk));
  for (auto& th : pool) th.join();
}

}  // namespace moefold
