// Decode-range dense GEMM (decode_gemm.h): y[r, n] = x[r, :] . w[n, :] (+ bias[n]) for M = 1..256 live
// rows, bf16 operands, fp32 accumulation on mma.sync m16n8k16, with a reduction order fixed by (N, K).
//
// Grid: (column tiles of BN weight rows) x (S K-splits). A block owns BN columns and ALL live rows
// (M-tiles of 16 rows, spread over the warps; M-tiles past the live count are skipped), and streams
// its K-split through a STAGES-deep cp.async pipeline of 64-wide K chunks (16-byte copies, chunks
// swizzled by (row & 7) so ldmatrix reads are bank-conflict free). Every output element is one
// accumulation chain of mma steps over its split in ascending k; k >= K and weight rows >= N are
// zero-filled by the copies, the same way for every M.
//
// Split combine (S > 1): each block stores its fp32 partial tile to the workspace in its register
// fragment order (coalesced float4 per lane), fences, and bumps the column tile's integer counter;
// the block that brings the counter to S reads the S partials (its own from registers) and adds
// them in split order 0..S-1, adds the bias, rounds and stores, then resets the counter to zero.
// The order of the adds is independent of which block finishes last.
//
// Tile configurations (chosen from max_rows; none changes a value's chain, the test proves it):
//   max_rows <= 16 : 1 M-tile,  4 warps x (16 rows x 16 cols), BN = 64,  6 stages, 3 blocks/SM
//   max_rows <= 64 : 4 M-tiles, 4 warps as 2 (M) x 2 (N), each 2 M-tiles x 32 cols, BN = 64, 5 stages
//   max_rows <= 256: 16 M-tiles, 8 warps as 4 (M) x 2 (N), each 4 M-tiles x 64 cols, BN = 128, 4 stages
// A warp's M-tiles are interleaved (tile i*WARPS_M + wm), so a partly live bucket keeps warps busy.
//
// Two launch configurations of the same arithmetic (DecodeGemmCfg, decode_gemm.h; MOEFOLD_DECODE_GEMM_CFG):
//   old: as above: the weight copies start after the live-count read, the split combine through the
//        workspace (fence, counter, the last block reads S - 1 partials back from L2): a serial tail of
//        several L2 round trips that costs ~3-5 us per call at M = 1, whatever the shape.
//   new: (a) before griddepcontrol.wait each block asks L2 for the first chunks of its weight slice
//        (cp.async.bulk.prefetch.L2: harmless whatever the previous kernel writes, since L2 is the point
//        of coherence; under PDL it streams the weights while the previous kernel still runs), then
//        (b) issues the ring's first weight copies before it reads the live count, and (c) combines the
//        splits inside a thread-block cluster: the S blocks of a column tile are one cluster (dims
//        (1, S, 1), rank = split), each stores its fp32 partial in its own shared memory, one cluster
//        barrier, then block r folds the r-th S-th of the tile's partial slots, reading partials
//        0..S-1 in split order over DSMEM (all loads issued together), adds the bias, rounds, stores;
//        a second barrier keeps every block's shared memory alive until all folds are done. S = 32 (or a
//        cluster the device cannot schedule) keeps the workspace combine.
//   Every element's chain (its mma steps over its split, the fold p_0 + p_1 + ... + p_{S-1} in that
//   order, `+ bias`, one rounding in store_pair) is the same in both: only where a partial waits
//   (L2 or shared memory) and which block does the fold change. "new_nopf" is new without (a);
//   "new16" is new up to 16 rows (the one-M-tile configuration) and old above; "new_nocl" is new with
//   the workspace combine (A/B of (c)).
#include <cooperative_groups.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/decode_gemm.h"
#include "ops/cuda/gemm_epilogue.cuh"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/l2_hint.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"

