// Causal depthwise conv1d + SiLU (Gated DeltaNet short conv) for varlen prefill and single-token decode.
// Prefill (for K = 4 with C and the x stride multiples of 8 the row-tile kernel further below, or under
// MOEFOLD_CONV_PREFILL=vec the vectorised kernel below; else this scalar one): one block per row
// and channel tile. A row at position t >= K-1 of its sequence reads only the
// new inputs; the thread at t == 0 of each (sequence, channel) computes the first K-1 outputs from the
// slot's conv state and then writes the slot's new state, so no thread reads a state another overwrites.
// Math: src/ops/cpu/gated_delta_net.cc causal_conv1d_silu.
#include "ops/cuda/causal_conv1d.h"

#include <cstdlib>
#include <cstring>

#include "ops/cuda/conv1d_step.cuh"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/silu_approx.cuh"

namespace moefold::cuda {
namespace {

constexpr int kConvThreads = 256;

const prof::Kernel kConvPrefill{"conv1d_prefill_kernel", prof::Category::Conv};
const prof::Kernel kConvPrefillTile{"conv1d_prefill_tile_kernel", prof::Category::Conv};
const prof::Kernel kConvDecode{"conv1d_decode_kernel", prof::Category::Conv};

/// Work of `rows` outputs over `seqs` sequences: x read and y written, the state read and written, w;
/// a multiply-add per tap.
prof::Work conv_work(int64_t rows, int64_t seqs, int C, int K) {
  return prof::Work{double(rows) * C * 4 + double(seqs) * C * (K - 1) * 4 + double(C) * K * 2,
                    2.0 * double(rows) * C * K};
}

// Argument checks (fmt's compile-time format check does not build under nvcc: runtime format strings).
#define CONV_REQUIRE(cond, f, ...) \
  do {                             \
    if (!(cond)) ::moefold::fail(fmt::runtime(f), __VA_ARGS__); \
  } while (0)


// Largest s in [0, n) with cu[s] <= r (cu non-decreasing, cu[0] <= r < cu[n]).
__device__ __forceinline__ int find_seq(const int32_t* cu, int n, int r) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__global__ void __launch_bounds__(kConvThreads)
    conv1d_prefill_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                          const int32_t* __restrict__ cu_seqlens, const int32_t* __restrict__ state_slots,
                          const int32_t* __restrict__ num_seqs_p, __nv_bfloat16* __restrict__ state_pool,
                          __nv_bfloat16* __restrict__ y, int C, int K, int64_t xs) {
  pdl_begin();
  const int ns = *num_seqs_p;
  if (ns <= 0) return;
  const int r = blockIdx.x;
  if (r >= cu_seqlens[ns]) return;
  const int c = blockIdx.y * kConvThreads + threadIdx.x;
  if (c >= C) return;
  const int s = find_seq(cu_seqlens, ns, r);
  const int bos = cu_seqlens[s];
  const int t = r - bos;
  const int Km1 = K - 1;
  float wc[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) wc[j] = j < K ? __bfloat162float(w[size_t(c) * K + j]) : 0.0f;

  if (t >= Km1) {  // all K inputs are new rows of this sequence
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j < K) acc += wc[j] * __bfloat162float(x[size_t(r - Km1 + j) * xs + c]);
    y[size_t(r) * C + c] = __float2bfloat16(silu_approx(acc));
    return;
  }
  if (t != 0) return;  // rows 1..K-2 are produced by the t == 0 thread below

  // Head of the sequence: window buf = [state (K-1 values) | x_0 .. x_{K-2}] and the new state.
  const int len = cu_seqlens[s + 1] - bos;
  __nv_bfloat16* st = state_pool + (size_t(state_slots[s]) * C + c) * Km1;
  float buf[2 * kMaxConvKernel];
  __nv_bfloat16 raw[2 * kMaxConvKernel];
#pragma unroll
  for (int i = 0; i < 2 * kMaxConvKernel; ++i) {
    __nv_bfloat16 v = __float2bfloat16(0.0f);
    if (i < Km1) v = st[i];
    else if (i < Km1 + len && i < 2 * Km1) v = x[size_t(bos + i - Km1) * xs + c];
    raw[i] = v;
    buf[i] = __bfloat162float(v);
  }
  const int nhead = len < Km1 ? len : Km1;
#pragma unroll
  for (int tt = 0; tt < kMaxConvKernel; ++tt) {
    if (tt >= nhead) break;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j < K) acc += wc[j] * buf[tt + j];
    y[size_t(bos + tt) * C + c] = __float2bfloat16(silu_approx(acc));
  }
  // New state: the last K-1 entries of [state | x_0 .. x_{len-1}].
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j >= Km1) break;
    const int i = len + j;  // index into [state | x]
    st[j] = i < 2 * Km1 ? raw[i] : x[size_t(bos + i - Km1) * xs + c];
  }
}

