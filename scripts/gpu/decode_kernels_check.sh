#!/usr/bin/env bash
# One GPU call for the decode kernels of issue 12 item 3 (routed experts, DeltaNet decode step): their
# contract tests, then the PERF cases (old kernel vs new, A B B A, copy bandwidth measured in the same
# binary), each under its own time limit; a summary table last.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/decode_kernels_check.sh [BUILD]
# Env: CHECK_S / PERF_S seconds per test binary (default 14 / 12); MOE_FILTER / GDN_FILTER replace the
# contract tests' filters; SKIP_GDN=1 skips the DeltaNet part, SKIP_PERF=1 the PERF cases; EXTRA adds
# test binaries (see below); OLD_BIN=path adds bench offline old (A)
# vs BUILD/moefold (B), A B B A, graphs both, decode batches $AB_BATCH (default 1,64,256), under AB_S
# seconds (default 34).
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
[ -n "${SKIP_GDN:-}" ] || run gdn_tests "$cs" gated_delta_net_test "${GDN_FILTER:-GdnDecode.*:GdnArgs.*:GdnPrefill.FixtureShapes}"
run moe_tests "$cs" moe_test "${MOE_FILTER:-MoeChain.TileConfigsBitIdentical:MoeStream.*:MoeGemv.SmallGraphReplay:MoeChain.SanitizeSmall}"
for e in ${EXTRA:-}; do  # EXTRA="binary:seconds[:filter] ...": more test binaries, e.g. cuda_graph_test:12
  IFS=: read -r ebin esecs efilter <<<"$e"
  run "$ebin" "$esecs" "$ebin" "${efilter:-*}"
done
[ -n "${SKIP_PERF:-}" ] || [ -n "${SKIP_GDN:-}" ] || run gdn_perf "$ps" gated_delta_net_test 'GdnPerf.DISABLED_DecodeVariants' --gtest_also_run_disabled_tests
[ -n "${SKIP_PERF:-}" ] || run moe_perf "$ps" moe_test 'MoePerf.DISABLED_DecodeExperts' --gtest_also_run_disabled_tests
if [ -n "${OLD_BIN:-}" ]; then
  A_BIN=$OLD_BIN B_BIN=${1:-build-cuda}/moefold A_FLAGS= timeout "${AB_S:-34}" scripts/gpu/decode_ab.sh \
    "${1:-build-cuda}/moefold" configs/qwen3.6-35b-a3b "$out/ab" --load-format dummy \
    --decode-batch "${AB_BATCH:-1,64,256}" --decode-steps 16 >"$out/ab.txt" 2>&1
  echo "SUMMARY bench_ab rc=$?"
fi
echo "== PERF =="
cat "$out"/gdn_perf.txt "$out/moe_perf.txt" 2>/dev/null | grep -h '^PERF' | sed -e 's/^PERF //'
[ -f "$out/ab.txt" ] && { echo "== bench offline A (old) B (new) B A =="; grep -E '^ *(decode batch|[0-9]+ )' "$out/ab.txt" | tail -5; grep -E '^decode' "$out/ab.txt" | head -12; }
