#!/usr/bin/env bash
# One GPU call (session 12): the route contracts (old vs narrow vs wide top-k; the cluster kernel against
# logits + route), the fused combine + norm and q / k prologue contracts and two end-to-end GPU suites
# (their support checks now use vec_width), and the route timings (A B B A).
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/session12_contracts.sh [BUILD]
set -u
B=${1:-build-cuda}
T=$B/tests
out=${OUT:-/tmp}/s12b
mkdir -p "$out"
: >"$out/table.txt"
. "$(dirname "$0")/step.sh"
step route_contracts 200 "$T/moe_test" --gtest_filter='MoeRouteFast.*:MoeRouterCluster.*:MoeRouter.*:MoeRoute.*'
step combine_norm 200 "$T/moe_test" --gtest_filter='MoeCombineNorm*'
step qk_norm_rope 200 "$T/qk_norm_rope_test"
step cuda_graph 300 "$T/cuda_graph_test" &
step cuda_executor 300 "$T/cuda_executor_test" &
wait
step route_perf 120 "$T/moe_test" --gtest_filter='MoeRoutePerf.DISABLED_WideVsNarrow' --gtest_also_run_disabled_tests
grep PERF "$out/route_perf.log" >>"$out/table.txt"
cat "$out/table.txt"
