// The persistent form of the warp-specialised prefill attention kernel (AttnKernel::WsPersist;
// attention_flash.h WsVariant::Persist): attention_ws.cu's kernel with its V2 data movement, one block
// per multiprocessor walking the work items. Contract as attention.h.
#include "ops/cuda/attention_ws.cuh"
// (first: it includes cuda_check.h first)
#include <algorithm>
#include <mutex>

#include "ops/cuda/pdl.cuh"
#include "ops/cuda/tma_map.h"

namespace moefold::cuda::detail {
using namespace ptx;
namespace {

/// The persistent form (WsVariant::Persist): one block per multiprocessor walks the work items of
/// attn_ws_kernel's grid in that grid's order (longest query tiles first): block b takes items b,
/// 2P - 1 - b, 2P + b, ... (P blocks; a snake, so that the long and the short items even out). The
/// producer runs on into the next item's K/V while the consumers finish and store the current one,
/// and the K/V rings run on across items. Per item: attn_ws_kernel's kV2 path (the same tiles in the
/// same order, the same arithmetic), so the same bits. kIW always; kPP, kQR as there; kTall: tall
/// boxes where a tile's pages are consecutive (WsVariant::PersistTall; attention_ws.cuh load_tile).
template <typename KV, int D, int BN_, int STAGES, bool kPP, bool kQR, bool kTall>
__global__ void __launch_bounds__(kThreads, 1)
    attn_ws_persist_kernel(const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                           const __grid_constant__ CUtensorMap tmk_tall, const __grid_constant__ CUtensorMap tmv_tall,
                           const FlashArgs a, int num_seqs) {
  static_assert(std::is_same_v<KV, bf16>, "the products read bf16 K/V");
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
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wgi = warp >> 2;
  const int NX = a.Hkv * a.head_chunks, items = NX * num_seqs * a.qtiles, P = int(gridDim.x), b = int(blockIdx.x);
  auto item_of = [&](int k) { return k * P + ((k & 1) ? P - 1 - b : b); };
  struct Item {
    int s, kvh, hchunk, row0, n, ctx, t0, kv_end, ntiles;
  };
  // Work item w (attn_ws_kernel's block (x, y, z) = (w % NX, w / NX % S, w / (NX S))); false: no rows.
  auto decode = [&](int w, Item& it) {
    const int x = w % NX, y = (w / NX) % num_seqs, z = w / (NX * num_seqs);
    it.s = y, it.kvh = x / a.head_chunks, it.hchunk = x % a.head_chunks;
    it.row0 = a.cu[y], it.n = a.cu[y + 1] - it.row0, it.ctx = a.ctx[y];
    it.t0 = (a.qtiles - 1 - z) * a.TB;
    if (it.ctx < 0 || it.t0 >= it.n) return false;
    it.kv_end = it.ctx + min(it.t0 + a.TB, it.n);
    it.ntiles = (it.kv_end + BN - 1) / BN;
    return true;
  };
  // Ring position r (tiles of this block so far): stage and phase parity.
  auto stage = [](int r) { return r % STAGES; };
  auto phase = [](int r) { return uint32_t(r / STAGES) & 1u; };

  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(full_k(st), 32);
      mbar_init(full_v(st), 32);
      mbar_init(empty_k(st), 8);
      mbar_init(empty_v(st), 8);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wgi == 0) {  // ---- producer: attn_ws_kernel's kV2 order, item after item ----
    setmaxnreg_dec<kProducerRegs>();
    if (warp != 0) return;
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmk)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmv)) : "memory");
      if constexpr (kTall) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmk_tall)) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmv_tall)) : "memory");
      }
    }
    int r0 = 0;
