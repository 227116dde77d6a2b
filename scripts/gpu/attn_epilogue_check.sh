#!/usr/bin/env bash
# One GPU call for the V2 prefill attention kernels' block prologue and epilogue (attention_ws.cu /
# attention_ws.cuh: Q tiles by TMA, 16-byte output stores, the gated epilogue's sigmoid_nobranch): the
# invariance test (every kernel but flash: batch invariance, fp32 reference, *_bits_vs_ws, sigmoid_nobranch
# against sigmoidf_ over every bf16 and 4M fp32 values; rerun with MOEFOLD_ATTN_Q_TMA=0 if it times out),
# the prefill contracts, memcheck and racecheck of the small cases, then the timings of a binary built
# before the change (OLD, e.g. build-cuda/old/attention_test: a) and this one (b; c: with
# MOEFOLD_ATTN_Q_TMA=0) in the order A B C B A, and this one beside torch SDPA. Table last.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/attn_epilogue_check.sh [BUILD] [OLD]
set -uo pipefail
b=${1:-build-cuda}
t=$b/tests
old=${2:-$b/old/attention_test}
out=${OUT:-/tmp}/attn_epi
mkdir -p "$out"
: >"$out/table.txt"
. "$(dirname "$0")/step.sh"
step inv "${INV_S:-90}" "$t/attention_invariance_test"
[ $? -eq 124 ] && step inv_noqtma "${INV_S:-90}" env MOEFOLD_ATTN_Q_TMA=0 "$t/attention_invariance_test"
step attn "${ATTN_S:-60}" env MOEFOLD_TEST_KERNELS=ws,ws2,ws2_tall,ws_persist_tall,auto "$t/attention_test" \
  --gtest_filter='AttentionPrefill.*:AttentionSmall.*'
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
step memcheck "${MEM_S:-40}" env MOEFOLD_TEST_KERNELS=ws2,ws2_tall,ws_persist_tall "$san" --tool memcheck \
  "$t/attention_test" --gtest_filter='AttentionSmall.*:AttentionPrefill.ConsecutivePages'
step racecheck "${RACE_S:-60}" env MOEFOLD_TEST_KERNELS=ws2_tall "$san" --tool racecheck "$t/attention_test" \
  --gtest_filter='AttentionSmall.*'
perf() {  # log binary [env...]
  local log=$1 bin=$2
  shift 2
  env MOEFOLD_TEST_KERNELS=ws2_tall,ws_persist_tall "$@" timeout 40 "$bin" --gtest_also_run_disabled_tests \
    --gtest_filter=AttentionPerf.DISABLED_Flash >"$out/$log.log" 2>&1
}
perf a1 "$old"; perf b1 "$t/attention_test"; perf c1 "$t/attention_test" MOEFOLD_ATTN_Q_TMA=0
perf b2 "$t/attention_test"; perf a2 "$old"
timeout "${SDPA_S:-50}" python3 scripts/gpu/attention_vs_sdpa.py --binary "$t/attention_test" --kernels auto,ws_persist_tall \
  --timeout 45 >"$out/sdpa.log" 2>&1
echo "sdpa rc=$?" >>"$out/table.txt"

grep -h '=FAIL' "$out"/inv*.log "$out"/attn.log "$out"/memcheck.log | cut -c1-150 | sed -E 's/ rel_err.*//' | sort | uniq -c | head -12
grep -h 'NOTE sigmoid_nobranch' "$out"/inv*.log | head -1
grep -h 'bits_vs_ws' "$out"/inv*.log | grep -c '=PASS' | sed 's/^/bits_vs_ws rows passing: /'
echo "A B C B A (ms): a = before, b = this tree, c = this tree with MOEFOLD_ATTN_Q_TMA=0"
for f in a1 b1 c1 b2 a2; do
  grep '^PERF' "$out/$f.log" | sed -E "s/PERF kernel=attn_(\S+) shape=([^,]+),Hq=[0-9]+,Hkv=[0-9]+,D=[0-9]+,(\S+) us=([0-9.]+).*/\2,\3 \1 $f \4/"
done | awk '{k = $1 " " $2; if (!(k in row)) order[n++] = k; row[k] = row[k] sprintf(" %s=%.3f", $3, $4 / 1000)}
            END {for (i = 0; i < n; i++) print order[i] row[order[i]]}'
sed -n '/^bf16 GEMM/,$p' "$out/sdpa.log"
cat "$out/table.txt"
