// Dense GEMMs through cuBLASLt (see gemm.h). The plan cache keys on everything that changes the
// descriptors or the algorithm choice: shape, strides, output type, bias, accumulate, pointer
// alignment and stream (so two threads on two streams never share a descriptor).
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/launch_scope.h"

namespace moefold::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt's recommendation for Hopper
constexpr int64_t kDecodeRows = 256;  // GEMMs of up to this many rows share one algorithm per problem
constexpr int kHeuristicResults = 16;

// One registry entry per public function: whatever kernels cuBLASLt runs inside one call are one interval.
const prof::Kernel kGemmBf16{"gemm_bf16", prof::Category::DenseGemm};
const prof::Kernel kGemmBf16F32Out{"gemm_bf16_f32out", prof::Category::DenseGemm};
const prof::Kernel kAddBias{"add_bias_kernel", prof::Category::DenseGemm};

struct StreamCtx {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bias_in_epilogue = false;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

using PlanKey = std::tuple<int, cudaStream_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int, int>;

struct Cache {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;                       // per device
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;      // per (device, stream)
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: CUDA may be torn down before static destructors
  return *c;
}

int alignment_of(const void* p, int64_t ld_bytes) {
  uintptr_t v = reinterpret_cast<uintptr_t>(p) | uintptr_t(ld_bytes) | uintptr_t(256);
  return int(v & (~v + 1));  // lowest set bit, capped at 256
}

__global__ void add_bias_kernel(__nv_bfloat16* y, const __nv_bfloat16* bias, int64_t T, int64_t out, int64_t ld) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * out) return;
  int64_t t = i / out, o = i % out;
  y[t * ld + o] = __float2bfloat16(__bfloat162float(y[t * ld + o]) + __bfloat162float(bias[o]));
}
__global__ void add_bias_kernel(float* y, const float* bias, int64_t T, int64_t out, int64_t ld) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * out) return;
  int64_t t = i / out, o = i % out;
  y[t * ld + o] += bias[o];
}

StreamCtx stream_ctx(Cache& c, int dev, cudaStream_t stream) {
  StreamCtx s;
  auto h = c.handles.find(dev);
  if (h == c.handles.end()) {
    cublasLtHandle_t handle;
    MOEFOLD_CUBLAS_CHECK(cublasLtCreate(&handle));
    h = c.handles.emplace(dev, handle).first;
  }
  s.handle = h->second;
  auto w = c.workspaces.find({dev, stream});
  if (w == c.workspaces.end()) {
    void* p = nullptr;
    MOEFOLD_CUDA_CHECK(cudaMalloc(&p, kWorkspaceBytes));
    w = c.workspaces.emplace(std::make_pair(dev, stream), p).first;
  }
  s.workspace = w->second;
  return s;
}

