// Shared device and host helpers of the warp-specialised prefill attention kernels (attention_ws.cu,
// attention_ws_persist.cu; private to them): tile configuration, the swizzled layout, the online
// softmax, the producer's tile loads, the V2 epilogue and the KV tensor maps. See attention_ws.cu.
#pragma once
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdlib>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/attention_flash.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/wgmma.cuh"

namespace moefold::cuda::detail {
using namespace ptx;
namespace {

constexpr int kBM = 128, kThreads = 384;
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128 * 24 + 256 * 240 <= 65536

/// BN keys per tile (a multiple of 16: whole 16-key pieces).
template <int D, int BN_, int STAGES>
struct WsCfg {
  static constexpr int BN = BN_;
  static constexpr uint32_t q_bytes = kBM * D * 2, kv_bytes = BN * D * 2;
  // Q | K[STAGES] | V[STAGES] | mbarriers; each tile region 1024-byte aligned (the swizzle follows
  // address bits).
  static constexpr uint32_t k_off = q_bytes, v_off = k_off + STAGES * kv_bytes, bar_off = v_off + STAGES * kv_bytes;
  static constexpr size_t smem = size_t(bar_off) + 4 * STAGES * 8 + 1024;
};

/// Byte offset of the 16-byte chunk holding elements (r, c .. c + 7) of an R-row, K-major matrix
/// stored as column tiles of 64 elements in the 128-byte swizzle layout (the TMA SWIZZLE_128B layout).
__device__ __forceinline__ uint32_t sw_off(int r, int c, int R) {
  return uint32_t((c >> 6) * R * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int D>
__device__ __forceinline__ void mma_pv(float (&o)[D / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (D == 64) wg::mma_rs_n64_mn(o, a, db);
  else if constexpr (D == 128) wg::mma_rs_n128_mn(o, a, db);
  else if constexpr (D == 192) wg::mma_rs_n192_mn(o, a, db);
  else wg::mma_rs_n256_mn(o, a, db);
}

/// Online-softmax state of one consumer thread: rows g and g + 8 of its warp's 16.
template <int D, int BN>
struct Softmax {
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2] = {1.0f, 1.0f};

  /// Masks S (keys > lim[i] of row i, when `mask`), updates m and l, stores the rescale factor of O
  /// in alpha and overwrites S with the probabilities (fp32; pack() rounds them for P V).
  __device__ __forceinline__ void step(float (&sc)[BN / 2], bool mask, int kb, int tig, const int (&lim)[2], float sl2) {
    constexpr int NT = BN / 8;
    if (mask) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kb + 8 * j + 2 * tig + (e & 1) > lim[e >> 1]) sc[4 * j + e] = -INFINITY;
    }
    float mx[2] = {m[0], m[1]}, msc[2];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      mx[0] = fmaxf(mx[0], fmaxf(sc[4 * j], sc[4 * j + 1]));
      mx[1] = fmaxf(mx[1], fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      msc[i] = mx[i] == -INFINITY ? 0.0f : mx[i] * sl2;
      // An unchanged max rescales by exactly 1, so that a tile wholly past this row's last key (the
      // block visits key tiles up to its LAST row's key) leaves m, l and O bit for bit as they were:
      // a row's bits then do not depend on how many such tiles its query tile makes it visit. (Without
      // the select the compiler contracts m * sl2 - msc into fma(m, sl2, -msc): the rounding error of
      // m * sl2, whose exp2 can be 1 -/+ an ulp, so O and l drifted with each masked tile.)
      alpha[i] = mx[i] == m[i] ? 1.0f : fast_exp2(m[i] * sl2 - msc[i]);
      m[i] = mx[i];
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[4 * j + e] = fast_exp2(fmaf(sc[4 * j + e], sl2, -msc[e >> 1]));
        l[e >> 1] += sc[4 * j + e];
      }
  }

  /// The bf16 probabilities in the m16n8k16 A-fragment layout (one fragment per 16 keys). Kept apart
  /// from step() so that the registers P V reads are written only after that product completed.
  __device__ __forceinline__ static void pack(const float (&sc)[BN / 2], uint32_t (&p)[BN / 16][4]) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      p[j / 2][(j & 1) * 2 + 0] = pack2(sc[4 * j], sc[4 * j + 1]);
      p[j / 2][(j & 1) * 2 + 1] = pack2(sc[4 * j + 2], sc[4 * j + 3]);
    }
  }