// Vectorised prefill for K == kVecK (C and the x row stride multiples of 8, 16-byte aligned x / y): a
// thread owns 8 channels of kVecRows consecutive rows and writes 16-byte outputs. A tile that lies inside
// one sequence past its first K-1 rows (nearly all of them) streams through its rows with a sliding window
// of K-1 rows, kVecStep new rows loaded per step (loads of the unrolled steps run ahead of their use); other
// tiles go row by row. Rows at positions 0 < t < K-1 are left to the t == 0 row's thread, which (like the
// scalar kernel) reads the slot's state, writes the sequence's first K-1 outputs and then the new state, so
// no thread reads a state another overwrites. Same fp32 arithmetic (tap order) as the scalar kernel.
constexpr int kVecK = 4;
constexpr int kVecRows = 32;
constexpr int kVecStep = 4;
constexpr int kVecThreads = 128;

__device__ __forceinline__ void unpack8(const uint4& u, float (&v)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// Head rows t < K-1 of sequence s and its new conv state, channels [c0, c0 + 8) (scalar, once per sequence).
__device__ void conv_head8(const __nv_bfloat16* __restrict__ x, const float (&wc)[8][kVecK], int s, int bos,
                           int len, const int32_t* __restrict__ state_slots, __nv_bfloat16* __restrict__ state_pool,
                           __nv_bfloat16* __restrict__ y, int C, int c0, int64_t xs) {
  constexpr int Km1 = kVecK - 1;
  const int nhead = len < Km1 ? len : Km1;
  for (int ch = 0; ch < 8; ++ch) {
    const int c = c0 + ch;
    __nv_bfloat16* st = state_pool + (size_t(state_slots[s]) * C + c) * Km1;
    float buf[2 * Km1];
    __nv_bfloat16 raw[2 * Km1];
#pragma unroll
    for (int i = 0; i < 2 * Km1; ++i) {
      __nv_bfloat16 v = __float2bfloat16(0.0f);
      if (i < Km1) v = st[i];
      else if (i < Km1 + len) v = x[size_t(bos + i - Km1) * xs + c];
      raw[i] = v;
      buf[i] = __bfloat162float(v);
    }
    for (int tt = 0; tt < nhead; ++tt) {
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kVecK; ++j) acc += wc[ch][j] * buf[tt + j];
      y[size_t(bos + tt) * C + c] = __float2bfloat16(silu_approx(acc));
    }
#pragma unroll
    for (int j = 0; j < Km1; ++j) {
      const int i = len + j;
      st[j] = i < 2 * Km1 ? raw[i] : x[size_t(bos + i - Km1) * xs + c];
    }
  }
}

// One output row of 8 channels from the K input rows ending at it (fp32, tap order as the scalar kernel).
__device__ __forceinline__ uint4 conv_row8(const float (&wc)[8][kVecK], const uint4& x0, const uint4& x1,
                                           const uint4& x2, const uint4& x3) {
  float in[kVecK][8];
  unpack8(x0, in[0]);
  unpack8(x1, in[1]);
  unpack8(x2, in[2]);
  unpack8(x3, in[3]);
  __align__(16) __nv_bfloat16 o[8];
#pragma unroll
  for (int ch = 0; ch < 8; ++ch) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kVecK; ++j) acc += wc[ch][j] * in[j][ch];
    o[ch] = __float2bfloat16(silu_approx(acc));
  }
  return *reinterpret_cast<const uint4*>(o);
}

