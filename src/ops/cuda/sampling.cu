// Token selection kernels (see sampling.h). One block per row. Greedy is a block argmax. Sampling
// runs the CPU sampler's steps as passes over the row: argmax / flags, min_p + survivor count,
// top_k by an 8-bit radix select over the 64-bit key (ordered logit bits << 32 | ~id), whose
// descending order is exactly the CPU's "better" order (larger logit, then lower id); top_p by a
// radix select on the same key guided by bucket masses; then the inverse-CDF draw in ascending id
// order via a block scan of per-thread contiguous chunks. Around them: the logit mask, the raw
// log-softmax with top_logprobs (a count-mode radix select on the same key), the penalties on the
// distinct history tokens, and the sampled token's raw logprob.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <cfloat>
#include <climits>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/sampling.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
using namespace detail;
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr float kGreedyTemperature = 1e-5f;  // SamplingParams::kGreedyTemperature

struct Best {
  float v;
  int32_t i;  // INT_MAX: none
};

__device__ __forceinline__ bool better(Best a, Best b) {
  if (a.i == INT_MAX) return false;
  if (b.i == INT_MAX) return true;
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best c{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    if (better(c, b)) b = c;
  }
  return b;
}

/// Block-wide best (all threads get it). Uses sb[kWarps].
__device__ Best block_best(Best b, Best* sb) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  b = warp_best(b);
  __syncthreads();
  if (lane == 0) sb[warp] = b;
  __syncthreads();
  b = lane < int(blockDim.x >> 5) ? sb[lane] : Best{-INFINITY, INT_MAX};
  return warp_best(b);
}

template <class T>
__device__ T block_sum(T v, T* sm) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x >> 5) ? sm[lane] : T(0);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ int block_or(int v, int* sm) { return block_sum<int>(v ? 1 : 0, sm) > 0; }

/// Scans the row: best non-NaN entry, and the NaN / +inf flags.
__device__ Best scan_row(const float* x, int64_t vocab, int& flags, Best* sb, int* si) {
  Best b{-INFINITY, INT_MAX};
  int nan = 0, pinf = 0;
  auto visit = [&](float v, int64_t i) {
    if (isnan(v)) {
      nan = 1;
      return;
    }
    if (v == INFINITY) pinf = 1;
    const Best c{v, int32_t(i)};
    if (better(c, b)) b = c;
  };
  // `better` is a total order (value, then lower id), so the visiting order does not change the
  // result: 16-byte loads where the row allows, for more bytes in flight per thread.
  int64_t i0 = 0;
  if ((reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int64_t n4 = vocab / 4;
    for (int64_t j = threadIdx.x; j < n4; j += blockDim.x) {
      const float4 q = x4[j];
      visit(q.x, 4 * j);
      visit(q.y, 4 * j + 1);
      visit(q.z, 4 * j + 2);
      visit(q.w, 4 * j + 3);
    }
    i0 = 4 * n4;
  }
  for (int64_t i = i0 + threadIdx.x; i < vocab; i += blockDim.x) visit(x[i], i);
  b = block_best(b, sb);
  flags = (block_or(nan, si) ? kSampleNaN : 0) | (block_or(pinf, si) ? kSamplePosInf : 0);
  if (b.i == INT_MAX || b.v == -INFINITY) flags |= kSampleEmpty;
  return b;
}

__global__ void argmax_kernel(const float* logits, int64_t max_rows, int64_t vocab, int64_t ld, int32_t* tokens,
                              int32_t* flags, const int32_t* live) {
  pdl_begin();
  __shared__ Best sb[kWarps];
  __shared__ int si[kWarps];
  const int64_t row = blockIdx.x;
  if (row >= live_count(live, max_rows)) return;
  int f;
  const Best b = scan_row(logits + row * ld, vocab, f, sb, si);
  if (threadIdx.x == 0) {
    tokens[row] = b.i == INT_MAX ? -1 : b.i;
    if (flags) flags[row] = f;
  }
}

/// Order-preserving map of a float to uint32 (larger float -> larger key), and the 64-bit
/// selection key: descending key order = larger logit first, lower id first among equal logits.
/// -0.0 is keyed as +0.0: the CPU compares values, for which they are equal (a tie, lower id first).
__device__ __forceinline__ uint64_t sel_key(float v, int64_t i) {
  uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t(u) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(i));
}

