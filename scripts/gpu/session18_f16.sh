#!/usr/bin/env bash
# Session 18: FP8 decode kernels on f16 products (fp8_mma.cuh: weights decoded in one instruction a
# pair, activations staged once per CTA as power-of-two-scaled f16; the bf16 chain's bits). Contract and
# bitwise tests with sanitizers, the end-to-end GPU suites, the kernels alone (L2 flushed) with the f16
# chain on and off (F16_ENV names the switch), then bench offline -q fp8 A B B A (A: OLD_BIN, B: this
# tree) and B with the switch at 0. (First run: fp8_gemv, F16_ENV=MOEFOLD_FP8_F16; second: the stream
# gate_up kernel, MOEFOLD_MOE_FP8_F16.)
# Usage: [FP8_FILTER=gtest filter] [SUITES='...'] [RUNS='A B B A B:f16off'] [BATCHES=1,8]
#        scripts/gpu/session18_f16.sh BIN_DIR OLD_BIN OUT_DIR
set -uo pipefail
b=$1 old=$2 out=$3
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
sw=${F16_ENV:-MOEFOLD_MOE_FP8_F16}
san=${SAN_FILTER:-MoeFp8.StreamEqualsRegisterFedBitwise:MoeFp8.SharedExpert*}
summ() { grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|ERROR SUMMARY|RACECHECK SUMMARY' "$1" | head -8; }
echo "== fp8_kernels_test (MOEFOLD_FP8_QUICK=1) ${FP8_FILTER:-*}"
MOEFOLD_FP8_QUICK=1 timeout 300 "$b/tests/fp8_kernels_test" --gtest_filter="${FP8_FILTER:-*}" > "$out/fp8_kernels.txt" 2>&1
echo "rc $?: $(grep -c 'verdict=PASS' "$out/fp8_kernels.txt") pass, $(grep -c 'verdict=FAIL' "$out/fp8_kernels.txt") fail"
summ "$out/fp8_kernels.txt"; grep 'verdict=FAIL' "$out/fp8_kernels.txt" | head -5
for tool in memcheck racecheck synccheck; do
  echo "== $tool $san (small)"
  MOEFOLD_FP8_SMALL=1 timeout 200 compute-sanitizer --tool $tool --print-limit 4 "$b/tests/fp8_kernels_test" \
    --gtest_filter="$san" > "$out/$tool.txt" 2>&1
  summ "$out/$tool.txt"
done
for t in ${SUITES:-cuda_executor_test cuda_graph_test mixed_step_cuda_test}; do
  echo "== $t"
  timeout 240 "$b/tests/$t" > "$out/$t.txt" 2>&1
  echo "rc $?"; summ "$out/$t.txt"
done
echo "== FP8 kernels alone (Fp8Bench, L2 flushed): $sw on | off"
for f in 1 0; do
  env $sw=$f MOEFOLD_FP8_BENCH=1 ${BENCH_ENV:-MOEFOLD_FP8_BENCH_MOE_ONLY=1} timeout 200 "$b/tests/fp8_kernels_test" \
    --gtest_filter='Fp8Bench.*' > "$out/bench_f16_$f.txt" 2>&1
  echo "$sw=$f"; grep -E 'BENCH (ceiling|moe_fp8_batch1|fp8_gemv .*T=(1|8) |fp8_lm_head .*T=1 )' "$out/bench_f16_$f.txt"
done
echo "== bench offline -q fp8: A = old binary, B = this tree"
i=0
for run in ${RUNS:-A B B A B:f16off}; do
  i=$((i + 1))
  bin=$b/moefold envs=()
  case $run in A) bin=$old ;; B:f16off) envs=($sw=0) ;; esac
  env "${envs[@]}" "$bin" bench offline --model $model --load-format dummy --prefill 0 --decode-batch "${BATCHES:-1,8}" \
    --decode-steps 16 -q fp8 > "$out/plain_$i.log" 2>&1
  echo "$run: $(grep -E '^decode' "$out/plain_$i.log" | tr -s ' ' | cut -d' ' -f1-5 | tr '\n' ' ')"
done
