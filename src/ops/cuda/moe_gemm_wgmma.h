// Internal to the MoE chain (moe_experts.cu, moe_gemm_wgmma.cu, tests): the Hopper warpgroup (wgmma)
// version of the 128-row expert GEMMs of moe_gemm.cuh, the default (MOEFOLD_MOE_GEMM=mma selects
// the mma.sync tiles). Same function and bits as the tiles: per output element one fp32 chain of k16
// steps over K ascending from zero (a wgmma m64nNk16 step rounds as an mma.sync m16n8k16 step:
// tests/cuda/wgmma_probe_test.cu), the same SwiGLU epilogue, one rounding to bf16.
#pragma once
#include <cuda_runtime.h>

#include "ops/cuda/moe.h"

namespace moefold::cuda::moe_detail {

struct GemmParams;  // moe_gemm.cuh

/// Whether the 128-row expert tiles (moe_expert_config 2) run the wgmma kernels: MOEFOLD_MOE_GEMM
/// (read once): unset, "" or "wgmma" = yes (the default), "mma" = no; any other value throws moefold::Error. The
/// setter overrides it (tests, A/B timing) and forces the tile width (0: automatic, 128 or 256; other
/// values throw moefold::Error); the bits do not change.
bool expert_gemm_wgmma();
void set_expert_gemm_wgmma(bool on, int tile_n = 0);

/// The B rows of one wgmma tile for `shape`'s gate_up (true) or down GEMM: the forced width, else 256
/// when the columns split into whole tiles (gate_up: I % 128, down: H % 256), else 128 (every shape
/// MoeShape allows: I % 64, H % 128).
int expert_gemm_wgmma_tile_n(const MoeShape& shape, bool gate_up);

/// gate_up + SwiGLU (GemmParams of GemmMode::kExpertGateUp, the 128-row plan tiles): act[j, :] for every
/// planned pair j, as moe_gemm_kernel<CfgPrefill, kExpertGateUp>. E: experts of gate_up ([E, 2I, H]);
/// max_tiles: the worst case of plan tiles (the live count is read from p.num_tiles on the device).
/// Asynchronous; throws moefold::Error on a launch error.
void launch_wgmma_gate_up(const GemmParams& p, int E, int max_tiles, cudaStream_t stream);
/// down (GemmParams of GemmMode::kExpertDown): y[pairs[j], :] for every planned pair j. Asynchronous.
void launch_wgmma_down(const GemmParams& p, int E, int max_tiles, cudaStream_t stream);

}  // namespace moefold::cuda::moe_detail
