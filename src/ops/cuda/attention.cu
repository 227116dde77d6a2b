// Paged attention kernels (see attention.h for the contract).
//
// One kernel body serves prefill and decode. A block owns one KV head of one sequence, a tile of
// TB query tokens x HB query heads of that KV head's group (up to 32 "rows", 4 per warp), and a KV
// range: the whole causal range (prefill), or one split of it (decode; partial results go to a
// workspace and a combine kernel merges them by log-sum-exp). Per 32-key tile the block stages K
// and V in shared memory (rows padded by 16 bytes so that lane-per-key 16-byte reads are
// conflict-free); each lane scores one key against the warp's 4 rows (q kept in shared memory in
// fp32, pre-scaled by scale * log2(e)), the warp does the online-softmax update with shuffles, then
// each lane accumulates head_dim/32 output dims over the tile's keys. Prefill uses the tensor-core
// kernel further below by default (AttnKernel::Auto); this CUDA-core kernel serves decode and the
// AttnKernel::Simt prefill variant. K/V tiles arrive by cp.async, double-buffered: the next tile's copies
// run under the current tile's math.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <cuda_fp8.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_flash.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
using namespace detail;
using namespace ptx;
namespace {

constexpr int kR = 4;          // query rows per warp
constexpr int kBN = 32;        // keys per tile (one per lane)
constexpr int kMaxWarps = 8;   // rows per block <= 32
constexpr float kLog2e = 1.4426950408889634f;

// Decode splits: a sequence of kv_len keys is split into chunks of decode_split_len(kv_len) keys, a
// function of that sequence's own length alone (never of the batch or of a host bound), so that its
// output is bitwise the same whatever else the step holds: at most kMaxDecodeSplits chunks, each a
// multiple of kDecodeSplitUnit keys. A sequence with a single chunk is written directly.
constexpr int kDecodeSplitUnit = 32;
constexpr int kMaxDecodeSplits = 64;
constexpr int kDecodeSplit = -1;  // Args::split_size value selecting the per-sequence rule

__host__ __device__ __forceinline__ int decode_split_len(int kv_len) {
  const int units = (kv_len + kDecodeSplitUnit * kMaxDecodeSplits - 1) / (kDecodeSplitUnit * kMaxDecodeSplits);
  return kDecodeSplitUnit * (units > 1 ? units : 1);
}
__host__ __device__ __forceinline__ int decode_num_splits(int kv_len) {
  const int len = decode_split_len(kv_len);
  return (kv_len + len - 1) / len;
}

struct Args {
  const bf16* q;
  int64_t q_ts, q_hs;
  const bf16* gate;
  int64_t g_ts, g_hs;
  const bf16* kc;
  const bf16* vc;
  /// FP8 pages (attn_kernel<D, true>): e4m3 bytes and the dequantisation scale of each KV head.
  const uint8_t* kc8;
  const uint8_t* vc8;
  const float* k_scale;
  const float* v_scale;
  const int32_t* bt;
  int max_blocks;
  const int32_t* cu;  // nullptr: decode (row s = sequence s, one row)
  const int32_t* ctx_lens;
  bf16* out;  // dense [rows, Hq, D]
  float* part_o;
  float* part_ml;
  int max_splits, split_size;  // split_size 0: no split, direct output; kDecodeSplit: per sequence
  int Hq, Hkv, G, HB, TB, head_chunks, block_size, qtiles;
  float scale_log2;
  bool sync_stage;  // K/V tiles staged through registers instead of cp.async (A/B runs only)
};

/// Query rows [row0, row0 + n) of sequence s: from cu_seqlens (prefill), or row s alone (decode).
__device__ __forceinline__ void seq_rows(const Args& a, int s, int& row0, int& n) {
  if (a.cu) {
    row0 = a.cu[s];
    n = a.cu[s + 1] - row0;
  } else {
    row0 = s;
    n = 1;
  }
}

/// The stored K/V element: bf16, or an e4m3 byte for FP8 pages.
template <bool FP8>
using KvElem = std::conditional_t<FP8, uint8_t, bf16>;

/// Shared-memory row stride of a K/V tile in elements: head_dim plus 16 bytes.
template <int D, bool FP8 = false>
constexpr int kv_stride() { return D + 16 / int(sizeof(KvElem<FP8>)); }

/// Two buffers of a K and a V tile (the next tile's copies run under the current tile's math), then the
/// warps' q rows in fp32.
template <int D, bool FP8 = false, int R = kR>
size_t smem_bytes(int nwarps) {
  return size_t(4 * kBN * kv_stride<D, FP8>()) * sizeof(KvElem<FP8>) + size_t(nwarps * R * D) * sizeof(float);
}

/// n e4m3 bytes at p as fp32 values times `scale` (exact conversion, one fp32 multiply: the CPU's
/// kv_fp8_load; NaN stays NaN).
template <int N>
__device__ __forceinline__ void load_e4m3(const uint8_t* p, float scale, float* f) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(p[i]), __NV_E4M3);
    f[i] = __half2float(__half(h)) * scale;
  }
}

/// N stored elements at p as fp32 (bf16: exact; e4m3: times scale).
template <int N, bool FP8>
__device__ __forceinline__ void load_kv(const KvElem<FP8>* p, float scale, float* f) {
  if constexpr (FP8) {
    load_e4m3<N>(p, scale, f);
  } else {
    (void)scale;
    load_bf16<N>(p, f);
  }
}

