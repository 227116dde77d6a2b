// The tensor-parallel step's kernels (see tp_ops.h). Row kernels give one block to each row (padding
// rows return after writing their zeros); flat kernels are grid-stride loops. Simple fp32 loops: these
// move [rows, hidden] activations once per block, next to GEMMs that read the weights.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/tp_ops.h"

namespace moefold::cuda {
using namespace detail;
namespace {

const prof::Kernel kSum{"tp_rank_order_sum_kernel", prof::Category::Communication};
const prof::Kernel kGather{"tp_gather_vocab_kernel", prof::Category::Communication};
const prof::Kernel kEmbed{"tp_embedding_kernel", prof::Category::Glue};
const prof::Kernel kCast{"tp_cast_kernel", prof::Category::Glue};
const prof::Kernel kResidual{"tp_residual_add_kernel", prof::Category::Other};
const prof::Kernel kLocalIds{"tp_moe_local_ids_kernel", prof::Category::MoeRouting};
const prof::Kernel kCombine{"tp_moe_combine_kernel", prof::Category::MoeRouting};

constexpr int kThreads = 256;

unsigned flat_blocks(int64_t n) {
  return unsigned(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 4096));
}

void check_rows(int64_t rows, int64_t dim, const char* what) {
  MOEFOLD_CHECK(rows >= 0 && rows < (int64_t(1) << 31) && dim >= 0, "{}: bad shape [{}, {}]", what, rows, dim);
}

__global__ void sum_kernel(RankInputs in, int n_ranks, float* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float s = in.p[0][i];
    for (int r = 1; r < n_ranks; ++r) s += in.p[r][i];
    out[i] = s;
  }
}

__global__ void embed_kernel(const __nv_bfloat16* __restrict__ table, int64_t v0, int64_t vn, int64_t vocab,
                             int64_t hidden, const int32_t* __restrict__ ids, float* __restrict__ out, int64_t max_rows,
                             const int32_t* live, int32_t* oob) {
  const int64_t t = blockIdx.x;
  float* dst = out + t * hidden;
  const bool is_live = t < live_count(live, max_rows);
  const int32_t id = is_live ? ids[t] : -1;
  if (is_live && (id < 0 || int64_t(id) >= vocab) && threadIdx.x == 0 && oob) *oob = 1;
  const bool mine = is_live && int64_t(id) >= v0 && int64_t(id) < v0 + vn;
  const __nv_bfloat16* src = table + (mine ? int64_t(id) - v0 : 0) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = mine ? __bfloat162float(src[i]) : 0.0f;
}

__global__ void to_f32_kernel(const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int64_t max_rows,
                              int64_t dim, const int32_t* live) {
  const int64_t t = blockIdx.x;
  const bool is_live = t < live_count(live, max_rows);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) y[t * dim + i] = is_live ? __bfloat162float(x[t * dim + i]) : 0.0f;
}

__global__ void to_bf16_kernel(const float* __restrict__ y, __nv_bfloat16* __restrict__ out, int64_t max_rows,
                               int64_t dim, const int32_t* live) {
  const int64_t t = blockIdx.x;
  if (t >= live_count(live, max_rows)) return;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[t * dim + i] = __float2bfloat16_rn(y[t * dim + i]);
}

__global__ void residual_kernel(__nv_bfloat16* __restrict__ h, const float* __restrict__ y, int64_t max_rows,
                                int64_t dim, const int32_t* live) {
  const int64_t t = blockIdx.x;
  if (t >= live_count(live, max_rows)) return;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const int64_t j = t * dim + i;
    h[j] = __float2bfloat16_rn(__bfloat162float(h[j]) + y[j]);
  }
}

__global__ void local_ids_kernel(const int32_t* __restrict__ ids, int64_t first, int64_t count,
                                 int32_t* __restrict__ local, int64_t max_rows, int64_t k, const int32_t* live) {
  const int64_t n = live_count(live, max_rows) * k;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = ids[i];
    local[i] = e >= first && e < first + count ? int32_t(e - first) : -1;
  }
}

__global__ void combine_kernel(const float* __restrict__ weights, const int32_t* __restrict__ local,
                               const __nv_bfloat16* __restrict__ y, const __nv_bfloat16* __restrict__ shared_out,
                               const __nv_bfloat16* __restrict__ gate_w, const __nv_bfloat16* __restrict__ x,
                               int64_t max_rows, int64_t k, int64_t H, const int32_t* live, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  float* dst = out + t * H;
  if (t >= live_count(live, max_rows)) {
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) dst[i] = 0.0f;
    return;
  }
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float gate;
  if (shared_out && gate_w) {  // g = sigmoid(gate_w . x[t]): per-thread partials, then a fixed tree
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) s += __bfloat162float(gate_w[i]) * __bfloat162float(x[t * H + i]);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      float d = 0.0f;
      for (int w = 0; w < int(blockDim.x / 32); ++w) d += warp_sums[w];
      gate = 1.0f / (1.0f + expf(-d));
    }
    __syncthreads();
  } else if (threadIdx.x == 0) {
    gate = 1.0f;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s < k; ++s) {
      const int64_t p = t * k + s;
      if (local[p] >= 0) acc += weights[p] * __bfloat162float(y[p * H + i]);
    }
    if (shared_out) acc += gate * __bfloat162float(shared_out[t * H + i]);
    dst[i] = acc;
  }
}

__global__ void pad_kernel(const float* __restrict__ src, int64_t rows, int64_t cols, int64_t stride,
                           float* __restrict__ dst) {
  const int64_t n = rows * stride;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / stride, c = i % stride;
    dst[i] = c < cols ? src[r * cols + c] : 0.0f;
  }
}

