#!/usr/bin/env bash
# Decode speed of two configurations in the order A B B A, one `moefold bench offline` process each (the
# 35B shape does not fit twice in one GPU), then one table: per decode batch the median step of each
# run, the B/A ratio and B's fraction of the HBM floor. Default A = --enforce-eager, B = CUDA graphs;
# A_FLAGS / B_FLAGS (extra bench offline flags) and A_ENV / B_ENV (VAR=value words) choose others;
# A_BIN / B_BIN run two different moefold binaries (default: MOEFOLD_BIN for both), e.g. an old build as A.
# Usage: [A_FLAGS=..] [B_ENV=..] scripts/gpu/decode_ab.sh MOEFOLD_BIN MODEL_DIR OUT_DIR [bench offline args...]
#   e.g. scripts/gpu/decode_ab.sh build-cuda/moefold configs/qwen3.6-35b-a3b $OUT --decode-batch 1,8,64,256
#        A_ENV=MOEFOLD_PDL=0 A_FLAGS= scripts/gpu/decode_ab.sh ...   (PDL off vs on, both with graphs)
set -euo pipefail
bin=$1 model=$2 out=$3
shift 3
mkdir -p "$out"
i=0
a_flags=${A_FLAGS---enforce-eager} b_flags=${B_FLAGS-}
a_bin=${A_BIN-$bin} b_bin=${B_BIN-$bin}
for mode in A B B A; do
  i=$((i + 1))
  if [ "$mode" = A ]; then flags=$a_flags envs=${A_ENV-} run_bin=$a_bin; else flags=$b_flags envs=${B_ENV-} run_bin=$b_bin; fi
  echo "=== run $i: $mode ($envs $flags)"
  # shellcheck disable=SC2086
  env $envs "$run_bin" bench offline --model "$model" --prefill 0 --json "$out/decode_$i.json" $flags "$@" 2>&1 |
    tee "$out/decode_$i.log"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = [json.load(open(f"{out}/decode_{i}.json")) for i in range(1, 5)]
print(f"\n{'decode batch':>12} {'A1 ms':>12} {'B1 ms':>12} {'B2 ms':>12} {'A2 ms':>12} "
      f"{'B/A':>6} {'B % of floor':>17}")
for j, d in enumerate(runs[0]["decode"]):
    t = [r["decode"][j]["median_step_s"] * 1e3 for r in runs]
    ratio = (t[1] + t[2]) / (t[0] + t[3])
    frac = 100 * d["hbm_floor_s"] / (min(t[1], t[2]) / 1e3)
    print(f"{d['batch']:>12} {t[0]:>12.2f} {t[1]:>12.2f} {t[2]:>12.2f} {t[3]:>12.2f} {ratio:>6.2f} {frac:>16.1f}%")
PY
