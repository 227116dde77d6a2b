#!/usr/bin/env bash
# Session 19: the router logits' deep pipeline at one row tile (MOEFOLD_MOE_ROUTER_DEEP), then where the
# bf16 decode step goes at batch 64 and 256. Contracts (the wide / tile / cluster logits byte for byte),
# the route phase benchmark, the graph and executor suites, bench offline A B B A (A = ROUTER_DEEP=0),
# and --timeline at batch 64 and 256 (35B shape, dummy weights).
# Usage: scripts/gpu/session19_router.sh BIN_DIR OUT_DIR
set -uo pipefail
b=$1 out=$2
mkdir -p "$out"
model=configs/qwen3.6-35b-a3b
summ() { grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|ERROR SUMMARY|RACECHECK SUMMARY' "$1" | head -8; }
echo "== moe_test router / route / cluster contracts"
timeout 300 "$b/tests/moe_test" --gtest_filter='MoeRouter*:MoeRoute.*:MoeRouterCluster.*:MoePlan.*:MoeRouteFast.*' \
  > "$out/moe_router.txt" 2>&1
echo "rc $?: $(grep -c 'verdict=PASS' "$out/moe_router.txt") pass, $(grep -c 'verdict=FAIL' "$out/moe_router.txt") fail"
summ "$out/moe_router.txt"
"$b/tests/moe_test" --gtest_also_run_disabled_tests --gtest_filter='MoeRoutePhases.*' 2>&1 | grep PERF
for t in cuda_graph_test cuda_executor_test; do
  timeout 240 "$b/tests/$t" > "$out/$t.txt" 2>&1
  echo "$t rc $?: $(summ "$out/$t.txt" | tr '\n' ' ')"
done
echo "== bench offline: A = MOEFOLD_MOE_ROUTER_DEEP=0, B = default"
i=0
for run in A B B A; do
  i=$((i + 1))
  d=1; [ "$run" = A ] && d=0
  MOEFOLD_MOE_ROUTER_DEEP=$d "$b/moefold" bench offline --model $model --load-format dummy --prefill 0 \
    --decode-batch 1,8 --decode-steps 16 > "$out/bf16_$i.log" 2>&1
  MOEFOLD_MOE_ROUTER_DEEP=$d "$b/moefold" bench offline --model $model --load-format dummy --prefill 0 \
    --decode-batch 1 --decode-steps 16 -q fp8 > "$out/fp8_$i.log" 2>&1
  echo "$run: bf16 $(grep -E '^decode' "$out/bf16_$i.log" | tr -s ' ' | cut -d' ' -f1-5 | tr '\n' ' ')| fp8 $(grep -E '^decode' "$out/fp8_$i.log" | tr -s ' ' | cut -d' ' -f1-5)"
done
lib=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1 || true)
[ -n "$lib" ] && export MOEFOLD_CUPTI_LIBRARY=$lib
"$b/moefold" bench offline --model $model --load-format dummy --prefill 0 --decode-batch 1,64,256 --decode-steps 8 \
  --timeline --timeline-rows 22 > "$out/traced.log" 2>&1
sed -n '/^case/,/^$/p' "$out/traced.log"
sed -n '/^decode batch 64:/,$p' "$out/traced.log" | cut -c1-150