namespace moefold::cuda {
namespace {

using namespace ptx;

constexpr int kBK = 64;          // K chunk per pipeline stage (fixed: split boundaries are chunk boundaries)
constexpr int kRefBN = 64;       // column-tile width S(N, K) is reckoned with (independent of the config)
constexpr int kTargetBlocks = 256;  // ~2 waves of 132 SMs
constexpr int kMaxSplits = 32;
constexpr int kMinChunksPerSplit = 2;

template <int MT_, int WARPS_M_, int WARPS_N_, int NF_, int STAGES_, int MIN_BLOCKS_>
struct Cfg {
  static constexpr int MT = MT_;            // M-tiles of 16 rows the block can hold
  static constexpr int WARPS_M = WARPS_M_;  // warps sharing the M-tiles (interleaved)
  static constexpr int WARPS_N = WARPS_N_;  // warps sharing the columns
  static constexpr int NF = NF_;            // n8 fragments per warp
  static constexpr int STAGES = STAGES_;
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int MTW = MT / WARPS_M;  // M-tiles per warp
  static constexpr int BM = MT * 16;
  static constexpr int BN = WARPS_N * NF * 8;
  static constexpr int THREADS = WARPS_M * WARPS_N * 32;
  static constexpr size_t SMEM = size_t(STAGES) * (BM + BN) * kBK * sizeof(__nv_bfloat16);
  // fp32 partial of one (column tile, split): every warp's MTW x NF fragments of 32 lanes x 4 floats.
  static constexpr size_t PARTIAL_FLOATS = size_t(BM) * BN;
  static_assert(MT % WARPS_M == 0 && NF % 2 == 0, "tile shape");
};

using CfgS = Cfg<1, 1, 4, 2, 6, 3>;    // max_rows <= 16
using CfgM = Cfg<4, 2, 2, 4, 5, 2>;    // max_rows <= 64
using CfgL = Cfg<16, 4, 2, 8, 4, 1>;   // max_rows <= 256

struct Params {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  const void* bias;  // bf16 (bf16 out) or fp32 (fp32 out), may be null
  void* y;
  unsigned* counters;  // [column tiles] (S > 1)
  float* partials;     // [column tiles][S][PARTIAL_FLOATS] (S > 1)
  const int32_t* live_rows;
  int64_t x_stride, y_stride;
  bool pair_stores;  // (row, col) and (row, col + 1) stored as one aligned pair (even y_stride, aligned y)
  int max_rows, K, N, S, KC;  // KC = ceil(K / 64) chunks
  int pf_chunks;              // new config: chunks of its slice each block prefetches to L2 (0 = none)
  int l2_hint;                // l2_stream_hint(): 1 weight copies evict_first, 2 the prefetch too
  int cluster;                // new config: 1 = split combine inside the (1, S, 1) cluster, 0 = workspace
};

/// Asks L2 to fetch [p, p + bytes) (16-byte aligned, bytes a multiple of 16) without waiting.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

/// prefetch_l2 with an L2 cache policy (ptx.cuh l2_policy).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes, uint64_t policy) {
  asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(p), "r"(bytes), "l"(policy)
               : "memory");
}

/// Offset (elements) of 16-byte chunk `ch` of row `r` in a [rows, 64] bf16 tile, swizzled.
__device__ __forceinline__ int swz(int r, int ch) { return r * kBK + ((ch ^ (r & 7)) << 3); }

using gemm_epilogue::store_pair;

namespace cg = cooperative_groups;

constexpr int kMaxClusterSplits = 16;  // the largest cluster (16 is non-portable; 8 is always allowed)

