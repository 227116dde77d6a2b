// The DeepSeek-V4 CPU reference behind the Executor interface, so that ModelRunner (logits, generate,
// chat) drives it like every other family. Each state slot holds one sequence's Dsv4Cache (window,
// compressor buffers and compressed entries); the paged KV cache is not used by this family.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/executor.h"

namespace moefold {

/// Loads the deepseek_v4 model in `dir` (`dummy`: seeded random weights) and serves `num_slots`
/// sequences; `num_blocks` is only reported back (num_kv_blocks), for ModelRunner's page bookkeeping.
/// forward() throws Error when a sequence's first row is not at its slot's next position, and
/// set_routing() when capture or replay is asked for (not implemented for this family).
std::unique_ptr<Executor> make_deepseek_v4_executor(const std::string& dir, bool dummy, uint64_t seed,
                                                    int32_t num_blocks, int32_t num_slots);

}  // namespace moefold