  __device__ __forceinline__ void rescale(float (&o)[D / 2]) const {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  }
};

/// Producer warp: K or V of keys [kb, kb + BN) into the swizzled tile at shared address `dst`,
/// completing on mbarrier `full` (32 arrivals: every lane; lane 0 also expects the TMA bytes).
/// Pieces of 16 keys wholly before kv_end (a prefix of the tile) are TMA boxes; the rest the lanes copy.
/// Lane i < (whole 16-key pieces of [kb, kv_end) in the tile): the first cache slot of piece i (a
/// block-table read); other lanes 0.
template <int BN>
__device__ __forceinline__ int piece_slot(const FlashArgs& a, const int32_t* bt, int kb, int kv_end, int lane) {
  const int nfull = min(BN / 16, (kv_end - kb) >> 4);
  int my_slot = 0;
  if (lane < nfull) {
    const int key0 = kb + 16 * lane;
    const int pi = a.bs_shift >= 0 ? key0 >> a.bs_shift : key0 / a.block_size;
    my_slot = bt[pi] * a.block_size + (key0 - pi * a.block_size);
  }
  return my_slot;
}

/// my_slot: piece_slot() of this tile. kSkipTail: pieces wholly at or past kv_end are not written
/// (for K: the mask replaces their scores by -inf whatever the tile holds; V needs the zeros, as P
/// is 0 there and 0 * NaN would reach O).
/// kTall (WsVariant::V2Tall / PersistTall): a tile of BN keys wholly before kv_end whose pieces lie in
/// consecutive cache slots (piece i at slot0 + 16 i: the pages it covers are consecutive in the cache,
/// wherever the tile starts within a page) is one box of BN slots per 64 columns through `tall_map`
/// (kv_map with rows = BN) instead of BN / 16 boxes of 16 slots. The same bytes land at the same
/// shared addresses: the 128-byte swizzle is a function of the address (16-byte chunk index XOR bits
/// 7..9, i.e. the row mod 8 in a 1024-byte aligned column tile), so a BN-row box at a column tile's
/// start lays row r out exactly as the 16-row box of piece r / 16 did at offset 2048 (r / 16). Other
/// tiles (pages not consecutive, the sequence's last tile) take the piece-wise path.
template <typename KV, int D, int BN, bool kSkipTail = false, bool kTall = false>
__device__ __forceinline__ void load_tile(const CUtensorMap* map, const KV* cache, const FlashArgs& a,
                                          const int32_t* bt, int kvh, int kb, int kv_end, uint32_t dst,
                                          uint32_t full, int lane, int my_slot, const CUtensorMap* tall_map = nullptr) {
  constexpr int CH = D * int(sizeof(KV)) / 16;  // 16-byte chunks per row
  if constexpr (kTall) {
    static_assert(BN / 16 <= 32 && BN <= 256, "one lane per piece; TMA boxes of at most 256 rows");
    if (kv_end - kb >= BN) {  // every piece whole (then my_slot holds every piece's slot)
      const int slot0 = __shfl_sync(0xffffffffu, my_slot, 0);
      if (__all_sync(0xffffffffu, lane >= BN / 16 || my_slot == slot0 + 16 * lane)) {
        if (lane == 0) {
          mbar_arrive_expect_tx(full, uint32_t(BN) * uint32_t(D) * uint32_t(sizeof(KV)));
#pragma unroll
          for (int ct = 0; ct < D / 64; ++ct) tma_load_3d(dst + uint32_t(ct * BN * 128), tall_map, full, ct * 64, kvh, slot0);
        } else {
          mbar_arrive(full);
        }
        return;
      }
    }
  }
  const int nfull = min(BN / 16, (kv_end - kb) >> 4);
  const int nlanes = kSkipTail ? min(BN / 16, (kv_end - kb + 15) >> 4) : BN / 16;  // pieces written
#pragma unroll 1
  for (int c16 = nfull; c16 < nlanes; ++c16) {  // the sequence's last piece and any past it: zeros past the end
    const int key0 = kb + 16 * c16;
#pragma unroll 1
    for (int idx = lane; idx < 16 * CH; idx += 32) {
      const int r = idx / CH, c = idx % CH, key = key0 + r;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (key < kv_end) {
        const int pi = a.bs_shift >= 0 ? key >> a.bs_shift : key / a.block_size;
        const int64_t slot = int64_t(bt[pi]) * a.block_size + (key - pi * a.block_size);
        v = *reinterpret_cast<const uint4*>(cache + (slot * a.Hkv + kvh) * D + c * (16 / int(sizeof(KV))));
      }
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + sw_off(16 * c16 + r, c * 8, BN)), "r"(v.x),
                   "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
    }
  }
  if (nfull < nlanes) wg::fence_proxy_async();  // the lanes' stores, before the tensor cores read them
  if (lane == 0) mbar_arrive_expect_tx(full, uint32_t(nfull) * 16u * uint32_t(D) * uint32_t(sizeof(KV)));
