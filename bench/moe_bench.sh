#!/usr/bin/env bash
# Device-side driver for the MoE chain (run on the H200 from the repo root, after building here with
# scripts/gpu/build.sh BUILD moe_test): contract tests, compute-sanitizer memcheck + racecheck on small
# cases, the moefold micro-benchmark and the torch._grouped_mm reference, in one command. Full logs go to
# $OUT (or /tmp/moe_out); a summary is printed last.
# Usage: bench/moe_bench.sh BUILD
set -uo pipefail
b=${1:-build-cuda}
out=${OUT:-/tmp/moe_out}
mkdir -p "$out"
source scripts/gpu/env.sh "$b"
t=./$b/tests/moe_test
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
s0=$(date +%s)
# One process per suite, so that a fault in one leaves the others' results.
for f in 'MoeRouter.*:20' 'MoePlan.*:20' 'MoeChain.E16k4:30' 'MoeChain.E256k8RealShape:60' 'MoeChain.TileConfigs*:40' 'MoeBench.*:60'; do
  MOEFOLD_MOE_BENCH=1 timeout "${f##*:}" "$t" --gtest_filter="${f%:*}" >> "$out/moe_test.log" 2>&1
  echo "moe_test ${f%:*} rc=$? ($(( $(date +%s) - s0 )) s)" | tee -a "$out/summary.txt"
done
s3=$(date +%s)
PYTHONUNBUFFERED=1 timeout 45 python3 bench/moe_torch_ref.py > "$out/torch_ref.log" 2>&1; echo "torch_ref rc=$? ($(( $(date +%s) - s3 )) s)" | tee -a "$out/summary.txt"
s1=$(date +%s)
timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --gtest_filter='MoeChain.Sanitize*' \
  > "$out/memcheck.log" 2>&1; echo "memcheck rc=$? ($(( $(date +%s) - s1 )) s)" | tee -a "$out/summary.txt"
s2=$(date +%s)
timeout 25 compute-sanitizer --tool racecheck --error-exitcode 9 "$t" --gtest_filter='MoeChain.SanitizeSmall' \
  > "$out/racecheck.log" 2>&1; echo "racecheck rc=$? ($(( $(date +%s) - s2 )) s)" | tee -a "$out/summary.txt"
{
  echo "CONTRACT lines: $(grep -c '^CONTRACT' "$out/moe_test.log") total, $(grep -c 'verdict=PASS' "$out/moe_test.log") PASS, $(grep -c 'verdict=FAIL' "$out/moe_test.log") FAIL"
  grep 'verdict=FAIL' "$out/moe_test.log" | head -20
  grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/moe_test.log" | head -12
  grep -E 'Failure|error|Error' "$out/moe_test.log" | head -10
  grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid' "$out/memcheck.log" "$out/racecheck.log" | head -10
  grep -E 'PASSED|FAILED' "$out/memcheck.log" "$out/racecheck.log" | head -6
  grep -E '^(BENCH|TORCH)' "$out/moe_test.log" "$out/torch_ref.log"
  grep -E 'Error|error' "$out/torch_ref.log" | head -5 || true
} | tee -a "$out/summary.txt"