struct RowCtx {
  const float* x;
  int64_t vocab;
  double xm, t, log_min_p;
  bool use_min_p;
  __device__ bool alive(float v) const {
    return !isnan(v) && v != -INFINITY && (!use_min_p || (double(v) - xm) / t >= log_min_p);
  }
  __device__ double weight(float v) const { return exp((double(v) - xm) / t); }
};

/// Every non-NaN entry (-inf included) of a row: the candidates of top_logprobs (CPU top_n).
struct AnyCtx {
  const float* x;
  int64_t vocab;
  __device__ bool alive(float v) const { return !isnan(v); }
  __device__ double weight(float) const { return 0.0; }
};

/// Radix select over keys of the entries with c.alive(v) && key >= lo (Ctx: RowCtx or AnyCtx). Mode count: returns the
/// k-th largest key (k >= 1) as a threshold (keep key >= result). Mode mass: returns the boundary
/// of the shortest prefix (descending key) whose weight reaches `target`.
template <bool kMass, class Ctx>
__device__ uint64_t radix_select(const Ctx& c, uint64_t lo, int64_t k, double target, unsigned* hc, double* hm,
                                 uint64_t* s_prefix, int* s_done, double* s_acc, int64_t* s_krem) {
  uint64_t prefix = 0;
  if (threadIdx.x == 0) {
    *s_acc = 0.0;
    *s_krem = k;
  }
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += blockDim.x) {
      hc[d] = 0;
      if (kMass) hm[d] = 0.0;
    }
    __syncthreads();
    const int hi_shift = shift + 8;
    for (int64_t i = threadIdx.x; i < c.vocab; i += blockDim.x) {
      const float v = c.x[i];
      if (!c.alive(v)) continue;
      const uint64_t key = sel_key(v, i);
      if (key < lo) continue;
      if (hi_shift < 64 && ((key ^ prefix) >> hi_shift) != 0) continue;
      const unsigned d = unsigned(key >> shift) & 255u;
      atomicAdd(&hc[d], 1u);
      if (kMass) atomicAdd(&hm[d], c.weight(v));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int sel = -1;
      int done = 0;
      if (kMass) {
        double acc = *s_acc;
        int lowest = -1;
        for (int d = 255; d >= 0; --d) {
          if (hc[d] == 0) continue;
          lowest = d;
          if (acc + hm[d] >= target) {
            sel = d;
            break;
          }
          acc += hm[d];
        }
        if (sel < 0) {  // rounding never reached the target: keep the whole range (CPU: last = hi - 1)
          sel = lowest;
          acc -= hm[lowest];
        }
        *s_acc = acc;
        done = hc[sel] == 1;
      } else {
        int64_t krem = *s_krem, cum = 0;
        for (int d = 255; d >= 0; --d) {
          if (cum + int64_t(hc[d]) >= krem) {
            sel = d;
            break;
          }
          cum += hc[d];
        }
        krem -= cum;
        *s_krem = krem;
        done = int64_t(hc[sel]) == krem;
      }
      *s_prefix = prefix | (uint64_t(unsigned(sel)) << shift);
      *s_done = done;
    }
    __syncthreads();
    prefix = *s_prefix;
    const int done = *s_done;
    __syncthreads();
    if (done) break;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int64_t max_rows, int64_t vocab,
                                                          int64_t ld, SampleRowParams p, int32_t* tokens,
                                                          int32_t* flags, const int32_t* live) {
  pdl_begin();
  __shared__ Best sb[kWarps];
  __shared__ int si[kWarps];
  __shared__ int64_t sl[kWarps];
  __shared__ double sd[kWarps];
  __shared__ unsigned hc[256];
  __shared__ double hm[256];
  __shared__ uint64_t s_prefix;
  __shared__ int s_done, s_win, s_last;
  __shared__ double s_acc;
  __shared__ int64_t s_krem;

  const int64_t row = blockIdx.x;
  if (row >= live_count(live, max_rows)) return;
  const float* x = logits + row * ld;
  int f;
  const Best b = scan_row(x, vocab, f, sb, si);
  const float temp = p.temperature[row];
  if (temp < kGreedyTemperature || (f & (kSamplePosInf | kSampleEmpty))) {
    if (threadIdx.x == 0) {
      int32_t tok = b.i == INT_MAX ? -1 : b.i;
      if (f & kSamplePosInf) tok = b.i;  // the lowest-id +inf entry is the best
      tokens[row] = tok;
      if (flags) flags[row] = f;
    }
    return;
  }
  RowCtx c;
  c.x = x;
  c.vocab = vocab;
  c.xm = double(b.v);
  c.t = double(temp);
  const float min_p = p.min_p ? p.min_p[row] : 0.0f;
  c.use_min_p = min_p > 0.0f;
  c.log_min_p = c.use_min_p ? log(double(min_p)) : 0.0;

  // top_k (step 6) over the min_p survivors (step 5).
  uint64_t lo = 0;
  const int64_t k = p.top_k[row];
  if (k > 0) {
    int64_t n_alive = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) n_alive += c.alive(x[i]) ? 1 : 0;
    n_alive = block_sum<int64_t>(n_alive, sl);
    if (k < n_alive) lo = radix_select<false>(c, 0, k, 0.0, hc, hm, &s_prefix, &s_done, &s_acc, &s_krem);
  }
  // top_p (step 7) over the survivors so far.
  const float top_p = p.top_p[row];
  if (top_p < 1.0f) {
    double z = 0.0;
    int64_t n = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float v = x[i];
      if (c.alive(v) && sel_key(v, i) >= lo) {
        z += c.weight(v);
        ++n;
      }
    }
    z = block_sum<double>(z, sd);
    n = block_sum<int64_t>(n, sl);
    if (n > 1) {
      const uint64_t lp = radix_select<true>(c, lo, 0, double(top_p) * z, hc, hm, &s_prefix, &s_done, &s_acc, &s_krem);
      lo = lp > lo ? lp : lo;
    }
  }
  // Draw (step 8): inverse CDF in ascending id order. Thread t owns ids [t * chunk, (t + 1) * chunk).
  const int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t i0 = int64_t(threadIdx.x) * chunk, i1 = min(vocab, i0 + chunk);
  double local = 0.0;
  int last = -1;
  for (int64_t i = i0; i < i1; ++i) {
    const float v = x[i];
    if (c.alive(v) && sel_key(v, i) >= lo) {
      local += c.weight(v);
      last = int(i);
    }
  }
  // Block inclusive scan of `local` (fixed order: deterministic).
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  double inc = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  if (threadIdx.x == 0) {
    s_win = INT_MAX;
    s_last = -1;
  }
  if (lane == 31) sd[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    double w = lane < kWarps ? sd[lane] : 0.0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < kWarps) sd[lane] = w;  // inclusive warp totals
  }
  __syncthreads();
  const double before = warp > 0 ? sd[warp - 1] : 0.0;
  inc += before;
  const double excl = inc - local;  // only used by the winner as its walk's start
  const double total = sd[kWarps - 1];
  const double target = p.uniform[row] * total;
  if (last >= 0 && inc > target) atomicMin(&s_win, int(threadIdx.x));  // first chunk holding the crossing
  if (last >= 0) atomicMax(&s_last, last);
  __syncthreads();
  if (int(threadIdx.x) == s_win) {
    int tok = last;  // rounding fallback inside the chunk
    double cum = excl;
    for (int64_t i = i0; i < i1; ++i) {
      const float v = x[i];
      if (c.alive(v) && sel_key(v, i) >= lo) {
        cum += c.weight(v);
        if (cum > target) {
          tok = int(i);
          break;
        }
      }
    }
    if (tok < 0) tok = s_last;
    tokens[row] = tok;
    if (flags) flags[row] = f;
  }
  if (threadIdx.x == 0 && s_win == INT_MAX) {  // u * Z never exceeded through rounding: the last survivor
    tokens[row] = s_last;
    if (flags) flags[row] = f;
  }
}