#pragma unroll 1
  for (int c16 = 0; c16 < nfull; ++c16) {
    const int slot0 = __shfl_sync(0xffffffffu, my_slot, c16);
    if (lane == 0) {
#pragma unroll
      for (int ct = 0; ct < D / 64; ++ct)
        tma_load_3d(dst + uint32_t(ct * BN * 128 + c16 * 16 * 128), map, full, ct * 64, kvh, slot0);
    }
  }
  if (lane != 0) mbar_arrive(full);
}

/// Transposes a 4 x 4 block of 32-bit words over the lanes of a quad: lane t holds row t in x0 .. x3
/// before and column t after (two exchange rounds).
__device__ __forceinline__ void quad_transpose(uint32_t& x0, uint32_t& x1, uint32_t& x2, uint32_t& x3, int tig) {
  const bool hi = tig & 2, odd = tig & 1;
  const unsigned quad = 0xfu << (threadIdx.x & 28);  // (the quad alone: other quads may skip their row)
  // lanes t, t ^ 2: the 2 x 2 blocks off the diagonal
  uint32_t r0 = __shfl_xor_sync(quad, hi ? x0 : x2, 2), r1 = __shfl_xor_sync(quad, hi ? x1 : x3, 2);
  if (hi) x0 = r0, x1 = r1;
  else x2 = r0, x3 = r1;
  // lanes t, t ^ 1: within the 2 x 2 blocks
  r0 = __shfl_xor_sync(quad, odd ? x0 : x1, 1);
  r1 = __shfl_xor_sync(quad, odd ? x2 : x3, 1);
  if (odd) x0 = r0, x2 = r1;
  else x1 = r0, x3 = r1;
}

/// sigmoidf_(x) = 1 / (1 + e^-x) bit for bit without its branch, for y = 1 + e^-x in [1, 2^126): the
/// reciprocal as the compiler's rcp.rn takes it on that range (rcp.approx, then one Newton step with
/// the residual y r - 1 from an fma; outside the range, and for NaN, rcp.rn calls its slow path
/// instead), with expf and the addition written as sigmoidf_ writes them. Sets `slow` where y leaves
/// the range (x < -87.3 or NaN): the caller then recomputes with sigmoidf_. Without the per-element
/// branch, the gated epilogue's sigmoids overlap (the branchy form waits out each one's latency).
__device__ __forceinline__ float sigmoid_nobranch(float x, bool& slow) {
  const float y = 1.0f + expf(-x);
  slow |= !(y < 0x1p126f);
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
  const float e = __fmaf_rn(y, r, -1.0f);
  return __fmaf_rn(r, -e, r);
}