__global__ void __launch_bounds__(kVecThreads, 4)
    conv1d_prefill_vec_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                              const int32_t* __restrict__ cu_seqlens, const int32_t* __restrict__ state_slots,
                              const int32_t* __restrict__ num_seqs_p, __nv_bfloat16* __restrict__ state_pool,
                              __nv_bfloat16* __restrict__ y, int C, int64_t xs) {
  constexpr int K = kVecK, Km1 = K - 1;
  static_assert(K == 4 && kVecStep == 4 && kVecRows % kVecStep == 0, "the sliding window below is written for K = 4");
  pdl_begin();
  const int ns = *num_seqs_p;
  if (ns <= 0) return;
  const int c0 = (blockIdx.x * kVecThreads + threadIdx.x) * 8;
  if (c0 >= C) return;
  const int r0 = blockIdx.y * kVecRows;
  const int rend = min(r0 + kVecRows, cu_seqlens[ns]);
  if (r0 >= rend) return;
  const __nv_bfloat16* xc = x + c0;
  const auto ld = [&](int r) { return __ldg(reinterpret_cast<const uint4*>(xc + size_t(r) * xs)); };
  float wc[8][K];  // w[c0 + ch, 0..3]: 64 contiguous bytes (four 16-byte loads where w is 16-byte aligned)
  if ((reinterpret_cast<uintptr_t>(w) & 15u) == 0) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(w + size_t(c0) * K) + q);
      float f[8];
      unpack8(u, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) wc[2 * q + e / 4][e % 4] = f[e];
    }
  } else {
#pragma unroll
    for (int ch = 0; ch < 8; ++ch)
#pragma unroll
      for (int j = 0; j < K; ++j) wc[ch][j] = __bfloat162float(w[size_t(c0 + ch) * K + j]);
  }
  int s = find_seq(cu_seqlens, ns, r0);
  int bos = cu_seqlens[s], eos = cu_seqlens[s + 1];
  if (r0 - bos >= Km1 && rend <= eos) {  // the whole tile lies past the head of one sequence
    uint4 a = ld(r0 - 3), b = ld(r0 - 2), c = ld(r0 - 1);
    __nv_bfloat16* yr = y + size_t(r0) * C + c0;
#pragma unroll
    for (int i = 0; i < kVecRows; i += kVecStep) {
      uint4 n[kVecStep];
#pragma unroll
      for (int j = 0; j < kVecStep; ++j) n[j] = r0 + i + j < rend ? ld(r0 + i + j) : make_uint4(0u, 0u, 0u, 0u);
      const uint4 o0 = conv_row8(wc, a, b, c, n[0]), o1 = conv_row8(wc, b, c, n[0], n[1]);
      const uint4 o2 = conv_row8(wc, c, n[0], n[1], n[2]), o3 = conv_row8(wc, n[0], n[1], n[2], n[3]);
      if (r0 + i < rend) *reinterpret_cast<uint4*>(yr + size_t(i) * C) = o0;
      if (r0 + i + 1 < rend) *reinterpret_cast<uint4*>(yr + size_t(i + 1) * C) = o1;
      if (r0 + i + 2 < rend) *reinterpret_cast<uint4*>(yr + size_t(i + 2) * C) = o2;
      if (r0 + i + 3 < rend) *reinterpret_cast<uint4*>(yr + size_t(i + 3) * C) = o3;
      a = n[1], b = n[2], c = n[3];
    }
    return;
  }
  for (int r = r0; r < rend; ++r) {
    while (r >= eos) {  // next sequence (skipping empty ones)
      ++s;
      bos = cu_seqlens[s];
      eos = cu_seqlens[s + 1];
    }
    const int t = r - bos;
    if (t >= Km1)
      *reinterpret_cast<uint4*>(y + size_t(r) * C + c0) = conv_row8(wc, ld(r - 3), ld(r - 2), ld(r - 1), ld(r));
    else if (t == 0)
      conv_head8(x, wc, s, bos, eos - bos, state_slots, state_pool, y, C, c0, xs);
  }
}

// Row-tile prefill for K == kVecK (the default; same preconditions as the vectorised
// kernel): a thread owns 8 channels (16-byte loads and stores along C) of R consecutive rows. It loads
// its R rows and the K-1 rows before them (the halo: the previous tile's last rows) at once, before any
// dependent work, so that R + 3 16-byte loads per thread are in flight; then computes channel pair by
// channel pair (each input unpacked once, each pair's input registers dead after it) and stores R rows.
// A tile inside one sequence past its first K-1 rows (all but the tiles at sequence heads) takes that
// path; other tiles go row by row as in the vectorised kernel, with the head rows t < K-1 and the new
// state written by the thread of row t == 0 (conv_head8): the sequence's state is read and written by
// one thread, so no block overwrites a state another still reads (a sequence may span many tiles, so
// the blocks of its last rows cannot write it without racing the reads of its head). Same fp32
// arithmetic (tap order, fma chain, silu, round to nearest bf16) as the other two kernels: bitwise equal
// outputs and states. Flat 1-D grid, channel blocks fastest (a row's channels are read together).
constexpr int kTileThreads = 128;

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xFFFF0000u); }
__device__ __forceinline__ uint32_t word_of(const uint4& u, int p) {
  return p == 0 ? u.x : (p == 1 ? u.y : (p == 2 ? u.z : u.w));
}
__device__ __forceinline__ void set_word(uint4& u, int p, uint32_t v) {
  if (p == 0) u.x = v;
  else if (p == 1) u.y = v;
  else if (p == 2) u.z = v;
  else u.w = v;
}

