#!/usr/bin/env bash
# Session 16's last H200 call: the router logits' wide-tile kernel against the 16 x 16-tile one (bitwise,
# memcheck), the approximate SiLU of the conv1d and the gated RMSNorm (DeltaNet contract tests, fused
# decode == three launches), qk_norm_rope's loads ahead of its cos / sin table, the end-to-end GPU suites,
# then a 32k-token prefill of the 35B shape profiled A B B A (A: main before the session, B: this tree), B
# again with two and four norm rows a thread, and the kernel table of the first B run.
# Usage: [SUITES='name:filter ...'] [RUNS='old new ...'] scripts/gpu/session16_final.sh BIN_DIR OUT_DIR
#   BIN_DIR: moefold_old, moefold, moe_test, gated_delta_net_test, and the suites' *_test binaries.
#   SUITES, RUNS: the test binaries (with gtest filters) and the profile runs, in place of the defaults below.
set -uo pipefail
b=$1 out=$2
mkdir -p "$out"
default_suites="moe_test:MoeRouter.*:MoeRoute*:MoePlan.*:MoeStream.*:MoeSharedStream.*:MoeCombine*:MoeChain.TileConfigsBitIdentical gated_delta_net_test
  qk_norm_rope_test cuda_graph_test cuda_executor_test mixed_step_cuda_test prefix_cache_cuda_test"
for t in ${SUITES:-$default_suites}; do
  name=${t%%:*} filter='*'
  [ "$name" != "$t" ] && filter=${t#*:}
  echo "== $name"
  timeout 200 "$b/$name" --gtest_filter="$filter" > "$out/$name.txt" 2>&1
  echo "rc $?"
  grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|rror' "$out/$name.txt" | head -8
done
echo "== memcheck MoeRouter.WideLogitsEqualTileLogits"
timeout 150 compute-sanitizer --tool memcheck --print-limit 4 "$b/moe_test" --gtest_filter='MoeRouter.WideLogitsEqualTileLogits' 2>&1 |
  grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' | head -4
echo "== profile prefill:32768"
i=0
for run in ${RUNS:-old new new old new:MOEFOLD_NORM_ROWS_PER_THREAD=2 new:MOEFOLD_NORM_ROWS_PER_THREAD=4}; do
  i=$((i + 1))
  n=${run%%:*} envs=()
  [ "$n" != "$run" ] && envs=("${run#*:}")
  bin=$b/moefold
  req=(--require-kernel router_logits_wide_kernel --require-kernel gated_rms_norm_kernel)
  if [ "$n" = old ]; then bin=$b/moefold_old; req=(); fi
  env "${envs[@]}" timeout 120 "$bin" profile --model configs/qwen3.6-35b-a3b --load-format dummy --device cuda \
    --workload prefill:32768 "${req[@]}" > "$out/prof_$i.txt" 2>&1
  echo "run $i $run (rc $?): $(grep -m1 'profiled wall' "$out/prof_$i.txt")"
  grep -E '^(router_logits|gated_rms_norm|rms_norm|add_rms_norm|conv1d_prefill|qk_norm_rope)' "$out/prof_$i.txt" | sed 's/^/    /'
done
echo "== kernel table, run 2"
sed -n '/^category/,$p' "$out/prof_2.txt" | head -45
