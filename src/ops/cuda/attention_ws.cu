// Warp-specialised prefill attention on Hopper (sm_90a), in the manner of FlashAttention-3; contract
// as attention.h (AttnKernel::Ws* and Auto for head_dim 64/128/192/256 on pages of a multiple of 16
// tokens).
//
// A block owns 128 (token, q head) rows of one KV head (the GQA group shares every K/V tile, as in
// attention_wgmma.cu) and runs three warpgroups:
//  - warpgroup 0, the producer (its registers given up with setmaxnreg): one warp fills a ring of
//    STAGES K and V tiles in shared memory. Each 16-key piece of a tile lies in one page, so it is
//    one bulk tensor copy (TMA) per 64 columns, through a 3-D tensor map over the cache
//    [slots, kv heads, head_dim], landing in the 128-byte swizzle layout wgmma reads; the piece
//    holding the sequence's last key (and pieces past it) is copied by the warp's lanes with zeros
//    past the end instead (unused cache slots may hold anything, NaN included, and 0 * NaN would
//    reach the output). Full / empty mbarriers per stage, separate for K and V.
//  - warpgroups 1 and 2, the consumers (64 rows each, registers raised with setmaxnreg): S = Q K^T
//    (wgmma, both operands in shared memory), online softmax in fp32, O += P V (P from registers, V
//    read MN-major). kIW (intra-warpgroup overlap): S(j) and P(j-1) V(j-1) are issued together and
//    the softmax of S(j) runs while P V is on the tensor cores. kPP (ping-pong): a pair of named
//    barriers makes the two consumers take turns issuing their products, so one warpgroup's softmax
//    runs under the other's matrix work. kQR: Q K^T with Q in registers (loaded once with ldmatrix;
//    the wgmma register-A form), for 128-key tiles. Defaults per head size: launch_attention_ws.
// Causal: a block visits only the key tiles up to its last row; the one tile crossing the diagonal
// is masked and comes last. Batch invariance: key tiles start at multiples of BN from key 0, so a
// row sees the same tiles in the same order wherever its query tile starts; the tiles past its own
// last key (more or fewer, by where the query tile ends) are exact no-ops (Softmax::step). Longest
// query tiles are scheduled first, across the sequences of a batch. The sigmoid output gate is
// fused into the store. KV: the cache element type (bf16 today; a
// template parameter so that FP8 KV can convert on the way into the products).
// kV2 (WsVariant::V2; the same bits): the producer issues K(j) before V(j - 1) (S(j) and P V(j - 1)
// are issued together, and K's stage frees half a tile before V's), reads each tile's block-table
// entries a tile ahead, leaves K pieces wholly past the block's last key unwritten (masked anyway),
// and prefetches the gate rows into L2, and loads the block's Q tile by TMA where its 128 rows are whole
// (the consumers copy the others); the epilogue (attention_ws.cuh store_rows_v2) issues a row's gate
// loads before its stores, takes the gate's sigmoid without a per-element branch and stores 16-byte
// pieces. kTall (WsVariant::V2Tall): kV2 with a tile whose pages are consecutive in the cache
// loaded as one TMA box per 64 columns (load_tile; 4 instead of 20 per K tile at d256), the same bits.
// The persistent form of the same is attention_ws_persist.cu (its consumers copy Q, and its gated
// epilogue stores 4-byte pieces: registers); helpers attention_ws.cuh.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/attention_flash.h"
#include "ops/cuda/attention_ws.cuh"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/wgmma.cuh"

