#!/usr/bin/env bash
# Session 16's first H200 call (issue 13): the conv1d prefill with the approximate SiLU against the IEEE-division
# one (two binaries, A B B A, and the row-tile variants), then Nsight Compute on the conv kernel and on the
# DeltaNet prefill's chunk kernel and state pass (throughput, occupancy, stall reasons), at 1 x 32768, 16/32
# heads (the 35B shape's DeltaNet layer).
# Usage: scripts/gpu/session16_probe.sh OLD_BENCH NEW_BENCH OUT_DIR
#   OLD_BENCH, NEW_BENCH: gdn_bench_test binaries (before and after the change). SKIP_NCU=1: the conv table only
#   (also written to OUT_DIR/conv.md).
set -uo pipefail
old=$1 new=$2 out=$3
mkdir -p "$out"
shape=1:32768:16:32
conv_us() {  # NAME BINARY [VAR=val ...]: conv1d prefill microseconds (CUDA-graph replays)
  local name=$1 bin=$2
  shift 2
  env "$@" GDN_BENCH=$shape GDN_BENCH_REPS=20 timeout 60 "$bin" --gtest_also_run_disabled_tests \
    --gtest_filter=GdnBench.DISABLED_Prefill 2>&1 |
    awk -v n="$name" '/kernel=conv1d_prefill/ { for (i = 1; i <= NF; ++i) if ($i ~ /^(us|bytes)=/) v[substr($i, 1, index($i, "=") - 1)] = substr($i, index($i, "=") + 1); printf "| %s | %.1f | %.0f |\n", n, v["us"], v["bytes"] / v["us"] / 1e3 }'
}
{
  echo "== conv1d prefill, $shape (C = 8192, K = 4): bytes = rows x C x 4 (x read once, y written)"
  echo "| kernel | us | GB/s |"
  echo "|---|---|---|"
  for n in old new new old; do
    if [ $n = old ]; then conv_us "old (IEEE division)" "$old"; else conv_us "new (approximate)" "$new"; fi
  done
  conv_us "new, 4 rows a thread" "$new" MOEFOLD_CONV_TILE_ROWS=4
  conv_us "new, 16 rows a thread" "$new" MOEFOLD_CONV_TILE_ROWS=16
  conv_us "new, vec kernel" "$new" MOEFOLD_CONV_PREFILL=vec
  conv_us "old, 16 rows a thread" "$old" MOEFOLD_CONV_TILE_ROWS=16
} | tee "$out/conv.md"
[ "${SKIP_NCU:-0}" = 1 ] && exit 0

stalls='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats
  --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis)
ncu_run() {  # NAME BINARY KERNEL_REGEX COUNT
  local name=$1 bin=$2 re=$3 count=$4
  echo "== ncu: $name"
  env GDN_BENCH=$shape GDN_BENCH_REPS=1 timeout 200 ncu --kernel-name "regex:$re" --launch-count "$count" \
    "${sections[@]}" --metrics "$stalls" "$bin" --gtest_also_run_disabled_tests \
    --gtest_filter=GdnBench.DISABLED_Prefill > "$out/ncu_$name.txt" 2>&1
  grep -E '^  [a-z_]+.*\(|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issued Warp Per|No Eligible|L2 Hit Rate|L1/TEX Hit|Executed Ipc Active|stalled_(long_scoreboard|short_scoreboard|barrier|mio_throttle|lg_throttle|math_pipe|wait|not_selected|selected|dispatch|tex|drain|membar|branch|no_inst|sleeping|misc)' \
    "$out/ncu_$name.txt" | head -80
}
ncu_run conv_old "$old" 'conv1d_prefill' 1
ncu_run conv_new "$new" 'conv1d_prefill' 1
ncu_run gdn_new "$new" 'gdn_tc_chunk_kernel|gdn_tc_scan_kernel' 2
