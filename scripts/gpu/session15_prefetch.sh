#!/usr/bin/env bash
# The L2 prefetches of MOEFOLD_L2_PREFETCH (src/ops/cuda/l2_hint.h) on the H200: their contract tests
# (same bits with and without), then bf16 decode on the 35B shape, one binary, palindrome order
# (scripts/gpu/decode_configs.sh): at batch 1 each prefetch alone, none, all, and all with the decode
# GEMM's own pre-wait prefetch (MOEFOLD_DECODE_GEMM_CFG=new_nocl); then none vs all at BATCHES.
# Usage: scripts/gpu/session15_prefetch.sh BIN_DIR OUT_DIR [BATCHES]
set -uo pipefail
b=$1 out=$2 batches=${3:-2,4,8}
mkdir -p "$out"
for t in decode_gemm_cfg_test:'*NextPrefetch*' moe_test:'MoeRouteFast.BitwiseEqualsOldKernels:*Stream*:*Shared*' \
  cuda_graph_test:'*' mixed_step_cuda_test:'*'; do
  echo "== ${t%%:*}"
  timeout 240 "$b/${t%%:*}" --gtest_filter="${t#*:}" 2>&1 | grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|tests? ran|rror'
done
m=$b/moefold
P=MOEFOLD_L2_PREFETCH
bash scripts/gpu/decode_configs.sh "$out/b1" \
  "none:$m:$P=0 n:$m:$P=n s:$m:$P=s r:$m:$P=r nsr:$m:$P=nsr nsr_nocl:$m:$P=nsr,MOEFOLD_DECODE_GEMM_CFG=new_nocl" \
  --decode-batch 1
bash scripts/gpu/decode_configs.sh "$out/bn" "none:$m:$P=0 nsr:$m:$P=nsr" --decode-batch "$batches"
bash scripts/gpu/decode_configs.sh "$out/fp8" "none:$m:$P=0 nsr:$m:$P=nsr" -q fp8 --decode-batch 1