template <class TOut>
void run_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, const TOut* bias, TOut* y, int64_t T, int64_t in,
              int64_t out, cudaStream_t stream, bool accumulate, int64_t x_stride, int64_t y_stride) {
  constexpr bool kF32 = std::is_same_v<TOut, float>;
  constexpr cudaDataType_t kOutType = kF32 ? CUDA_R_32F : CUDA_R_16BF;
  if (x_stride == 0) x_stride = in;
  if (y_stride == 0) y_stride = out;
  MOEFOLD_CHECK(T >= 0 && in > 0 && out > 0 && x_stride >= in && y_stride >= out,
                "gemm: bad sizes T={} in={} out={} x_stride={} y_stride={}", T, in, out, x_stride, y_stride);
  if (T == 0) return;
  MOEFOLD_CHECK(x && w && y, "gemm: null pointer");

  int dev = 0;
  MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
  const int al_x = alignment_of(x, x_stride * 2), al_w = alignment_of(w, in * 2);
  const int al_y = alignment_of(y, y_stride * int64_t(sizeof(TOut)));
  const bool want_bias = bias != nullptr;
  const PlanKey key{dev, stream, T, in, out, x_stride, y_stride, int(kF32), int(want_bias), int(accumulate),
                    al_x * 1024 + al_w, al_y};

  Cache& c = cache();
  StreamCtx ctx;
  Plan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    ctx = stream_ctx(c, dev, stream);
    auto it = c.plans.find(key);
    if (it == c.plans.end()) {
      auto p = std::make_unique<Plan>();
      MOEFOLD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      MOEFOLD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
      MOEFOLD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
      // Column-major view: A = W as [in, out] (ld in), op T -> [out, in]; B = X as [in, T] (ld x_stride);
      // C = D = Y as [out, T] (ld y_stride).
      MOEFOLD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, uint64_t(in), uint64_t(out), in));
      MOEFOLD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, uint64_t(in), uint64_t(T), x_stride));
      MOEFOLD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, kOutType, uint64_t(out), uint64_t(T), y_stride));

      cublasLtMatmulPreference_t pref;
      MOEFOLD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t ws = kWorkspaceBytes;
      const uint32_t ua = uint32_t(al_w), ub = uint32_t(al_x), uc = uint32_t(al_y);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ua, sizeof ua);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ub, sizeof ub);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &uc, sizeof uc);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &uc, sizeof uc);

      // Decode-sized GEMMs (T <= kDecodeRows) all run one algorithm per problem, chosen once at
      // T = kDecodeRows among those without split-K or a cross-CTA reduction: each output row is then
      // computed by the same kernel with the same reduction order whatever T is, so a row's bits do
      // not depend on the other rows of the step (batch invariance). Larger T picks per shape.
      const bool decode_regime = T <= kDecodeRows;
      if (decode_regime) {
        const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof none);
      }
      cublasLtMatrixLayout_t qb = p->b, qc = p->c;  // the layouts the heuristic is asked about
      if (decode_regime) {
        MOEFOLD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&qb, CUDA_R_16BF, uint64_t(in), uint64_t(kDecodeRows), x_stride));
        MOEFOLD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&qc, kOutType, uint64_t(out), uint64_t(kDecodeRows), y_stride));
      }
      // The first result usable for this T (decode regime: without split-K).
      auto pick = [&](cublasLtMatmulHeuristicResult_t& res) -> bool {
        cublasLtMatmulHeuristicResult_t found[kHeuristicResults];
        int nres = 0;
        if (cublasLtMatmulAlgoGetHeuristic(ctx.handle, p->op, p->a, qb, qc, qc, pref, kHeuristicResults, found,
                                           &nres) != CUBLAS_STATUS_SUCCESS)
          return false;
        for (int i = 0; i < nres; ++i) {
          if (decode_regime) {
            int32_t splitk = 1;
            size_t written = 0;
            cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                 sizeof splitk, &written);
            if (splitk > 1) continue;
            cublasLtMatmulHeuristicResult_t check{};
            if (cublasLtMatmulAlgoCheck(ctx.handle, p->op, p->a, p->b, p->c, p->c, &found[i].algo, &check) !=
                CUBLAS_STATUS_SUCCESS)
              continue;
          }
          res = found[i];
          return true;
        }
        return false;
      };
      cublasLtMatmulHeuristicResult_t res{};
      bool found = false;
      if (want_bias) {  // try the fused bias epilogue first; fall back to a separate bias kernel
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        MOEFOLD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        const void* dummy = bias;
        MOEFOLD_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dummy, sizeof dummy));
        found = pick(res);
        if (found) {
          p->bias_in_epilogue = true;
        } else {
          const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;
          MOEFOLD_CUBLAS_CHECK(
              cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &none, sizeof none));
        }
      }
      if (!found) found = pick(res);
      if (decode_regime) {
        cublasLtMatrixLayoutDestroy(qb);
        cublasLtMatrixLayoutDestroy(qc);
      }
      if (!found) {
        cublasLtMatmulPreferenceDestroy(pref);
        fail("gemm: cuBLASLt found no algorithm for T={} in={} out={}", T, in, out);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      p->algo = res.algo;
      it = c.plans.emplace(key, std::move(p)).first;
    }
    plan = it->second.get();
  }

  if (plan->bias_in_epilogue) {
    const void* bp = bias;
    MOEFOLD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  LaunchScope launch(kF32 ? kGemmBf16F32Out : kGemmBf16, stream, [&] {  // W, x, y (read too when accumulating)
    const double y_bytes = double(T) * out * sizeof(TOut) * (accumulate ? 2 : 1);
    return prof::Work{double(in) * out * 2 + double(T) * in * 2 + y_bytes + (plan->bias_in_epilogue ? out * sizeof(TOut) : 0),
                      2.0 * double(T) * in * out};
  });
  MOEFOLD_CUBLAS_CHECK(cublasLtMatmul(ctx.handle, plan->op, &alpha, w, plan->a, x, plan->b, &beta, y, plan->c, y,
                                     plan->c, &plan->algo, ctx.workspace, kWorkspaceBytes, stream));
  if (want_bias && !plan->bias_in_epilogue) {
    const int64_t n = T * out;
    LaunchScope bias_launch(kAddBias, stream, prof::Work{double(n) * 2 * sizeof(TOut) + double(out) * sizeof(TOut), 0});
    add_bias_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(y, bias, T, out, y_stride);
    MOEFOLD_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void gemm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
               int64_t T, int64_t in, int64_t out, cudaStream_t stream, bool accumulate, int64_t x_stride,
               int64_t y_stride) {
  run_gemm<__nv_bfloat16>(x, w, bias, y, T, in, out, stream, accumulate, x_stride, y_stride);
}

void gemm_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y, int64_t T,
                      int64_t in, int64_t out, cudaStream_t stream, bool accumulate, int64_t x_stride,
                      int64_t y_stride) {
  run_gemm<float>(x, w, bias, y, T, in, out, stream, accumulate, x_stride, y_stride);
}

void gemm_release_all() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.plans.clear();
  for (auto& [k, p] : c.workspaces) cudaFree(p);
  c.workspaces.clear();
  for (auto& [d, h] : c.handles) cublasLtDestroy(h);
  c.handles.clear();
}

}  // namespace moefold::cuda
