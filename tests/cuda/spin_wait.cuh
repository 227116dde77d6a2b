// Test helper: a device busy-wait on the global timer, for kernels whose duration a test sets.
#pragma once
#include <cstdint>

namespace moefold::test {

/// Busy-waits about `ns` nanoseconds of %globaltimer (the GPU's nanosecond clock).
__device__ __forceinline__ void spin_ns(int64_t ns) {
  uint64_t t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (int64_t(t - t0) < ns);
}

}  // namespace moefold::test