// ---- logit masks, penalties and raw logprobs (run around the selection kernels) --------------------

__global__ void mask_logits_kernel(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const int32_t* ids,
                            const int32_t* num_ids, const int32_t* live) {
  pdl_begin();
  const int64_t row = blockIdx.x;
  if (row >= live_count(live, max_rows)) return;
  const int32_t n = *num_ids;
  float* x = logits + row * ld;
  for (int32_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int32_t id = ids[j];
    if (id >= 0 && id < vocab) x[id] = -INFINITY;  // duplicates write the same value
  }
}

/// One thread per logit of a constrained row: -inf where the row's grammar bitmask bit is clear.
/// grid (rows, ceil(vocab / blockDim)); the bitmask word is a broadcast load within each warp.
__global__ void token_bitmask_kernel(float* logits, int64_t max_rows, int64_t vocab, int64_t ld,
                                     const uint32_t* bitmask, const int32_t* mask_row, const int32_t* live) {
  pdl_begin();
  const int64_t row = blockIdx.x;
  if (row >= live_count(live, max_rows)) return;
  const int32_t m = mask_row[row];
  if (m < 0) return;
  const int64_t t = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (t >= vocab) return;
  const int64_t words = (vocab + 31) / 32;
  const uint32_t bits = bitmask[int64_t(m) * words + t / 32];
  if (!((bits >> (t % 32)) & 1u)) logits[row * ld + t] = -INFINITY;
}