template <int R>
__global__ void __launch_bounds__(kTileThreads)
    conv1d_prefill_tile_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                               const int32_t* __restrict__ cu_seqlens, const int32_t* __restrict__ state_slots,
                               const int32_t* __restrict__ num_seqs_p, __nv_bfloat16* __restrict__ state_pool,
                               __nv_bfloat16* __restrict__ y, int C, int64_t xs, int channel_blocks) {
  constexpr int K = kVecK, Km1 = K - 1, N = R + Km1;
  pdl_begin();
  const int ns = *num_seqs_p;
  if (ns <= 0) return;
  const int cb = int(blockIdx.x % unsigned(channel_blocks));
  const int r0 = int(blockIdx.x / unsigned(channel_blocks)) * R;
  const int c0 = (cb * kTileThreads + int(threadIdx.x)) * 8;
  if (c0 >= C) return;
  const int rend = min(r0 + R, cu_seqlens[ns]);
  if (r0 >= rend) return;
  const __nv_bfloat16* xc = x + c0;
  uint4 win[N];  // rows r0 - 3 .. r0 + R - 1 (zeros outside [0, rend): never used for an output)
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const int r = r0 - Km1 + k;
    win[k] = r >= 0 && r < rend ? __ldg(reinterpret_cast<const uint4*>(xc + size_t(r) * xs))
                                : make_uint4(0u, 0u, 0u, 0u);
  }
  // w[c0 + ch, 0..3] as bf16: wp[q] holds channels 2q (words x, y) and 2q + 1 (words z, w), taps in order.
  uint4 wp[4];
  if ((reinterpret_cast<uintptr_t>(w) & 15u) == 0) {
#pragma unroll
    for (int q = 0; q < 4; ++q) wp[q] = __ldg(reinterpret_cast<const uint4*>(w + size_t(c0) * K) + q);
  } else {
    const uint16_t* wb = reinterpret_cast<const uint16_t*>(w) + size_t(c0) * K;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = uint32_t(wb[8 * q + 2 * e]) | (uint32_t(wb[8 * q + 2 * e + 1]) << 16);
      wp[q] = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
  int s = find_seq(cu_seqlens, ns, r0);
  int bos = cu_seqlens[s], eos = cu_seqlens[s + 1];
  if (r0 - bos >= Km1 && rend <= eos) {  // inside one sequence, past its head: all from registers
    uint4 out[R];
#pragma unroll
    for (int p = 0; p < 4; ++p) {  // channels c0 + 2p (low halves) and c0 + 2p + 1 (high halves)
      const uint4 wq = wp[p];
      const float wa[K] = {bf16_lo(wq.x), bf16_hi(wq.x), bf16_lo(wq.y), bf16_hi(wq.y)};
      const float wb[K] = {bf16_lo(wq.z), bf16_hi(wq.z), bf16_lo(wq.w), bf16_hi(wq.w)};
      float a[N], b[N];
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const uint32_t u = word_of(win[k], p);
        a[k] = bf16_lo(u);
        b[k] = bf16_hi(u);
      }
#pragma unroll
      for (int i = 0; i < R; ++i) {
        float acc_a = 0.0f, acc_b = 0.0f;
#pragma unroll
        for (int j = 0; j < K; ++j) {
          acc_a += wa[j] * a[i + j];
          acc_b += wb[j] * b[i + j];
        }
        const __nv_bfloat162 o = __floats2bfloat162_rn(silu_approx(acc_a), silu_approx(acc_b));
        set_word(out[i], p, *reinterpret_cast<const uint32_t*>(&o));
      }
    }
    __nv_bfloat16* yr = y + size_t(r0) * C + c0;
#pragma unroll
    for (int i = 0; i < R; ++i)
      if (r0 + i < rend) *reinterpret_cast<uint4*>(yr + size_t(i) * C) = out[i];
    return;
  }
  // Tiles at sequence heads or holding several sequences: row by row (rare for long prompts).
  float wc[8][K];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 wq = wp[q];
    const uint32_t v[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      wc[2 * q + e / 2][2 * (e % 2)] = bf16_lo(v[e]);
      wc[2 * q + e / 2][2 * (e % 2) + 1] = bf16_hi(v[e]);
    }
  }
  const auto ld = [&](int r) { return __ldg(reinterpret_cast<const uint4*>(xc + size_t(r) * xs)); };
  for (int r = r0; r < rend; ++r) {
    while (r >= eos) {  // next sequence (skipping empty ones)
      ++s;
      bos = cu_seqlens[s];
      eos = cu_seqlens[s + 1];
    }
    const int t = r - bos;
    if (t >= Km1)
      *reinterpret_cast<uint4*>(y + size_t(r) * C + c0) = conv_row8(wc, ld(r - 3), ld(r - 2), ld(r - 1), ld(r));
    else if (t == 0)
      conv_head8(x, wc, s, bos, eos - bos, state_slots, state_pool, y, C, c0, xs);
  }
}

