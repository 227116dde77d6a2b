#!/usr/bin/env bash
# Decode step time of several configurations, one `moefold bench offline` process each, in a palindrome
# order (A B C C B A), then one table of every run's median per batch. A configuration is
# LABEL:BINARY[:VAR=value,VAR2=value].
# Usage: scripts/gpu/decode_configs.sh OUT_DIR "A:build/moefold B:build/moefold:MOEFOLD_X=1" [bench offline args...]
set -euo pipefail
out=$1 configs=$2
shift 2
mkdir -p "$out"
model=${MODEL:-configs/qwen3.6-35b-a3b}
order="$configs $(echo $configs | tr ' ' '\n' | tac | tr '\n' ' ')"
i=0
for c in $order; do
  i=$((i + 1))
  IFS=: read -r label bin envs <<<"$c"
  # shellcheck disable=SC2046
  env $(echo "${envs:-}" | tr ',' ' ') "$bin" bench offline --model "$model" --prefill 0 --decode-steps 16 \
    --json "$out/${label}_$i.json" "$@" >"$out/${label}_$i.log" 2>&1 || { echo "run $i ($c) failed:"; tail -5 "$out/${label}_$i.log"; exit 1; }
done
python3 - "$out" "$order" <<'PY'
import json, sys, collections
out, order = sys.argv[1], sys.argv[2].split()
t = collections.defaultdict(list)
for i, c in enumerate(order, 1):
    label = c.split(":")[0]
    for d in json.load(open(f"{out}/{label}_{i}.json"))["decode"]:
        t[(label, d["batch"])].append(d["median_step_s"] * 1e3)
batches = sorted({b for _, b in t})
labels = list(dict.fromkeys(c.split(":")[0] for c in order))
print(f"\n{'config':>10} " + " ".join(f"{'batch ' + str(b) + ' ms (runs in order)':>30}" for b in batches))
for l in labels:
    print(f"{l:>10} " + " ".join(f"{' / '.join(f'{x:.3f}' for x in t[(l, b)]):>30}" for b in batches))
PY