/// Raw log-softmax of a row (CPU: log_sum_exp and top_n): lse in double, then, for n > 0, the n best
/// (logit desc, id asc) entries by a count-mode radix select for the n-th key and one collection pass.
__global__ void __launch_bounds__(kThreads) raw_logprobs_kernel(const float* logits, int64_t max_rows, int64_t vocab,
                                                                int64_t ld, const int32_t* top_n, double* lse,
                                                                int32_t* top_ids, float* top_lp, const int32_t* live) {
  pdl_begin();
  __shared__ Best sb[kWarps];
  __shared__ int si[kWarps];
  __shared__ double sd[kWarps];
  __shared__ unsigned hc[256];
  __shared__ double hm[256];
  __shared__ uint64_t s_prefix;
  __shared__ int s_done, s_count;
  __shared__ double s_acc;
  __shared__ int64_t s_krem;
  __shared__ uint64_t s_keys[kMaxTopLogprobs];

  const int64_t row = blockIdx.x;
  if (row >= live_count(live, max_rows)) return;
  const int32_t want = top_n[row];
  if (want < 0) return;
  const float* x = logits + row * ld;
  int f;
  const Best b = scan_row(x, vocab, f, sb, si);
  const double m = b.i == INT_MAX ? -INFINITY : double(b.v);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = x[i];
    if (!isnan(v)) sum += exp(double(v) - m);  // exp(-inf) = 0
  }
  sum = block_sum<double>(sum, sd);
  const double l = m + log(sum);
  if (threadIdx.x == 0) lse[row] = l;
  // top_logprobs: skipped for a row with NaN (the sampler reports that row as failed).
  const int64_t n = min(int64_t(min(want, kMaxTopLogprobs)), vocab);
  if (n == 0 || (f & kSampleNaN)) return;
  const AnyCtx c{x, vocab};
  const uint64_t thr = n < vocab ? radix_select<false>(c, 0, n, 0.0, hc, hm, &s_prefix, &s_done, &s_acc, &s_krem) : 0;
  if (threadIdx.x == 0) s_count = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const uint64_t key = sel_key(x[i], i);
    if (key >= thr) {  // exactly n keys (keys are distinct)
      const int slot = atomicAdd(&s_count, 1);
      if (slot < kMaxTopLogprobs) s_keys[slot] = key;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int cnt = min(s_count, int(n));
    for (int a = 1; a < cnt; ++a)  // insertion sort, largest key (best) first
      for (int j = a; j > 0 && s_keys[j] > s_keys[j - 1]; --j) {
        const uint64_t t = s_keys[j];
        s_keys[j] = s_keys[j - 1];
        s_keys[j - 1] = t;
      }
    for (int j = 0; j < int(n); ++j) {
      const int32_t id = j < cnt ? int32_t(0xFFFFFFFFu - uint32_t(s_keys[j] & 0xFFFFFFFFu)) : -1;
      top_ids[row * kMaxTopLogprobs + j] = id;
      top_lp[row * kMaxTopLogprobs + j] = id >= 0 ? float(double(x[id]) - l) : NAN;
    }
  }
}

