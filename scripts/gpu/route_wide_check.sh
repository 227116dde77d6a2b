#!/usr/bin/env bash
# One GPU call (session 12): the fused route's top-k over ceil(E / 32) warps a row (topk_row_wide) and the
# router logits' deeper ring at one row tile. (1) moe_test's route contracts (old vs fast-narrow vs
# fast-wide, the same bytes; the cluster kernel against logits + route, which now run different ring
# depths), compute-sanitizer memcheck and racecheck on the small cases, the router and chain tests; (2) the
# fused route's time, a warp a row vs wide, A B B A (MoeRoutePerf.DISABLED_WideVsNarrow); (3) bench
# offline on the 35B shape at batch 1, 2, 8, A = MOEFOLD_MOE_ROUTE=narrow, B = the defaults, A B B A.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/route_wide_check.sh [BUILD]
set -u
B=${1:-build-cuda}
T=$B/tests
M=configs/qwen3.6-35b-a3b
out=${OUT:-/tmp}/s12
mkdir -p "$out"
: >"$out/table.txt"
. "$(dirname "$0")/step.sh"
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
step route_contracts 200 "$T/moe_test" --gtest_filter='MoeRouteFast.*:MoeRouterCluster.*'
step memcheck 300 "$cs" --tool memcheck "$T/moe_test" --gtest_filter='MoeRouteFast.SanitizeSmall'
step racecheck 300 "$cs" --tool racecheck "$T/moe_test" --gtest_filter='MoeRouteFast.SanitizeSmall'
step route_perf 120 "$T/moe_test" --gtest_filter='MoeRoutePerf.DISABLED_WideVsNarrow' --gtest_also_run_disabled_tests
grep PERF "$out/route_perf.log" | tee -a "$out/table.txt"
step router_tests 200 "$T/moe_test" --gtest_filter='MoeRouter.*:MoeRoute.*:MoePlan.*:MoeChain.*:-MoeChain.Sanitize*'
A_ENV=MOEFOLD_MOE_ROUTE=narrow A_FLAGS= bash "$(dirname "$0")/decode_ab.sh" "$B/moefold" $M "$out/ab" \
  --load-format dummy --decode-batch 1,2,8 --require-kernel router_topk_plan_fast_kernel >"$out/ab.log" 2>&1
tail -5 "$out/ab.log" | tee -a "$out/table.txt"
tar czf "$out/../s12_logs.tgz" -C "$out" . 2>/dev/null
cat "$out/table.txt"
