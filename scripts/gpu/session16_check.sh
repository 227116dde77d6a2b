#!/usr/bin/env bash
# Session 16's second H200 call (issue 13): the conv1d table again (written to OUT/conv.md), the DeltaNet
# contract tests and memcheck with the approximate SiLU, and a 32k-token prefill of the 35B shape profiled
# A B B A (A: the binary before the change, B: after), with the kernel table of the first B run.
# Usage: scripts/gpu/session16_check.sh BIN_DIR OUT_DIR
#   BIN_DIR: gdn_bench_old, gdn_bench_test, gated_delta_net_test, moefold_old, moefold.
set -uo pipefail
b=$1 out=$2
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
SKIP_NCU=1 bash "$here/session16_probe.sh" "$b/gdn_bench_old" "$b/gdn_bench_test" "$out" > /dev/null
cat "$out/conv.md"
echo "== gated_delta_net_test"
timeout 150 "$b/gated_delta_net_test" > "$out/gdn_test.txt" 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|tests? ran' "$out/gdn_test.txt" | head -12
echo "== memcheck GdnConv.*"
timeout 120 compute-sanitizer --tool memcheck --print-limit 4 "$b/gated_delta_net_test" --gtest_filter='GdnConv.*' 2>&1 |
  grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' | head -4
echo "== profile prefill:32768, A B B A"
i=0
for n in old new new old; do
  i=$((i + 1))
  bin=$b/moefold
  req=(--require-kernel conv1d_prefill_tile_kernel --require-kernel gdn_tc_scan_kernel)
  [ $n = old ] && bin=$b/moefold_old
  timeout 120 "$bin" profile --model configs/qwen3.6-35b-a3b --load-format dummy --device cuda \
    --workload prefill:32768 "${req[@]}" > "$out/prof_${i}_$n.txt" 2>&1
  echo "run $i $n (rc $?): $(grep -m1 'profiled wall' "$out/prof_${i}_$n.txt")"
  grep -E '^(conv|DeltaNet|norm and rope) ' "$out/prof_${i}_$n.txt" | sed 's/^/    /'
done
echo "== kernel table, run 2 (new)"
sed -n '/^category/,$p' "$out/prof_2_new.txt" | head -60
