#!/usr/bin/env bash
# One GPU call for the fused decode kernels (issue 12 item 3): the DeltaNet decode layer in one launch
# (gdn_decode_fused_kernel: conv step + delta rule + gated norm), the next layer's input norm in the
# MoE combine (moe_combine_onepass_kernel:norm) and the attention prologue (qk_norm_rope_kernel: q / k
# norms, RoPE, the cache write). Their contracts (bitwise vs the launches they replace),
# compute-sanitizer memcheck / racecheck, the four end-to-end GPU suites at once (graph == eager, solo ==
# beside others, resumed == fresh) with the FP8 prefill contracts beside them, bench offline A B B A
# (A: both fusions off, B: on, with --require-kernel) and a batch-1 kernel table. Logs packed into
# $OUT/fusion_logs.tgz; one table last.
# Usage (repository root, after `source scripts/gpu/env.sh BUILD`): scripts/gpu/decode_fusion_check.sh [BUILD]
set -u
B=${1:-build-cuda}
T=$B/tests
out=${OUT:-/tmp}/fusion
mkdir -p "$out"
: >"$out/table.txt"
. "$(dirname "$0")/step.sh"
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
step gdn_fused 120 "$T/gated_delta_net_test" --gtest_filter='GdnDecodeFused.*:GdnDecode.*'
step combine_norm 120 "$T/moe_test" --gtest_filter='MoeCombineNorm.*:MoeCombineFast.*'
step qk_norm_rope 120 "$T/qk_norm_rope_test"
step core_ops 120 "$T/core_ops_test"
pids=()
for t in mixed_step_cuda_test cuda_graph_test cuda_executor_test prefix_cache_cuda_test; do
  MOEFOLD_FUSE_GDN_DECODE=1 step "$t" 150 "$T/$t" &
  pids+=($!)
done
step fp8_prefill 200 "$T/moe_fp8_prefill_test" --gtest_filter='Fp8ActQuant.*:MoeFp8Prefill.*' &
pids+=($!)
{
  step racecheck_gdn 150 "$san" --tool racecheck --racecheck-report hazard "$T/gated_delta_net_test" \
    --gtest_filter='GdnDecodeFused.SanitizeSmall'
  step memcheck_gdn 100 "$san" --tool memcheck "$T/gated_delta_net_test" --gtest_filter='GdnDecodeFused.SanitizeSmall'
  step memcheck_comb 60 "$san" --tool memcheck "$T/moe_test" --gtest_filter='MoeCombineNorm.SwitchOffGivesSameBits'
  step memcheck_qk 60 "$san" --tool memcheck "$T/qk_norm_rope_test" --gtest_filter='QkNormRope.UnsupportedLayoutsDecline'
} &
pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
grep -h "PROBE\|verdict=FAIL" "$out"/cuda_executor_test.log | head -6 >>"$out/table.txt"
# Fused == unfused through the executor: greedy tokens with the three switches off vs on (eager), per model.
off="MOEFOLD_FUSE_COMBINE_NORM=0 MOEFOLD_FUSE_GDN_DECODE=0 MOEFOLD_FUSE_QK_ROPE=0"
for m in tests/fixtures/qwen3 tests/fixtures/qwen3_moe tests/fixtures/qwen3_5_moe tests/fixtures/qwen3_next \
  configs/qwen3.6-35b-a3b; do
  lf=auto
  case $m in configs/*) lf=dummy ;; esac
  args=(generate --model "$m" --device cuda --load-format $lf --prompt-ids 11,22,33,44,55,66,77 --max-tokens 24
    --output json)
  # shellcheck disable=SC2086
  a=$(env $off timeout 60 "$B/moefold" "${args[@]}" --enforce-eager 2>>"$out/generate.log")
  b=$(MOEFOLD_FUSE_GDN_DECODE=1 timeout 60 "$B/moefold" "${args[@]}" --enforce-eager 2>>"$out/generate.log")
  g=$(MOEFOLD_FUSE_GDN_DECODE=1 timeout 60 "$B/moefold" "${args[@]}" 2>>"$out/generate.log")
  v=FAIL
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$b" = "$g" ] && v=PASS
  echo "fused==unfused==graph $m verdict=$v ${b:0:60}" >>"$out/table.txt"
done
A_FLAGS= A_ENV="MOEFOLD_FUSE_COMBINE_NORM=0 MOEFOLD_FUSE_GDN_DECODE=0 MOEFOLD_FUSE_QK_ROPE=0" B_ENV=MOEFOLD_FUSE_GDN_DECODE=1 \
  B_FLAGS="--require-kernel gdn_decode_fused_kernel --require-kernel moe_combine_onepass_kernel:norm --require-kernel qk_norm_rope_kernel" \
  timeout 220 scripts/gpu/decode_ab.sh "$B/moefold" configs/qwen3.6-35b-a3b "$out/ab" --load-format dummy \
  --decode-batch 1,8,64 --decode-steps 12 >"$out/ab.log" 2>&1
echo "decode A/B rc=$?" >>"$out/table.txt"
MOEFOLD_FUSE_GDN_DECODE=1 timeout 90 "$B/moefold" profile --model configs/qwen3.6-35b-a3b --load-format dummy --device cuda \
  --workload decode:1x512 --steps 6 >"$out/profile.log" 2>&1
echo "profile rc=$?" >>"$out/table.txt"
tar czf "${OUT:-/tmp}/fusion_logs.tgz" -C "$out" .
sed -n '/^kernel /,/^$/p' "$out/profile.log" | head -45
sed -n '/decode batch/,$p' "$out/ab.log"
cat "$out/table.txt"