template <int D, bool FP8 = false, int R = kR>
__global__ void __launch_bounds__(kMaxWarps * 32) attn_kernel(const Args a) {
  pdl_begin();
  using KvT = KvElem<FP8>;
  constexpr int DPL = D / 32;  // output dims per lane
  constexpr int KS = kv_stride<D, FP8>();
  constexpr int CH = D / 8;  // 8-element chunks of a row (the score loop)
  constexpr int EPC = 16 / int(sizeof(KvT));  // elements per 16-byte load
  constexpr int LCH = D / EPC;               // 16-byte loads per row
  extern __shared__ __align__(16) unsigned char smem_raw[];
  KvT* const kv_smem = reinterpret_cast<KvT*>(smem_raw);  // buffer b: K tile at 2b, V tile at 2b + 1
  float* Qs = reinterpret_cast<float*>(kv_smem + 4 * kBN * KS);
  const KvT* kc;
  const KvT* vc;
  if constexpr (FP8) {
    kc = a.kc8, vc = a.vc8;
  } else {
    kc = a.kc, vc = a.vc;
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = blockIdx.z;
  const int qtile = int(blockIdx.x) % a.qtiles, split = int(blockIdx.x) / a.qtiles;
  const int kvh = int(blockIdx.y) / a.head_chunks, hchunk = int(blockIdx.y) % a.head_chunks;
  int row0, n;
  seq_rows(a, s, row0, n);
  const int ctx = a.ctx_lens[s];
  if (ctx < 0) return;
  const int t0 = qtile * a.TB;
  if (t0 >= n) return;
  const int kv_end = ctx + min(t0 + a.TB, n);
  int kv_lo = 0, kv_hi = kv_end;
  // A sequence longer than the host bound (more chunks than the grid has) still runs correctly: its
  // last chunk takes the rest.
  const int nsp = a.split_size == kDecodeSplit ? min(decode_num_splits(kv_end), a.max_splits) : 1;
  if (split >= nsp) return;
  if (nsp > 1) {
    const int len = decode_split_len(kv_end);
    kv_lo = split * len;
    kv_hi = split == nsp - 1 ? kv_end : min(kv_lo + len, kv_end);
  }

  // This warp's rows: (token, q head) pairs; q rows staged in shared memory as scaled fp32.
  int lim[R], tok[R], head[R];
  bool valid[R];
  float* Qw = Qs + warp * R * D;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int rb = warp * R + r, tb = rb / a.HB, hh = rb % a.HB, hg = hchunk * a.HB + hh;
    valid[r] = tb < a.TB && t0 + tb < n && hg < a.G;
    tok[r] = t0 + tb;
    head[r] = kvh * a.G + hg;
    lim[r] = valid[r] ? ctx + tok[r] : kv_end - 1;
    const bf16* qr = a.q + int64_t(row0 + tok[r]) * a.q_ts + int64_t(head[r]) * a.q_hs;
    for (int c = lane; c < CH; c += 32) {
      float f[8];
      if (valid[r]) {
        load_bf16<8>(qr + c * 8, f);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) f[i] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) Qw[r * D + c * 8 + i] = f[i] * a.scale_log2;
    }
  }
  __syncwarp();

  float m[R], l[R], o[R][DPL];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int d = 0; d < DPL; ++d) o[r][d] = 0.0f;
  }
  const int32_t* bt = a.bt + int64_t(s) * a.max_blocks;
  // FP8 pages: one scale per KV head, so one per block (dequantised in registers as the tile is read).
  const float ksc = FP8 ? a.k_scale[kvh] : 1.0f, vsc = FP8 ? a.v_scale[kvh] : 1.0f;

  // The tile of keys [kb, kb + kBN) into buffer b by cp.async, keys >= kv_hi zero-filled: every copy of
  // a tile in flight at once (a register round trip per 16 bytes left a decode block of two warps
  // waiting on ~16 serial loads), and the next tile's copies under the current tile's math.
  const auto stage = [&](int kb, int b) {
    KvT* Kb = kv_smem + (2 * b) * kBN * KS;
    KvT* Vb = Kb + kBN * KS;
    for (int idx = threadIdx.x; idx < kBN * LCH; idx += blockDim.x) {
      const int rr = idx / LCH, c = idx % LCH, key = kb + rr;
      const bool ok = key < kv_hi;
      int64_t off = 0;
      if (ok) {
        const int64_t page = bt[key / a.block_size];
        off = ((page * a.block_size + key % a.block_size) * a.Hkv + kvh) * D + c * EPC;
      }
      if (a.sync_stage) {  // MOEFOLD_ATTN_DECODE_STAGE=sync: through registers (the A/B reference)
        const uint4 z = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(Kb + rr * KS + c * EPC) = ok ? *reinterpret_cast<const uint4*>(kc + off) : z;
        *reinterpret_cast<uint4*>(Vb + rr * KS + c * EPC) = ok ? *reinterpret_cast<const uint4*>(vc + off) : z;
      } else {
        cp_async16(Kb + rr * KS + c * EPC, kc + off, ok);
        cp_async16(Vb + rr * KS + c * EPC, vc + off, ok);
      }
    }
    cp_async_commit();
  };
  if (kv_lo < kv_hi) stage(kv_lo, 0);
  int buf = 0;
  for (int kb = kv_lo; kb < kv_hi; kb += kBN, buf ^= 1) {
    __syncthreads();  // the previous tile (buffer buf ^ 1) is consumed
    if (kb + kBN < kv_hi) {
      stage(kb + kBN, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile kb is in buffer buf for every thread
    const KvT* Ks = kv_smem + (2 * buf) * kBN * KS;
    const KvT* Vs = Ks + kBN * KS;

    // Scores: lane = key.
    float sc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sc[r] = 0.0f;
    const KvT* krow = Ks + lane * KS;
#pragma unroll 4
    for (int c = 0; c < CH; ++c) {
      float kf[8];
      load_kv<8, FP8>(krow + c * 8, ksc, kf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 qa = *reinterpret_cast<const float4*>(Qw + r * D + c * 8);
        const float4 qb = *reinterpret_cast<const float4*>(Qw + r * D + c * 8 + 4);
        sc[r] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                 qb.z * kf[6] + qb.w * kf[7];
      }
    }
    const int key = kb + lane;
    float p[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float sr = (key < kv_hi && key <= lim[r]) ? sc[r] : -INFINITY;
      const float mn = fmaxf(m[r], warp_max(sr));
      const float mu = mn == -INFINITY ? 0.0f : mn;
      const float alpha = exp2f(m[r] - mu);
      p[r] = exp2f(sr - mu);
      l[r] = l[r] * alpha + warp_sum(p[r]);
      m[r] = mn;
#pragma unroll
      for (int d = 0; d < DPL; ++d) o[r][d] *= alpha;
    }
    // p . V: lane owns dims [lane * DPL, lane * DPL + DPL).
    const int jn = min(kBN, kv_hi - kb);
    for (int j = 0; j < jn; ++j) {
      float vf[DPL];
      load_kv<DPL, FP8>(Vs + j * KS + lane * DPL, vsc, vf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float pj = __shfl_sync(0xffffffffu, p[r], j);
#pragma unroll
        for (int d = 0; d < DPL; ++d) o[r][d] = fmaf(pj, vf[d], o[r][d]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (!valid[r]) continue;
    const int64_t grow = row0 + tok[r];
    if (nsp == 1) {
      const float inv = 1.0f / l[r];
      float ov[DPL];
#pragma unroll
      for (int d = 0; d < DPL; ++d) ov[d] = o[r][d] * inv;
      if (a.gate) {
        float gf[DPL];
        load_bf16<DPL>(a.gate + grow * a.g_ts + int64_t(head[r]) * a.g_hs + lane * DPL, gf);
#pragma unroll
        for (int d = 0; d < DPL; ++d) ov[d] *= sigmoidf_(gf[d]);
      }
      store_bf16<DPL>(a.out + (grow * a.Hq + head[r]) * D + lane * DPL, ov);
    } else {
      const int64_t pi = (grow * a.Hq + head[r]) * a.max_splits + split;
#pragma unroll
      for (int d = 0; d < DPL; ++d) a.part_o[pi * D + lane * DPL + d] = o[r][d];
      if (lane == 0) {
        a.part_ml[2 * pi] = m[r];
        a.part_ml[2 * pi + 1] = l[r];
      }
    }
  }
}

// Merges the splits of one (row, q head): grid (max rows per sequence, Hq, S), D threads.
template <int D>
__global__ void combine_kernel(const Args a) {
  pdl_begin();
  const int t = blockIdx.x, h = blockIdx.y, s = blockIdx.z, d = threadIdx.x;
  int row0, n;
  seq_rows(a, s, row0, n);
  const int ctx = a.ctx_lens[s];
  if (ctx < 0 || t >= n) return;
  const int kv_end = ctx + t + 1;
  const int nsp = min(decode_num_splits(kv_end), a.max_splits);
  if (nsp <= 1) return;  // written directly by attn_kernel
  const int64_t grow = row0 + t, base = (grow * a.Hq + h) * a.max_splits;
  float M = -INFINITY;
  for (int sp = 0; sp < nsp; ++sp) M = fmaxf(M, a.part_ml[2 * (base + sp)]);
  float L = 0.0f, acc = 0.0f;
  for (int sp = 0; sp < nsp; ++sp) {
    const float lsp = a.part_ml[2 * (base + sp) + 1];
    if (lsp == 0.0f) continue;
    const float w = exp2f(a.part_ml[2 * (base + sp)] - M);
    L += lsp * w;
    acc += a.part_o[(base + sp) * D + d] * w;
  }
  float ov = acc / L;
  if (a.gate) ov *= sigmoidf_(__bfloat162float(a.gate[grow * a.g_ts + int64_t(h) * a.g_hs + d]));
  a.out[(grow * a.Hq + h) * D + d] = __float2bfloat16_rn(ov);
}

template <int D, bool FP8 = false, int R = kR>
void launch_attn(const Args& a, dim3 grid, int nwarps, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(attn_kernel<D, FP8, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            int(smem_bytes<D, FP8, R>(kMaxWarps))));
  });
  launch_pdl(attn_kernel<D, FP8, R>, dim3(grid), dim3(nwarps * 32), smem_bytes<D, FP8, R>(nwarps), stream, a);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

template <class F>
void dispatch_head_dim(int D, F&& f) {
  switch (D) {
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 96: f(std::integral_constant<int, 96>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    case 192: f(std::integral_constant<int, 192>{}); break;
    case 256: f(std::integral_constant<int, 256>{}); break;
    default: fail("attention: head_dim {} not supported by decode (32, 64, 96, 128, 192, 256)", D);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Query rows per warp of a decode launch: one q head a warp (a block of a one-token step holds G q heads
/// of one KV head, so G warps instead of G / 4 shorten its chain; measured faster on the H200 from batch 1
/// to 64 at every context, docs/benchmarks.md). A row's arithmetic does not depend on it: the same bits
/// either way. MOEFOLD_ATTN_DECODE_ROWS=1|4 sets it (A/B runs; read at every call).
int decode_rows_per_warp() {
  if (const char* e = std::getenv("MOEFOLD_ATTN_DECODE_ROWS")) {
    const std::string v(e);
    MOEFOLD_CHECK(v == "1" || v == "4", "MOEFOLD_ATTN_DECODE_ROWS={}: expected 1 or 4", v);
    return v == "1" ? 1 : kR;
  }
  return 1;
}

/// MOEFOLD_ATTN_DECODE_STAGE: unset or `async` (cp.async, double-buffered), `sync` (attn_kernel stages its K/V
/// tiles through registers, one at a time: same bits, for A/B runs and the bitwise test); anything else is an
/// error. Read at every call, so that a test can switch it.
bool decode_sync_stage() {
  const char* e = std::getenv("MOEFOLD_ATTN_DECODE_STAGE");
  if (!e || std::string(e) == "async") return false;
  MOEFOLD_CHECK(std::string(e) == "sync", "MOEFOLD_ATTN_DECODE_STAGE={}: expected async or sync", e);
  return true;
}

/// AttnKernel::Auto may take the warp-specialised prefill kernel unless MOEFOLD_ATTN_PREFILL=wgmma (read once;
/// for A/B runs).
bool prefill_ws_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MOEFOLD_ATTN_PREFILL");
    return !(e && std::string(e) == "wgmma");
  }();
  return on;
}

// ---- registry entries and the work of one call ---------------------------------------------------------
const prof::Kernel kAttnPrefillFa{"attn_fa_kernel", prof::Category::AttentionPrefill};
const prof::Kernel kAttnPrefillWg{"attn_wgmma_kernel", prof::Category::AttentionPrefill};
const prof::Kernel kAttnPrefillWs{"attn_ws_kernel", prof::Category::AttentionPrefill};
const prof::Kernel kAttnPrefillTc{"attn_tc_kernel", prof::Category::AttentionPrefill};
const prof::Kernel kAttnPrefillSimt{"attn_kernel:prefill", prof::Category::AttentionPrefill};
const prof::Kernel kAttnDecode{"attn_kernel:decode", prof::Category::AttentionDecode};
const prof::Kernel kAttnPrefillSimtFp8{"attn_kernel:prefill_fp8", prof::Category::AttentionPrefill};
const prof::Kernel kAttnDecodeCombine{"combine_kernel", prof::Category::AttentionDecode};
const prof::Kernel kKvWrite{"kv_write_kernel", prof::Category::Glue};
const prof::Kernel kSlotMapping{"slot_mapping_kernel", prof::Category::Glue};

/// Attention work of the running step (prof::step_facts; zero outside a step): q (and gate) read, out
/// written, every sequence's cached K and V read once; QK^T and PV over the causal (query, key) pairs.
/// decode: one query row per sequence over context_lens[s] + 1 keys.
prof::Work attention_work(const AttentionShape& sh, bool decode) {
  const prof::StepFacts* f = prof::step_facts();
  if (!f) return {};
  double rows = 0, pairs = 0, kv_tokens = 0;
  for (size_t s = 0; s < f->context_lens.size(); ++s) {
    const double ctx = f->context_lens[s];
    const double n = decode ? 1.0 : double(f->cu_seqlens[s + 1] - f->cu_seqlens[s]);
    if (n <= 0) continue;
    rows += n;
    pairs += n * ctx + n * (n + 1) / 2;
    kv_tokens += ctx + n;
  }
  const double q_elems = rows * sh.num_heads * sh.head_dim;
  return prof::Work{q_elems * 2 * (sh.gate ? 3 : 2) + kv_tokens * sh.num_kv_heads * sh.head_dim * 4,
                    4.0 * pairs * sh.num_heads * sh.head_dim};
}

/// Bytes of the split-KV partial results (fp32 o and (m, l) per split) of a decode step.
double decode_partial_bytes(const AttentionShape& sh, int max_splits) {
  const prof::StepFacts* f = prof::step_facts();
  if (!f || max_splits <= 1) return 0;
  double splits = 0;
  for (int32_t ctx : f->context_lens) {
    const int nsp = ctx >= 0 ? decode_num_splits(ctx + 1) : 0;
    splits += nsp > 1 ? nsp : 0;
  }
  return splits * sh.num_heads * (sh.head_dim + 2) * 4.0;
}

/// Fills the shape-derived fields of Args and checks the preconditions.
Args make_args(const bf16* q, const bf16* k_cache, const bf16* v_cache, const int32_t* block_tables,
               int max_blocks_per_seq, const int32_t* context_lens, bf16* out, const AttentionShape& sh,
               int rows) {
  const int D = sh.head_dim;
  MOEFOLD_CHECK(sh.num_heads > 0 && sh.num_kv_heads > 0 && sh.num_heads % sh.num_kv_heads == 0,
                "attention: {} query heads is not a multiple of {} KV heads", sh.num_heads, sh.num_kv_heads);
  MOEFOLD_CHECK(sh.block_size > 0 && max_blocks_per_seq > 0, "attention: bad block_size {} / max_blocks {}",
                sh.block_size, max_blocks_per_seq);
  Args a{};
  a.sync_stage = decode_sync_stage();
  a.q = q;
  a.q_hs = sh.q_head_stride ? sh.q_head_stride : D;
  a.q_ts = sh.q_token_stride ? sh.q_token_stride : sh.num_heads * a.q_hs;
  a.gate = sh.gate;
  a.g_hs = sh.gate_head_stride ? sh.gate_head_stride : D;
  a.g_ts = sh.gate_token_stride ? sh.gate_token_stride : sh.num_heads * a.g_hs;
  MOEFOLD_CHECK(aligned16(q) && aligned16(out) && aligned16(k_cache) && aligned16(v_cache) &&
                    (!sh.gate || aligned16(sh.gate)) && a.q_hs % 8 == 0 && a.q_ts % 8 == 0 && a.g_hs % 8 == 0 &&
                    a.g_ts % 8 == 0,
                "attention: q / gate / out / caches must be 16-byte aligned with strides multiple of 8");
  a.kc = k_cache;
  a.vc = v_cache;
  a.bt = block_tables;
  a.max_blocks = max_blocks_per_seq;
  a.ctx_lens = context_lens;
  a.out = out;
  a.Hq = sh.num_heads;
  a.Hkv = sh.num_kv_heads;
  a.G = sh.num_heads / sh.num_kv_heads;
  a.HB = std::min(a.G, rows);
  a.TB = rows / a.HB;
  a.head_chunks = (a.G + a.HB - 1) / a.HB;
  a.block_size = sh.block_size;
  const float scale = sh.scale > 0 ? sh.scale : float(1.0 / std::sqrt(double(D)));
  a.scale_log2 = scale * kLog2e;
  return a;
}

struct DecodePlan {
  int nwarps, head_chunks, split_size, max_splits;
};

DecodePlan plan_decode(const AttentionShape& sh, int64_t max_kv_len, int rows_per_warp = kR) {
  DecodePlan p{};
  const int G = sh.num_kv_heads > 0 ? sh.num_heads / sh.num_kv_heads : 1;
  const int R = rows_per_warp;
  p.nwarps = std::max(1, (std::min(G, kMaxWarps * R) + R - 1) / R);
  const int HB = std::min(G, p.nwarps * R);
  p.head_chunks = (G + HB - 1) / HB;
  MOEFOLD_CHECK(max_kv_len < (int64_t(1) << 30), "attention_decode: max_kv_len {} too large", max_kv_len);
  // The grid covers the most chunks any sequence of up to max_kv_len keys can have (decode_num_splits
  // is not monotonic in kv_len: it peaks at kMaxDecodeSplits from 64 * kDecodeSplitUnit keys on).
  const int64_t kv = std::max<int64_t>(max_kv_len, 1);
  p.max_splits = kv >= int64_t(kDecodeSplitUnit) * kMaxDecodeSplits
                     ? kMaxDecodeSplits
                     : int((kv + kDecodeSplitUnit - 1) / kDecodeSplitUnit);
  p.split_size = kDecodeSplit;
  return p;
}


// ---- tensor-core prefill kernel ---------------------------------------------------------------------
// Flash-attention-2 structure on mma.sync m16n8k16 (bf16 in, fp32 accumulate): 4 warps x 16 rows
// (the same (token, q head) row packing as above, 64 rows per block), BN-key K/V tiles staged with
// cp.async in shared memory rows padded by 16 bytes (conflict-free ldmatrix), S = Q K^T and O += P V
// on tensor cores, online softmax in fp32 on the S fragments (each thread owns 2 rows; row
// statistics reduced over the 4-thread quad), P rounded to bf16 as the A operand of P V. The V load
// of a tile overlaps S = Q K^T, the next K load overlaps P V.
constexpr int kTcRows = 64;

template <int D>
constexpr int tc_bn() { return D >= 256 ? 32 : 64; }

template <int D>
size_t tc_smem_bytes() {
  return size_t(kTcRows + 2 * tc_bn<D>()) * size_t(kv_stride<D>()) * sizeof(bf16);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <int D>
__global__ void __launch_bounds__(128) attn_tc_kernel(const Args a) {
  pdl_begin();
  constexpr int BN = tc_bn<D>(), KS = kv_stride<D>(), CH = D / 8, NT = BN / 8, DT = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + kTcRows * KS;
  bf16* Vs = Ks + BN * KS;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int s = blockIdx.z, qtile = blockIdx.x;
  const int kvh = int(blockIdx.y) / a.head_chunks, hchunk = int(blockIdx.y) % a.head_chunks;
  const int row0 = a.cu[s], n = a.cu[s + 1] - row0;
  const int ctx = a.ctx_lens[s];
  if (ctx < 0) return;
  const int t0 = qtile * a.TB;
  if (t0 >= n) return;
  const int kv_end = ctx + min(t0 + a.TB, n);

  // Q tile (rows (token, head) as in attn_kernel), zero rows where invalid.
  for (int idx = threadIdx.x; idx < kTcRows * CH; idx += blockDim.x) {
    const int rb = idx / CH, c = idx % CH, tb = rb / a.HB, hg = hchunk * a.HB + rb % a.HB;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (tb < a.TB && t0 + tb < n && hg < a.G)
      v = *reinterpret_cast<const uint4*>(a.q + int64_t(row0 + t0 + tb) * a.q_ts + int64_t(kvh * a.G + hg) * a.q_hs +
                                          c * 8);
    *reinterpret_cast<uint4*>(Qs + rb * KS + c * 8) = v;
  }
  // This thread's two rows: warp * 16 + g and + 8.
  int lim[2], tok[2], head[2];
  bool valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int rb = warp * 16 + g + 8 * i, tb = rb / a.HB, hg = hchunk * a.HB + rb % a.HB;
    valid[i] = tb < a.TB && t0 + tb < n && hg < a.G;
    tok[i] = t0 + tb;
    head[i] = kvh * a.G + hg;
    lim[i] = valid[i] ? ctx + tok[i] : kv_end - 1;
  }
  const int32_t* bt = a.bt + int64_t(s) * a.max_blocks;
  auto load_tile = [&](bf16* dst, const bf16* cache, int kb) {
    for (int idx = threadIdx.x; idx < BN * CH; idx += blockDim.x) {
      const int rr = idx / CH, c = idx % CH, key = kb + rr;
      bf16* d = dst + rr * KS + c * 8;
      if (key < kv_end) {
        const int64_t page = bt[key / a.block_size];
        cp_async16(d, cache + ((page * a.block_size + key % a.block_size) * a.Hkv + kvh) * D + c * 8);
      } else {
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_commit();
  };

  float o[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  load_tile(Ks, a.kc, 0);
  for (int kb = 0; kb < kv_end; kb += BN) {
    cp_async_wait_all();
    __syncthreads();  // K(kb) (and the Q tile) visible; every warp is done with V(kb - BN)
    load_tile(Vs, a.vc, kb);

    float sc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4];
      ldmatrix_x4(qa, Qs + (warp * 16 + (lane & 15)) * KS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int p = 0; p < NT / 2; ++p) {
        uint32_t kf[4];
        ldmatrix_x4(kf, Ks + (16 * p + ((lane >> 4) << 3) + (lane & 7)) * KS + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16_16816(sc[2 * p], qa, kf[0], kf[1]);
        mma_bf16_16816(sc[2 * p + 1], qa, kf[2], kf[3]);
      }
    }
    // Mask, online softmax (log2 domain) on rows lim[0] (elements 0, 1) and lim[1] (elements 2, 3).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kb + 8 * j + 2 * tig + (e & 1), i = e >> 1;
        const float v = (key < kv_end && key <= lim[i]) ? sc[j][e] * a.scale_log2 : -INFINITY;
        sc[j][e] = v;
        mx[i] = fmaxf(mx[i], v);
      }
    float alpha[2], mu[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float mn = fmaxf(m[i], mx[i]);
      mu[i] = mn == -INFINITY ? 0.0f : mn;
      alpha[i] = exp2f(m[i] - mu[i]);
      m[i] = mn;
      l[i] *= alpha[i];
    }
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float p0 = exp2f(sc[j][0] - mu[0]), p1 = exp2f(sc[j][1] - mu[0]);
      const float p2 = exp2f(sc[j][2] - mu[1]), p3 = exp2f(sc[j][3] - mu[1]);
      l[0] += p0 + p1;
      l[1] += p2 + p3;
      pa[j / 2][(j & 1) * 2 + 0] = pack_bf16(p0, p1);
      pa[j / 2][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
    }
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }

    cp_async_wait_all();
    __syncthreads();  // V(kb) visible; every warp is done with K(kb)
    if (kb + BN < kv_end) load_tile(Ks, a.kc, kb + BN);
#pragma unroll
    for (int k2 = 0; k2 < BN / 16; ++k2)
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, Vs + (16 * k2 + ((lane >> 3) & 1) * 8 + (lane & 7)) * KS + 16 * dp + (lane >> 4) * 8);
        mma_bf16_16816(o[2 * dp], pa[k2], vf[0], vf[1]);
        mma_bf16_16816(o[2 * dp + 1], pa[k2], vf[2], vf[3]);
      }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!valid[i]) continue;
    const int64_t grow = row0 + tok[i];
    const float inv = 1.0f / l[i];
    bf16* orow = a.out + (grow * a.Hq + head[i]) * D;
    const bf16* grow_gate = a.gate ? a.gate + grow * a.g_ts + int64_t(head[i]) * a.g_hs : nullptr;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      const int d = 8 * j + 2 * tig;
      float v0 = o[j][2 * i] * inv, v1 = o[j][2 * i + 1] * inv;
      if (grow_gate) {
        const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(grow_gate + d));
        v0 *= sigmoidf_(gf.x);
        v1 *= sigmoidf_(gf.y);
      }
      *reinterpret_cast<__nv_bfloat162*>(orow + d) = __floats2bfloat162_rn(v0, v1);
    }
  }
}