namespace moefold::cuda::detail {
using namespace ptx;
namespace {

template <typename KV, int D, int BN_, int STAGES, bool kPP, bool kIW, bool kQR, bool kV2, bool kTall>
__global__ void __launch_bounds__(kThreads, 1)
    attn_ws_kernel(const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                   const __grid_constant__ CUtensorMap tmk_tall, const __grid_constant__ CUtensorMap tmv_tall,
                   const __grid_constant__ CUtensorMap tmq, const FlashArgs a, bool q_tma) {
  static_assert(std::is_same_v<KV, bf16>, "the products read bf16 K/V (FP8 KV: convert in the consumers)");
  pdl_begin();
  using C = WsCfg<D, BN_, STAGES>;
  constexpr int BN = C::BN, CH = D / 8, KT = D / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const uint32_t sbase = smem_u32(base);
  const uint32_t q_addr = sbase, k_addr = sbase + C::k_off, v_addr = sbase + C::v_off, bars = sbase + C::bar_off;
  auto full_k = [&](int st) { return bars + uint32_t(st) * 8u; };
  auto full_v = [&](int st) { return bars + uint32_t(STAGES + st) * 8u; };
  auto empty_k = [&](int st) { return bars + uint32_t(2 * STAGES + st) * 8u; };
  auto empty_v = [&](int st) { return bars + uint32_t(3 * STAGES + st) * 8u; };
  const uint32_t q_full = bars + uint32_t(4 * STAGES) * 8u;  // kV2 with q_tma: the Q tile's TMA bytes

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wgi = warp >> 2;
  const int s = blockIdx.y;  // (grid z: query tiles, longest first for every sequence of a batch)
  const int qtile = a.qtiles - 1 - int(blockIdx.z);
  const int kvh = int(blockIdx.x) / a.head_chunks, hchunk = int(blockIdx.x) % a.head_chunks;
  const int row0 = a.cu[s], n = a.cu[s + 1] - row0, ctx = a.ctx[s];
  if (ctx < 0) return;
  const int t0 = qtile * a.TB;
  if (t0 >= n) return;
  const int kv_end = ctx + min(t0 + a.TB, n);
  const int ntiles = (kv_end + BN - 1) / BN;
  // kV2: the producer loads the Q tile by TMA (one box per 64 columns) where its 128 rows are all
  // tokens of the sequence and heads of the group (q_tma: the launch's strides and alignment allow it).
  const bool qt = kV2 && q_tma && a.HB * a.TB == kBM && (hchunk + 1) * a.HB <= a.G && t0 + a.TB <= n;

  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(full_k(st), 32);
      mbar_init(full_v(st), 32);
      mbar_init(empty_k(st), 8);  // one arrival per consumer warp
      mbar_init(empty_v(st), 8);
    }
    if constexpr (kV2) mbar_init(q_full, 1);
    fence_mbar_init();
  }
  __syncthreads();
  const int32_t* bt = a.bt + int64_t(s) * a.max_blocks;

  if (wgi == 0) {  // ---- producer ----
    setmaxnreg_dec<kProducerRegs>();
    if (warp != 0) return;
    if constexpr (kV2) {
      // K(jt) is issued before V(jt - 1): the consumers need them together (S(jt) beside P V(jt - 1)),
      // and K's stage is free half a tile before V's. Each tile's block-table reads are issued a tile
      // ahead (before the empty waits) and serve both K and V.
      if (lane == 0) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmk)) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmv)) : "memory");
        if constexpr (kTall) {
          asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmk_tall)) : "memory");
          asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmv_tall)) : "memory");
        }
        if (qt) {
          mbar_arrive_expect_tx(q_full, uint32_t(kBM) * uint32_t(D) * 2u);
#pragma unroll
          for (int ct = 0; ct < D / 64; ++ct)
            tma_load_3d(q_addr + uint32_t(ct * kBM * 128), &tmq, q_full, ct * 64, kvh * a.G + hchunk * a.HB, row0 + t0);
        }
      }
      int slot = piece_slot<BN>(a, bt, 0, kv_end, lane), slot_prev = 0;
      int st = 0, st_prev = 0;
      uint32_t ph = 0, ph_prev = 0;
