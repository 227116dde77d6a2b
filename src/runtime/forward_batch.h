// ForwardBatch: everything one model step needs, built once on the host per step and read by every
// layer. Rows of all sequences are concatenated: sequence s owns rows [cu_seqlens[s], cu_seqlens[s+1]).
// A sequence contributes a prefill chunk of any length or one decode token; the same code serves both.
#pragma once
#include <cstdint>
#include <vector>

namespace moefold {

struct ForwardBatch {
  std::vector<int32_t> token_ids;     ///< [T]
  std::vector<int32_t> positions;     ///< [T] absolute position of each row in its sequence
  std::vector<int32_t> cu_seqlens;    ///< [S + 1] query-row offsets
  std::vector<int32_t> context_lens;  ///< [S] tokens already in the KV cache / DeltaNet state before this step
  std::vector<int32_t> block_tables;  ///< [S, max_blocks_per_seq] KV page ids (unused entries -1)
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> state_slots;   ///< [S] DeltaNet state slot of each sequence
  std::vector<int32_t> logits_rows;   ///< rows whose logits are computed, in output order

  int32_t num_rows() const { return int32_t(token_ids.size()); }
  int32_t num_seqs() const { return int32_t(context_lens.size()); }
  const int32_t* block_table(int32_t s) const { return block_tables.data() + size_t(s) * size_t(max_blocks_per_seq); }
};

}  // namespace moefold