/// Split combine of the new config inside the cluster of the tile's S blocks (rank = split): each
/// block stores its partial (the layout of the workspace slots) in its own shared memory, then block r
/// folds slots [r * F / S, (r + 1) * F / S) of the tile over partials 0..S-1 in split order (read over
/// DSMEM), adds the bias, rounds and stores. The fold is the workspace combine's expression for
/// expression: sum = p_0, then sum = sum + p_s for s = 1..S-1.
template <class C, class OutT>
__device__ __forceinline__ void cluster_combine(const Params& p, const float (&acc)[C::MTW][C::NF][4],
                                                unsigned char* smem_raw, int live, int mt_live) {
  constexpr int MTW = C::MTW, NF = C::NF, WARPS_M = C::WARPS_M, THREADS = C::THREADS;
  constexpr int F = THREADS * MTW * NF;  // float4 slots of one partial
  static_assert(size_t(F) * sizeof(float4) <= C::SMEM, "the partial reuses the ring's shared memory");
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wm = warp % WARPS_M;
  const int split = blockIdx.y, n0 = blockIdx.x * C::BN;
  float4* mine = reinterpret_cast<float4*>(smem_raw);

  cp_async_wait_all();  // only empty groups are left; no copy may land in the ring after this
  __syncthreads();      // every warp is done reading the ring
#pragma unroll
  for (int i = 0; i < MTW; ++i) {
    if (i * WARPS_M + wm >= mt_live) continue;
#pragma unroll
    for (int j = 0; j < NF; ++j)
      mine[((warp * MTW + i) * NF + j) * 32 + lane] = make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
  }
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();  // release / acquire: every block's partial is visible to the cluster

  const int per = (F + p.S - 1) / p.S;
  const int f_end = min(F, (split + 1) * per);
  for (int f = split * per + tid; f < f_end; f += THREADS) {
    const int fl = f & 31, j = (f >> 5) % NF, wi = (f >> 5) / NF;
    const int i = wi % MTW, w = wi / MTW;
    const int mt = i * WARPS_M + w % WARPS_M;
    const int row0 = mt * 16 + (fl >> 2);
    if (mt >= mt_live || row0 >= live) continue;
    float4 v[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s)
      if (s < p.S) v[s] = *cl.map_shared_rank(mine + f, s);
    float sum[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
#pragma unroll
    for (int s = 1; s < kMaxClusterSplits; ++s)
      if (s < p.S) {
        sum[0] = sum[0] + v[s].x;
        sum[1] = sum[1] + v[s].y;
        sum[2] = sum[2] + v[s].z;
        sum[3] = sum[3] + v[s].w;
      }
    const int col = n0 + ((w / WARPS_M) * NF + j) * 8 + (fl & 3) * 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + h * 8;
      if (row < live) gemm_epilogue::store_pair<OutT>(p, row, col, sum[2 * h], sum[2 * h + 1]);
    }
  }
  cl.sync();  // no block leaves (freeing its shared memory) while another may still read it
}

