#!/usr/bin/env bash
# One device call for the decode path (issue 12): the GPU contract tests of the decode kernels and the
# executor (graphs vs eager, live rows vs alone, sampling), compute-sanitizer memcheck on their *Small*
# cases, bench offline eager vs graphs A B B A (batch-invariant) plus one non-invariant run, a decode
# kernel profile, and bench serve at concurrency 1 (1024 in / 256 out) eager vs graphs A B B A.
# Usage (on the GPU machine): scripts/gpu/decode_check.sh BIN_DIR CONFIG_DIR SERVE_DIR OUT_DIR
#   BIN_DIR: moefold + the test binaries + lib.tar.xz; SERVE_DIR: CONFIG_DIR plus a tokenizer.json.
set -uo pipefail
bin=$1 cfg=$2 serve_dir=$3 out=$4
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/scripts/gpu/env.sh" "$bin"
mkdir -p "$out"
log=$out/tests.log
: >"$log"
for t in cuda_graph_test cuda_executor_test decode_gemm_test gemv_test sampling_test moe_test profiler_test \
         attention_test core_ops_test gated_delta_net_test gated_rms_norm_test dummy_fill_test; do
  [ -x "$bin/$t" ] || continue
  timeout 200 "$bin/$t" >/tmp/$t.log 2>&1
  rc=$?
  echo "$t rc=$rc pass=$(grep -c 'verdict=PASS' /tmp/$t.log) fail=$(grep -c 'verdict=FAIL' /tmp/$t.log)"
  grep -E 'verdict=FAIL|\[  FAILED  \]' /tmp/$t.log | head -4 | cut -c1-240
  cat /tmp/$t.log >>"$log"
done
for t in cuda_graph_test decode_gemm_test sampling_test; do
  echo "memcheck $t: $(timeout 120 compute-sanitizer --tool memcheck "$bin/$t" --gtest_filter='*Small*' 2>&1 | tail -1)"
done
PYTHONUNBUFFERED=1 "$root/scripts/gpu/decode_ab.sh" "$bin/moefold" "$cfg" /tmp/ab --decode-batch 1,8,64,256 \
  --decode-steps 16 >"$out/decode_ab.log" 2>&1
"$bin/moefold" bench offline --model "$cfg" --prefill 0 --decode-batch 1,8,64,256 --decode-steps 16 \
  --no-batch-invariant >"$out/decode_noninv.log" 2>&1
"$bin/moefold" profile --model "$cfg" --load-format dummy --device cuda --workload decode:1x16 \
  --workload decode:64x16 >"$out/profile.log" 2>&1
for mode in eager graphs graphs eager; do
  extra=""
  [ "$mode" = eager ] && extra=--enforce-eager
  SERVE_ARGS="--device cuda --load-format dummy --max-num-seqs 64 --max-num-batched-tokens 8192 \
    --kv-cache-memory 24G --max-model-len 4096 $extra" \
    "$root/scripts/gpu/serve_bench.sh" "$bin/moefold" "$serve_dir" "/tmp/serve_$mode" --tokenizer "$serve_dir" \
    --random-prompt-format token-ids --random-input-len 1024 --random-output-len 256 --num-prompts 6 \
    --max-concurrency 1 --ignore-eos >>"$out/serve.log" 2>&1
  echo "serve $mode: $(grep -E 'Output token throughput' "$out/serve.log" | tail -1)"
done
echo
tail -6 "$out/decode_ab.log"
grep -E '^decode batch' "$out/decode_noninv.log" | sed 's/^/non-invariant graphs: /'
