// ForwardBatch: everything one model step needs, built once on the host per step and read by every
// layer. Rows of all sequences are concatenated: sequence s owns rows [cu_seqlens[s], cu_seqlens[s+1]).
// A sequence contributes a prefill chunk of any length or one decode token; the same code serves both.
#pragma once
#include <cstdint>
#include <vector>

namespace moefold {

/// Snapshot request of a step: after the first 64 * (chunk + 1) rows of sequence `seq` in this step,
/// copy that sequence's DeltaNet state (conv and recurrent, every linear-attention layer, bitwise as
/// the live state is kept) into state slot `dst_slot`. Only sequences of prompt rows (prefill) take
/// snapshots, and rows [0, 64 * (chunk + 1)) must lie within the sequence's rows.
struct StateSnapshot {
  int32_t seq;
  int32_t chunk;
  int32_t dst_slot;
};

/// Granularity of DeltaNet state snapshots: the chunk length of the chunked delta-rule prefill.
inline constexpr int32_t kStateSnapshotChunk = 64;
/// Most snapshots one step may ask for (the GPU executor's snapshot table).
inline constexpr int32_t kMaxStepSnapshots = 64;

struct ForwardBatch {
  std::vector<int32_t> token_ids;     ///< [T]
  std::vector<int32_t> positions;     ///< [T] absolute position of each row in its sequence
  std::vector<int32_t> cu_seqlens;    ///< [S + 1] query-row offsets
  std::vector<int32_t> context_lens;  ///< [S] tokens already in the KV cache / DeltaNet state before this step
  std::vector<int32_t> block_tables;  ///< [S, max_blocks_per_seq] KV page ids (unused entries -1)
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> state_slots;   ///< [S] DeltaNet state slot of each sequence
  std::vector<int32_t> logits_rows;   ///< rows whose logits are computed, in output order
  /// [S] or empty: 1 when the sequence's rows are prompt tokens (the DeltaNet layers then take the
  /// chunked prefill form even for one row, so a prompt gives the same bits however it is split at
  /// 64-token boundaries), 0 for generated tokens (one-token recurrent decode). Empty: a one-row
  /// sequence is a decode row.
  std::vector<uint8_t> prefill;
  std::vector<StateSnapshot> snapshots;  ///< DeltaNet state snapshots to take in this step

  /// Whether sequence s's rows take the DeltaNet decode (recurrent) form.
  bool decode_rows(int32_t s) const {
    const int32_t n = cu_seqlens[size_t(s + 1)] - cu_seqlens[size_t(s)];
    return n == 1 && (prefill.empty() || !prefill[size_t(s)]);
  }

  int32_t num_rows() const { return int32_t(token_ids.size()); }
  int32_t num_seqs() const { return int32_t(context_lens.size()); }
  const int32_t* block_table(int32_t s) const { return block_tables.data() + size_t(s) * size_t(max_blocks_per_seq); }
};

}  // namespace moefold