/// Repetition, frequency and presence penalties on each row's distinct history tokens (CPU:
/// apply_penalties; the same fp32 operations, unfused, in the same order). Saves every raw value.
__global__ void penalties_kernel(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, PenaltyRows p,
                                 const int32_t* live) {
  pdl_begin();
  const int64_t row = blockIdx.x;
  if (row >= live_count(live, max_rows)) return;
  const int32_t b0 = p.offsets[row], b1 = p.offsets[row + 1];
  if (b0 >= b1) return;
  const float rep = p.repetition[row], fr = p.frequency[row], pr = p.presence[row];
  float* x = logits + row * ld;
  for (int32_t j = b0 + int32_t(threadIdx.x); j < b1; j += int32_t(blockDim.x)) {
    const int32_t t = p.tokens[j];
    if (t < 0 || t >= vocab) continue;
    float v = x[t];
    p.saved[j] = v;
    if (rep != 1.0f) v = v > 0.0f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
    const int32_t cnt = p.counts[j];
    if (cnt > 0) {
      if (fr != 0.0f) v = __fsub_rn(v, __fmul_rn(fr, float(cnt)));
      if (pr != 0.0f) v = __fsub_rn(v, pr);
    }
    x[t] = v;
  }
}

/// logprob[row] = raw logit of the sampled token - lse (the raw value from the penalty kernel's saved
/// copy when the token was penalized).
__global__ void token_logprob_kernel(const float* logits, int64_t max_rows, int64_t vocab, int64_t ld,
                                     const int32_t* tokens, const int32_t* top_n, const double* lse, PenaltyRows p,
                                     float* logprob, const int32_t* live) {
  pdl_begin();
  __shared__ float s_raw;
  const int64_t row = blockIdx.x;
  if (row >= live_count(live, max_rows)) return;
  if (top_n[row] < 0) return;
  const int32_t t = tokens[row];
  if (t < 0 || t >= vocab) {
    if (threadIdx.x == 0) logprob[row] = NAN;
    return;
  }
  if (threadIdx.x == 0) s_raw = logits[row * ld + t];
  __syncthreads();
  if (p.offsets) {
    const int32_t b0 = p.offsets[row], b1 = p.offsets[row + 1];
    for (int32_t j = b0 + int32_t(threadIdx.x); j < b1; j += int32_t(blockDim.x))
      if (p.tokens[j] == t) s_raw = p.saved[j];  // history tokens of a row are distinct: one writer
  }
  __syncthreads();
  if (threadIdx.x == 0) logprob[row] = float(double(s_raw) - lse[row]);
}

void check_args(int64_t max_rows, int64_t vocab, int64_t& ld, const char* what) {
  if (ld == 0) ld = vocab;
  MOEFOLD_CHECK(max_rows >= 0 && max_rows < (int64_t(1) << 31) && vocab > 0 && vocab < (int64_t(1) << 31) - 1 &&
                    ld >= vocab,
                "{}: bad sizes rows={} vocab={} ld={}", what, max_rows, vocab, ld);
}

// Work: every logit of the rows read once (bytes counted for all max_rows: the live count is on the device).
const prof::Kernel kArgmax{"argmax_kernel", prof::Category::Sampling};
const prof::Kernel kSample{"sample_kernel", prof::Category::Sampling};
const prof::Kernel kMask{"mask_logits_kernel", prof::Category::Sampling};
const prof::Kernel kTokenBitmask{"token_bitmask_kernel", prof::Category::Sampling};
const prof::Kernel kRawLogprobs{"raw_logprobs_kernel", prof::Category::Sampling};
const prof::Kernel kPenalties{"penalties_kernel", prof::Category::Sampling};
const prof::Kernel kTokenLogprob{"token_logprob_kernel", prof::Category::Sampling};

}  // namespace

