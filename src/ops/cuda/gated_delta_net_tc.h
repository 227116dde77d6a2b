// Tensor-core chunked prefill of the Gated DeltaNet delta rule (Hopper mma.sync, bf16 operands, fp32
// accumulation and fp32 state): the fast path behind gdn_chunked_prefill (gated_delta_net.h) for the
// shapes it covers. Internal to the CUDA backend; callers use gdn_chunked_prefill.
#pragma once
#include "ops/cuda/gated_delta_net.h"
#include "ops/cuda/launch_scope.h"

namespace moefold::cuda::detail {

/// Profiler work of a prefill or decode launch over `rows` tokens of `seqs` sequences (bytes moved, FLOPs of
/// the recurrent form). Defined in gated_delta_net.cu.
prof::Work gdn_work(int64_t rows, int64_t seqs, const GdnDims& d);

/// False when the environment sets MOEFOLD_GDN_TC=0 (forces the scalar prefill kernel: A/B runs, tests).
bool gdn_prefill_tc_enabled();

/// True when gdn_prefill_tc handles these dims and arguments: dk == 128, dv a multiple of 16, q/k/v
/// 16-byte aligned with a row stride that keeps every row 16-byte aligned.
bool gdn_prefill_tc_supported(const GdnArgs& args, const GdnDims& dims);

/// gdn_chunked_prefill's contract (same arguments, already checked by it) on tensor cores: the split path
/// (gdn_prefill_tc_split) where it runs, else the fused gdn_prefill_tc_kernel. Precondition:
/// gdn_prefill_tc_supported(args, dims). Throws moefold::Error on a launch error. Asynchronous on `stream`.
void gdn_prefill_tc(const GdnArgs& args, const int32_t* cu_seqlens, int max_seqs, const GdnSnapshot* snapshots,
                    const int32_t* num_snapshots, int max_snapshots, const GdnDims& dims, cudaStream_t stream);

/// The split tensor-core prefill (gated_delta_net_tc_split.cu): a chunk-parallel kernel over every (chunk,
/// value head) writes T = (I + A)^-1, the decay-masked M and the row scales of each chunk to a scratch
/// buffer (per process and device, grown on demand, at most MOEFOLD_GDN_TC_SCRATCH_MB = 512 MiB; larger
/// launches run in windows of chunks), then a sequential pass per (value columns, head, sequence) carries
/// the state. Same arguments and preconditions as gdn_prefill_tc, plus args.max_rows >= the launch's rows.
/// Returns false (nothing launched) when it does not run: args.max_rows == 0, MOEFOLD_GDN_TC_SPLIT=0, or
/// the scratch cannot grow (out of memory, or a stream capture in progress). The scratch is shared: one
/// prefill at a time per device (the executor's single stream). Asynchronous on `stream`.
bool gdn_prefill_tc_split(const GdnArgs& args, const int32_t* cu_seqlens, int max_seqs, const GdnSnapshot* snapshots,
                          const int32_t* num_snapshots, int max_snapshots, const GdnDims& dims, cudaStream_t stream);

/// Phases of the tensor-core prefill's per-chunk loop that gdn_prefill_tc_profile times (index 0 unused):
/// 1 wait for the chunk's rows, 2 norms + gates + scan, 3 A and M, 4 diagonal inverses + K S / Q S,
/// 5 off-diagonal blocks of T, 6 R, 7 V' = T R, 8 O and the state update. The split path's state pass
/// counts 1 wait, 2 K S / Q S + R, 3 V' = T R, 4 O and the state update (its chunk kernel is not timed).
inline constexpr int kGdnTcPhases = 9;

/// Turns per-phase cycle counting on or off for later gdn_prefill_tc launches (thread 0 of each block adds
/// its clock64 deltas after each barrier to a device buffer; a few percent slower while on). For benches.
void gdn_prefill_tc_profile(bool on);

/// Device buffer of the phase counters while profiling is on, else nullptr (for the split path's launches).
unsigned long long* gdn_prefill_tc_phase_buffer();

/// Copies the summed cycles per phase (over blocks and chunks) since the last read and zeroes them.
/// Synchronous. All zero when profiling was never on.
void gdn_prefill_tc_profile_read(unsigned long long (&cycles)[kGdnTcPhases]);

}  // namespace moefold::cuda::detail
