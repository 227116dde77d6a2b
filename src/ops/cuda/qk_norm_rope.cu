// qk_norm_rope_kv_write (qk_norm_rope.h): one block per token, one warp per q or k head row. Lane j holds
// elements [8j, 8j + 8) of the row: the layout and the fixed-order sum of squares of rms_norm_kernel for
// head_dim / 8 <= 32 vectors (row_norm.cuh: one lane group of tpr = head_dim / 8 lanes a row). The normalised
// row is rounded to bf16 (rms_norm's store), then each rotated pair (x[i], x[i + half]) meets in the lanes
// holding i and i + half (one shuffle) and rotates with rope_kernel's arithmetic (cos / sin from double,
// computed once per token in shared memory). k rows and the v rows are then copied to the cache slot.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/qk_norm_rope.h"
#include "ops/cuda/row_norm.cuh"

namespace moefold::cuda {
using namespace detail;
namespace {

constexpr int kThreads = 512;
constexpr int kMaxHalf = 128;  // rotary_dim / 2 <= head_dim / 2 <= 128

const prof::Kernel kQkNormRope{"qk_norm_rope_kernel", prof::Category::NormRope};

struct Params {
  QkNormRopeArgs a;
  int64_t qts, qhs, kts, khs, vts;
  int hq, hkv, dim, tpr, half;
  const double* inv_freq;
  const int32_t* live;
  int64_t max_rows;
};

__global__ void __launch_bounds__(kThreads) qk_norm_rope_kernel(Params p) {
  pdl_begin();
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int64_t t = blockIdx.x;
  if (t >= live_count(p.live, p.max_rows)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const double pos = double(p.a.positions[t]);
  for (int i = threadIdx.x; i < p.half; i += blockDim.x) {
    double s, c;
    sincos(pos * p.inv_freq[i], &s, &c);
    cs[i] = float(c);
    sn[i] = float(s);
  }
  __syncthreads();
  const int64_t slot = p.a.slot_mapping[t];
  const int n = p.dim / 8;
  const bool zc = p.a.kind == NormKind::ZeroCentred;
  for (int r = warp; r < p.hq + p.hkv; r += nwarps) {
    const bool is_q = r < p.hq;
    bf16* row = is_q ? p.a.q + t * p.qts + int64_t(r) * p.qhs : p.a.k + t * p.kts + int64_t(r - p.hq) * p.khs;
    const bf16* w = is_q ? p.a.q_norm : p.a.k_norm;
    const bool mine = lane < n;
    float f[8], g[8], ss = 0.0f;
    if (mine) {
      load_bf16<8>(w + 8 * lane, g);
      load_bf16<8>(row + 8 * lane, f);
      ss = add_squares<8>(ss, f);
    }
    for (int o = p.tpr >> 1; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / float(p.dim) + p.a.eps);
#pragma unroll
    for (int e = 0; e < 8; ++e) {  // the norm's bf16 store, read back
      f[e] = f[e] * inv * (zc ? 1.0f + g[e] : g[e]);
      f[e] = __bfloat162float(__float2bfloat16(f[e]));
    }
    // RoPE: lanes [0, half / 8) hold the low halves of the pairs, the next half / 8 lanes the high halves.
    const int hl = p.half / 8;
    const bool lo = lane < hl, hi = lane >= hl && lane < 2 * hl;
    const int partner = lo ? lane + hl : (hi ? lane - hl : lane);
    float other[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) other[e] = __shfl_sync(0xffffffffu, f[e], partner);
    if (lo || hi) {
      const int j0 = 8 * (lo ? lane : lane - hl);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float c = cs[j0 + e], s = sn[j0 + e];
        f[e] = lo ? rope_lo(f[e], other[e], c, s) : rope_hi(other[e], f[e], c, s);
      }
    }
    if (mine) {
      store_bf16<8>(row + 8 * lane, f);
      if (!is_q && slot >= 0) store_bf16<8>(p.a.k_cache + (slot * p.hkv + (r - p.hq)) * p.dim + 8 * lane, f);
    }
  }
  if (slot < 0) return;
  const int64_t kv_dim = int64_t(p.hkv) * p.dim;
  for (int64_t i = int64_t(threadIdx.x) * 8; i < kv_dim; i += int64_t(blockDim.x) * 8) {
    float f[8];
    load_bf16<8>(p.a.v + t * p.vts + i, f);
    store_bf16<8>(p.a.v_cache + slot * kv_dim + i, f);
  }
}

void strides(const HeadRows& r, int64_t dim, int64_t& hs, int64_t& ts) {
  hs = r.head_stride ? r.head_stride : dim;
  ts = r.token_stride ? r.token_stride : r.heads * hs;
}

}  // namespace

bool qk_norm_rope_supported(const QkNormRopeArgs& a, int64_t dim, const RopeFreqs& freqs) {
  static const bool on = [] {
    const char* v = std::getenv("MOEFOLD_FUSE_QK_ROPE");
    return !(v && std::string_view(v) == "0");
  }();
  if (!on || !(dim == 64 || dim == 128 || dim == 256)) return false;
  const int64_t half = freqs.rotary_dim / 2;
  if (half % 8 != 0 || half < 8 || 2 * half > dim) return false;
  int64_t qhs, qts, khs, kts;
  strides(a.q_rows, dim, qhs, qts);
  strides(a.k_rows, dim, khs, kts);
  const int64_t vts = a.v_stride ? a.v_stride : a.k_rows.heads * dim;
  const int vw = vec_width(dim, {a.q, a.k, a.v, a.q_norm, a.k_norm, a.k_cache, a.v_cache}, {qhs, qts, khs, kts, vts});
  return vw == 8 && row_geom(dim, 8).tpr == int(dim / 8);
}

void qk_norm_rope_kv_write(const QkNormRopeArgs& a, int64_t max_rows, int64_t dim, const RopeFreqs& freqs,
                           const int32_t* live_rows, cudaStream_t stream) {
  MOEFOLD_CHECK(a.q && a.k && a.v && a.q_norm && a.k_norm && a.k_cache && a.v_cache && a.slot_mapping && a.positions,
                "qk_norm_rope_kv_write: null pointer argument");
  MOEFOLD_CHECK(qk_norm_rope_supported(a, dim, freqs),
                "qk_norm_rope_kv_write: unsupported layout (head_dim {}, rotary_dim {})", dim, freqs.rotary_dim);
  MOEFOLD_CHECK(max_rows >= 0 && max_rows < (int64_t(1) << 31), "qk_norm_rope_kv_write: bad max_rows {}", max_rows);
  if (max_rows == 0) return;
  Params p{};
  p.a = a;
  strides(a.q_rows, dim, p.qhs, p.qts);
  strides(a.k_rows, dim, p.khs, p.kts);
  p.vts = a.v_stride ? a.v_stride : a.k_rows.heads * dim;
  p.hq = int(a.q_rows.heads);
  p.hkv = int(a.k_rows.heads);
  p.dim = int(dim);
  p.tpr = row_geom(dim, 8).tpr;
  p.half = int(freqs.rotary_dim / 2);
  p.inv_freq = freqs.inv_freq.data();
  p.live = live_rows;
  p.max_rows = max_rows;
  LaunchScope launch(kQkNormRope, stream, [&] {  // q, k read and written, k, v written to the cache, v read
    const double heads = double(p.hq + p.hkv);
    return prof::Work{double(work_rows(max_rows, live_rows)) * (heads * dim * 4 + double(p.hkv) * dim * 6), 0};
  });
  const int warps = std::min(kThreads / 32, p.hq + p.hkv);
  launch_pdl(qk_norm_rope_kernel, dim3(unsigned(max_rows)), dim3(unsigned(32 * std::max(warps, 1))), 0, stream, p);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