template <class C, class OutT, bool kNew>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) decode_gemm_kernel(const Params p) {
  constexpr int BM = C::BM, BN = C::BN, STAGES = C::STAGES, THREADS = C::THREADS;
  constexpr int MTW = C::MTW, NF = C::NF, WARPS_M = C::WARPS_M;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* sX = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sW = sX + STAGES * BM * kBK;
  __shared__ int s_last;

  const int tile = blockIdx.x, split = blockIdx.y;
  const int n0 = tile * BN;
  const int c_begin = int((int64_t(split) * p.KC) / p.S);
  const int c_end = int((int64_t(split + 1) * p.KC) / p.S);
  const int nchunks = c_end - c_begin;
  const int tid = threadIdx.x;
  const uint64_t w_policy = l2_policy(p.l2_hint >= 1);

  auto load_w = [&](int stage, int chunk) {
    __nv_bfloat16* wd = sW + stage * BN * kBK;
    const int k0 = chunk * kBK;
    for (int c = tid; c < BN * 8; c += THREADS) {
      const int r = c >> 3, ch = c & 7;
      const int n = n0 + r, k = k0 + ch * 8;
      const bool ok = n < p.N && k < p.K;
      const __nv_bfloat16* src = ok ? p.w + int64_t(n) * p.K + k : p.w;
      cp_async16(wd + swz(r, ch), src, ok, w_policy);
    }
  };

  if constexpr (kNew) {
    // (a) The weights do not depend on any earlier kernel: ask L2 for them before waiting.
    if (p.pf_chunks > 0 && tid < BN && n0 + tid < p.N) {
      const int k0 = c_begin * kBK, k1 = min(min(c_end, c_begin + p.pf_chunks) * kBK, p.K);
      if (k1 > k0) {
        const void* src = p.w + int64_t(n0 + tid) * p.K + k0;
        const uint32_t bytes = uint32_t(k1 - k0) * uint32_t(sizeof(__nv_bfloat16));
        if (p.l2_hint >= 2) prefetch_l2(src, bytes, w_policy);
        else prefetch_l2(src, bytes);
      }
    }
  }
  pdl_begin();
  if constexpr (kNew) {
    // (b) The ring's first weight chunks before the live count (they join cp.async group 0).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
      if (s < nchunks) load_w(s, c_begin + s);
  }

  const int live = int(detail::live_count(p.live_rows, p.max_rows));
  if (live <= 0) {  // every block returns: counters untouched
    if constexpr (kNew) cp_async_wait_all();
    return;
  }
  const int mt_live = (live + 15) >> 4;
  const int rows_alloc = mt_live * 16;  // x tile rows filled (rows >= live zero-filled, never read)

  auto load_x = [&](int stage, int chunk) {
    __nv_bfloat16* xd = sX + stage * BM * kBK;
    const int k0 = chunk * kBK;
    for (int c = tid; c < rows_alloc * 8; c += THREADS) {
      const int r = c >> 3, ch = c & 7;
      const int k = k0 + ch * 8;
      const bool ok = r < live && k < p.K;
      const __nv_bfloat16* src = ok ? p.x + int64_t(r) * p.x_stride + k : p.x;
      cp_async16(xd + swz(r, ch), src, ok);
    }
  };
  auto load_stage = [&](int stage, int chunk) {
    load_w(stage, chunk);
    load_x(stage, chunk);
  };

  const int warp = tid >> 5, lane = tid & 31;
  const int wm = warp % WARPS_M, wn = warp / WARPS_M;

  float acc[MTW][NF][4];
#pragma unroll
  for (int i = 0; i < MTW; ++i)
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nchunks) {
      if constexpr (kNew) load_x(s, c_begin + s);  // its weights are in flight already
      else load_stage(s, c_begin + s);
    }
    cp_async_commit();
  }

  for (int it = 0; it < nchunks; ++it) {
    cp_async_wait<STAGES - 2>();  // chunk `it` has landed (this thread's copies) ...
    __syncthreads();              // ... everyone's, and stage (it - 1) % STAGES is free again
    {
      const int nk = it + STAGES - 1;
      if (nk < nchunks) load_stage(nk % STAGES, c_begin + nk);
      cp_async_commit();
    }
    const __nv_bfloat16* xs = sX + (it % STAGES) * BM * kBK;
    const __nv_bfloat16* ws = sW + (it % STAGES) * BN * kBK;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t bfr[NF][2];
#pragma unroll
      for (int j = 0; j < NF; j += 2) {
        const int f = (lane >> 4) ? j + 1 : j;
        const int r = (wn * NF + f) * 8 + (lane & 7);
        uint32_t t[4];
        ldmatrix_x4(t, ws + swz(r, ks * 2 + ((lane >> 3) & 1)));
        bfr[j][0] = t[0];
        bfr[j][1] = t[1];
        bfr[j + 1][0] = t[2];
        bfr[j + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < MTW; ++i) {
        const int mt = i * WARPS_M + wm;
        if (mt < mt_live) {  // warp-uniform
          uint32_t af[4];
          ldmatrix_x4(af, xs + swz(mt * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
          for (int j = 0; j < NF; ++j) mma_bf16_16816(acc[i][j], af, bfr[j][0], bfr[j][1]);
        }
      }
    }
  }
  cp_async_wait_all();

  const int g = lane >> 2, lc = (lane & 3) * 2;
  auto col_of = [&](int j) { return n0 + (wn * NF + j) * 8 + lc; };

  if (p.S == 1) {
#pragma unroll
    for (int i = 0; i < MTW; ++i) {
      const int mt = i * WARPS_M + wm;
      if (mt >= mt_live) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = mt * 16 + g + h * 8;
        if (row >= live) continue;
#pragma unroll
        for (int j = 0; j < NF; ++j) store_pair<OutT>(p, row, col_of(j), acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
    }
    return;
  }

  // ---- split combine ------------------------------------------------------------------------------
  // Partial layout of one (tile, split): float4 index ((warp * MTW + i) * NF + j) * 32 + lane.
  if constexpr (kNew) {
    if (p.cluster) {
      cluster_combine<C, OutT>(p, acc, smem_raw, live, mt_live);
      return;
    }
  }
  auto slot = [&](int s) {
    return reinterpret_cast<float4*>(p.partials + (int64_t(tile) * p.S + s) * int64_t(C::PARTIAL_FLOATS));
  };
  {
    float4* dst = slot(split);
#pragma unroll
    for (int i = 0; i < MTW; ++i) {
      if (i * WARPS_M + wm >= mt_live) continue;
#pragma unroll
      for (int j = 0; j < NF; ++j)
        __stcg(dst + ((warp * MTW + i) * NF + j) * 32 + lane,
               make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]));
    }
  }
  __threadfence();  // this thread's partial is visible device-wide before the counter moves
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(p.counters + tile, 1u) == unsigned(p.S - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // acquire: the other splits' partials (fenced before their increments) are visible

#pragma unroll
  for (int i = 0; i < MTW; ++i) {
    const int mt = i * WARPS_M + wm;
    if (mt >= mt_live) continue;
    float sum[NF][4];
    for (int s = 0; s < p.S; ++s) {
      const float4* src = slot(s);
#pragma unroll
      for (int j = 0; j < NF; ++j) {
        float v[4];
        if (s == split) {
#pragma unroll
          for (int q = 0; q < 4; ++q) v[q] = acc[i][j][q];
        } else {
          const float4 t = __ldcg(src + ((warp * MTW + i) * NF + j) * 32 + lane);
          v[0] = t.x;
          v[1] = t.y;
          v[2] = t.z;
          v[3] = t.w;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) sum[j][q] = s == 0 ? v[q] : sum[j][q] + v[q];
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = mt * 16 + g + h * 8;
      if (row >= live) continue;
#pragma unroll
      for (int j = 0; j < NF; ++j) store_pair<OutT>(p, row, col_of(j), sum[j][2 * h], sum[j][2 * h + 1]);
    }
  }
  if (tid == 0) p.counters[tile] = 0u;  // no other block of this launch touches it any more
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int splits_for(int64_t N, int64_t K) {
  const int64_t tiles = ceil_div(N, kRefBN), kc = ceil_div(K, kBK);
  const int64_t max_s = std::max<int64_t>(1, std::min<int64_t>(kMaxSplits, kc / kMinChunksPerSplit));
  int64_t s = 1;
  while (tiles * s < kTargetBlocks && s * 2 <= max_s) s *= 2;
  return int(s);
}

enum class Which { S, M, L };
Which which_cfg(int64_t max_rows) { return max_rows <= 16 ? Which::S : max_rows <= 64 ? Which::M : Which::L; }

// The tile counters sit at the start of the workspace in a region of one size for every weight: a
// weight is split (and counts tiles) only when it has fewer than kTargetBlocks column tiles, so the
// counters never need more. One size keeps the partials of any weight clear of the counters of any
// other that shares the workspace (the executor serialises all its dense GEMMs through one).
constexpr size_t kCounterBytes = size_t((kTargetBlocks * 4 + 255) / 256 * 256);
size_t counter_bytes(int64_t N) {
  (void)N;
  return kCounterBytes;
}

template <class C>
size_t partial_bytes(int64_t N, int S) {
  return size_t(ceil_div(N, C::BN)) * size_t(S) * C::PARTIAL_FLOATS * sizeof(float);
}

size_t workspace_bytes_impl(int64_t max_rows, int64_t N, int64_t K) {
  const int S = splits_for(N, K);
  if (S == 1 || max_rows <= 0) return 0;
  switch (which_cfg(max_rows)) {
    case Which::S: return counter_bytes(N) + partial_bytes<CfgS>(N, S);
    case Which::M: return counter_bytes(N) + partial_bytes<CfgM>(N, S);
    default: return counter_bytes(N) + partial_bytes<CfgL>(N, S);
  }
}

template <class C, class OutT, bool kNew>
void set_attrs_once() {
  auto* kern = decode_gemm_kernel<C, OutT, kNew>;
  // Set once per instantiation (a host-side attribute: safe during graph capture).
  static const bool attr_set = [&] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::SMEM)));
    // All of L1 as shared memory, so MIN_BLOCKS blocks fit per SM (the copies bypass L1 anyway).
    MOEFOLD_CUDA_CHECK(
        cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)));
    if (kNew) {  // clusters of 16 (S = 16) are non-portable; refused attributes leave those S unclustered
      if (cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
        (void)cudaGetLastError();
    }
    return true;
  }();
  (void)attr_set;
}

