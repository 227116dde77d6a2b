// RoPE kernel (see rope.h): one block per token. Work item = V consecutive pairs (x[j..j+V), x[j+half..))
// of one q or k head. Each thread first loads its first item (16-byte accesses where aligned), while the
// block's first threads compute the token's rotary_dim/2 (cos, sin) pairs in double into shared memory;
// then, after one barrier, it rotates from registers (more items than threads: a loop after that).
// The same per-element math as before (and as ops/cpu/rope.h): the bits do not depend on V.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/row_norm.cuh"  // dispatch_vec

namespace moefold::cuda {
using namespace detail;
namespace {

constexpr int kMaxHalf = 512;  // rotary_dim <= 1024

const prof::Kernel kRope{"rope_kernel", prof::Category::NormRope};

template <int V>
__device__ __forceinline__ void rotate(const float* lo, const float* hi, const float* cs, const float* sn, float* o1,
                                       float* o2) {
#pragma unroll
  for (int i = 0; i < V; ++i) {
    o1[i] = rope_lo(lo[i], hi[i], cs[i], sn[i]);
    o2[i] = rope_hi(lo[i], hi[i], cs[i], sn[i]);
  }
}

template <int V>
__global__ void rope_kernel(bf16* q, int64_t qh, int64_t qts, int64_t qhs, bf16* k, int64_t kh, int64_t kts,
                            int64_t khs, const int32_t* __restrict__ positions, int64_t max_rows, int half,
                            const double* __restrict__ inv_freq, const int32_t* live) {
  pdl_begin();
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int64_t t = blockIdx.x;
  if (t >= live_count(live, max_rows)) return;
  const int cph = half / V;  // items per head
  const int64_t nq = qh * cph, total = nq + kh * cph;
  // Item e: its head's base pointer and its first pair index j.
  auto item = [&](int64_t e, int& j) -> bf16* {
    if (e < nq) {
      j = int(e % cph) * V;
      return q + t * qts + (e / cph) * qhs;
    }
    j = int((e - nq) % cph) * V;
    return k + t * kts + ((e - nq) / cph) * khs;
  };
  int64_t e = threadIdx.x;
  float lo[V], hi[V], o1[V], o2[V];
  int j = 0;
  bf16* base = nullptr;
  if (e < total) {
    base = item(e, j);
    load_bf16<V>(base + j, lo);
    load_bf16<V>(base + j + half, hi);
  }
  const double pos = double(positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double s, c;
    sincos(pos * inv_freq[i], &s, &c);
    cs[i] = float(c);
    sn[i] = float(s);
  }
  __syncthreads();
  if (e >= total) return;
  rotate<V>(lo, hi, cs + j, sn + j, o1, o2);
  store_bf16<V>(base + j, o1);
  store_bf16<V>(base + j + half, o2);
  for (e += blockDim.x; e < total; e += blockDim.x) {
    base = item(e, j);
    load_bf16<V>(base + j, lo);
    load_bf16<V>(base + j + half, hi);
    rotate<V>(lo, hi, cs + j, sn + j, o1, o2);
    store_bf16<V>(base + j, o1);
    store_bf16<V>(base + j + half, o2);
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
  const int64_t kh = k ? k_rows.heads : 0;
  const int64_t pairs = (q_rows.heads + kh) * half;
  LaunchScope launch(kRope, stream, [&] {  // the rotated part of every head, read and written; positions
    return prof::Work{double(work_rows(max_rows, live_rows)) * (double(pairs) * 8 + 4), 0};
  });
  const int vw = k ? vec_width(half, {q, k}, {qts, qhs, kts, khs}) : vec_width(half, {q}, {qts, qhs});
  dispatch_vec(vw, [&](auto v) {
    constexpr int V = decltype(v)::value;
    const int64_t items = pairs / V;
    const int threads = int(std::min<int64_t>(512, std::max<int64_t>(32, (items + 31) / 32 * 32)));
    launch_pdl(rope_kernel<V>, dim3(unsigned(max_rows)), dim3(threads), 0, stream, q, q_rows.heads, qts, qhs, k, kh,
               kts, khs, positions, max_rows, half, freqs.inv_freq.data(), live_rows);
  });
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