__global__ void gather_kernel(const float* __restrict__ all, int64_t rows, int64_t shard, int64_t vocab,
                              float* __restrict__ logits) {
  const int64_t n = rows * vocab;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / vocab, v = i % vocab, j = v / shard, c = v % shard;
    logits[i] = all[(j * rows + r) * shard + c];
  }
}

}  // namespace

void rank_order_sum(const RankInputs& in, int n_ranks, float* out, int64_t n, cudaStream_t stream) {
  MOEFOLD_CHECK(n_ranks >= 1 && n_ranks <= kTpMaxRanks, "rank_order_sum: {} ranks outside [1, {}]", n_ranks, kTpMaxRanks);
  if (n <= 0) return;
  LaunchScope launch(kSum, stream, prof::Work{double(n) * 4 * (n_ranks + 1), 0});
  sum_kernel<<<flat_blocks(n), kThreads, 0, stream>>>(in, n_ranks, out, n);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void tp_embedding_f32(const __nv_bfloat16* embed_local, int64_t v0, int64_t vn, int64_t vocab, int64_t hidden,
                      const int32_t* ids, float* out, int64_t max_rows, const int32_t* live_rows, int32_t* oob_flag,
                      cudaStream_t stream) {
  check_rows(max_rows, hidden, "tp_embedding_f32");
  if (max_rows == 0) return;
  LaunchScope launch(kEmbed, stream, prof::Work{double(max_rows) * double(hidden) * 6, 0});
  embed_kernel<<<unsigned(max_rows), kThreads, 0, stream>>>(embed_local, v0, vn, vocab, hidden, ids, out, max_rows,
                                                            live_rows, oob_flag);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void bf16_rows_to_f32(const __nv_bfloat16* x, float* y, int64_t max_rows, int64_t dim, const int32_t* live_rows,
                      cudaStream_t stream) {
  check_rows(max_rows, dim, "bf16_rows_to_f32");
  if (max_rows == 0) return;
  LaunchScope launch(kCast, stream, prof::Work{double(max_rows) * double(dim) * 6, 0});
  to_f32_kernel<<<unsigned(max_rows), kThreads, 0, stream>>>(x, y, max_rows, dim, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void f32_rows_to_bf16(const float* y, __nv_bfloat16* out, int64_t max_rows, int64_t dim, const int32_t* live_rows,
                      cudaStream_t stream) {
  check_rows(max_rows, dim, "f32_rows_to_bf16");
  if (max_rows == 0) return;
  LaunchScope launch(kCast, stream, prof::Work{double(max_rows) * double(dim) * 6, 0});
  to_bf16_kernel<<<unsigned(max_rows), kThreads, 0, stream>>>(y, out, max_rows, dim, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void residual_add_f32(__nv_bfloat16* h, const float* y, int64_t max_rows, int64_t dim, const int32_t* live_rows,
                      cudaStream_t stream) {
  check_rows(max_rows, dim, "residual_add_f32");
  if (max_rows == 0) return;
  LaunchScope launch(kResidual, stream, prof::Work{double(max_rows) * double(dim) * 8, 0});
  residual_kernel<<<unsigned(max_rows), kThreads, 0, stream>>>(h, y, max_rows, dim, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void moe_local_ids(const int32_t* ids, int64_t first, int64_t count, int32_t* local, int64_t max_rows, int64_t k,
                   const int32_t* live_rows, cudaStream_t stream) {
  check_rows(max_rows, k, "moe_local_ids");
  if (max_rows == 0) return;
  LaunchScope launch(kLocalIds, stream, prof::Work{double(max_rows * k) * 8, 0});
  local_ids_kernel<<<flat_blocks(max_rows * k), kThreads, 0, stream>>>(ids, first, count, local, max_rows, k, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void moe_combine_local_f32(const float* weights, const int32_t* local, const __nv_bfloat16* y,
                           const __nv_bfloat16* shared_out, const __nv_bfloat16* shared_gate_w,
                           const __nv_bfloat16* x, int64_t max_rows, int64_t k, int64_t hidden,
                           const int32_t* live_rows, float* out, cudaStream_t stream) {
  check_rows(max_rows, hidden, "moe_combine_local_f32");
  if (max_rows == 0) return;
  LaunchScope launch(kCombine, stream, prof::Work{double(max_rows) * double(hidden) * (2.0 * double(k) + 8), 0});
  combine_kernel<<<unsigned(max_rows), kThreads, 0, stream>>>(weights, local, y, shared_out, shared_gate_w, x, max_rows,
                                                              k, hidden, live_rows, out);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void pad_columns(const float* src, int64_t rows, int64_t cols, int64_t stride, float* dst, cudaStream_t stream) {
  MOEFOLD_CHECK(rows >= 0 && cols >= 0 && cols <= stride, "pad_columns: {} columns into rows of {}", cols, stride);
  if (rows == 0 || stride == 0) return;
  LaunchScope launch(kCast, stream, prof::Work{double(rows) * double(stride + cols) * 4, 0});
  pad_kernel<<<flat_blocks(rows * stride), kThreads, 0, stream>>>(src, rows, cols, stride, dst);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void gather_vocab_shards(const float* all, int n_ranks, int64_t rows, int64_t shard, int64_t vocab, float* logits,
                         cudaStream_t stream) {
  MOEFOLD_CHECK(n_ranks >= 1 && shard >= 1 && int64_t(n_ranks) * shard >= vocab,
                "gather_vocab_shards: {} shards of {} rows do not cover a vocabulary of {}", n_ranks, shard, vocab);
  if (rows == 0) return;
  LaunchScope launch(kGather, stream, prof::Work{double(rows) * double(vocab) * 8, 0});
  gather_kernel<<<flat_blocks(rows * vocab), kThreads, 0, stream>>>(all, rows, shard, vocab, logits);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
