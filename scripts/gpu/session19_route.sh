#!/usr/bin/env bash
# Session 19: the route taken inside the one-token FP8 stream kernels (no route kernel). Contract tests
# (bitwise vs the route kernel), sanitizers, the end-to-end suites, then bench offline -q fp8 with
# MOEFOLD_MOE_STREAM_ROUTE=0 (A) and 1 (B) in the order A B B A, and one traced step of B.
# Usage: [BATCHES=1,8] scripts/gpu/session19_route.sh BIN_DIR OUT_DIR
set -uo pipefail
b=$1 out=$2
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
summ() { grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|ERROR SUMMARY|RACECHECK SUMMARY' "$1" | head -8; }
echo "== fp8_kernels_test MoeFp8.*"
MOEFOLD_FP8_QUICK=1 timeout 300 "$b/tests/fp8_kernels_test" --gtest_filter='MoeFp8.*' > "$out/fp8_kernels.txt" 2>&1
echo "rc $?: $(grep -c 'verdict=PASS' "$out/fp8_kernels.txt") pass, $(grep -c 'verdict=FAIL' "$out/fp8_kernels.txt") fail"
summ "$out/fp8_kernels.txt"; grep 'verdict=FAIL' "$out/fp8_kernels.txt" | head -5
for tool in memcheck racecheck synccheck; do
  MOEFOLD_FP8_SMALL=1 timeout 200 compute-sanitizer --tool $tool "$b/tests/fp8_kernels_test" \
    --gtest_filter='MoeFp8.StreamRouteEqualsRouteKernelBitwise' > "$out/san_$tool.txt" 2>&1
  echo "$tool rc $?: $(summ "$out/san_$tool.txt" | tr '\n' ' ')"
done
for t in ${SUITES:-cuda_executor_test cuda_graph_test}; do
  echo "== $t"
  timeout 240 "$b/tests/$t" > "$out/$t.txt" 2>&1
  echo "rc $?"; summ "$out/$t.txt"
done
echo "== bench offline -q fp8: A = MOEFOLD_MOE_STREAM_ROUTE=0, B = on"
i=0
for run in ${RUNS:-A B B A}; do
  i=$((i + 1))
  r=1; [ "$run" = A ] && r=0
  MOEFOLD_MOE_STREAM_ROUTE=$r "$b/moefold" bench offline --model $model --load-format dummy --prefill 0 \
    --decode-batch "${BATCHES:-1,8}" --decode-steps 16 -q fp8 > "$out/plain_$i.log" 2>&1
  echo "$run: $(grep -E '^decode' "$out/plain_$i.log" | tr -s ' ' | cut -d' ' -f1-5 | tr '\n' ' ')"
done
"$b/moefold" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1 --decode-steps 16 \
  > "$out/plain_bf16.log" 2>&1
echo "bf16: $(grep -E '^decode' "$out/plain_bf16.log" | tr -s ' ' | cut -d' ' -f1-5)"
lib=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1 || true)
[ -n "$lib" ] && export MOEFOLD_CUPTI_LIBRARY=$lib
"$b/moefold" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1 --decode-steps 8 -q fp8 \
  --timeline --timeline-rows 14 --timeline-csv "$out/steps_fp8.csv" > "$out/traced_fp8.log" 2>&1
sed -n '/^decode batch 1:/,$p' "$out/traced_fp8.log" | head -20