#pragma unroll 1
      for (int jt = 0; jt <= ntiles; ++jt) {
        const int kb = jt * BN;
        const int slot_next = jt + 1 < ntiles ? piece_slot<BN>(a, bt, kb + BN, kv_end, lane) : 0;
        if (jt < ntiles) {
          mbar_wait(empty_k(st), ph ^ 1);
          load_tile<KV, D, BN, true, kTall>(&tmk, a.kc, a, bt, kvh, kb, kv_end, k_addr + uint32_t(st) * C::kv_bytes,
                                            full_k(st), lane, slot, &tmk_tall);
        }
        if (jt > 0) {
          mbar_wait(empty_v(st_prev), ph_prev ^ 1);
          load_tile<KV, D, BN, false, kTall>(&tmv, a.vc, a, bt, kvh, kb - BN, kv_end,
                                             v_addr + uint32_t(st_prev) * C::kv_bytes, full_v(st_prev), lane, slot_prev,
                                             &tmv_tall);
        }
        slot_prev = slot, slot = slot_next, st_prev = st, ph_prev = ph;
        if (++st == STAGES) st = 0, ph ^= 1;
      }
      if (a.gate) prefetch_rows<D>(a, a.gate, a.g_ts, a.g_hs, row0, n, t0, kvh, hchunk, lane);  // for the epilogue
      return;
    }
    int st = 0;
    uint32_t ph = 0;
#pragma unroll 1
    for (int jt = 0; jt < ntiles; ++jt) {
      const int kb = jt * BN;
      mbar_wait(empty_k(st), ph ^ 1);
      load_tile<KV, D, BN>(&tmk, a.kc, a, bt, kvh, kb, kv_end, k_addr + uint32_t(st) * C::kv_bytes, full_k(st), lane,
                           piece_slot<BN>(a, bt, kb, kv_end, lane));
      mbar_wait(empty_v(st), ph ^ 1);
      load_tile<KV, D, BN>(&tmv, a.vc, a, bt, kvh, kb, kv_end, v_addr + uint32_t(st) * C::kv_bytes, full_v(st), lane,
                           piece_slot<BN>(a, bt, kb, kv_end, lane));
      if (++st == STAGES) st = 0, ph ^= 1;
    }
    return;
  }

  // ---- consumers: warpgroup cw owns rows cw * 64 .. + 63 ----
  setmaxnreg_inc<kConsumerRegs>();
  const int cw = wgi - 1, ctid = tid - 128 - cw * 128, w4 = warp & 3, g = lane >> 2, tig = lane & 3;
  if (!qt) {
    for (int idx = ctid; idx < 64 * CH; idx += 128) {
      const int rb = cw * 64 + idx / CH, c = idx % CH, tb = rb / a.HB, hg = hchunk * a.HB + rb % a.HB;
      unsigned char* d = base + sw_off(rb, c * 8, kBM);
      if (tb < a.TB && t0 + tb < n && hg < a.G)
        cp_async16(d, a.q + int64_t(row0 + t0 + tb) * a.q_ts + int64_t(kvh * a.G + hg) * a.q_hs + c * 8);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
    cp_async_commit();
  }

  int lim[2], tok[2], head[2];
  bool valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int rb = cw * 64 + w4 * 16 + g + 8 * i, tb = rb / a.HB, hg = hchunk * a.HB + rb % a.HB;
    valid[i] = tb < a.TB && t0 + tb < n && hg < a.G;
    tok[i] = t0 + tb;
    head[i] = kvh * a.G + hg;
    lim[i] = valid[i] ? ctx + tok[i] : kv_end - 1;
  }
  const int full_end = ctx + t0 + 1;  // tiles ending at or before this key need no mask
  const uint32_t qa = q_addr + uint32_t(cw * 64 * 128);
  const float sl2 = a.scale_log2;
  if (qt) {
    mbar_wait(q_full, 0);
  } else {
    cp_async_wait_all();
    wg::fence_proxy_async();
    named_sync(1 + cw, 128);  // this warpgroup's Q rows staged
  }

  // Ping-pong: barrier 3 + w gates warpgroup w's issue; the second consumer lets the first go first.
  const int my_bar = 3 + cw, other_bar = 3 + (cw ^ 1);
  if (kPP && cw == 1) named_arrive(3, 256);

  // kQR: this warp's 16 Q rows as m16n8k16 A fragments in registers (S = Q K^T from registers).
  uint32_t qf[kQR ? KT : 1][4];
  if constexpr (kQR) {
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
      ldmatrix_x4(qf[kk], base + sw_off(cw * 64 + w4 * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8, kBM));
  }
  auto issue_s = [&](float (&sc)[BN / 2], int st) {
#pragma unroll
    for (int j = 0; j < BN / 2; ++j) sc[j] = 0.0f;
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      const uint64_t da = wg::desc_sw128(qa + uint32_t((kk >> 2) * kBM * 128 + (kk & 3) * 32));
      const uint64_t db = wg::desc_sw128(k_addr + uint32_t(st) * C::kv_bytes + uint32_t((kk >> 2) * BN * 128 + (kk & 3) * 32));
      if constexpr (kQR) {
        static_assert(!kQR || BN == 128, "Q from registers: 128-key tiles");
        wg::mma_rs_n128(sc, qf[kk], db);
      } else if constexpr (BN == 64) wg::mma_ss_n64(sc, da, db, kk > 0 ? 1 : 0);
      else if constexpr (BN == 80) wg::mma_ss_n80(sc, da, db, kk > 0 ? 1 : 0);
      else wg::mma_ss_n128(sc, da, db, kk > 0 ? 1 : 0);
    }
    wg::commit();
  };
  auto issue_pv = [&](float (&o)[D / 2], const uint32_t (&p)[BN / 16][4], int st) {
    wg::fence();
#pragma unroll
    for (int k2 = 0; k2 < BN / 16; ++k2)  // V rows (keys) in 64-dim column tiles BN * 128 bytes apart
      mma_pv<D>(o, p[k2], wg::desc_sw128_mn(v_addr + uint32_t(st) * C::kv_bytes + uint32_t(k2 * 2048), BN * 128, 1024));
    wg::commit();
  };
  // Turn-taking: a consumer's last arrival is skipped when the other has no turn left to take.
  auto pp_sync = [&] {
    if constexpr (kPP) named_sync(my_bar, 256);
  };
  auto pp_arrive = [&](int jt) {
    if constexpr (kPP)
      if (!(cw == 1 && jt == ntiles - 1)) named_arrive(other_bar, 256);
  };

  float o[D / 2];