/// Whether a (1, S, 1) cluster of this instantiation's blocks can be resident on the device (S a power
/// of two in [2, 16]): asked once per S through cudaOccupancyMaxActiveClusters, but never while `stream`
/// is being captured (the query is not a stream operation, but a refused call would invalidate the
/// capture); then S <= 8 (the portable sizes, 8 blocks in a GPC of 16+ SMs) counts as fitting and 16 as
/// not, for that call only. Either answer gives the same bits (the workspace combine is the fallback).
template <class C, class OutT>
bool cluster_fits(int S, cudaStream_t stream) {
  static std::mutex mu;
  static std::array<int, kMaxClusterSplits + 1> known{};  // 0: not asked, 1: fits, 2: does not
  std::lock_guard<std::mutex> lock(mu);
  if (known[size_t(S)] == 0) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone) return S <= 8;
    cudaLaunchConfig_t lc{};
    lc.gridDim = dim3(1, unsigned(S));
    lc.blockDim = dim3(C::THREADS);
    lc.dynamicSmemBytes = C::SMEM;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = unsigned(S);
    at[0].val.clusterDim.z = 1;
    lc.attrs = at;
    lc.numAttrs = 1;
    int n = 0;
    const bool ok = cudaOccupancyMaxActiveClusters(&n, decode_gemm_kernel<C, OutT, true>, &lc) == cudaSuccess && n > 0;
    if (!ok) (void)cudaGetLastError();
    known[size_t(S)] = ok ? 1 : 2;
  }
  return known[size_t(S)] == 1;
}

