#!/usr/bin/env bash
# The L2 evict_first hint on the streamed weights (src/ops/cuda/l2_hint.h), on the 35B shape: bf16 decode
# with MOEFOLD_L2_STREAM_HINT=0 / 1 in the order A B B A at batches 1, 8 and 64; FP8 (-q fp8) decode at
# batch 1 with OLD_BIN (a build without the hint, whose ld_stream16 has none) against BUILD's binary,
# A B B A; then the batch-1 timeline with the hint (what the step waits for now).
# Usage: scripts/gpu/session14_l2hint.sh BUILD OUT_DIR [OLD_BIN]
set -uo pipefail
build=$1 out=$2 old=${3:-}
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
bench=(bench offline --model $model --prefill 0 --decode-steps 16)
for h in 0 1 1 0; do
  echo "hint=$h $(MOEFOLD_L2_STREAM_HINT=$h "$build/moefold" "${bench[@]}" --decode-batch 1,8,64 2>&1 |
    grep 'decode batch' | awk '{printf "b%s %s ms  ", $3, $4}')"
done
if [ -n "$old" ]; then
  for b in A B B A; do
    bin=$build/moefold; [ $b = A ] && bin=$old
    echo "fp8 $b $("$bin" "${bench[@]}" -q fp8 --decode-batch 1 2>&1 | grep 'decode batch' | awk '{printf "b%s %s ms", $3, $4}')"
  done
fi
lib=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1 || true)
[ -n "$lib" ] && export MOEFOLD_CUPTI_LIBRARY=$lib
for h in 0 1; do
  echo "=== traced, MOEFOLD_L2_STREAM_HINT=$h"
  MOEFOLD_L2_STREAM_HINT=$h "$build/moefold" bench offline --model $model --prefill 0 --decode-steps 12 --decode-batch 1 \
    --timeline --timeline-rows 22 2>&1 | tee "$out/traced_$h.log" | sed -n '/^case/,$p'
done
