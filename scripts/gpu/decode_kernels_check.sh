#!/usr/bin/env bash
# One GPU call for the decode kernels of issue 12 item 3 (routed experts, DeltaNet decode step): their
# contract tests, then the PERF cases (old kernel vs new, A B B A, copy bandwidth measured in the same
# binary), each under its own time limit; a summary table last.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/decode_kernels_check.sh [BUILD]
# Env: CHECK_S / PERF_S seconds per test binary (default 14 / 12).
set -uo pipefail
b=${1:-build-cuda}/tests
out=${OUT:-/tmp}/decode_kernels
mkdir -p "$out"
cs=${CHECK_S:-14}
ps=${PERF_S:-12}
run() {  # name seconds binary filter [extra]
  local name=$1 secs=$2 bin=$3 filter=$4
  shift 4
  timeout "$secs" "$b/$bin" --gtest_filter="$filter" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  local pass fail
  pass=$(grep -c 'verdict=PASS' "$out/$name.txt")
  fail=$(grep -c 'verdict=FAIL' "$out/$name.txt")
  echo "SUMMARY $name rc=$rc contracts_pass=$pass contracts_fail=$fail $(grep -E '^\[  (PASSED|FAILED) ' "$out/$name.txt" | tr '\n' ' ')"
  grep -E 'verdict=FAIL|^\[  FAILED  \]|Failure|error' "$out/$name.txt" | head -5
}
run gdn_tests "$cs" gated_delta_net_test 'GdnDecode.*:GdnArgs.*:GdnPrefill.FixtureShapes'
run moe_tests "$cs" moe_test 'MoeChain.TileConfigsBitIdentical:MoeStream.*:MoeGemv.SmallGraphReplay:MoeChain.SanitizeSmall'
run gdn_perf "$ps" gated_delta_net_test 'GdnPerf.DISABLED_DecodeVariants' --gtest_also_run_disabled_tests
run moe_perf "$ps" moe_test 'MoePerf.DISABLED_DecodeExperts' --gtest_also_run_disabled_tests
echo "== PERF =="
grep -h '^PERF' "$out/gdn_perf.txt" "$out/moe_perf.txt" | sed -e 's/^PERF //'