#pragma unroll
  for (int j = 0; j < D / 2; ++j) o[j] = 0.0f;
  Softmax<D, BN> sm;
  float sc[BN / 2];
  uint32_t p[BN / 16][4];

  if constexpr (kIW) {
    // Tile 0: S, softmax. Then for each tile j: S(j) and P(j-1) V(j-1) issued together, softmax(j)
    // under P V. Last: P V of the last tile.
    mbar_wait(full_k(0), 0);
    pp_sync();
    issue_s(sc, 0);
    pp_arrive(0);
    wg::wait<0>();
    wg::fence_regs(sc);
    if (lane == 0) mbar_arrive(empty_k(0));
    sm.step(sc, BN > full_end, 0, tig, lim, sl2);
    sm.pack(sc, p);
    int st_prev = 0, st = 0;
    uint32_t ph = 0;
#pragma unroll 1
    for (int jt = 1; jt < ntiles; ++jt) {
      if (++st == STAGES) st = 0, ph ^= 1;
      const int kb = jt * BN;
      mbar_wait(full_k(st), ph);
      pp_sync();
      issue_s(sc, st);
      sm.rescale(o);
      mbar_wait(full_v(st_prev), ph ^ (st == 0 ? 1u : 0u));
      issue_pv(o, p, st_prev);
      pp_arrive(jt);
      wg::wait<1>();
      wg::fence_regs(sc);
      if (lane == 0) mbar_arrive(empty_k(st));
      sm.step(sc, kb + BN > full_end, kb, tig, lim, sl2);  // under P V(jt - 1)
      wg::wait<0>();
      wg::fence_regs(o);
      if (lane == 0) mbar_arrive(empty_v(st_prev));
      sm.pack(sc, p);
      st_prev = st;
    }
    sm.rescale(o);
    mbar_wait(full_v(st), ph);
    issue_pv(o, p, st);
    wg::wait<0>();
    wg::fence_regs(o);
  } else {
    int st = 0;
    uint32_t ph = 0;
#pragma unroll 1
    for (int jt = 0; jt < ntiles; ++jt) {
      const int kb = jt * BN;
      mbar_wait(full_k(st), ph);
      pp_sync();
      issue_s(sc, st);
      pp_arrive(jt);
      wg::wait<0>();
      wg::fence_regs(sc);
      if (lane == 0) mbar_arrive(empty_k(st));
      sm.step(sc, kb + BN > full_end, kb, tig, lim, sl2);
      sm.pack(sc, p);
      sm.rescale(o);
      mbar_wait(full_v(st), ph);
      issue_pv(o, p, st);
      wg::wait<0>();
      wg::fence_regs(o);
      if (lane == 0) mbar_arrive(empty_v(st));
      if (++st == STAGES) st = 0, ph ^= 1;
    }
  }

  if constexpr (kV2) {
    const int64_t grow[2] = {row0 + tok[0], row0 + tok[1]};
    store_rows_v2<D, true>(a, o, sm.l, valid, grow, head, tig);
    return;
  }
  float l[2] = {sm.l[0], sm.l[1]};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!valid[i]) continue;
    const int64_t grow = row0 + tok[i];
    const float inv = 1.0f / l[i];
    bf16* orow = a.out + (grow * a.Hq + head[i]) * D;
    const bf16* grow_gate = a.gate ? a.gate + grow * a.g_ts + int64_t(head[i]) * a.g_hs : nullptr;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int d = 8 * j + 2 * tig;
      float v0 = o[4 * j + 2 * i] * inv, v1 = o[4 * j + 2 * i + 1] * inv;
      if (grow_gate) {
        const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(grow_gate + d));
        v0 *= sigmoidf_(gf.x);
        v1 *= sigmoidf_(gf.y);
      }
      *reinterpret_cast<__nv_bfloat162*>(orow + d) = __floats2bfloat162_rn(v0, v1);
    }
  }
}

