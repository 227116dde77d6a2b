#!/usr/bin/env bash
# Session 13: the host's share of a decode step. The graph-launch microbenchmark; the GPU end-to-end
# suites with the one-copy step metadata; then decode A/B: A = BUILD/moefold_a (a build before the
# one-copy metadata: one pageable copy per field), B = BUILD/moefold; then one traced batch-1 run.
# (The session's run also measured a step cut into graph pieces of 4 and 10 layers: slower, removed;
# docs/benchmarks.md, "Session 13".)
set -euo pipefail
build=$1 out=$2
mkdir -p "$out"
"$build/tests/graph_launch_perf_test" --gtest_also_run_disabled_tests 2>&1 | grep -v "^\[\|^Running\|^$"
for t in cuda_graph_test cuda_executor_test mixed_step_cuda_test prefix_cache_cuda_test; do
  "$build/tests/$t" >"$out/$t.log" 2>&1 && echo "$t: $(grep -c '^\[       OK' "$out/$t.log") ok" || { echo "$t FAILED"; grep -B2 -A12 "Failure\|FAILED" "$out/$t.log" | head -60; }
done
bash scripts/gpu/decode_configs.sh "$out/ab" "A:$build/moefold_a B:$build/moefold" --decode-batch 1,8,64
"$build/moefold" bench offline --model configs/qwen3.6-35b-a3b --prefill 0 \
  --decode-steps 12 --decode-batch 1 --timeline --timeline-rows 6 2>&1 | sed -n '/^Kernel timelines/,$p'
