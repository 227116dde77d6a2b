#!/usr/bin/env bash
# GPU check of the shared expert inside the streaming expert kernels (moe_forward_shared,
# MOEFOLD_MOE_SHARED_STREAM=1) and of the wide streaming configuration (MOEFOLD_MOE_STREAM_WIDE=1):
# the moe_test contracts (bitwise vs the separate chain), compute-sanitizer memcheck on the small case,
# the executor tests with the fused path on (decoding alone vs beside prefills must stay bitwise), and
# MoePerf.DISABLED_SharedExpertBatch1 (A B C C B A table printed last). Logs under $OUT/s8shexp.
# Usage (worktree root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/shared_stream_check.sh [BUILD]
set -u
B=${1:-build-cuda}
T=$B/tests
L=${OUT:-/tmp}/s8shexp
mkdir -p "$L"
. "$(dirname "$0")/step.sh"
export MOEFOLD_MOE_SHARED_STREAM=1
timeout 30 "$T/moe_test" --gtest_filter='MoeSharedStream.*:MoeStream.SanitizeSmall:MoeStream.GraphReplayFixtureShapes:MoeChain.TileConfigsBitIdentical' >"$L/moe.log" 2>&1
summary moe_test $? "$L/moe.log"
MOEFOLD_MOE_STREAM_WIDE=1 timeout 10 "$T/moe_test" --gtest_filter='MoeStream.GraphReplayFixtureShapes:MoeChain.TileConfigsBitIdentical' >"$L/moe_wide.log" 2>&1
summary moe_test:wide_routed $? "$L/moe_wide.log"
timeout 20 compute-sanitizer --tool memcheck "$T/moe_test" --gtest_filter='MoeSharedStream.SanitizeSmall' >"$L/memcheck.log" 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$L/memcheck.log" | head -1)"
for t in mixed_step_cuda_test:15 cuda_graph_test:10 cuda_executor_test:10 prefix_cache_cuda_test:10; do
  timeout "${t#*:}" "$T/${t%:*}" >"$L/${t%:*}.log" 2>&1
  summary "${t%:*}" $? "$L/${t%:*}.log"
done
unset MOEFOLD_MOE_SHARED_STREAM
timeout 15 "$T/moe_test" --gtest_also_run_disabled_tests --gtest_filter='MoePerf.DISABLED_SharedExpertBatch1' >"$L/perf.log" 2>&1
echo "perf rc=$?"
grep -E '^PERF' "$L/perf.log" | sed -E 's/E=256,k=8,H=2048,I=512,Is=512,//'
sed -n '/^batch-1 MoE layer/,$p' "$L/perf.log"
