// RoPE kernel (see rope.h): one block per token. The block's first threads compute the token's
// rotary_dim/2 (cos, sin) pairs in double into shared memory; then all threads rotate the pairs of
// every q and k head of that token.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
using namespace detail;
namespace {

constexpr int kMaxHalf = 512;  // rotary_dim <= 1024

const prof::Kernel kRope{"rope_kernel", prof::Category::NormRope};

__global__ void rope_kernel(bf16* q, int64_t qh, int64_t qts, int64_t qhs, bf16* k, int64_t kh, int64_t kts,
                            int64_t khs, const int32_t* __restrict__ positions, int64_t max_rows, int half,
                            const double* __restrict__ inv_freq, const int32_t* live) {
  pdl_begin();
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int64_t t = blockIdx.x;
  if (t >= live_count(live, max_rows)) return;
  const double pos = double(positions[t]);
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    double s, c;
    sincos(pos * inv_freq[j], &s, &c);
    cs[j] = float(c);
    sn[j] = float(s);
  }
  __syncthreads();
  const int64_t nq = qh * half, total = nq + (k ? kh * half : 0);
  for (int64_t e = threadIdx.x; e < total; e += blockDim.x) {
    bf16* base;
    int j;
    if (e < nq) {
      base = q + t * qts + (e / half) * qhs;
      j = int(e % half);
    } else {
      base = k + t * kts + ((e - nq) / half) * khs;
      j = int((e - nq) % half);
    }
    const float lo = __bfloat162float(base[j]), hi = __bfloat162float(base[j + half]);
    base[j] = __float2bfloat16_rn(lo * cs[j] - hi * sn[j]);
    base[j + half] = __float2bfloat16_rn(hi * cs[j] + lo * sn[j]);
  }
}

}  // namespace

RopeFreqs::RopeFreqs(int64_t rotary_dim_, const std::vector<double>& f) : rotary_dim(rotary_dim_) {
  MOEFOLD_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim / 2 <= kMaxHalf &&
                    f.size() == size_t(rotary_dim / 2),
                "RopeFreqs: rotary_dim {} needs {} frequencies (got {}), at most {}", rotary_dim, rotary_dim / 2,
                f.size(), 2 * kMaxHalf);
  inv_freq = to_device(f);
}

void apply_rope(bf16* q, HeadRows q_rows, bf16* k, HeadRows k_rows, const int32_t* positions, int64_t max_rows,
                int64_t head_dim, const RopeFreqs& freqs, const int32_t* live_rows, cudaStream_t stream) {
  MOEFOLD_CHECK(max_rows >= 0 && max_rows < (int64_t(1) << 31), "apply_rope: bad max_rows {}", max_rows);
  MOEFOLD_CHECK(freqs.rotary_dim <= head_dim, "apply_rope: rotary_dim {} > head_dim {}", freqs.rotary_dim, head_dim);
  auto resolve = [&](HeadRows r, int64_t& hs, int64_t& ts) {
    hs = r.head_stride ? r.head_stride : head_dim;
    ts = r.token_stride ? r.token_stride : r.heads * hs;
    MOEFOLD_CHECK(r.heads >= 1 && hs >= head_dim, "apply_rope: bad head layout");
  };
  int64_t qhs, qts, khs = 0, kts = 0;
  resolve(q_rows, qhs, qts);
  if (k) resolve(k_rows, khs, kts);
  if (max_rows == 0) return;
  const int half = int(freqs.rotary_dim / 2);
  const int64_t pairs = (q_rows.heads + (k ? k_rows.heads : 0)) * half;
  const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (pairs + 31) / 32 * 32)));
  LaunchScope launch(kRope, stream, [&] {  // the rotated part of every head, read and written; positions
    return prof::Work{double(work_rows(max_rows, live_rows)) * (double(pairs) * 8 + 4), 0};
  });
  launch_pdl(rope_kernel, dim3(unsigned(max_rows)), dim3(threads), 0, stream, q, q_rows.heads, qts, qhs, k, k ? k_rows.heads : 0, kts,
                                                          khs, positions, max_rows, half,
                                                          freqs.inv_freq.data(), live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
