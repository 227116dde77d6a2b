// Numerics probe behind the batch-invariant wgmma prefill GEMM (ops/cuda/prefill_gemm_wgmma.cu): does
// a chain of wgmma m64nNk16 steps (bf16 x bf16 -> fp32, both operands from shared memory) give bitwise
// the same fp32 results as the same chain of mma.sync m16n8k16 steps (the decode GEMM's instruction)?
// One warpgroup computes D = C0 + sum over L k16 steps of A_l . B_l^T both ways, from the same random
// inputs (bf16 with exponents spread over 2^-12..2^12, so the tensor cores' alignment and rounding of
// the partial sums matter) and a random or zero fp32 C0, for chains of 1..64 steps and N = 64, 128,
// 192, 256. Also checked, for plan B (a wgmma decode GEMM with swapped operands): whether a wgmma
// element is the same with A and B swapped (D^T from B . A^T) and whether it depends on N.
// Prints one PROBE line per case (differing elements, max ulp, each path's max ulp from the fp64 sum
// rounded to fp32) and CONTRACT lines; a difference fails the test: the answer the next run needs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/wgmma.cuh"
#include "ops/cuda/wgmma_ss.cuh"

using namespace moefold;
using namespace moefold::test;
namespace cu = moefold::cuda;

namespace {

constexpr int kM = 64, kMaxSteps = 64, kKmax = kMaxSteps * 16;

/// D (both ways) for one chain: A [64][kKmax], B [N][kKmax] bf16 row-major (K contiguous), C0 [64][N].
template <int N>
__global__ void __launch_bounds__(128) probe_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, const float* C0,
                                                    int L, float* d_mma, float* d_wg) {
  using namespace cu::ptx;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  auto ld32 = [](const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); };
  // ---- mma.sync m16n8k16: warp w owns rows 16w .. 16w + 15, all N columns in n8 fragments ----
  for (int j = 0; j < N / 8; ++j) {
    const int r0 = warp * 16 + g, col = 8 * j + 2 * t;
    float c[4] = {C0[r0 * N + col], C0[r0 * N + col + 1], C0[(r0 + 8) * N + col], C0[(r0 + 8) * N + col + 1]};
    for (int l = 0; l < L; ++l) {
      const int k = 16 * l + 2 * t;
      const uint32_t a[4] = {ld32(A + r0 * kKmax + k), ld32(A + (r0 + 8) * kKmax + k), ld32(A + r0 * kKmax + k + 8),
                             ld32(A + (r0 + 8) * kKmax + k + 8)};
      const int n = 8 * j + g;
      mma_bf16_16816(c, a, ld32(B + n * kKmax + k), ld32(B + n * kKmax + k + 8));
    }
    d_mma[r0 * N + col] = c[0];
    d_mma[r0 * N + col + 1] = c[1];
    d_mma[(r0 + 8) * N + col] = c[2];
    d_mma[(r0 + 8) * N + col + 1] = c[3];
  }
  // ---- wgmma m64nNk16, operands in shared memory (128-byte swizzle, K-major 64-element rows) ----
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* sA = smem + ((1024 - (smem_u32(smem) & 1023)) & 1023);
  unsigned char* sB = sA + kM * 128;
  float d[N / 2];  // indexed only by unrolled loops: registers
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = warp * 16 + g + 8 * (i >> 1), col = 8 * j + 2 * t + (i & 1);
      d[4 * j + i] = C0[r * N + col];
    }
  for (int q = 0; q * 4 < L; ++q) {
    __syncthreads();  // the previous chunk's products are done (wait<0> below) before overwriting
    for (int idx = tid; idx < (kM + N) * 8; idx += 128) {
      const int r = idx >> 3, ch = idx & 7;
      const __nv_bfloat16* src = r < kM ? A + r * kKmax : B + (r - kM) * kKmax;
      const uint4 v = *reinterpret_cast<const uint4*>(src + 64 * q + 8 * ch);
      const int rr = r < kM ? r : r - kM;
      *reinterpret_cast<uint4*>((r < kM ? sA : sB) + rr * 128 + ((ch ^ (rr & 7)) << 4)) = v;
    }
    cu::wg::fence_proxy_async();
    __syncthreads();
    cu::wg::fence();
    const uint64_t da = cu::wg::desc_sw128(smem_u32(sA)), db = cu::wg::desc_sw128(smem_u32(sB));
    const int steps = L - 4 * q < 4 ? L - 4 * q : 4;
    for (int ks = 0; ks < steps; ++ks) cu::wgss::mma(d, da + uint64_t(2 * ks), db + uint64_t(2 * ks));
    cu::wg::commit();
    cu::wg::wait<0>();
    cu::wg::fence_regs(d);
  }
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = warp * 16 + g + 8 * (i >> 1), col = 8 * j + 2 * t + (i & 1);
      d_wg[r * N + col] = d[4 * j + i];
    }
}

