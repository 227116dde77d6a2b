#!/usr/bin/env bash
# One GPU call for the streaming expert kernels' cp.async prologue (src/ops/cuda/moe_stream.cu: kStages - 1
# groups committed, empty ones past a warp's last step): compute-sanitizer racecheck on the tiny fused
# layer (MoeSharedStream.SanitizeTiny; before the fix: RAW hazards cp_async16 -> ldmatrix_x4), memcheck,
# the moe_test contracts (bitwise vs the separate chain, every tile config), then with the shared expert
# inside the streaming kernels (MOEFOLD_MOE_SHARED_STREAM=1) the four end-to-end GPU suites run at once,
# twice (graph == eager, alone == beside prefills, resumed == fresh), and bench offline at batch 1 in the
# order A B B A (A: shared expert as separate kernels, B: fused). Logs under $OUT/ring.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/moe_stream_ring_check.sh [BUILD]
set -u
B=${1:-build-cuda}
T=$B/tests
L=${OUT:-/tmp}/ring
mkdir -p "$L"
. "$(dirname "$0")/step.sh"
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 100 "$san" --tool racecheck --racecheck-report hazard "$T/moe_test" --gtest_filter='MoeSharedStream.SanitizeTiny' \
  >"$L/racecheck.log" 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' "$L/racecheck.log")"
timeout 40 "$san" --tool memcheck "$T/moe_test" --gtest_filter='MoeSharedStream.SanitizeTiny:MoeStream.SanitizeSmall' \
  >"$L/memcheck.log" 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$L/memcheck.log" | head -1)"
timeout 60 "$T/moe_test" --gtest_filter='MoeSharedStream.*:MoeStream.SanitizeSmall:MoeStream.GraphReplayFixtureShapes:MoeChain.TileConfigsBitIdentical:MoeCombineFast.*' \
  >"$L/moe.log" 2>&1
summary moe_test $? "$L/moe.log"
export MOEFOLD_MOE_SHARED_STREAM=1
for round in 1 2; do
  pids=()
  for t in mixed_step_cuda_test cuda_graph_test cuda_executor_test prefix_cache_cuda_test; do
    timeout 60 "$T/$t" >"$L/$t.$round.log" 2>&1 &
    pids+=($!)
  done
  i=0
  for t in mixed_step_cuda_test cuda_graph_test cuda_executor_test prefix_cache_cuda_test; do
    wait "${pids[$i]}"
    summary "$t (fused, round $round, four at once)" $? "$L/$t.$round.log"
    i=$((i + 1))
  done
done
unset MOEFOLD_MOE_SHARED_STREAM
A_FLAGS= A_ENV=MOEFOLD_MOE_SHARED_STREAM=0 B_ENV=MOEFOLD_MOE_SHARED_STREAM=1 timeout 240 \
  scripts/gpu/decode_ab.sh "$B/moefold" configs/qwen3.6-35b-a3b "$L/ab" --decode-batch 1 --decode-steps 16 \
  >"$L/ab.log" 2>&1
echo "decode A/B rc=$?"
sed -n '/decode batch/,$p' "$L/ab.log"