template <class C, class OutT, bool kNew>
void launch(Params p, cudaStream_t stream, bool allow_cluster = true) {
  set_attrs_once<C, OutT, kNew>();
  auto* kern = decode_gemm_kernel<C, OutT, kNew>;
  const dim3 grid(unsigned(ceil_div(p.N, C::BN)), unsigned(p.S));
  p.cluster = kNew && allow_cluster && p.S > 1 && p.S <= kMaxClusterSplits && cluster_fits<C, OutT>(p.S, stream) ? 1 : 0;
  if (!p.cluster) {
    launch_pdl(kern, grid, dim3(C::THREADS), C::SMEM, stream, p);
  } else {
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = unsigned(p.S);
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(C::THREADS);
    cfg.dynamicSmemBytes = C::SMEM;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_enabled() ? 2 : 1;
    MOEFOLD_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, p));
  }
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

/// Chunks of its split each block of the new config prefetches to L2: all of them while the whole
/// weight is at most kPrefetchBytes, else that share of each split (at least one chunk).
constexpr double kPrefetchBytes = 24.0 * (1 << 20);
int prefetch_chunks(int64_t N, int64_t K, int S) {
  const int64_t per_split = ceil_div(ceil_div(K, kBK), S);
  const double bytes = double(N) * double(K) * sizeof(__nv_bfloat16);
  if (bytes <= kPrefetchBytes) return int(per_split);
  return int(std::max<int64_t>(1, int64_t(double(per_split) * kPrefetchBytes / bytes)));
}

