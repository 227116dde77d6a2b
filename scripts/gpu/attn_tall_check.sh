#!/usr/bin/env bash
# One GPU call for the tall-box forms of the prefill attention kernel (issue 14; ws2_tall, ws_persist_tall:
# src/ops/cuda/attention_ws.cuh load_tile) beside their old forms (ws2, ws_persist) and ws: batch
# invariance + fp32 reference + bits equal to ws (attention_invariance_test, pages in shuffled runs), the
# prefill contracts (attention_test, ConsecutivePages included), compute-sanitizer memcheck of the new forms
# (AttentionSmall.*, and AttentionPrefill.ConsecutivePages, where d128 / d256 take the tall path), the
# benchmark shapes beside torch SDPA (attention_vs_sdpa.py, contiguous pages), and the same timings over
# shuffled pages (MOEFOLD_TEST_PERF_PAGES=shuffled: every tile takes the piece-wise fallback). Table last.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/attn_tall_check.sh [BUILD]
# Env: INV_S / ATTN_S / MEM_S / SDPA_S / SHUF_S seconds per step (default 18 / 22 / 25 / 35 / 15: 115 s at
# most). Logs under $OUT/attn_tall (or /tmp/attn_tall).
set -uo pipefail
b=${1:-build-cuda}
t=$b/tests
out=${OUT:-/tmp}/attn_tall
mkdir -p "$out"
: >"$out/table.txt"
k=ws,ws2,ws_persist,ws2_tall,ws_persist_tall
new=ws2_tall,ws_persist_tall

. "$(dirname "$0")/step.sh"

step inv "${INV_S:-18}" env MOEFOLD_TEST_KERNELS="$k,auto" "$t/attention_invariance_test"
step attn "${ATTN_S:-22}" env MOEFOLD_TEST_KERNELS="$k" "$t/attention_test" --gtest_filter='AttentionPrefill.*:AttentionSmall.*'
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
step memcheck "${MEM_S:-25}" env MOEFOLD_TEST_KERNELS="$new" "$sanitizer" --tool memcheck "$t/attention_test" \
  --gtest_filter='AttentionSmall.*:AttentionPrefill.ConsecutivePages'
timeout "${SDPA_S:-35}" python3 scripts/gpu/attention_vs_sdpa.py --binary "$t/attention_test" --kernels "$k,auto" \
  --timeout 30 >"$out/sdpa.log" 2>&1
echo "sdpa rc=$?" >>"$out/table.txt"
MOEFOLD_TEST_PERF_PAGES=shuffled MOEFOLD_TEST_KERNELS=ws2,ws_persist,ws2_tall,ws_persist_tall timeout "${SHUF_S:-15}" \
  "$t/attention_test" --gtest_also_run_disabled_tests --gtest_filter=AttentionPerf.DISABLED_Flash >"$out/shuffled.log" 2>&1
echo "shuffled rc=$?" >>"$out/table.txt"

grep -h '=FAIL' "$out/inv.log" "$out/attn.log" "$out/memcheck.log" | cut -c1-160 | head -6
grep -h 'bits_vs_ws' "$out/inv.log" "$out/attn.log" | grep -c '=PASS' | sed 's/^/bits_vs_ws rows passing: /'
grep -h 'ERROR SUMMARY' "$out/memcheck.log"
echo "shuffled pages (ms):"
grep '^PERF' "$out/shuffled.log" | sed -E 's/PERF kernel=attn_(\S+) shape=([^,]+),Hq=[0-9]+,Hkv=[0-9]+,D=[0-9]+,(\S+) us=([0-9.]+).*/\2 \3 \1 \4/' |
  awk '{k = $1 " " $2; if (!(k in row)) order[n++] = k; row[k] = row[k] sprintf(" %s=%.3f", $3, $4 / 1000)}
       END {for (i = 0; i < n; i++) print order[i] row[order[i]]}'
sed -n '/^bf16 GEMM/,$p' "$out/sdpa.log"
cat "$out/table.txt"