template <int D, int BN, int STAGES, bool kPP, bool kIW, bool kQR = false, bool kV2 = false, bool kTall = false>
void launch_cfg(const FlashArgs& a, dim3 grid, cudaStream_t stream) {
  using C = WsCfg<D, BN, STAGES>;
  constexpr size_t smem = C::smem + 16;  // + the Q tile's mbarrier
  static_assert(smem <= 227 * 1024, "shared memory");
  static_assert(!kTall || kV2, "tall boxes: the V2 producer");
  auto* k = attn_ws_kernel<bf16, D, BN, STAGES, kPP, kIW, kQR, kV2, kTall>;
  static std::once_flag once;
  std::call_once(once, [k] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  });
  const CUtensorMap mk = kv_map(a.kc, a.Hkv, D), mv = kv_map(a.vc, a.Hkv, D);
  // (the tall maps are encoded only where the kernel reads them; otherwise the piece maps again)
  const CUtensorMap mkt = kTall ? kv_map(a.kc, a.Hkv, D, BN) : mk, mvt = kTall ? kv_map(a.vc, a.Hkv, D, BN) : mv;
  const bool q_tma = kV2 && q_tma_ok(a);
  const CUtensorMap mq = q_tma ? q_map(a) : mk;
  launch_pdl(k, grid, dim3(kThreads), smem, stream, mk, mv, mkt, mvt, mq, a, q_tma);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool ws_supports(int head_dim, int block_size) {
  return (head_dim == 64 || head_dim == 128 || head_dim == 192 || head_dim == 256) && block_size % 16 == 0;
}

