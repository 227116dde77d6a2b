// Shared pieces of the split tensor-core prefill (gated_delta_net_tc_split.cu, gated_delta_net_tc_chunk.cu):
// the tile constants, the per-(chunk, value head) record the chunk kernel writes and the state pass reads,
// and the chunk kernels' launchers. Internal to the CUDA backend.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/gated_delta_net.h"

namespace moefold::cuda::detail::gdn_tc {

constexpr int kC = kGdnChunk;  // 64 rows per chunk
constexpr int kDK = 128;       // key dim
constexpr int kThreads = 128;  // 4 warps
constexpr int kQLD = kDK + 8;  // bf16 row pitch of q / k tiles (conflict-free ldmatrix)
constexpr int kFLD = kC + 4;   // fp32 row pitch of A and T
constexpr int kXLD = 24;       // fp32 row pitch of the per-warp 16x16 scratch

// Record of one (chunk, value head), bytes. Fragment arrays are [warp w][k-block ks][lane]; only ks <= w
// is written and read (the lower block triangle).
struct Rec {
  static constexpr int kT = 0;                       // uint4 {hi[4], lo[4]} x2: T rows 16w.., cols 16ks..
  static constexpr int kM = kT + 4 * 4 * 32 * 32;    // uint4: M (bf16 A fragment)
  static constexpr int kVec = kM + 4 * 4 * 32 * 16;  // float4 per row i: beta, beta e^G / |k|, e^{G_L - G} / |k|,
                                                     //   e^G dk^-0.5 / |q|
  static constexpr int kDecay = kVec + kC * 16;      // float: e^{G_L}
  static constexpr int kBytes = kDecay + 16;
};

/// base[s] = first global chunk of live sequence s (chunks of the live sequences before it), s = 0..max_seqs
/// (padding entries: the total). One small launch on `stream`.
void launch_chunk_base(const int32_t* cu_seqlens, const int32_t* num_seqs, int max_seqs, int32_t* base,
                       cudaStream_t stream);

/// Records of global chunks [w0, w0 + n) (those that exist) for every value head into recs (record
/// (c - w0, h) at ((c - w0) * Hv + h) * Rec::kBytes); blocks of `group` value heads sharing a key head
/// (group divides Hv / Hk). Asynchronous on `stream`.
void launch_chunk_records(const GdnArgs& args, const int32_t* cu_seqlens, const int32_t* base, int max_seqs, int w0,
                          int n, const GdnDims& dims, int group, char* recs, cudaStream_t stream);

}  // namespace moefold::cuda::detail::gdn_tc