/// The epilogue of the V2 and persistent paths: this thread's rows i with valid[i] (global row
/// grow[i], q head head[i]) as out = o / l, times sigmoid(gate) when gated: attn_ws_kernel's own
/// arithmetic (sigmoid_nobranch, and sigmoidf_ again for a row where that leaves its range), with all
/// of a row's gate loads issued before its first store (there each load waited for the previous
/// store: gate and out may alias for the compiler). With a.vec_out (16-byte aligned out) the rows go
/// out in 16-byte pieces, the quad's words transposed first: ungated rows up to D = 128, gated rows
/// with kVecGated (the non-persistent kernel; the persistent one would spill). lpart: the thread's
/// partial sums.
template <int D, bool kVecGated = false>
__device__ __forceinline__ void store_rows_v2(const FlashArgs& a, const float (&o)[D / 2], const float (&lpart)[2],
                                              const bool (&valid)[2], const int64_t (&grow)[2], const int (&head)[2],
                                              int tig) {
  float l[2] = {lpart[0], lpart[1]};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!valid[i]) continue;
    const float inv = 1.0f / l[i];
    bf16* orow = a.out + (grow[i] * a.Hq + head[i]) * D;
    if (a.gate) {
      const bf16* grow_gate = a.gate + grow[i] * a.g_ts + int64_t(head[i]) * a.g_hs;
      uint32_t gr[D / 8];
#pragma unroll
      for (int j = 0; j < D / 8; ++j) gr[j] = __ldg(reinterpret_cast<const unsigned int*>(grow_gate + 8 * j + 2 * tig));
      // out word j: columns 8 j + 2 tig, + 1 (`exact`: sigmoidf_, the reference form)
      auto word = [&](int j, bool exact, bool& slow) {
        __nv_bfloat162 gh;
        static_assert(sizeof(gh) == sizeof(uint32_t));
        memcpy(&gh, &gr[j], sizeof(gh));
        const float2 gf = __bfloat1622float2(gh);
        const float v0 = o[4 * j + 2 * i] * inv, v1 = o[4 * j + 2 * i + 1] * inv;
        const float s0 = exact ? sigmoidf_(gf.x) : sigmoid_nobranch(gf.x, slow);
        const float s1 = exact ? sigmoidf_(gf.y) : sigmoid_nobranch(gf.y, slow);
        return __floats2bfloat162_rn(v0 * s0, v1 * s1);
      };
      bool slow = false;
      if (kVecGated && a.vec_out) {  // 16-byte stores, as below
#pragma unroll
        for (int m = 0; m < D / 32; ++m) {
          uint32_t w[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const __nv_bfloat162 h = word(4 * m + u, false, slow);
            memcpy(&w[u], &h, sizeof(uint32_t));
          }
          quad_transpose(w[0], w[1], w[2], w[3], tig);
          *reinterpret_cast<uint4*>(orow + 32 * m + 8 * tig) = make_uint4(w[0], w[1], w[2], w[3]);
        }
        // A lane's words went out in its quad neighbours' stores: where one lane is slow, the quad
        // redoes its row together, after those stores (the rows of a quad are one row: valid alike).
        const unsigned quad = 0xfu << (threadIdx.x & 28);
        if (__any_sync(quad, slow)) {
          __syncwarp(quad);
          slow = true;
        }
      } else {
#pragma unroll
        for (int j = 0; j < D / 8; ++j) *reinterpret_cast<__nv_bfloat162*>(orow + 8 * j + 2 * tig) = word(j, false, slow);
      }
      if (slow) {  // a gate below -87.3 (or NaN) in this row: the row again, in sigmoidf_'s own form
        // (each lane its own words, 4 bytes at a time)
#pragma unroll
        for (int j = 0; j < D / 8; ++j) *reinterpret_cast<__nv_bfloat162*>(orow + 8 * j + 2 * tig) = word(j, true, slow);
      }
    } else if (D <= 128 && a.vec_out) {  // 16-byte stores: the quad's words of 4 column groups transposed
      // first (not at 256: the persistent form's registers would spill)
#pragma unroll
      for (int m = 0; m < D / 32; ++m) {
        uint32_t w[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int j = 4 * m + u;
          w[u] = pack2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
        }
        quad_transpose(w[0], w[1], w[2], w[3], tig);  // lane tig: columns 32 m + 8 tig .. + 7
        *reinterpret_cast<uint4*>(orow + 32 * m + 8 * tig) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<__nv_bfloat162*>(orow + 8 * j + 2 * tig) =
            __floats2bfloat162_rn(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
    }
  }
}