__global__ void __launch_bounds__(kConvThreads)
    conv1d_decode_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                         const int32_t* __restrict__ state_slots, const int32_t* __restrict__ num_seqs_p,
                         __nv_bfloat16* __restrict__ state_pool, __nv_bfloat16* __restrict__ y, int C, int K,
                         int64_t xs) {
  pdl_begin();
  const int s = blockIdx.x;
  if (s >= *num_seqs_p) return;
  const int c = blockIdx.y * kConvThreads + threadIdx.x;
  if (c >= C) return;
  __nv_bfloat16* st = state_pool + (size_t(state_slots[s]) * C + c) * (K - 1);
  __nv_bfloat16 win[kMaxConvKernel];
  conv1d::load_window(st, x[size_t(s) * xs + c], K, win);
  y[size_t(s) * C + c] = conv1d::output(w + size_t(c) * K, K, win);
  conv1d::store_state(st, K, win);
}

enum class PrefillKernel { kScalar, kVec, kTile };

/// MOEFOLD_CONV_PREFILL: unset / "tile" (the default: the row-tile kernel where the vectorised kernel's
/// preconditions hold), "vec" (the vectorised kernel, same preconditions), "scalar" (the scalar kernel
/// always). All three give the same bits. Read at each launch.
PrefillKernel prefill_kernel(const void* x, const void* y, int C, int K, int64_t x_stride) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const char* e = std::getenv("MOEFOLD_CONV_PREFILL");
  if (e && std::strcmp(e, "scalar") == 0) return PrefillKernel::kScalar;
  if (!(K == kVecK && C % 8 == 0 && x_stride % 8 == 0 && aligned(x) && aligned(y))) return PrefillKernel::kScalar;
  return e && std::strcmp(e, "vec") == 0 ? PrefillKernel::kVec : PrefillKernel::kTile;
}

/// MOEFOLD_CONV_TILE_ROWS: rows per thread of the row-tile kernel, 4, 8 (the default) or 16.
int prefill_tile_rows() {
  const char* e = std::getenv("MOEFOLD_CONV_TILE_ROWS");
  const int r = e ? std::atoi(e) : 8;
  return r == 4 || r == 16 ? r : 8;
}

void check_args(const void* x, const void* w, const void* slots, const void* num_seqs, const void* pool,
                const void* y, int C, int K, const char* fn) {
  CONV_REQUIRE(x && w && slots && num_seqs && pool && y, "{}: null pointer argument", fn);
  CONV_REQUIRE(C > 0, "{}: channel count C = {} must be positive", fn, C);
  CONV_REQUIRE(K >= 1 && K <= kMaxConvKernel, "{}: conv kernel width K = {} must be in [1, {}]", fn, K,
                kMaxConvKernel);
  CONV_REQUIRE(x != y, "{}: x and y must not alias", fn);
}

}  // namespace