#pragma unroll 1
    for (int k = 0;; ++k) {
      const int w = item_of(k);
      if (w >= items) break;
      Item it;
      if (!decode(w, it)) continue;
      const int32_t* bt = a.bt + int64_t(it.s) * a.max_blocks;
      int slot = piece_slot<BN>(a, bt, 0, it.kv_end, lane), slot_prev = 0;
      if (k > 0)  // the consumers load this item's Q when they are done with the previous item
        prefetch_rows<D>(a, a.q, a.q_ts, a.q_hs, it.row0, it.n, it.t0, it.kvh, it.hchunk, lane);
#pragma unroll 1
      for (int jt = 0; jt <= it.ntiles; ++jt) {
        const int kb = jt * BN;
        const int slot_next = jt + 1 < it.ntiles ? piece_slot<BN>(a, bt, kb + BN, it.kv_end, lane) : 0;
        if (jt < it.ntiles) {
          const int st = stage(r0 + jt);
          mbar_wait(empty_k(st), phase(r0 + jt) ^ 1);
          load_tile<KV, D, BN, true, kTall>(&tmk, a.kc, a, bt, it.kvh, kb, it.kv_end,
                                            k_addr + uint32_t(st) * C::kv_bytes, full_k(st), lane, slot, &tmk_tall);
        }
        if (jt > 0) {
          const int st = stage(r0 + jt - 1);
          mbar_wait(empty_v(st), phase(r0 + jt - 1) ^ 1);
          load_tile<KV, D, BN, false, kTall>(&tmv, a.vc, a, bt, it.kvh, kb - BN, it.kv_end,
                                             v_addr + uint32_t(st) * C::kv_bytes, full_v(st), lane, slot_prev, &tmv_tall);
        }
        slot_prev = slot, slot = slot_next;
      }
      r0 += it.ntiles;
      if (a.gate) prefetch_rows<D>(a, a.gate, a.g_ts, a.g_hs, it.row0, it.n, it.t0, it.kvh, it.hchunk, lane);
    }
    return;
  }

  // ---- consumers: warpgroup cw owns rows cw * 64 .. + 63 of every item ----
  setmaxnreg_inc<kConsumerRegs>();
  const int cw = wgi - 1, ctid = tid - 128 - cw * 128, w4 = warp & 3, g = lane >> 2, tig = lane & 3;
  const uint32_t qa = q_addr + uint32_t(cw * 64 * 128);
  const float sl2 = a.scale_log2;
  const int my_bar = 3 + cw, other_bar = 3 + (cw ^ 1);
  int r0 = 0;
#pragma unroll 1
  for (int k = 0;; ++k) {
    const int w = item_of(k);
    if (w >= items) break;
    Item it;
    if (!decode(w, it)) continue;
    // Q rows of this item (the previous item's products that read them have all completed).
    for (int idx = ctid; idx < 64 * CH; idx += 128) {
      const int rb = cw * 64 + idx / CH, c = idx % CH, tb = rb / a.HB, hg = it.hchunk * a.HB + rb % a.HB;
      unsigned char* d = base + sw_off(rb, c * 8, kBM);
      if (tb < a.TB && it.t0 + tb < it.n && hg < a.G)
        cp_async16(d, a.q + int64_t(it.row0 + it.t0 + tb) * a.q_ts + int64_t(it.kvh * a.G + hg) * a.q_hs + c * 8);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
    cp_async_commit();
    // This thread's rows i: (token tb, q head hg) of the item; whether they exist.
    auto row_of = [&](int i, int& tb, int& hg) {
      const int rb = cw * 64 + w4 * 16 + g + 8 * i;
      tb = rb / a.HB, hg = it.hchunk * a.HB + rb % a.HB;
      return tb < a.TB && it.t0 + tb < it.n && hg < a.G;
    };
    int lim[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int tb, hg;
      lim[i] = row_of(i, tb, hg) ? it.ctx + it.t0 + tb : it.kv_end - 1;
    }
    const int full_end = it.ctx + it.t0 + 1, ntiles = it.ntiles;
    cp_async_wait_all();
    wg::fence_proxy_async();
    named_sync(1 + cw, 128);
    if (kPP && cw == 1) named_arrive(3, 256);
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
        const uint64_t db =
            wg::desc_sw128(k_addr + uint32_t(st) * C::kv_bytes + uint32_t((kk >> 2) * BN * 128 + (kk & 3) * 32));
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
      for (int k2 = 0; k2 < BN / 16; ++k2)
        mma_pv<D>(o, p[k2], wg::desc_sw128_mn(v_addr + uint32_t(st) * C::kv_bytes + uint32_t(k2 * 2048), BN * 128, 1024));
      wg::commit();
    };
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
    {
      const int st = stage(r0);
      mbar_wait(full_k(st), phase(r0));
      pp_sync();
      issue_s(sc, st);
      pp_arrive(0);
      wg::wait<0>();
      wg::fence_regs(sc);
      if (lane == 0) mbar_arrive(empty_k(st));
      sm.step(sc, BN > full_end, 0, tig, lim, sl2);
      sm.pack(sc, p);
    }
#pragma unroll 1
    for (int jt = 1; jt < ntiles; ++jt) {
      const int kb = jt * BN, st = stage(r0 + jt), st_prev = stage(r0 + jt - 1);
      mbar_wait(full_k(st), phase(r0 + jt));
      pp_sync();
      issue_s(sc, st);
      sm.rescale(o);
      mbar_wait(full_v(st_prev), phase(r0 + jt - 1));
      issue_pv(o, p, st_prev);
      pp_arrive(jt);
      wg::wait<1>();
      wg::fence_regs(sc);
      if (lane == 0) mbar_arrive(empty_k(st));
      sm.step(sc, kb + BN > full_end, kb, tig, lim, sl2);
      wg::wait<0>();
      wg::fence_regs(o);
      if (lane == 0) mbar_arrive(empty_v(st_prev));
      sm.pack(sc, p);
    }
    {
      const int st = stage(r0 + ntiles - 1);
      sm.rescale(o);
      mbar_wait(full_v(st), phase(r0 + ntiles - 1));
      issue_pv(o, p, st);
      wg::wait<0>();
      wg::fence_regs(o);
      if (lane == 0) mbar_arrive(empty_v(st));  // (the ring runs on into the next item)
    }
    r0 += ntiles;
    int head[2];
    int64_t grow[2];
    bool valid[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int tb, hg;
      valid[i] = row_of(i, tb, hg);
      grow[i] = it.row0 + it.t0 + tb;
      head[i] = it.kvh * a.G + hg;
    }
    store_rows_v2<D>(a, o, sm.l, valid, grow, head, tig);
  }
}

