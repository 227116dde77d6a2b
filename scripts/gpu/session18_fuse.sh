#!/usr/bin/env bash
# Session 18: FP8 input projections fused (attention q|k|v; DeltaNet qkv|z in FP8 + b|a in bf16). Tests,
# the end-to-end GPU suites, then bench offline -q fp8 A B B A (A: OLD_BIN, B: this tree), B with
# MOEFOLD_FP8_FUSE=0 (B:unfused) or MOEFOLD_FP8_FUSE_AUX=0 (B:noaux: the DeltaNet's bf16 b|a on the main
# stream), --fp8-lm-head, and bf16 beside it. (As run in session 18 it also measured fp8_gemv's
# ring kernel, commit 83e8c34, since reverted: the ring lines are gone.)
# Usage: [RUNS='A B B A B:unfused'] [BATCHES=1,8,64] scripts/gpu/session18_fuse.sh BIN_DIR OLD_BIN OUT_DIR
set -uo pipefail
b=$1 old=$2 out=$3
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
summ() { grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|ERROR SUMMARY|RACECHECK SUMMARY' "$1" | head -8; }
echo "== fp8_kernels_test (MOEFOLD_FP8_QUICK=1)"
MOEFOLD_FP8_QUICK=1 timeout 300 "$b/tests/fp8_kernels_test" > "$out/fp8_kernels.txt" 2>&1
echo "rc $?: $(grep -c 'verdict=PASS' "$out/fp8_kernels.txt") pass, $(grep -c 'verdict=FAIL' "$out/fp8_kernels.txt") fail"
summ "$out/fp8_kernels.txt"; grep 'verdict=FAIL' "$out/fp8_kernels.txt" | head -5
for t in ${SUITES:-cuda_executor_test cuda_graph_test mixed_step_cuda_test prefix_cache_cuda_test}; do
  echo "== $t"
  timeout 240 "$b/tests/$t" > "$out/$t.txt" 2>&1
  echo "rc $?"; summ "$out/$t.txt"; grep -h 'fp8_gemv_mma_kernel launches' "$out/$t.txt"
done
echo "== bench offline -q fp8: A = old binary, B = this tree"
i=0
for run in ${RUNS:-A B B A B:unfused}; do
  i=$((i + 1))
  bin=$b/moefold envs=()
  case $run in A) bin=$old ;; B:unfused) envs=(MOEFOLD_FP8_FUSE=0) ;; B:noaux) envs=(MOEFOLD_FP8_FUSE_AUX=0) ;; esac
  env "${envs[@]}" "$bin" bench offline --model $model --load-format dummy --prefill 0 --decode-batch "${BATCHES:-1,8,64}" \
    --decode-steps 16 -q fp8 > "$out/plain_$i.log" 2>&1
  echo "$run: $(grep -E '^decode' "$out/plain_$i.log" | tr -s ' ' | cut -d' ' -f1-5 | tr '\n' ' ')"
done
i=$((i + 1))
"$b/moefold" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1 --decode-steps 16 -q fp8 \
  --fp8-lm-head > "$out/plain_$i.log" 2>&1
echo "--fp8-lm-head: $(grep -E '^decode' "$out/plain_$i.log" | tr -s ' ' | cut -d' ' -f1-5 | tr '\n' ' ')"
for bin in "$old" "$b/moefold"; do
  "$bin" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1 --decode-steps 16 \
    > "$out/plain_bf16.log" 2>&1
  echo "bf16 $( [ "$bin" = "$old" ] && echo A || echo B): $(grep -E '^decode' "$out/plain_bf16.log" | tr -s ' ' | cut -d' ' -f1-5)"
done