void causal_conv1d_silu_prefill(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* cu_seqlens,
                                const int32_t* state_slots, const int32_t* num_seqs, int max_rows,
                                __nv_bfloat16* conv_state_pool, __nv_bfloat16* y, int C, int K,
                                cudaStream_t stream, int64_t x_stride) {
  check_args(x, w, state_slots, num_seqs, conv_state_pool, y, C, K, "causal_conv1d_silu_prefill");
  if (x_stride == 0) x_stride = C;
  CONV_REQUIRE(x_stride >= C, "causal_conv1d_silu_prefill: x_stride {} < C = {}", x_stride, C);
  CONV_REQUIRE(cu_seqlens != nullptr, "{}: null cu_seqlens", "causal_conv1d_silu_prefill");
  CONV_REQUIRE(max_rows >= 0, "causal_conv1d_silu_prefill: max_rows = {} is negative", max_rows);
  if (max_rows == 0) return;
  const PrefillKernel kind = prefill_kernel(x, y, C, K, x_stride);
  if (kind == PrefillKernel::kTile) {
    const int rows = prefill_tile_rows();
    const int cblocks = (C / 8 + kTileThreads - 1) / kTileThreads;
    const int64_t blocks = int64_t(cblocks) * ((max_rows + rows - 1) / rows);
    CONV_REQUIRE(blocks < (int64_t(1) << 31), "causal_conv1d_silu_prefill: {} row tiles x {} channel blocks",
                 (max_rows + rows - 1) / rows, cblocks);
    LaunchScope launch(kConvPrefillTile, stream, [&] {
      const prof::StepFacts* f = prof::step_facts();
      return conv_work(f ? std::min<int64_t>(f->rows, max_rows) : max_rows, f ? int64_t(f->context_lens.size()) : 1,
                       C, K);
    });
    const auto kernel = rows == 4 ? conv1d_prefill_tile_kernel<4>
                        : rows == 16 ? conv1d_prefill_tile_kernel<16>
                                     : conv1d_prefill_tile_kernel<8>;
    launch_pdl(kernel, dim3(unsigned(blocks)), dim3(kTileThreads), 0, stream, x, w, cu_seqlens, state_slots, num_seqs,
               conv_state_pool, y, C, x_stride, cblocks);
    MOEFOLD_CUDA_CHECK_LAUNCH();
    return;
  }
  LaunchScope launch(kConvPrefill, stream, [&] {
    const prof::StepFacts* f = prof::step_facts();
    return conv_work(f ? std::min<int64_t>(f->rows, max_rows) : max_rows, f ? int64_t(f->context_lens.size()) : 1, C, K);
  });
  if (kind == PrefillKernel::kVec) {
    const dim3 vgrid(unsigned((C / 8 + kVecThreads - 1) / kVecThreads), unsigned((max_rows + kVecRows - 1) / kVecRows));
    launch_pdl(conv1d_prefill_vec_kernel, vgrid, dim3(kVecThreads), 0, stream, x, w, cu_seqlens, state_slots,
               num_seqs, conv_state_pool, y, C, x_stride);
    MOEFOLD_CUDA_CHECK_LAUNCH();
    return;
  }
  const dim3 grid(unsigned(max_rows), unsigned((C + kConvThreads - 1) / kConvThreads));
  launch_pdl(conv1d_prefill_kernel, dim3(grid), dim3(kConvThreads), 0, stream, x, w, cu_seqlens, state_slots, num_seqs,
                                                           conv_state_pool, y, C, K, x_stride);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void causal_conv1d_silu_decode(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* state_slots,
                               const int32_t* num_seqs, int max_seqs, __nv_bfloat16* conv_state_pool,
                               __nv_bfloat16* y, int C, int K, cudaStream_t stream, int64_t x_stride) {
  check_args(x, w, state_slots, num_seqs, conv_state_pool, y, C, K, "causal_conv1d_silu_decode");
  if (x_stride == 0) x_stride = C;
  CONV_REQUIRE(x_stride >= C, "causal_conv1d_silu_decode: x_stride {} < C = {}", x_stride, C);
  CONV_REQUIRE(max_seqs >= 0, "causal_conv1d_silu_decode: max_seqs = {} is negative", max_seqs);
  if (max_seqs == 0) return;
  const dim3 grid(unsigned(max_seqs), unsigned((C + kConvThreads - 1) / kConvThreads));
  LaunchScope launch(kConvDecode, stream, [&] { return conv_work(work_seqs(max_seqs), work_seqs(max_seqs), C, K); });
  launch_pdl(conv1d_decode_kernel, dim3(grid), dim3(kConvThreads), 0, stream, x, w, state_slots, num_seqs, conv_state_pool, y, C, K,
                                                          x_stride);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

namespace detail {

const char* causal_conv1d_prefill_kernel_name(const void* x, const void* y, int C, int K, int64_t x_stride) {
  if (x_stride == 0) x_stride = C;
  switch (prefill_kernel(x, y, C, K, x_stride)) {
    case PrefillKernel::kTile:
      return prefill_tile_rows() == 4 ? "tile4" : (prefill_tile_rows() == 16 ? "tile16" : "tile8");
    case PrefillKernel::kVec: return "vec";
    default: return "scalar";
  }
}

}  // namespace detail

}  // namespace moefold::cuda
