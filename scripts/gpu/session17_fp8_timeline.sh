#!/usr/bin/env bash
# Session 17, first H200 call: where the FP8 (-q fp8) batch-1 decode step's time goes beside bf16's, kernel
# by kernel (bench offline --timeline, CUPTI), and both untraced at batch 1 and 8 (35B shape, dummy weights).
# Usage: scripts/gpu/session17_fp8_timeline.sh BUILD OUT_DIR
set -uo pipefail
build=$1 out=$2
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
lib=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1 || true)
[ -n "$lib" ] && export MOEFOLD_CUPTI_LIBRARY=$lib
for q in none fp8 fp8 none; do
  "$build/moefold" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1,8 --decode-steps 16 \
    -q $q > "$out/plain_$q.log" 2>&1
  echo "plain -q $q: $(grep -E '^decode' "$out/plain_$q.log" | tr '\n' ' ')"
done
for q in none fp8; do
  "$build/moefold" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1 --decode-steps 12 \
    -q $q --timeline --timeline-rows 40 > "$out/traced_$q.log" 2>&1
  echo "=== traced -q $q"
  sed -n '/^case/,$p' "$out/traced_$q.log" | head -60
done