/// bf16 values sign * [1, 2) * 2^e, e uniform in [-12, 12], bf16-exact (as fp32).
std::vector<float> wide_bf16(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = mix64(seed * 0x9E3779B97F4A7C15ULL + i);
    const float m = 1.0f + float((r >> 8) & 127) / 128.0f;
    const int e = int((r >> 20) % 25) - 12;
    v[i] = std::ldexp((r & 1) ? m : -m, e);
  }
  return v;
}

int64_t ordered(float f) {
  int32_t i;
  std::memcpy(&i, &f, 4);
  return i < 0 ? -int64_t(i & 0x7fffffff) : int64_t(i);
}
int64_t ulp_dist(float a, float b) { return std::llabs(ordered(a) - ordered(b)); }

struct Outcome {
  std::vector<float> mma, wg;
};

template <int N>
Outcome run_chain(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c0, int L) {
  DeviceBuffer<bf16> da = dev_bf16(a), dbuf = dev_bf16(b);
  DeviceBuffer<float> dc = cu::to_device(c0), dm(size_t(kM) * N), dw(size_t(kM) * N);
  dm.fill_bytes(0xFF);
  dw.fill_bytes(0xFF);
  const size_t smem = size_t(kM + N) * 128 + 1024;
  MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(probe_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  probe_kernel<N><<<1, 128, smem>>>(da.data(), dbuf.data(), dc.data(), L, dm.data(), dw.data());
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  return {dm.download(), dw.download()};
}

struct Tally {
  size_t diff = 0, total = 0;
  int64_t max_ulp = 0;
  void add(const std::vector<float>& x, const std::vector<float>& y) {
    for (size_t i = 0; i < x.size(); ++i) {
      const bool same = std::memcmp(&x[i], &y[i], 4) == 0;
      diff += !same;
      if (!same) max_ulp = std::max<int64_t>(max_ulp, std::isfinite(x[i]) && std::isfinite(y[i]) ? ulp_dist(x[i], y[i]) : INT64_MAX);
    }
    total += x.size();
  }
};

/// Max ulp of each element of `d` from fp64's C0 + A . B^T over the first L steps, rounded to fp32.
template <int N>
int64_t ulp_from_fp64(const std::vector<float>& d, const std::vector<float>& a, const std::vector<float>& b,
                      const std::vector<float>& c0, int L) {
  int64_t m = 0;
  for (int r = 0; r < kM; ++r)
    for (int n = 0; n < N; ++n) {
      double s = c0[size_t(r) * N + n];
      for (int k = 0; k < 16 * L; ++k) s += double(a[size_t(r) * kKmax + k]) * double(b[size_t(n) * kKmax + k]);
      m = std::max(m, ulp_dist(d[size_t(r) * N + n], float(s)));
    }
  return m;
}

template <int N>
void probe_n(Tally& eq, uint64_t seed) {
  const std::vector<int> Ls = {1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 32, 33, 63, 64};
  for (int zero_c0 = 0; zero_c0 < 2; ++zero_c0)
    for (int L : Ls) {
      const uint64_t s = seed + uint64_t(L) * 7 + uint64_t(zero_c0) * 1000;
      const std::vector<float> a = wide_bf16(size_t(kM) * kKmax, s), b = wide_bf16(size_t(N) * kKmax, s + 1);
      std::vector<float> c0 = wide_bf16(size_t(kM) * N, s + 2);
      for (float& v : c0) v = zero_c0 ? 0.0f : v * 3.0f;  // fp32 values off the bf16 grid
      const Outcome o = run_chain<N>(a, b, c0, L);
      Tally t;
      t.add(o.mma, o.wg);
      eq.diff += t.diff;
      eq.total += t.total;
      eq.max_ulp = std::max(eq.max_ulp, t.max_ulp);
      const bool ref = L == 1 || L == 16 || L == 64;  // fp64 distance on a few (CPU cost)
      std::printf("PROBE N=%d L=%d c0=%s differing=%zu/%zu max_ulp=%lld%s\n", N, L, zero_c0 ? "zero" : "rand", t.diff,
                  t.total, (long long)t.max_ulp,
                  ref ? (" ulp_vs_fp64: mma=" + std::to_string(ulp_from_fp64<N>(o.mma, a, b, c0, L)) +
                         " wgmma=" + std::to_string(ulp_from_fp64<N>(o.wg, a, b, c0, L)))
                            .c_str()
                      : "");
    }
}

TEST(WgmmaProbe, ChainsEqualMmaSync) {
  MOEFOLD_REQUIRE_GPU();
  Tally eq;
  probe_n<64>(eq, 100);
  probe_n<128>(eq, 200);
  probe_n<192>(eq, 300);
  probe_n<256>(eq, 400);
  std::printf("PROBE_VERDICT wgmma_vs_mma_sync=%s differing=%zu/%zu max_ulp=%lld\n", eq.diff ? "DIFFER" : "EQUAL",
              eq.diff, eq.total, (long long)eq.max_ulp);
  EXPECT_TRUE(contract_exact("wgmma_vs_mma_sync", "N=64,128,192,256,L=1..64,c0=rand+zero", eq.diff));
}

// Plan B's preconditions: an element does not depend on N, nor on which operand is A.
TEST(WgmmaProbe, WgmmaIndependentOfNAndOperandRoles) {
  MOEFOLD_REQUIRE_GPU();
  Tally n_inv, swap_wg, swap_mma;
  for (int L : {1, 4, 16, 64}) {
    const uint64_t s = 900 + uint64_t(L);
    const std::vector<float> a = wide_bf16(size_t(kM) * kKmax, s), b = wide_bf16(size_t(256) * kKmax, s + 1);
    const std::vector<float> c256 = wide_bf16(size_t(kM) * 256, s + 2);
    std::vector<float> c64(size_t(kM) * 64), c64t(size_t(kM) * 64);
    for (int r = 0; r < kM; ++r)
      for (int n = 0; n < 64; ++n) c64[size_t(r) * 64 + n] = c64t[size_t(n) * 64 + r] = c256[size_t(r) * 256 + n];
    const std::vector<float> b64(b.begin(), b.begin() + ptrdiff_t(64) * kKmax);
    const Outcome wide = run_chain<256>(a, b, c256, L), narrow = run_chain<64>(a, b64, c64, L);
    const Outcome swapped = run_chain<64>(b64, a, c64t, L);  // D^T = C0^T + B . A^T
    std::vector<float> wide64(size_t(kM) * 64), sw_wg(size_t(kM) * 64), sw_mma(size_t(kM) * 64);
    for (int r = 0; r < kM; ++r)
      for (int n = 0; n < 64; ++n) {
        wide64[size_t(r) * 64 + n] = wide.wg[size_t(r) * 256 + n];
        sw_wg[size_t(r) * 64 + n] = swapped.wg[size_t(n) * 64 + r];
        sw_mma[size_t(r) * 64 + n] = swapped.mma[size_t(n) * 64 + r];
      }
    n_inv.add(narrow.wg, wide64);
    swap_wg.add(narrow.wg, sw_wg);
    swap_mma.add(narrow.mma, sw_mma);
  }
  std::printf("PROBE_VERDICT wgmma_n64_vs_n256=%s (%zu differ) wgmma_swapAB=%s (%zu) mma_sync_swapAB=%s (%zu)\n",
              n_inv.diff ? "DIFFER" : "EQUAL", n_inv.diff, swap_wg.diff ? "DIFFER" : "EQUAL", swap_wg.diff,
              swap_mma.diff ? "DIFFER" : "EQUAL", swap_mma.diff);
  EXPECT_TRUE(contract_exact("wgmma_n_invariance", "n64_vs_n256,L=1,4,16,64", n_inv.diff));
  EXPECT_TRUE(contract_exact("wgmma_swapAB", "n64,L=1,4,16,64", swap_wg.diff));
  EXPECT_TRUE(contract_exact("mma_sync_swapAB", "n8,L=1,4,16,64", swap_mma.diff));
}

}  // namespace
