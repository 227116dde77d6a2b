#!/usr/bin/env bash
# Where a CUDA-graph decode step's time goes, kernel by kernel (bench offline --timeline, CUPTI), beside
# the same bench without tracing (what the instrumentation costs), on the 35B shape. Extra configurations
# to trace: TIMELINE_ENVS="VAR=value VAR2=value ..." (one traced run at batch 1 each).
# Usage: scripts/gpu/decode_timeline.sh BUILD OUT_DIR [bench offline args...]
set -euo pipefail
build=$1 out=$2
shift 2
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
lib=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1 || true)
echo "libcupti: ${lib:-not found}"
if [ -n "$lib" ] && [ -z "${MOEFOLD_CUPTI_LIBRARY:-}" ]; then export MOEFOLD_CUPTI_LIBRARY=$lib; fi
"$build/tests/kernel_trace_test" 2>&1 | tail -25
"$build/moefold" bench offline --model $model --prefill 0 --decode-steps 12 --json "$out/plain.json" "$@" 2>&1 |
  tee "$out/plain.log" | tail -6
"$build/moefold" bench offline --model $model --prefill 0 --decode-steps 12 --timeline --timeline-rows 45 \
  --json "$out/traced.json" "$@" 2>&1 | tee "$out/traced.log" | sed -n '/^case/,$p'
for e in ${TIMELINE_ENVS:-}; do
  echo "=== traced with $e"
  env "$e" "$build/moefold" bench offline --model $model --prefill 0 --decode-steps 12 --decode-batch 1 --timeline \
    --timeline-rows 25 --json "$out/traced_${e%%=*}.json" 2>&1 | tee "$out/traced_${e%%=*}.log" | sed -n '/^case/,$p'
done
