#!/usr/bin/env bash
# The streaming expert kernels with A in registers and a weights-only ring (src/ops/cuda/moe_stream.cu,
# MOEFOLD_MOE_STREAM_REG_A = 0 ring A, 1 register A, 2 register A and up to 9 stages, 3 twice the stages,
# the default) on the H200: compute-sanitizer memcheck at the 35B shape, the bitwise contract tests at
# modes 3 and 2, the end-to-end graph and mixed-step suites, then bf16 decode at batch 1 on the 35B
# shape, one binary, palindrome order.
# Usage: scripts/gpu/session15_reg_a.sh BIN_DIR OUT_DIR
set -uo pipefail
b=$1 out=$2
mkdir -p "$out"
R=MOEFOLD_MOE_STREAM_REG_A
echo "== sanitizer, mode 3, 35B shape"
timeout 120 compute-sanitizer --tool memcheck --print-limit 4 "$b/moe_test" --gtest_filter='MoeStream.GraphReplay35BShape' 2>&1 |
  grep -E 'ERROR SUMMARY|PASSED|FAILED' | head -5
for mode in 3 2; do
  echo "== moe_test, mode $mode"
  env $R=$mode timeout 240 "$b/moe_test" --gtest_filter='MoeChain.TileConfigsBitIdentical:MoeSharedStream.*:MoeStream.*' 2>&1 |
    grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|tests? ran|rror' | head -12
done
for t in cuda_graph_test mixed_step_cuda_test; do
  echo "== $t"
  timeout 240 "$b/$t" 2>&1 | grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|rror' | head -8
done
m=$b/moefold
bash scripts/gpu/decode_configs.sh "$out/b1" "a0:$m:$R=0 a2:$m:$R=2 a3:$m:$R=3" --decode-batch 1