/// The persistent form: min(work items, multiprocessors) blocks.
template <int D, int BN, int STAGES, bool kPP, bool kQR, bool kTall>
void launch_persist(const FlashArgs& a, int num_seqs, cudaStream_t stream) {
  using C = WsCfg<D, BN, STAGES>;
  static_assert(C::smem <= 227 * 1024, "shared memory");
  auto* k = attn_ws_persist_kernel<bf16, D, BN, STAGES, kPP, kQR, kTall>;
  static std::once_flag once;
  std::call_once(once, [k] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::smem)));
  });
  const int64_t items = int64_t(a.Hkv) * a.head_chunks * num_seqs * a.qtiles;
  MOEFOLD_CHECK(items < (int64_t(1) << 31) - 2 * 65536, "attention (ws persistent): {} work items", items);
  const CUtensorMap mk = kv_map(a.kc, a.Hkv, D), mv = kv_map(a.vc, a.Hkv, D);
  const CUtensorMap mkt = kTall ? kv_map(a.kc, a.Hkv, D, BN) : mk, mvt = kTall ? kv_map(a.vc, a.Hkv, D, BN) : mv;
  const dim3 grid(unsigned(std::min<int64_t>(items, device_sm_count())));
  launch_pdl(k, grid, dim3(kThreads), C::smem, stream, mk, mv, mkt, mvt, a, num_seqs);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_attention_ws_persist(const FlashArgs& a, int num_seqs, bool tall, cudaStream_t stream) {
  MOEFOLD_CHECK(a.dh == 128 || a.dh == 256, "attention (ws persistent): head_dim {} (128 or 256)", a.dh);
  if (a.dh == 128) {
    if (tall) launch_persist<128, 128, 2, false, true, true>(a, num_seqs, stream);
    else launch_persist<128, 128, 2, false, true, false>(a, num_seqs, stream);
  } else {
    if (tall) launch_persist<256, 80, 2, true, false, true>(a, num_seqs, stream);
    else launch_persist<256, 80, 2, true, false, false>(a, num_seqs, stream);
  }
}

}  // namespace moefold::cuda::detail
