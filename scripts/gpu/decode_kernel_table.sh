#!/usr/bin/env bash
# Where one batch-1 decode step's time goes inside its CUDA graph: Nsight Compute profiles every kernel node
# of `moefold generate` on the 35B shape (dummy weights, graphs on; --graph-profiling node, boost clocks,
# no cache flush), and the table lists one decode step (the kernels after the second lm_head launch up to
# the third) by kernel and grid: calls, us each, the sum. The sum of the kernels' own durations, set beside
# the step's replay time from bench offline, says how much of a step is kernels and how much is boundaries.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/decode_kernel_table.sh [BUILD] [OUT_DIR]
set -u
B=${1:-build-cuda}
out=${2:-${OUT:-/tmp}/ktable}
mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
timeout 400 "$ncu" --graph-profiling node --clock-control none --cache-control none --csv --print-units base \
  --metrics gpu__time_duration.sum "$B/moefold" generate --model configs/qwen3.6-35b-a3b --load-format dummy \
  --device cuda --prompt-ids 11,22,33 --max-tokens 4 --output json >"$out/ncu.csv" 2>"$out/ncu.err"
echo "ncu rc=$?"
python3 - "$out/ncu.csv" <<'PY'
import csv, re, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]
ki, gi, vi = hdr.index("Kernel Name"), hdr.index("Grid Size"), hdr.index("Metric Value")
def short(n):
    n = n.replace("(anonymous namespace)", "")
    return n.split("(")[0].split("<")[0].split("::")[-1].replace("void ", "").strip()
ks = [(short(r[ki]), r[gi], float(r[vi].replace(",", "")) / 1e3) for r in rows[1:] if r[vi].replace(",", "").replace(".", "").isdigit()]
heads = [i for i, k in enumerate(ks) if k[0] == "decode_gemm_kernel" and k[2] > 100]  # the lm_head
if len(heads) < 3:
    print("lm_head launches found:", len(heads)); sys.exit(0)
step = ks[heads[1] + 1: heads[2] + 1]
agg = collections.OrderedDict()
for name, grid, us in step:
    a = agg.setdefault((name, grid), [0, 0.0]); a[0] += 1; a[1] += us
tot = sum(a[1] for a in agg.values())
print(f"one decode step: {len(step)} kernels, {tot:.1f} us of kernel time")
print(f"{'kernel':40} {'grid':>16} {'calls':>5} {'us each':>8} {'us total':>9} {'share':>6}")
for (name, grid), (n, us) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{name[:40]:40} {grid:>16} {n:>5} {us / n:>8.2f} {us:>9.1f} {100 * us / tot:>5.1f}%")
PY
