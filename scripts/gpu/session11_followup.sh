#!/usr/bin/env bash
# One GPU call (session 11): (1) the W8A8 prefill experts at their new default tile width (256-row items):
# the executor's FP8 tests and the kernel contracts; (2) bench offline -q fp8 prefill 4096 / 16384 in the
# order A B B A (A: MOEFOLD_MOE_FP8_TILE_N=128, B: the default 256, which --require-kernel proves ran the
# W8A8 kernels); (3) which decode fusion costs the batch-64 step: bench offline at batch 1 and 64 with every
# fusion on, all off, and each one off alone, in a palindrome order. Logs packed into $OUT/s11_logs.tgz.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/session11_followup.sh [BUILD]
set -u
B=${1:-build-cuda}
T=$B/tests
M=configs/qwen3.6-35b-a3b
out=${OUT:-/tmp}/s11
mkdir -p "$out"
: >"$out/table.txt"
. "$(dirname "$0")/step.sh"
step executor_fp8 120 "$T/cuda_executor_test" --gtest_filter='CudaForwardSmall.Fp8*' &
step fp8_contracts 150 "$T/moe_fp8_prefill_test" --gtest_filter='Fp8ActQuant.*:MoeFp8Prefill.*' &
wait
grep -h "PROBE" "$out/executor_fp8.log" | tee -a "$out/table.txt"
i=0
for mode in A B B A; do
  i=$((i + 1))
  e=MOEFOLD_MOE_FP8_TILE_N=128
  req=()
  [ $mode = B ] && { e=MOEFOLD_MOE_FP8_TILE_N=256; req=(--require-kernel moe_fp8_wgmma_kernel:gate_up --require-kernel moe_fp8_wgmma_kernel:down); }
  step "fp8_prefill_$i$mode" 200 env $e "$B/moefold" bench offline --model $M --load-format dummy -q fp8 \
    --prefill 4096,16384 --decode-batch 1 --decode-steps 4 --repeats 3 "${req[@]}"
  echo "run $i $mode $(grep -E '^prefill (4096|16384)' "$out/fp8_prefill_$i$mode.log" | awk '{print $1, $2, $3, $4}' | tr '\n' ' ')" | tee -a "$out/table.txt"
done
off_all="MOEFOLD_FUSE_COMBINE_NORM=0 MOEFOLD_FUSE_GDN_DECODE=0 MOEFOLD_FUSE_QK_ROPE=0"
i=0
for cfg in on all_off gdn_off comb_off qk_off qk_off comb_off gdn_off all_off on; do
  i=$((i + 1))
  case $cfg in
    on) e="MOEFOLD_PDL=1" ;;
    all_off) e=$off_all ;;
    gdn_off) e=MOEFOLD_FUSE_GDN_DECODE=0 ;;
    comb_off) e=MOEFOLD_FUSE_COMBINE_NORM=0 ;;
    qk_off) e=MOEFOLD_FUSE_QK_ROPE=0 ;;
  esac
  # shellcheck disable=SC2086
  step "fuse_$i.$cfg" 120 env $e "$B/moefold" bench offline --model $M --load-format dummy --prefill 0 \
    --decode-batch 1,64 --decode-steps 12
  echo "fuse $i $cfg $(grep -E '^decode batch' "$out/fuse_$i.$cfg.log" | awk '{print "b" $3, $4}' | tr '\n' ' ')" | tee -a "$out/table.txt"
done
tar czf "${OUT:-/tmp}/s11_logs.tgz" -C "$out" .
cat "$out/table.txt"
