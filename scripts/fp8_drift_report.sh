#!/usr/bin/env bash
# The FP8 drift report of docs/fp8.md on a real model (CPU): greedy drift and teacher-forced perplexity
# over GSM8K questions (+ answers) for FP8 weights, FP8 lm_head and FP8 KV cache vs unquantised, then
# the perplexity attribution: only one kind of tensor (or one layer) in FP8 at a time.
# Usage: scripts/fp8_drift_report.sh [MODEL] [OUT_DIR] [N_PROMPTS]   (defaults: models/smollm2-135m-instruct,
# /tmp/fp8_drift, 30). Writes one JSON per run to OUT_DIR and prints each run's summary lines.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-$root/models/smollm2-135m-instruct}
out=${2:-/tmp/fp8_drift}
n=${3:-30}
bin=${MOEFOLD_BINARY:-$root/build/moefold}
data=${GSM8K:-$root/../shared/data/gsm8k/test.jsonl}
[ -f "$data" ] || data=/work/shared/data/gsm8k/test.jsonl
mkdir -p "$out"
drift() {  # name, extra args...
  local name=$1; shift
  echo "== $name: $*"
  "$bin" drift --model "$model" --prompts-file "$data" --num-prompts "$n" --json "$out/$name.json" "$@" | grep '^drift:'
}
drift greedy_fp8_weights --b-quantization fp8 --max-tokens 32
drift greedy_fp8_lm_head --b-quantization none --b-fp8-lm-head --max-tokens 32
drift ppl_fp8_weights --b-quantization fp8 --with-answers --max-tokens 1
drift ppl_fp8_lm_head --b-quantization none --b-fp8-lm-head --with-answers --max-tokens 1
drift ppl_fp8_both --b-quantization fp8 --b-fp8-lm-head --with-answers --max-tokens 1
drift greedy_fp8_kv --b-quantization none --b-kv-cache-dtype fp8 --max-tokens 32
drift ppl_fp8_kv --b-quantization none --b-kv-cache-dtype fp8 --with-answers --max-tokens 1
for only in ${FP8_ONLY:-self_attn.q_proj self_attn.k_proj self_attn.v_proj self_attn.o_proj mlp.gate_proj mlp.up_proj mlp.down_proj layers.0. layers.29.}; do
  drift "ppl_only_${only//\//_}" --b-quantization fp8 --b-fp8-only "$only" --with-answers --max-tokens 1
done