void launch_attention_ws(FlashArgs a, int num_seqs, int max_q_len, WsVariant v, cudaStream_t stream) {
  MOEFOLD_CHECK(ws_supports(a.dh, a.block_size),
                "attention (ws): head_dim {} / page size {} not supported (64, 128, 192, 256; pages of 16k tokens)",
                a.dh, a.block_size);
  MOEFOLD_CHECK(reinterpret_cast<uintptr_t>(a.kc) % 16 == 0 && reinterpret_cast<uintptr_t>(a.vc) % 16 == 0,
                "attention (ws): caches must be 16-byte aligned");
  a.HB = std::min(a.G, kBM);
  a.TB = kBM / a.HB;
  a.head_chunks = (a.G + a.HB - 1) / a.HB;
  a.bs_shift = (a.block_size & (a.block_size - 1)) == 0 ? __builtin_ctz(unsigned(a.block_size)) : -1;
  a.qtiles = (max_q_len + a.TB - 1) / a.TB;
  a.vec_out = reinterpret_cast<uintptr_t>(a.out) % 16 == 0 && a.dh % 32 == 0;
  MOEFOLD_CHECK(a.qtiles <= 65535, "attention_prefill: {} query rows per sequence exceed the grid ({} tiles)",
                max_q_len, a.qtiles);
  if ((v == WsVariant::Persist || v == WsVariant::PersistTall) && (a.dh == 128 || a.dh == 256)) {
    launch_attention_ws_persist(a, num_seqs, v == WsVariant::PersistTall, stream);
    return;
  }
  const dim3 grid(unsigned(a.Hkv * a.head_chunks), unsigned(num_seqs), unsigned(a.qtiles));
  switch (a.dh) {
    case 64: launch_cfg<64, 128, 2, true, true>(a, grid, stream); break;
    case 192: launch_cfg<192, 64, 2, true, true>(a, grid, stream); break;
    case 128:  // default: softmax under P V without ping-pong, Q in registers (the fastest on the H200)
      switch (v) {
        case WsVariant::PingPong: launch_cfg<128, 128, 2, true, true>(a, grid, stream); break;
        case WsVariant::NoOverlap: launch_cfg<128, 128, 2, true, false>(a, grid, stream); break;
        case WsVariant::Plain: launch_cfg<128, 128, 2, false, false>(a, grid, stream); break;
        case WsVariant::Stages3: launch_cfg<128, 128, 3, true, true>(a, grid, stream); break;
        case WsVariant::NoPingPong: launch_cfg<128, 128, 2, false, true>(a, grid, stream); break;  // Q in smem
        case WsVariant::V2: launch_cfg<128, 128, 2, false, true, true, true>(a, grid, stream); break;
        case WsVariant::V2Tall: launch_cfg<128, 128, 2, false, true, true, true, true>(a, grid, stream); break;
        default: launch_cfg<128, 128, 2, false, true, true>(a, grid, stream); break;  // also QRegs
      }
      break;
    default:  // 256; default: ping-pong + overlap on 80-key tiles (3 stages do not fit)
      switch (v) {
        case WsVariant::NoPingPong: launch_cfg<256, 80, 2, false, true>(a, grid, stream); break;
        case WsVariant::NoOverlap: launch_cfg<256, 80, 2, true, false>(a, grid, stream); break;
        case WsVariant::Plain: launch_cfg<256, 80, 2, false, false>(a, grid, stream); break;
        case WsVariant::Bn64: launch_cfg<256, 64, 2, true, true>(a, grid, stream); break;
        case WsVariant::V2: launch_cfg<256, 80, 2, true, true, false, true>(a, grid, stream); break;
        case WsVariant::V2Tall: launch_cfg<256, 80, 2, true, true, false, true, true>(a, grid, stream); break;
        default: launch_cfg<256, 80, 2, true, true>(a, grid, stream); break;
      }
      break;
  }
}

}  // namespace moefold::cuda::detail
