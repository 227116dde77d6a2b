#!/usr/bin/env bash
# Session 15's last H200 call on main (the session-14 kernels): the end-to-end GPU suites, then the
# decode GEMM's pre-wait L2 prefetch with the workspace combine (MOEFOLD_DECODE_GEMM_CFG=new_nocl, never
# measured in a whole step) against the default at batches 1 and 8, palindrome order.
# Usage: scripts/gpu/session15_final.sh BIN_DIR OUT_DIR
set -uo pipefail
b=$1 out=$2
mkdir -p "$out"
for t in cuda_graph_test cuda_executor_test mixed_step_cuda_test prefix_cache_cuda_test decode_gemm_cfg_test:'DecodeGemmCfg.NewEqualsOld' \
  moe_test:'MoeChain.TileConfigsBitIdentical:MoeSharedStream.*:MoeStream.*'; do
  name=${t%%:*} filter='*'
  [ "$name" != "$t" ] && filter=${t#*:}
  echo "== $name"
  timeout 200 "$b/$name" --gtest_filter="$filter" 2>&1 | grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|rror' | head -8
done
m=$b/moefold
bash scripts/gpu/decode_configs.sh "$out/cfg" "old:$m:MOEFOLD_DECODE_GEMM_CFG=old nocl:$m:MOEFOLD_DECODE_GEMM_CFG=new_nocl" \
  --decode-batch 1,8
