#!/usr/bin/env bash
# Session 17: the one-token FP8 stream expert kernels (moe_fp8_stream.cu). Contract tests (bitwise against
# the register-fed kernels, the ideal chain), compute-sanitizer, the FP8 executor / graph suites, then
# bench offline -q fp8 at batch 1 and 8 with MOEFOLD_MOE_FP8_STREAM=0 1 1 0 and one traced batch-1 step.
# Usage: [SKIP_TESTS=1] scripts/gpu/session17_fp8_stream.sh BIN_DIR OUT_DIR
set -uo pipefail
b=$1 out=$2
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== fp8_kernels_test MoeFp8.*"
  MOEFOLD_FP8_QUICK=1 timeout 240 "$b/tests/fp8_kernels_test" --gtest_filter='MoeFp8.*' > "$out/fp8_moe.txt" 2>&1
  echo "rc $?"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|FAIL ' "$out/fp8_moe.txt" | head -12
  grep -E 'moe_fp8_stream' "$out/fp8_moe.txt" | head -4
  for tool in memcheck racecheck synccheck; do
    echo "== $tool StreamEqualsRegisterFedBitwise (small shapes)"
    MOEFOLD_FP8_SMALL=1 timeout 120 compute-sanitizer --tool $tool --print-limit 4 "$b/tests/fp8_kernels_test" \
      --gtest_filter='MoeFp8.StreamEqualsRegisterFedBitwise' > "$out/san_$tool.txt" 2>&1
    echo "rc $?"; grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED|Error' "$out/san_$tool.txt" | head -4
  done
  for t in cuda_executor_test:'*Fp8*' cuda_graph_test:'*'; do
    name=${t%%:*} filter=${t#*:}
    echo "== $name $filter"
    timeout 200 "$b/tests/$name" --gtest_filter="$filter" > "$out/$name.txt" 2>&1
    echo "rc $?"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED' "$out/$name.txt" | head -8
  done
fi
lib=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1 || true)
[ -n "$lib" ] && export MOEFOLD_CUPTI_LIBRARY=$lib
echo "== bench offline -q fp8, MOEFOLD_MOE_FP8_STREAM A B B A (A = 0)"
i=0
for v in 0 1 1 0; do
  i=$((i + 1))
  MOEFOLD_MOE_FP8_STREAM=$v "$b/moefold" bench offline --model $model --load-format dummy --prefill 0 \
    --decode-batch 1,8 --decode-steps 16 -q fp8 > "$out/plain_$i.log" 2>&1
  echo "stream=$v: $(grep -E '^decode' "$out/plain_$i.log" | tr -s ' ' | tr '\n' ' ')"
done
MOEFOLD_MOE_FP8_STREAM=1 "$b/moefold" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1 \
  --decode-steps 12 -q fp8 --timeline --timeline-rows 30 > "$out/traced.log" 2>&1
sed -n '/^decode batch 1:/,$p' "$out/traced.log" | head -40
