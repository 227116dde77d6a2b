#!/usr/bin/env bash
# Session 18: the FP8 decode GEMVs on f16 products (fp8_mma.cuh: weights decoded in one instruction a
# pair, activations staged once per CTA as power-of-two-scaled f16; the bf16 chain's bits). Contract and
# bitwise tests with sanitizers, the end-to-end GPU suites, the dense kernels alone (L2 flushed) with the
# f16 chain on and off, then bench offline -q fp8 A B B A (A: OLD_BIN, B: this tree) and B with
# MOEFOLD_FP8_F16=0.
# Usage: [FP8_FILTER=gtest filter] [SUITES='...'] [RUNS='A B B A B:f16off'] [BATCHES=1,8]
#        scripts/gpu/session18_f16.sh BIN_DIR OLD_BIN OUT_DIR
set -uo pipefail
b=$1 old=$2 out=$3
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
summ() { grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|ERROR SUMMARY|RACECHECK SUMMARY' "$1" | head -8; }
echo "== fp8_kernels_test (MOEFOLD_FP8_QUICK=1) ${FP8_FILTER:-*}"
MOEFOLD_FP8_QUICK=1 timeout 300 "$b/tests/fp8_kernels_test" --gtest_filter="${FP8_FILTER:-*}" > "$out/fp8_kernels.txt" 2>&1
echo "rc $?: $(grep -c 'verdict=PASS' "$out/fp8_kernels.txt") pass, $(grep -c 'verdict=FAIL' "$out/fp8_kernels.txt") fail"
summ "$out/fp8_kernels.txt"; grep 'verdict=FAIL' "$out/fp8_kernels.txt" | head -5
for tool in memcheck racecheck; do
  echo "== $tool Fp8Gemv.F16ProductsEqualBf16ChainBitwise + ContractVsIdealChain (small)"
  MOEFOLD_FP8_SMALL=1 timeout 200 compute-sanitizer --tool $tool --print-limit 4 "$b/tests/fp8_kernels_test" \
    --gtest_filter='Fp8Gemv.F16ProductsEqualBf16ChainBitwise:Fp8Gemv.ContractVsIdealChain' > "$out/$tool.txt" 2>&1
  summ "$out/$tool.txt"
done
for t in ${SUITES:-cuda_executor_test cuda_graph_test mixed_step_cuda_test}; do
  echo "== $t"
  timeout 240 "$b/tests/$t" > "$out/$t.txt" 2>&1
  echo "rc $?"; summ "$out/$t.txt"
done
echo "== dense FP8 kernels alone (Fp8Bench, L2 flushed): f16 on | off"
for f in 1 0; do
  MOEFOLD_FP8_F16=$f MOEFOLD_FP8_BENCH=1 timeout 200 "$b/tests/fp8_kernels_test" --gtest_filter='Fp8Bench.*' \
    > "$out/bench_f16_$f.txt" 2>&1
  echo "MOEFOLD_FP8_F16=$f"; grep -E 'BENCH (ceiling|fp8_gemv .*T=(1|8) |fp8_lm_head .*T=1 )' "$out/bench_f16_$f.txt"
done
echo "== bench offline -q fp8: A = old binary, B = this tree"
i=0
for run in ${RUNS:-A B B A B:f16off}; do
  i=$((i + 1))
  bin=$b/moefold envs=()
  case $run in A) bin=$old ;; B:f16off) envs=(MOEFOLD_FP8_F16=0) ;; esac
  env "${envs[@]}" "$bin" bench offline --model $model --load-format dummy --prefill 0 --decode-batch "${BATCHES:-1,8}" \
    --decode-steps 16 -q fp8 > "$out/plain_$i.log" 2>&1
  echo "$run: $(grep -E '^decode' "$out/plain_$i.log" | tr -s ' ' | cut -d' ' -f1-5 | tr '\n' ' ')"
done
