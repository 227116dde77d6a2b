#!/usr/bin/env bash
# One GPU call for the prefill attention variants ws2 / ws_persist (issue 14; src/ops/cuda/attention_ws.cu,
# attention_ws_persist.cu) beside the default ws: batch invariance + fp32 reference + bits equal to ws
# (attention_invariance_test), the prefill contracts (attention_test), compute-sanitizer memcheck of
# AttentionSmall, the benchmark shapes beside torch SDPA (attention_vs_sdpa.py: every variant per shape in
# one process, then the default again), and one ncu capture of ws2 (NCU_K) at qwen3.5 1x32768 d256 with
# source-level stall sampling (top SASS lines printed). Each step under its own time limit; table last.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/attn_ws2_check.sh [BUILD]
# Env: KERNELS (default ws,ws2,ws_persist), INV_S / ATTN_S / MEM_S / SDPA_S / NCU_S seconds per step
# (default 20 / 25 / 20 / 40 / 25: 130 s at most, plus 2 x 10 s for reading the ncu report), SKIP_NCU=1. Logs under $OUT/attn_ws2 (or /tmp/attn_ws2).
set -uo pipefail
b=${1:-build-cuda}
t=$b/tests
out=${OUT:-/tmp}/attn_ws2
mkdir -p "$out"
: >"$out/table.txt"
k=${KERNELS:-ws,ws2,ws_persist}
new=${k#ws,}

. "$(dirname "$0")/step.sh"

step inv "${INV_S:-20}" env MOEFOLD_TEST_KERNELS="$k,auto" "$t/attention_invariance_test"
step attn "${ATTN_S:-25}" env MOEFOLD_TEST_KERNELS="$k" "$t/attention_test" --gtest_filter='AttentionPrefill.*:AttentionSmall.*'
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
step memcheck "${MEM_S:-20}" env MOEFOLD_TEST_KERNELS="$new" "$sanitizer" --tool memcheck "$t/attention_test" \
  --gtest_filter='AttentionSmall.*'
timeout "${SDPA_S:-40}" python3 scripts/gpu/attention_vs_sdpa.py --binary "$t/attention_test" --kernels "$k,auto" \
  --timeout 30 >"$out/sdpa.log" 2>&1
echo "sdpa rc=$?" >>"$out/table.txt"

if [ "${SKIP_NCU:-0}" != 1 ]; then
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  # The first attn_ws_kernel launch of DISABLED_Perf with only $NCU_K (default ws2) selected: qwen3.5
  # 1x32768 (a warm-up run).
  MOEFOLD_TEST_KERNELS=${NCU_K:-ws2} timeout "${NCU_S:-25}" "$ncu" --clock-control none -k regex:attn_ws_kernel -c 1 \
    --section LaunchStats --section WarpStateStats --section SourceCounters --section SpeedOfLight \
    --import-source no -f -o "$out/ws32k" "$t/attention_invariance_test" --gtest_also_run_disabled_tests \
    --gtest_filter='*DISABLED_Perf' >"$out/ncu_run.log" 2>&1
  echo "ncu rc=$?" >>"$out/table.txt"
  timeout 10 "$ncu" -i "$out/ws32k.ncu-rep" --page details >"$out/ncu_details.txt" 2>&1
  timeout 10 "$ncu" -i "$out/ws32k.ncu-rep" --page source --csv --print-source sass >"$out/ncu_sass.csv" \
    2>"$out/ncu_sass.err"
  grep -E 'Registers Per Thread|Local Memory|Duration|Warp Cycles Per Issued|Compute \(SM\) Throughput' \
    "$out/ncu_details.txt" | sed -E 's/ {2,}/ /g' | head -8
  grep -o 'stalled [^.]*' "$out/ncu_details.txt" | head -3
  # Top SASS lines by stall samples, with their leading stall columns.
  python3 - "$out/ncu_sass.csv" <<'EOF'
import csv, sys
try:
    rows = list(csv.reader(open(sys.argv[1], errors="replace")))
except OSError as e:
    sys.exit(f"no source page: {e}")
hi = next((i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r)), None)
if hi is None:
    sys.exit("source page: no header; first lines: " + " | ".join(",".join(r)[:80] for r in rows[:3]))
h = rows[hi]
num = lambda s: float(s.replace(",", "")) if s.replace(",", "").replace(".", "", 1).isdigit() else 0.0
si = next(i for i, c in enumerate(h) if c.strip() == "Source")
ai = next((i for i, c in enumerate(h) if "Sampling (All" in c), None)
if ai is None:
    sys.exit("no stall-sampling column: " + ";".join(h)[:400])
body = [r for r in rows[hi + 1:] if len(r) == len(h)]
tot = sum(num(r[ai]) for r in body) or 1.0
stall_cols = [i for i, c in enumerate(h) if "stall" in c.lower() and "Sampling" not in c]
print(f"SASS lines {len(body)}, stall samples {tot:.0f}; top 24 (share, instruction, top reasons):")
for r in sorted(body, key=lambda r: -num(r[ai]))[:24]:
    reasons = sorted(((num(r[i]), h[i]) for i in stall_cols if num(r[i]) > 0), reverse=True)[:3]
    print(f"{num(r[ai]) / tot:6.1%}  {r[si].strip()[:60]:60}  " + ", ".join(f"{n}={v:.0f}" for v, n in reasons))
EOF
fi
grep -h '=FAIL' "$out/inv.log" "$out/attn.log" | cut -c1-160 | head -6
grep -h '^NOTE attn_invariance' "$out/inv.log" | head -3
grep -h 'ERROR SUMMARY' "$out/memcheck.log"
sed -n '/^bf16 GEMM/,$p' "$out/sdpa.log"
cat "$out/table.txt"