template <int D>
void launch_attn_tc(const Args& a, dim3 grid, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(attn_tc_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            int(tc_smem_bytes<D>())));
  });
  launch_pdl(attn_tc_kernel<D>, dim3(grid), dim3(128), tc_smem_bytes<D>(), stream, a);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

// ---- KV cache write and slot mapping ---------------------------------------------------------------
template <int V>
__global__ void kv_write_kernel(const bf16* __restrict__ k, int64_t ks, const bf16* __restrict__ v, int64_t vs,
                                bf16* __restrict__ kc, bf16* __restrict__ vc, const int32_t* __restrict__ slots,
                                int64_t max_rows, int64_t kv_dim, const int32_t* live) {
  pdl_begin();
  const int64_t r = blockIdx.x;
  if (r >= live_count(live, max_rows)) return;
  const int64_t slot = slots[r];
  if (slot < 0) return;
  for (int64_t i = int64_t(threadIdx.x) * V; i < kv_dim; i += int64_t(blockDim.x) * V) {
    float f[V];
    load_bf16<V>(k + r * ks + i, f);
    store_bf16<V>(kc + slot * kv_dim + i, f);
    load_bf16<V>(v + r * vs + i, f);
    store_bf16<V>(vc + slot * kv_dim + i, f);
  }
}

