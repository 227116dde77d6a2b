#!/usr/bin/env bash
# One GPU call comparing the W8A8 prefill experts' variants (src/ops/cuda/moe_fp8_wgmma.cu): the tile
# width (MOEFOLD_MOE_FP8_TILE_N 128 | 256) and down's A loads (MOEFOLD_MOE_FP8_DOWN_A tma | cpasync),
# the non-default variants' contracts (and memcheck / racecheck of the small shapes; 256t is the default), then
# Fp8Bench.PrefillExperts in the order 128t 256t 256c 256c 256t 128t. Logs packed into
# $OUT/fp8pf_variants.tgz; one table last.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/fp8_prefill_variants.sh [BUILD]
set -u
B=${1:-build-cuda}
T=$B/tests
out=${OUT:-/tmp}/fp8pfv
mkdir -p "$out"
: >"$out/table.txt"
. "$(dirname "$0")/step.sh"
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
envs() { echo "MOEFOLD_MOE_FP8_TILE_N=${1%?} MOEFOLD_MOE_FP8_DOWN_A=$([ "${1: -1}" = t ] && echo tma || echo cpasync)"; }
for v in 128t 256c; do
  # shellcheck disable=SC2046
  step "contracts.$v" 300 env $(envs $v) "$T/moe_fp8_prefill_test" --gtest_filter='Fp8ActQuant.*:MoeFp8Prefill.*'
  # shellcheck disable=SC2046
  step "sanitize.$v" 200 env $(envs $v) MOEFOLD_FP8_SMALL=1 "$san" --tool racecheck --racecheck-report hazard \
    "$T/moe_fp8_prefill_test" --gtest_filter='MoeFp8Prefill.OnlyFirstOrOnlyLastExpert'
  # shellcheck disable=SC2046
  step "memcheck.$v" 200 env $(envs $v) MOEFOLD_FP8_SMALL=1 "$san" --tool memcheck \
    "$T/moe_fp8_prefill_test" --gtest_filter='MoeFp8Prefill.*'
done
i=0
for v in 128t 256t 256c 256c 256t 128t; do
  i=$((i + 1))
  # shellcheck disable=SC2046
  step "bench_$i.$v" 200 env $(envs $v) MOEFOLD_FP8_BENCH=1 "$T/moe_fp8_prefill_test" --gtest_filter='Fp8Bench.*'
done
for f in "$out"/bench_*.log; do
  echo "$(basename "$f" .log): $(grep -h 'moe_fp8_prefill T=\|wgmma_kernel' "$f" | sed -E 's/.*(T=[0-9]+).*w8a8_wgmma us=([0-9/]+).*/\1 chain \2 |/; s/.*(T=[0-9]+) +moe_fp8_wgmma_kernel:([a-z_]+) +us\/call= *([0-9.]+) TFLOP\/s= *([0-9]+).*/\2 \3us \4TF |/' | tr '\n' ' ')"
done
cat "$out/table.txt"
tar czf "${OUT:-/tmp}/fp8pf_variants.tgz" -C "$out" . && rm -rf "$out"
