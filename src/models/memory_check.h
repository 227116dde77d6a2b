// Checks, before allocating, that a model fits in the memory this process may use, so that an
// oversized model fails with a message giving both numbers instead of being killed by the kernel's
// OOM killer (the 35B shape on the CPU needs ~140 GB of fp32 weights).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "io/model_config.h"

namespace moefold {

/// Bytes this process can still allocate: MemAvailable of /proc/meminfo, lowered to what the
/// cgroup's memory limit leaves (cgroup v2 memory.max - memory.current, else v1 limit_in_bytes -
/// usage_in_bytes) when a limit is set. nullopt when /proc/meminfo cannot be read (then no check).
std::optional<int64_t> available_memory_bytes();

/// The same from given file contents (for tests): `meminfo` is /proc/meminfo's text; `cgroup_limit`
/// and `cgroup_usage` are the cgroup files' text ("max" or empty: no limit).
std::optional<int64_t> available_memory_bytes(const std::string& meminfo, const std::string& cgroup_limit,
                                              const std::string& cgroup_usage);

/// Bytes of the fp32 weights the CPU backend holds for `cfg` (every parameter, 4 bytes each).
int64_t cpu_weight_bytes(const ModelConfig& cfg);

/// Bytes of the CPU backend's KV cache (`num_blocks` x `block_size` token slots of `kv_elem_bytes` per
/// element: 4 fp32, 2 bf16, 1 fp8) and fp32 DeltaNet state (`num_slots` sequences) for `cfg`.
int64_t cpu_cache_bytes(const ModelConfig& cfg, int64_t num_blocks, int64_t block_size, int64_t num_slots,
                        int64_t kv_elem_bytes = 4);

/// Throws Error "<what> needs N GiB ... but only M GiB of memory is available" when `needed` exceeds
/// `available`; does nothing when `available` is nullopt (unknown). The message suggests dummy weights on
/// a GPU only when `gpu_runs_it` (the model's family has a CUDA path).
void check_memory_fits(int64_t needed, std::optional<int64_t> available, const std::string& what,
                       bool gpu_runs_it = true);

}  // namespace moefold
