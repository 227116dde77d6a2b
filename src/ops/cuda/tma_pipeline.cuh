// Device helpers shared by the warp-specialised TMA + mbarrier wgmma kernels (prefill_gemm_wgmma.cu,
// moe_gemm_wgmma.cu): the 2-D bulk tensor copy, the predicated one-lane mbarrier arrival a consumer
// warp releases a stage with, the grouped raster of a persistent grid, and the 16-byte cp.async to a
// shared-memory (state space) address with zero fill. Semantics: the PTX ISA sections
// "cp.async.bulk.tensor", "mbarrier" and "cp.async".
#pragma once
#include <cstdint>

namespace moefold::cuda::tma {

/// Bulk tensor copy of the box at (c0 = column, c1 = row) of the 2-D map `map` (a __grid_constant__
/// parameter) to shared address `dst`, completing its bytes on mbarrier `bar`.
__device__ __forceinline__ void tma_2d(uint32_t dst, const void* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

/// One arrival on mbarrier `bar` by the threads with `lane` == 0, as a predicated instruction rather
/// than a branch: a branch around it between wgmma issue and wait is a divergent path on which ptxas
/// serialises every wgmma of the kernel (its warning C7518).
__device__ __forceinline__ void mbar_arrive_lane0(uint32_t bar, int lane) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.s32 p, %1, 0;\n@p mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"(lane)
      : "memory");
}

/// Tile t of the grouped raster over row_tiles x col_tiles, GROUP row tiles sweeping the column tiles
/// together (L2 reuse of the weights): (row tile mt, column tile nt).
template <int GROUP>
__device__ __forceinline__ void raster(int t, int row_tiles, int col_tiles, int& mt, int& nt) {
  const int per_group = GROUP * col_tiles;
  const int first_m = (t / per_group) * GROUP;
  const int gsize = min(row_tiles - first_m, GROUP);
  const int in = t % per_group;
  mt = first_m + in % gsize;
  nt = in / gsize;
}

/// 16-byte cp.async (L2 only) from global `src` to shared address `dst`; `valid` false reads nothing
/// and zero-fills the 16 bytes.
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

}  // namespace moefold::cuda::tma
