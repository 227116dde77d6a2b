// Causal depthwise conv1d + SiLU (Gated DeltaNet short conv) for varlen prefill and single-token decode.
// Prefill: one block per row and channel tile. A row at position t >= K-1 of its sequence reads only the
// new inputs; the thread at t == 0 of each (sequence, channel) computes the first K-1 outputs from the
// slot's conv state and then writes the slot's new state, so no thread reads a state another overwrites.
// Math: src/ops/cpu/gated_delta_net.cc causal_conv1d_silu.
#include "ops/cuda/causal_conv1d.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
namespace {

constexpr int kConvThreads = 256;

const prof::Kernel kConvPrefill{"conv1d_prefill_kernel", prof::Category::Conv};
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

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + __expf(-x)); }

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
    y[size_t(r) * C + c] = __float2bfloat16(silu_f(acc));
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
    y[size_t(bos + tt) * C + c] = __float2bfloat16(silu_f(acc));
  }
  // New state: the last K-1 entries of [state | x_0 .. x_{len-1}].
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j >= Km1) break;
    const int i = len + j;  // index into [state | x]
    st[j] = i < 2 * Km1 ? raw[i] : x[size_t(bos + i - Km1) * xs + c];
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
  const int Km1 = K - 1;
  __nv_bfloat16* st = state_pool + (size_t(state_slots[s]) * C + c) * Km1;
  __nv_bfloat16 win[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j < Km1) win[j] = st[j];
    else if (j == Km1) win[j] = x[size_t(s) * xs + c];
    else win[j] = __float2bfloat16(0.0f);
  }
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j)
    if (j < K) acc += __bfloat162float(w[size_t(c) * K + j]) * __bfloat162float(win[j]);
  y[size_t(s) * C + c] = __float2bfloat16(silu_f(acc));
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j)
    if (j < Km1) st[j] = win[j + 1];
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
  const dim3 grid(unsigned(max_rows), unsigned((C + kConvThreads - 1) / kConvThreads));
  LaunchScope launch(kConvPrefill, stream, [&] {
    const prof::StepFacts* f = prof::step_facts();
    return conv_work(f ? std::min<int64_t>(f->rows, max_rows) : max_rows, f ? int64_t(f->context_lens.size()) : 1, C, K);
  });
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

}  // namespace moefold::cuda
