#!/usr/bin/env bash
# One GPU call (session 12): the GPU test binaries whose sources became .cc files (no device code of their
# own: g++ compiles them instead of nvcc), the fused route's timing a warp a row vs wide (A B B A), and
# bench offline on the 35B shape at decode batch 1, 2, 8 with A = MOEFOLD_MOE_ROUTE=narrow, B = the
# defaults (wide), A B B A, the router logits back at their 3-deep ring.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/session12_final.sh [BUILD]
set -u
B=${1:-build-cuda}
T=$B/tests
out=${OUT:-/tmp}/s12c
mkdir -p "$out"
: >"$out/table.txt"
. "$(dirname "$0")/step.sh"
for t in moe_test gated_delta_net_test qk_norm_rope_test moe_fp8_prefill_test; do step $t 240 "$T/$t" & done
wait
for t in fp8_kernels_test decode_gemm_test gemv_test gated_rms_norm_test; do step $t 240 "$T/$t" & done
wait
step route_perf 120 "$T/moe_test" --gtest_filter='MoeRoutePerf.DISABLED_WideVsNarrow' --gtest_also_run_disabled_tests
grep PERF "$out/route_perf.log" >>"$out/table.txt"
A_ENV=MOEFOLD_MOE_ROUTE=narrow A_FLAGS= bash "$(dirname "$0")/decode_ab.sh" "$B/moefold" configs/qwen3.6-35b-a3b \
  "$out/ab" --load-format dummy --decode-batch 1,2,8 --require-kernel router_topk_plan_fast_kernel >"$out/ab.log" 2>&1
tail -5 "$out/ab.log" >>"$out/table.txt"
cat "$out/table.txt"
