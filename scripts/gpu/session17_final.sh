#!/usr/bin/env bash
# Session 17's last H200 call: the FP8 decode kernels with the hardware e4m3 conversion
# (fp8_mma.cuh: cvt.rn.f16x2.e4m3x2) and the one-token stream expert kernels with the shared expert
# inside (moe_fp8_stream.cu). Contract tests and sanitizers, the end-to-end GPU suites, then bench offline
# -q fp8 at batch 1 / 8 / 64, A B B A (A: OLD_BIN, main before the session; B: this tree), B without the
# fused shared expert (MOEFOLD_MOE_SHARED_STREAM=0) and with the register-fed experts
# (MOEFOLD_MOE_FP8_STREAM=0), and bf16 batch 1 beside it.
# Usage: [FP8_FILTER=gtest filter] [SUITES='...'] [RUNS='A B ...'] [BATCHES=1,8] [SHORT=1]
#        scripts/gpu/session17_final.sh BIN_DIR OLD_BIN OUT_DIR
set -uo pipefail
b=$1 old=$2 out=$3
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
echo "== fp8_kernels_test (MOEFOLD_FP8_QUICK=1)"
MOEFOLD_FP8_QUICK=1 timeout 300 "$b/tests/fp8_kernels_test" --gtest_filter="${FP8_FILTER:-*}" > "$out/fp8_kernels.txt" 2>&1
echo "rc $?: $(grep -c 'verdict=PASS' "$out/fp8_kernels.txt") pass, $(grep -c 'verdict=FAIL' "$out/fp8_kernels.txt") fail"
grep -E '^\[  (PASSED|FAILED) |^\[  FAILED' "$out/fp8_kernels.txt" | head -8
echo "== memcheck MoeFp8.StreamEqualsRegisterFedBitwise + Fp8Gemv.F32OutAndExactDecoding"
MOEFOLD_FP8_SMALL=1 timeout 150 compute-sanitizer --tool memcheck --print-limit 4 "$b/tests/fp8_kernels_test" \
  --gtest_filter='MoeFp8.StreamEqualsRegisterFedBitwise:MoeFp8.SharedExpert*:Fp8Gemv.F32OutAndExactDecoding' 2>&1 | grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' | head -4
for t in ${SUITES:-cuda_executor_test cuda_graph_test mixed_step_cuda_test}; do
  echo "== $t"
  timeout 240 "$b/tests/$t" > "$out/$t.txt" 2>&1
  echo "rc $?"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED' "$out/$t.txt" | head -6
done
echo "== bench offline -q fp8: A = old binary, B = this tree"
i=0
for run in ${RUNS:-A B B A B:shared0 B:stream0}; do
  i=$((i + 1))
  bin=$b/moefold envs=()
  case $run in A) bin=$old ;; B:shared0) envs=(MOEFOLD_MOE_SHARED_STREAM=0) ;; B:stream0) envs=(MOEFOLD_MOE_FP8_STREAM=0) ;; esac
  env "${envs[@]}" "$bin" bench offline --model $model --load-format dummy --prefill 0 --decode-batch "${BATCHES:-1,8,64}" \
    --decode-steps 16 -q fp8 > "$out/plain_$i.log" 2>&1
  echo "$run: $(grep -E '^decode' "$out/plain_$i.log" | tr -s ' ' | cut -d' ' -f1-5 | tr '\n' ' ')"
done
[ -n "${SHORT:-}" ] && exit 0
"$b/moefold" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1 --decode-steps 16 \
  > "$out/plain_bf16.log" 2>&1
echo "bf16: $(grep -E '^decode' "$out/plain_bf16.log" | tr -s ' ' | cut -d' ' -f1-5)"
MOEFOLD_FP8_BENCH=1 MOEFOLD_FP8_BENCH_MOE_ONLY=1 timeout 200 "$b/tests/fp8_kernels_test" --gtest_filter='Fp8Bench.*' \
  > "$out/bench.txt" 2>&1
grep -E 'BENCH (ceiling|moe_fp8_batch1|moe_fp8 T=(1|8|64) )' "$out/bench.txt"
lib=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1 || true)
[ -n "$lib" ] && export MOEFOLD_CUPTI_LIBRARY=$lib
"$b/moefold" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1 --decode-steps 12 -q fp8 \
  --timeline --timeline-rows 30 > "$out/traced.log" 2>&1
sed -n '/^decode batch 1:/,$p' "$out/traced.log" | head -36