__global__ void slot_mapping_kernel(const int32_t* cu, const int32_t* ctx_lens, const int32_t* bt, int max_blocks,
                                    int block_size, int32_t* slots) {
  pdl_begin();
  const int s = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int row0 = cu[s], n = cu[s + 1] - row0;
  if (i >= n) return;
  const int pos = ctx_lens[s] + i;
  slots[row0 + i] = bt[int64_t(s) * max_blocks + pos / block_size] * block_size + pos % block_size;
}

}  // namespace

void kv_cache_write(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride, bf16* k_cache,
                    bf16* v_cache, const int32_t* slot_mapping, int64_t max_rows, int64_t kv_dim,
                    const int32_t* live_rows, cudaStream_t stream) {
  MOEFOLD_CHECK(max_rows >= 0 && max_rows < (int64_t(1) << 31) && kv_dim > 0, "kv_cache_write: bad sizes");
  if (k_stride == 0) k_stride = kv_dim;
  if (v_stride == 0) v_stride = kv_dim;
  if (max_rows == 0) return;
  LaunchScope launch(kKvWrite, stream, [&] { return prof::Work{double(work_rows(max_rows, live_rows)) * kv_dim * 8, 0}; });
  auto go = [&](auto vw) {
    constexpr int V = decltype(vw)::value;
    const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (kv_dim / V + 31) / 32 * 32)));
    launch_pdl(kv_write_kernel<V>, dim3(unsigned(max_rows)), dim3(threads), 0, stream, k, k_stride, v, v_stride, k_cache, v_cache,
                                                                    slot_mapping, max_rows, kv_dim, live_rows);
  };
  switch (vec_width(kv_dim, {k, v, k_cache, v_cache}, {k_stride, v_stride})) {
    case 8: go(std::integral_constant<int, 8>{}); break;
    case 4: go(std::integral_constant<int, 4>{}); break;
    case 2: go(std::integral_constant<int, 2>{}); break;
    default: go(std::integral_constant<int, 1>{}); break;
  }
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void compute_slot_mapping(const int32_t* cu_seqlens, const int32_t* context_lens, const int32_t* block_tables,
                          int max_blocks_per_seq, int block_size, int num_seqs, int max_q_len,
                          int32_t* slot_mapping, cudaStream_t stream) {
  MOEFOLD_CHECK(num_seqs >= 0 && num_seqs < 65536 && max_q_len >= 0 && block_size > 0,
                "compute_slot_mapping: bad sizes");
  if (num_seqs == 0 || max_q_len == 0) return;
  const dim3 grid(ceil_div_u(max_q_len, 256), unsigned(num_seqs));
  LaunchScope launch(kSlotMapping, stream, [&] {
    const prof::StepFacts* f = prof::step_facts();
    return prof::Work{f ? double(f->rows) * 8 + double(f->context_lens.size()) * 12 : 0.0, 0};
  });
  launch_pdl(slot_mapping_kernel, dim3(grid), dim3(256), 0, stream, cu_seqlens, context_lens, block_tables, max_blocks_per_seq,
                                                 block_size, slot_mapping);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void attention_prefill(const bf16* q, const bf16* k_cache, const bf16* v_cache, const int32_t* block_tables,
                       int max_blocks_per_seq, const int32_t* cu_seqlens, const int32_t* context_lens, int num_seqs,
                       int max_q_len, bf16* out, const AttentionShape& shape, cudaStream_t stream) {
  MOEFOLD_CHECK(num_seqs >= 0 && num_seqs < 65536 && max_q_len >= 0, "attention_prefill: bad sizes");
  if (shape.kernel != AttnKernel::TensorCore && shape.kernel != AttnKernel::Simt) {
    MOEFOLD_CHECK(detail::flash_supports_head_dim(shape.head_dim),
                  "attention: head_dim {} not supported on the GPU (multiples of 16 from 16 to 256)", shape.head_dim);
    const Args b = make_args(q, k_cache, v_cache, block_tables, max_blocks_per_seq, context_lens, out, shape, kTcRows);
    if (num_seqs == 0 || max_q_len == 0) return;
    detail::FlashArgs f{};
    f.q = b.q, f.q_ts = b.q_ts, f.q_hs = b.q_hs, f.gate = b.gate, f.g_ts = b.g_ts, f.g_hs = b.g_hs;
    f.kc = b.kc, f.vc = b.vc, f.bt = b.bt, f.max_blocks = b.max_blocks, f.cu = cu_seqlens, f.ctx = context_lens;
    f.out = out, f.Hq = b.Hq, f.Hkv = b.Hkv, f.G = b.G, f.block_size = b.block_size, f.dh = shape.head_dim;
    f.scale_log2 = b.scale_log2;
    // (shape.batch_invariant does not narrow the choice: the ws and wgmma kernels' rows are invariant.)
    const bool ws_ok = prefill_ws_enabled() && detail::ws_supports(shape.head_dim, shape.block_size) &&
                       aligned16(k_cache) && aligned16(v_cache);
    // The ws form measured fastest on the H200 (docs/benchmarks.md, session 8) at d128 and d256: the
    // reordered producer with one TMA box per 64 columns over consecutive pages; it gives Ws's bits.
    const AttnKernel ws_default = shape.head_dim == 256 || shape.head_dim == 128 ? AttnKernel::WsV2Tall : AttnKernel::Ws;
    const AttnKernel k = shape.kernel != AttnKernel::Auto              ? shape.kernel
                         : ws_ok                                       ? ws_default
                         : detail::wgmma_supports_head_dim(shape.head_dim) ? AttnKernel::Wgmma
                                                                           : AttnKernel::Flash;
    if (k >= AttnKernel::Ws && k <= AttnKernel::WsPersistTall) {
      LaunchScope launch(kAttnPrefillWs, stream, [&] { return attention_work(shape, false); });
      detail::launch_attention_ws(f, num_seqs, max_q_len,
                                  static_cast<detail::WsVariant>(int(k) - int(AttnKernel::Ws)), stream);
      return;
    }
    if (k == AttnKernel::Wgmma || k == AttnKernel::WgmmaVt || k == AttnKernel::WgmmaPipe) {
      LaunchScope launch(kAttnPrefillWg, stream, [&] { return attention_work(shape, false); });
      detail::launch_attention_wgmma(f, num_seqs, max_q_len,
                                     k == AttnKernel::WgmmaVt ? 1 : k == AttnKernel::WgmmaPipe ? 2 : 0, stream);
      return;
    }
    LaunchScope launch(kAttnPrefillFa, stream, [&] { return attention_work(shape, false); });
    detail::launch_attention_flash(f, num_seqs, max_q_len, stream);
    return;
  }
  const bool tc = shape.kernel == AttnKernel::TensorCore;
  const int nwarps = kMaxWarps;
  Args a = make_args(q, k_cache, v_cache, block_tables, max_blocks_per_seq, context_lens, out, shape,
                     tc ? kTcRows : nwarps * kR);
  if (num_seqs == 0 || max_q_len == 0) return;
  a.cu = cu_seqlens;
  a.split_size = 0;
  a.max_splits = 1;
  a.qtiles = (max_q_len + a.TB - 1) / a.TB;
  const dim3 grid(unsigned(a.qtiles), unsigned(a.Hkv * a.head_chunks), unsigned(num_seqs));
  LaunchScope launch(tc ? kAttnPrefillTc : kAttnPrefillSimt, stream, [&] { return attention_work(shape, false); });
  dispatch_head_dim(shape.head_dim, [&](auto dd) {
    constexpr int D = decltype(dd)::value;
    if (tc) {
      launch_attn_tc<D>(a, grid, stream);
    } else {
      launch_attn<D>(a, grid, nwarps, stream);
    }
  });
}

bool attention_supports_head_dim(int head_dim) {
  return detail::flash_supports_head_dim(head_dim) &&
         (head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 192 || head_dim == 256);
}

size_t attention_decode_workspace_bytes(int num_seqs, const AttentionShape& shape, int64_t max_kv_len) {
  const DecodePlan p = plan_decode(shape, max_kv_len);
  if (p.max_splits <= 1) return 0;
  return size_t(num_seqs) * size_t(shape.num_heads) * size_t(p.max_splits) * size_t(shape.head_dim + 2) *
         sizeof(float);
}

namespace {

/// FP8 pages of one layer (null pointers: bf16 pages).
struct Fp8Pages {
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
};

/// Points `a` at FP8 pages (the bf16 page pointers are cleared).
void set_fp8(Args& a, const Fp8Pages& f) {
  MOEFOLD_CHECK(f.k && f.v && f.k_scale && f.v_scale, "attention: FP8 pages need k, v and their scales");
  a.kc = a.vc = nullptr;
  a.kc8 = f.k, a.vc8 = f.v, a.k_scale = f.k_scale, a.v_scale = f.v_scale;
}

void decode_impl(const bf16* q, const bf16* k_cache, const bf16* v_cache, const Fp8Pages* fp8,
                 const int32_t* block_tables, int max_blocks_per_seq, const int32_t* context_lens, int num_seqs,
                 int64_t max_kv_len, bf16* out, const AttentionShape& shape, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream) {
  MOEFOLD_CHECK(num_seqs >= 0 && num_seqs < 65536, "attention_decode: bad num_seqs {}", num_seqs);
  const int R = decode_rows_per_warp();
  const DecodePlan p = plan_decode(shape, max_kv_len, R);
  Args a = make_args(q, k_cache, v_cache, block_tables, max_blocks_per_seq, context_lens, out, shape, p.nwarps * R);
  if (fp8) set_fp8(a, *fp8);
  if (num_seqs == 0) return;
  MOEFOLD_CHECK(a.head_chunks == p.head_chunks, "attention_decode: inconsistent plan");
  a.cu = nullptr;
  a.qtiles = 1;
  a.split_size = p.split_size;
  a.max_splits = p.max_splits;
  if (p.max_splits > 1) {
    const size_t need = attention_decode_workspace_bytes(num_seqs, shape, max_kv_len);
    MOEFOLD_CHECK(workspace && workspace_bytes >= need && aligned16(workspace),
                  "attention_decode: needs a 16-byte aligned workspace of {} bytes, got {}", need, workspace_bytes);
    a.part_o = static_cast<float*>(workspace);
    a.part_ml = a.part_o + size_t(num_seqs) * size_t(shape.num_heads) * size_t(p.max_splits) * size_t(shape.head_dim);
  }
  const dim3 grid(unsigned(p.max_splits), unsigned(a.Hkv * a.head_chunks), unsigned(num_seqs));
  dispatch_head_dim(shape.head_dim, [&](auto dd) {
    constexpr int D = decltype(dd)::value;
    {
      LaunchScope launch(kAttnDecode, stream, [&] {
        prof::Work w = attention_work(shape, true);
        w.bytes += decode_partial_bytes(shape, p.max_splits);
        return w;
      });
      if (R == 1) {
        if (fp8) launch_attn<D, true, 1>(a, grid, p.nwarps, stream);
        else launch_attn<D, false, 1>(a, grid, p.nwarps, stream);
      } else {
        if (fp8) launch_attn<D, true>(a, grid, p.nwarps, stream);
        else launch_attn<D>(a, grid, p.nwarps, stream);
      }
    }
    if (p.max_splits > 1) {
      LaunchScope launch(kAttnDecodeCombine, stream, [&] {  // partials read, out written (and the gate read)
        const prof::StepFacts* f = prof::step_facts();
        const double out = f ? double(f->context_lens.size()) * shape.num_heads * shape.head_dim * 2 : 0.0;
        return prof::Work{decode_partial_bytes(shape, p.max_splits) + out * (shape.gate ? 2 : 1), 0};
      });
      launch_pdl(combine_kernel<D>, dim3(dim3(1, unsigned(a.Hq), unsigned(num_seqs))), dim3(D), 0, stream, a);
      MOEFOLD_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

void attention_decode(const bf16* q, const bf16* k_cache, const bf16* v_cache, const int32_t* block_tables,
                      int max_blocks_per_seq, const int32_t* context_lens, int num_seqs, int64_t max_kv_len,
                      bf16* out, const AttentionShape& shape, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  decode_impl(q, k_cache, v_cache, nullptr, block_tables, max_blocks_per_seq, context_lens, num_seqs, max_kv_len, out,
              shape, workspace, workspace_bytes, stream);
}

void attention_decode_fp8(const bf16* q, const uint8_t* k_cache, const uint8_t* v_cache, const float* k_scale,
                          const float* v_scale, const int32_t* block_tables, int max_blocks_per_seq,
                          const int32_t* context_lens, int num_seqs, int64_t max_kv_len, bf16* out,
                          const AttentionShape& shape, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const Fp8Pages f{k_cache, v_cache, k_scale, v_scale};
  decode_impl(q, reinterpret_cast<const bf16*>(k_cache), reinterpret_cast<const bf16*>(v_cache), &f, block_tables,
              max_blocks_per_seq, context_lens, num_seqs, max_kv_len, out, shape, workspace, workspace_bytes, stream);
}

void attention_prefill_fp8(const bf16* q, const uint8_t* k_cache, const uint8_t* v_cache, const float* k_scale,
                           const float* v_scale, const int32_t* block_tables, int max_blocks_per_seq,
                           const int32_t* cu_seqlens, const int32_t* context_lens, int num_seqs, int max_q_len,
                           bf16* out, const AttentionShape& shape, cudaStream_t stream) {
  MOEFOLD_CHECK(num_seqs >= 0 && num_seqs < 65536 && max_q_len >= 0, "attention_prefill: bad sizes");
  const int nwarps = kMaxWarps;
  Args a = make_args(q, reinterpret_cast<const bf16*>(k_cache), reinterpret_cast<const bf16*>(v_cache), block_tables,
                     max_blocks_per_seq, context_lens, out, shape, nwarps * kR);
  set_fp8(a, Fp8Pages{k_cache, v_cache, k_scale, v_scale});
  if (num_seqs == 0 || max_q_len == 0) return;
  a.cu = cu_seqlens;
  a.split_size = 0;
  a.max_splits = 1;
  a.qtiles = (max_q_len + a.TB - 1) / a.TB;
  const dim3 grid(unsigned(a.qtiles), unsigned(a.Hkv * a.head_chunks), unsigned(num_seqs));
  LaunchScope launch(kAttnPrefillSimtFp8, stream, [&] { return attention_work(shape, false); });
  dispatch_head_dim(shape.head_dim, [&](auto dd) { launch_attn<decltype(dd)::value, true>(a, grid, nwarps, stream); });
}

}  // namespace moefold::cuda