void argmax_rows(const float* logits, int64_t max_rows, int64_t vocab, int64_t ld, int32_t* tokens, int32_t* flags,
                 const int32_t* live_rows, cudaStream_t stream) {
  check_args(max_rows, vocab, ld, "argmax_rows");
  if (max_rows == 0) return;
  LaunchScope launch(kArgmax, stream, prof::Work{double(max_rows) * double(vocab) * 4, 0});
  launch_pdl(argmax_kernel, dim3(unsigned(max_rows)), dim3(kThreads), 0, stream, logits, max_rows, vocab, ld, tokens, flags, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void sample_rows(const float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const SampleRowParams& params,
                 int32_t* tokens, int32_t* flags, const int32_t* live_rows, cudaStream_t stream) {
  check_args(max_rows, vocab, ld, "sample_rows");
  MOEFOLD_CHECK(params.temperature && params.top_k && params.top_p && params.uniform,
                "sample_rows: temperature, top_k, top_p and uniform arrays are required");
  if (max_rows == 0) return;
  LaunchScope launch(kSample, stream, prof::Work{double(max_rows) * double(vocab) * 4, 0});
  launch_pdl(sample_kernel, dim3(unsigned(max_rows)), dim3(kThreads), 0, stream, logits, max_rows, vocab, ld, params, tokens, flags,
                                                             live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void mask_logits_rows(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const int32_t* ids,
                      const int32_t* num_ids, int64_t max_ids, const int32_t* live_rows, cudaStream_t stream) {
  check_args(max_rows, vocab, ld, "mask_logits_rows");
  MOEFOLD_CHECK(ids && num_ids, "mask_logits_rows: ids and num_ids are required");
  if (max_rows == 0 || max_ids == 0) return;
  LaunchScope launch(kMask, stream, prof::Work{double(max_rows) * double(max_ids) * 8, 0});
  launch_pdl(mask_logits_kernel, dim3(unsigned(max_rows)), dim3(256), 0, stream, logits, max_rows, vocab, ld, ids, num_ids, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void apply_token_bitmask_rows(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const uint32_t* bitmask,
                              const int32_t* mask_row, const int32_t* live_rows, cudaStream_t stream) {
  check_args(max_rows, vocab, ld, "apply_token_bitmask_rows");
  MOEFOLD_CHECK(bitmask && mask_row, "apply_token_bitmask_rows: bitmask and mask_row are required");
  if (max_rows == 0) return;
  constexpr unsigned kBlock = 512;
  const int64_t blocks_y = (vocab + kBlock - 1) / kBlock;
  MOEFOLD_CHECK(blocks_y <= 65535, "apply_token_bitmask_rows: vocabulary {} is too large", vocab);
  LaunchScope launch(kTokenBitmask, stream, prof::Work{double(max_rows) * double(vocab) * 4.5, 0});
  launch_pdl(token_bitmask_kernel, dim3(unsigned(max_rows), unsigned(blocks_y)), dim3(kBlock), 0, stream, logits, max_rows,
             vocab, ld, bitmask, mask_row, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void raw_logprobs_rows(const float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const int32_t* top_n,
                       double* lse, int32_t* top_ids, float* top_logprobs, const int32_t* live_rows,
                       cudaStream_t stream) {
  check_args(max_rows, vocab, ld, "raw_logprobs_rows");
  MOEFOLD_CHECK(top_n && lse && top_ids && top_logprobs, "raw_logprobs_rows: every array is required");
  if (max_rows == 0) return;
  LaunchScope launch(kRawLogprobs, stream, prof::Work{double(max_rows) * double(vocab) * 4, 0});
  launch_pdl(raw_logprobs_kernel, dim3(unsigned(max_rows)), dim3(kThreads), 0, stream, logits, max_rows, vocab, ld, top_n, lse, top_ids,
                                                                   top_logprobs, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void apply_penalties_rows(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const PenaltyRows& p,
                          const int32_t* live_rows, cudaStream_t stream) {
  check_args(max_rows, vocab, ld, "apply_penalties_rows");
  MOEFOLD_CHECK(p.repetition && p.frequency && p.presence && p.offsets && p.tokens && p.counts && p.saved,
                "apply_penalties_rows: every array is required");
  if (max_rows == 0) return;
  LaunchScope launch(kPenalties, stream, prof::Work{double(max_rows) * 64, 0});
  launch_pdl(penalties_kernel, dim3(unsigned(max_rows)), dim3(256), 0, stream, logits, max_rows, vocab, ld, p, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void token_logprobs_rows(const float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const int32_t* tokens,
                         const int32_t* top_n, const double* lse, const PenaltyRows* penalties, float* logprob,
                         const int32_t* live_rows, cudaStream_t stream) {
  check_args(max_rows, vocab, ld, "token_logprobs_rows");
  MOEFOLD_CHECK(tokens && top_n && lse && logprob, "token_logprobs_rows: tokens, top_n, lse and logprob are required");
  if (max_rows == 0) return;
  const PenaltyRows p = penalties ? *penalties : PenaltyRows{};
  LaunchScope launch(kTokenLogprob, stream, prof::Work{double(max_rows) * 16, 0});
  launch_pdl(token_logprob_kernel, dim3(unsigned(max_rows)), dim3(128), 0, stream, logits, max_rows, vocab, ld, tokens, top_n, lse, p,
                                                               logprob, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
