#!/usr/bin/env bash
# One GPU call for the W8A8 prefill experts (src/ops/cuda/moe_fp8_wgmma.cu, fp8_act_quant.cu): their
# contracts (moe_fp8_prefill_test), the decode FP8 kernels' contracts (fp8_kernels_test, quick), memcheck
# and racecheck on the small shapes, the chain's timing beside the dequantise + bf16 path
# (Fp8Bench.PrefillExperts), torch's peers and ceilings (fp8_prefill_peer_bench.py), then on the 35B shape
# with -q fp8: bench offline prefill in the order A B B A (A: MOEFOLD_MOE_FP8_PREFILL=dequant, B: the
# default) and the kernel table of a 16k-token prefill with --require-kernel. Logs under $OUT/fp8pf; one
# table last; the logs come back packed in $OUT/fp8pf_logs.tgz. The switches' variants (tile width, down's
# A loads): fp8_prefill_variants.sh.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/fp8_prefill_check.sh [BUILD]
set -u
B=${1:-build-cuda}
T=$B/tests
out=${OUT:-/tmp}/fp8pf
mkdir -p "$out"
: >"$out/table.txt"
. "$(dirname "$0")/step.sh"
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
step contracts 300 "$T/moe_fp8_prefill_test"
step decode_contracts 200 env MOEFOLD_FP8_QUICK=1 "$T/fp8_kernels_test"
step memcheck 200 env MOEFOLD_FP8_SMALL=1 "$san" --tool memcheck "$T/moe_fp8_prefill_test" \
  --gtest_filter='Fp8ActQuant.*:MoeFp8Prefill.ContractVsQuantisedReferences'
step racecheck 300 env MOEFOLD_FP8_SMALL=1 "$san" --tool racecheck --racecheck-report hazard "$T/moe_fp8_prefill_test" \
  --gtest_filter='MoeFp8Prefill.OnlyFirstOrOnlyLastExpert'
step bench 200 env MOEFOLD_FP8_BENCH=1 "$T/moe_fp8_prefill_test" --gtest_filter='Fp8Bench.*'
step peers 200 python3 scripts/gpu/fp8_prefill_peer_bench.py
M=configs/qwen3.6-35b-a3b
i=0
for mode in A B B A; do
  i=$((i + 1))
  if [ $mode = A ]; then e=MOEFOLD_MOE_FP8_PREFILL=dequant; else e=MOEFOLD_MOE_FP8_PREFILL=wgmma; fi
  step "prefill_$i$mode" 300 env $e "$B/moefold" bench offline --model $M -q fp8 --prefill 4096,16384 \
    --decode-batch 1 --decode-steps 4 --repeats 3
done
step profile 300 "$B/moefold" profile --model $M --load-format dummy -q fp8 --device cuda --workload prefill:16384 \
  --require-kernel moe_fp8_wgmma_kernel:gate_up --require-kernel moe_fp8_wgmma_kernel:down
echo "--- results"
grep -h "PROBE" "$out/contracts.log" | head -40
grep -h "BENCH\|PEER" "$out/bench.log" "$out/peers.log"
for f in "$out"/prefill_*.log; do echo "$(basename "$f"): $(grep -iE 'prefill +[0-9]+' "$f" | tr -s ' ' | tr '\n' ';')"; done
grep -iE "moe_fp8|fp8_quant|routed|total|prefill" "$out/profile.log" | head -30
cat "$out/table.txt"
tar czf "${OUT:-/tmp}/fp8pf_logs.tgz" -C "$out" . && rm -rf "$out"  # one file back
