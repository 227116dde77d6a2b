#!/usr/bin/env bash
# The FP8 drift / perplexity report of docs/fp8.md on a real model (CPU): greedy drift over GSM8K
# questions for FP8 weights, FP8 lm_head and FP8 KV cache vs unquantised; teacher-forced perplexity over
# questions + answers (`moefold perplexity`: KL per token, top-1 agreement) for FP8 weights (W8A16), the
# releases' W8A8 scheme (--b-fp8-activations) and the FP8 lm_head (the FP8 KV cache's through `drift
# --with-answers`); then the attribution by tensor kind and by layer (only that group in FP8).
# Usage: scripts/fp8_drift_report.sh [MODEL] [OUT_DIR] [N_PROMPTS]   (defaults: models/smollm2-135m-instruct,
# /tmp/fp8_drift, 30; N_KINDS=6 and N_LAYERS=6 prompts for the attributions). Writes one JSON per run to
# OUT_DIR and prints each run's summary lines. About an hour on two free cores for SmolLM2.
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
  echo "== $name: drift $*"
  "$bin" drift --model "$model" --prompts-file "$data" --num-prompts "$n" --json "$out/$name.json" "$@" | grep '^drift:'
}
ppl() {  # name, prompts, extra args...
  local name=$1 np=$2; shift 2
  echo "== $name: perplexity --num-prompts $np $*"
  "$bin" perplexity --model "$model" --prompts-file "$data" --with-answers --num-prompts "$np" \
    --json "$out/$name.json" "$@" | grep -v '^  A '
}
drift greedy_fp8_weights --b-quantization fp8 --max-tokens 32
drift greedy_fp8_lm_head --b-quantization none --b-fp8-lm-head --max-tokens 32
drift greedy_fp8_kv --b-quantization none --b-kv-cache-dtype fp8 --max-tokens 32
drift ppl_fp8_kv --b-quantization none --b-kv-cache-dtype fp8 --with-answers --max-tokens 1
ppl ppl_fp8_weights "$n" --b-quantization fp8
ppl ppl_fp8_w8a8 "$n" --b-quantization fp8 --b-fp8-activations
ppl ppl_fp8_lm_head "$n" --b-quantization none --b-fp8-lm-head
ppl attribution_kinds "${N_KINDS:-6}" --attribution kinds
ppl attribution_layers "${N_LAYERS:-6}" --attribution layers
ppl option_attention_bf16 "${N_KINDS:-6}" --b-fp8-only mlp.
ppl option_q_k_bf16 "${N_KINDS:-6}" --b-fp8-only self_attn.v_proj.,self_attn.o_proj.,mlp.