DecodeGemmCfg resolve(DecodeGemmCfg c) { return c == DecodeGemmCfg::Env ? decode_gemm_cfg() : c; }

const prof::Kernel kDecodeGemmBf16{"decode_gemm_kernel", prof::Category::DenseGemm};
const prof::Kernel kDecodeGemmF32{"decode_gemm_kernel:f32out", prof::Category::DenseGemm};

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

template <class OutT>
void run(const char* name, const __nv_bfloat16* x, const __nv_bfloat16* w, const void* bias, OutT* y,
         int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace, cudaStream_t stream,
         int64_t x_stride, int64_t y_stride, DecodeGemmCfg cfg) {
  cfg = resolve(cfg);
  const int64_t xs = x_stride ? x_stride : K, ys = y_stride ? y_stride : N;
  // Built only for an error message (this runs for every dense projection of every step).
  auto shape = [&] {
    return std::string(name) + "(max_rows=" + std::to_string(max_rows) + ", K=" + std::to_string(K) +
           ", N=" + std::to_string(N) + ", x_stride=" + std::to_string(xs) + ", y_stride=" + std::to_string(ys) + ")";
  };
  if (max_rows < 0 || max_rows > kDecodeGemmMaxRows)
    throw Error(shape() + ": max_rows must be in [0, " + std::to_string(kDecodeGemmMaxRows) + "]");
  if (N < 1 || N > (int64_t(1) << 30)) throw Error(shape() + ": N must be in [1, 2^30]");
  if (K < 8 || K % 8 != 0 || K > (int64_t(1) << 30)) throw Error(shape() + ": K must be a positive multiple of 8");
  if (xs < K || ys < N) throw Error(shape() + ": row strides must be >= the row lengths");
  if (xs % 8 != 0) throw Error(shape() + ": x_stride must keep rows of x 16-byte aligned (x_stride % 8)");
  if (max_rows == 0) return;
  if (!x || !w || !y) throw Error(shape() + ": null x, w or y");
  if (!aligned16(x) || !aligned16(w)) throw Error(shape() + ": x and w must be 16-byte aligned");
  Params p{};
  p.x = x;
  p.w = w;
  p.bias = bias;
  p.y = y;
  p.live_rows = live_rows;
  p.x_stride = xs;
  p.y_stride = ys;
  p.pair_stores = ys % 2 == 0 && reinterpret_cast<uintptr_t>(y) % (2 * sizeof(OutT)) == 0;
  p.max_rows = int(max_rows);
  p.K = int(K);
  p.N = int(N);
  p.S = splits_for(N, K);
  p.KC = int(ceil_div(K, kBK));
  if (p.S > 1) {
    if (!workspace || !aligned16(workspace))
      throw Error(shape() + ": needs a 16-byte aligned workspace of decode_gemm_workspace_bytes() = " +
                  std::to_string(workspace_bytes_impl(max_rows, N, K)) + " bytes");
    if (size_t(ceil_div(N, kRefBN)) * 4 > kCounterBytes) throw Error(shape() + ": too many column tiles to split");
    p.counters = static_cast<unsigned*>(workspace);
    p.partials = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + counter_bytes(N));
  }
  // W once, the live rows of x and y (and the partials when split), 2 flops per multiply-add.
  LaunchScope scope(std::is_same_v<OutT, float> ? kDecodeGemmF32 : kDecodeGemmBf16, stream, [&] {
    const double rows = double(work_rows(max_rows, live_rows));
    return prof::Work{double(N) * K * 2 + rows * (double(K) * 2 + double(N) * sizeof(OutT)),
                      2.0 * rows * double(N) * double(K)};
  });
  p.l2_hint = l2_stream_hint();
  if (cfg == DecodeGemmCfg::Old || (cfg == DecodeGemmCfg::NewUpTo16 && which_cfg(max_rows) != Which::S)) {
    switch (which_cfg(max_rows)) {
      case Which::S: launch<CfgS, OutT, false>(p, stream); break;
      case Which::M: launch<CfgM, OutT, false>(p, stream); break;
      default: launch<CfgL, OutT, false>(p, stream); break;
    }
    return;
  }
  p.pf_chunks = cfg == DecodeGemmCfg::NewNoPrefetch ? 0 : prefetch_chunks(N, K, p.S);
  switch (which_cfg(max_rows)) {
    case Which::S: launch<CfgS, OutT, true>(p, stream, cfg != DecodeGemmCfg::NewNoCluster); break;
    case Which::M: launch<CfgM, OutT, true>(p, stream, cfg != DecodeGemmCfg::NewNoCluster); break;
    default: launch<CfgL, OutT, true>(p, stream, cfg != DecodeGemmCfg::NewNoCluster); break;
  }
}

}  // namespace

