#!/usr/bin/env bash
# Decode speed, eager vs CUDA graphs, in the order A B B A (A = --enforce-eager, B = graphs), one
# `moefold bench offline` process each (the 35B shape does not fit twice in one GPU), then one table:
# per decode batch the median step of each run, the B/A ratios and the fraction of the HBM floor.
# Usage: scripts/gpu/decode_ab.sh MOEFOLD_BIN MODEL_DIR OUT_DIR [bench offline args...]
#   e.g. scripts/gpu/decode_ab.sh build-cuda/moefold configs/qwen3.6-35b-a3b $OUT --decode-batch 1,8,64,256
set -euo pipefail
bin=$1 model=$2 out=$3
shift 3
mkdir -p "$out"
i=0
for mode in eager graphs graphs eager; do
  i=$((i + 1))
  flag=""
  [ "$mode" = eager ] && flag=--enforce-eager
  echo "=== run $i: $mode"
  # shellcheck disable=SC2086
  "$bin" bench offline --model "$model" --prefill '' --json "$out/decode_$i.json" $flag "$@" 2>&1 | tee "$out/decode_$i.log"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = [json.load(open(f"{out}/decode_{i}.json")) for i in range(1, 5)]
print(f"\n{'decode batch':>12} {'eager A1 ms':>12} {'graph B1 ms':>12} {'graph B2 ms':>12} {'eager A2 ms':>12} "
      f"{'B/A':>6} {'graph % of floor':>17}")
for j, d in enumerate(runs[0]["decode"]):
    t = [r["decode"][j]["median_step_s"] * 1e3 for r in runs]
    ratio = (t[1] + t[2]) / (t[0] + t[3])
    frac = 100 * d["hbm_floor_s"] / (min(t[1], t[2]) / 1e3)
    print(f"{d['batch']:>12} {t[0]:>12.2f} {t[1]:>12.2f} {t[2]:>12.2f} {t[3]:>12.2f} {ratio:>6.2f} {frac:>16.1f}%")
PY