/// Rows of a block's 128 (token, head) rows of a [tokens, heads, D] bf16 operand (x at x + t * ts +
/// h * hs) into L2 (prefetch; for the gate read by the epilogue, and the persistent form's next Q).
template <int D>
__device__ __forceinline__ void prefetch_rows(const FlashArgs& a, const bf16* x, int64_t ts, int64_t hs, int row0, int n,
                                              int t0, int kvh, int hchunk, int lane) {
  constexpr int LPR = D / 64;  // 128-byte lines per row
#pragma unroll 1
  for (int idx = lane; idx < kBM * LPR; idx += 32) {
    const int rb = idx / LPR, tb = rb / a.HB, hg = hchunk * a.HB + rb % a.HB;
    if (tb < a.TB && t0 + tb < n && hg < a.G) {
      const bf16* gp = x + int64_t(row0 + t0 + tb) * ts + int64_t(kvh * a.G + hg) * hs + (idx % LPR) * 64;
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gp));
    }
  }
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MOEFOLD_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    MOEFOLD_CHECK(q == cudaDriverEntryPointSuccess && p != nullptr, "attention (ws): cuTensorMapEncodeTiled unavailable");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

/// The 3-D map [slots, Hkv, D] of one cache (slot count unbounded: only slots of the block tables
/// are addressed), boxes of `rows` slots (16: one piece; BN: a tall tile, at most 256) x 1 head x 64
/// elements, 128-byte swizzle.
template <typename KV>
CUtensorMap kv_map(const KV* cache, int Hkv, int D, int rows = 16) {
  static_assert(sizeof(KV) == 2, "bf16 cache");
  CUtensorMap m;
  const cuuint64_t dims[3] = {cuuint64_t(D), cuuint64_t(Hkv), cuuint64_t(1) << 31};
  const cuuint64_t strides[2] = {cuuint64_t(D) * sizeof(KV), cuuint64_t(Hkv) * D * sizeof(KV)};
  const cuuint32_t box[3] = {64, 1, cuuint32_t(rows)}, elem[3] = {1, 1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<KV*>(cache), dims, strides, box, elem,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MOEFOLD_CHECK(r == CUDA_SUCCESS, "attention (ws): cuTensorMapEncodeTiled failed ({})", int(r));
  return m;
}

/// Whether the V2 kernels may load Q tiles by TMA: 16-byte aligned rows and head strides, 128-row
/// tiles of whole token x head groups (MOEFOLD_ATTN_Q_TMA=0 turns it off, for A/B runs).
inline bool q_tma_ok(const FlashArgs& a) {
  static const bool env_on = [] {
    const char* e = std::getenv("MOEFOLD_ATTN_Q_TMA");
    return !(e && e[0] == '0' && e[1] == '\0');
  }();
  return env_on && reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && a.q_ts % 8 == 0 && a.q_hs % 8 == 0 &&
         a.HB * a.TB == kBM;
}

/// The 3-D map [tokens, Hq, D] over Q (rows q_ts elements apart, heads q_hs; the token count unbounded:
/// only tiles whose rows all lie in their sequence are addressed), boxes of TB tokens x HB heads x 64
/// elements in the 128-byte swizzle: a box lands as rows tb * HB + h, the layout sw_off gives the
/// consumers' copy.
inline CUtensorMap q_map(const FlashArgs& a) {
  CUtensorMap m;
  const cuuint64_t dims[3] = {cuuint64_t(a.dh), cuuint64_t(a.Hq), cuuint64_t(1) << 31};
  const cuuint64_t strides[2] = {cuuint64_t(a.q_hs) * 2, cuuint64_t(a.q_ts) * 2};
  const cuuint32_t box[3] = {64, cuuint32_t(a.HB), cuuint32_t(a.TB)}, elem[3] = {1, 1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(a.q), dims, strides, box,
                                 elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MOEFOLD_CHECK(r == CUDA_SUCCESS, "attention (ws): cuTensorMapEncodeTiled for Q failed ({})", int(r));
  return m;
}

}  // namespace
}  // namespace moefold::cuda::detail