DecodeGemmCfg decode_gemm_cfg() {
  static const DecodeGemmCfg c = [] {
    const char* v = std::getenv("MOEFOLD_DECODE_GEMM_CFG");
    if (!v || !*v) return kDecodeGemmDefaultCfg;
    const std::string s(v);
    if (s == "old") return DecodeGemmCfg::Old;
    if (s == "new") return DecodeGemmCfg::New;
    if (s == "new_nopf") return DecodeGemmCfg::NewNoPrefetch;
    if (s == "new16") return DecodeGemmCfg::NewUpTo16;
    if (s == "new_nocl") return DecodeGemmCfg::NewNoCluster;
    throw Error("MOEFOLD_DECODE_GEMM_CFG=" + s + ": expected old, new, new_nopf, new16 or new_nocl");
  }();
  return c;
}

int decode_gemm_splits(int64_t N, int64_t K) {
  if (N < 1 || K < 1) throw Error("decode_gemm_splits: N and K must be positive (N=" + std::to_string(N) +
                                  ", K=" + std::to_string(K) + ")");
  return splits_for(N, K);
}

size_t decode_gemm_workspace_bytes(int64_t max_rows, int64_t N, int64_t K) {
  if (max_rows < 0 || max_rows > kDecodeGemmMaxRows || N < 1 || K < 1)
    throw Error("decode_gemm_workspace_bytes: bad sizes (max_rows=" + std::to_string(max_rows) +
                ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")");
  return workspace_bytes_impl(max_rows, N, K);
}

void decode_gemm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
                      int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace,
                      cudaStream_t stream, int64_t x_stride, int64_t y_stride, DecodeGemmCfg cfg) {
  run<__nv_bfloat16>("decode_gemm_bf16", x, w, bias, y, max_rows, K, N, live_rows, workspace, stream, x_stride,
                     y_stride, cfg);
}

void decode_gemm_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                             int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace,
                             cudaStream_t stream, int64_t x_stride, int64_t y_stride, DecodeGemmCfg cfg) {
  run<float>("decode_gemm_bf16_f32out", x, w, bias, y, max_rows, K, N, live_rows, workspace, stream, x_stride,
             y_stride, cfg);
}

}  // namespace moefold::cuda
