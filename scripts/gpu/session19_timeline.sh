#!/usr/bin/env bash
# Session 19: one decode step's kernels in order (bench offline --timeline --timeline-csv, CUPTI), bf16 and
# -q fp8 at batch 1 (35B shape, dummy weights), for the per-layer critical path.
# Usage: scripts/gpu/session19_timeline.sh BUILD OUT_DIR
set -uo pipefail
build=$1 out=$2
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
lib=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1 || true)
[ -n "$lib" ] && export MOEFOLD_CUPTI_LIBRARY=$lib
for q in none fp8; do
  "$build/moefold" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1 --decode-steps 8 \
    -q $q --timeline --timeline-rows 25 --timeline-csv "$out/steps_$q.csv" > "$out/traced_$q.log" 2>&1
  echo "=== traced -q $q"; sed -n '/^case/,$p' "$out/traced_$q.log" | head -40
done
