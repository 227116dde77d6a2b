#!/usr/bin/env bash
# Nsight Compute detail of the decode step's latency-bound kernels inside the batch-1 CUDA graph of the 35B
# shape (dummy weights): launch statistics, speed of light, warp stall reasons and the source lines
# that stall (-lineinfo), one instance each of the kernels named on the command line (default: the fused
# route, the streaming expert gate_up, the fused DeltaNet decode).
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/decode_small_kernels_ncu.sh BUILD [KERNEL_REGEX...]
set -u
B=${1:-build-cuda}
shift || true
out=${OUT:-/tmp}/ncu_small
mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
kernels=("$@")
[ ${#kernels[@]} -eq 0 ] && kernels=(router_topk_plan_fast_kernel moe_stream_kernel gdn_decode_fused_kernel)
for k in "${kernels[@]}"; do
  timeout 120 "$ncu" --graph-profiling node --clock-control none -k "regex:$k" --launch-skip 45 --launch-count 1 \
    --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
    --section SourceCounters --section MemoryWorkloadAnalysis "$B/moefold" generate --model configs/qwen3.6-35b-a3b \
    --load-format dummy --device cuda --prompt-ids 11,22,33 --max-tokens 4 --output json >"$out/$k.txt" 2>&1
  echo "== $k rc=$?"
  grep -E "Duration|Registers Per|Achieved Occupancy|Memory Throughput|DRAM Throughput|Stall|Warp Cycles Per Issued|Local Memory|smsp__pcsamp|Block Size|Grid Size|Shared Memory Config" \
    "$out/$k.txt" | head -40
  sed -n '/Source Counters/,/^  Section/p' "$out/$k.txt" | grep -vE "^ *-+ *$" | head -40
done
