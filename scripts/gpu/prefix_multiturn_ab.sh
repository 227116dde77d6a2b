#!/usr/bin/env bash
# The prefix cache under multi-turn chat traffic, A B B A = cache on, off, off, on: four runs of
# `moefold bench serve --dataset-name multi_turn` (each conversation's next request carries the earlier
# turns and the model's actual replies), each against a fresh `moefold serve` (one server at a time: the
# 35B shape does not fit twice), then one table. Server logs and each run's JSON go to OUT_DIR.
#
# Usage: scripts/gpu/prefix_multiturn_ab.sh MOEFOLD_BIN TOKENIZER_DIR OUT_DIR [more bench serve args...]
#   TOKENIZER_DIR: a directory with tokenizer.json (and tokenizer_config.json when present), copied next
#   to the model config into OUT_DIR/model (the dummy-weight model directory the server loads).
# Environment:
#   MODEL_CONFIG  config directory (default configs/qwen3.6-35b-a3b); MODEL_DIR instead: a complete model
#                 directory used as is (e.g. SmolLM2 on the CPU for a dry run)
#   SERVE_ARGS    serve options (default: the 35B shape on the GPU with dummy weights, see below)
#   BENCH_ARGS    the dataset and load (default below); extra arguments after OUT_DIR are appended
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 3 ] || { sed -n '2,16p' "$0"; exit 2; }
bin=$1 tokdir=$2 out=$3
shift 3
mkdir -p "$out"
if [ -n "${MODEL_DIR:-}" ]; then
  model=$MODEL_DIR
else
  model=$out/model
  mkdir -p "$model"
  cp "${MODEL_CONFIG:-$root/configs/qwen3.6-35b-a3b}"/*.json "$model/"
  [ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer.json in $tokdir"; exit 1; }
  for f in tokenizer.json tokenizer_config.json special_tokens_map.json chat_template.jinja; do
    [ -f "$tokdir/$f" ] && cp "$tokdir/$f" "$model/"
  done
fi
serve_args=${SERVE_ARGS:---device cuda --load-format dummy --max-num-seqs 32 --max-num-batched-tokens 8192 --kv-cache-memory 24G --max-model-len 16384 --prefix-snapshot-memory 4G}
bench_args=${BENCH_ARGS:---dataset-name multi_turn --num-prompts 32 --multi-turn-num-turns 6 --multi-turn-shared-prefix-len 2048 --multi-turn-prefix-len 512 --multi-turn-user-len 256 --output-len 128 --ignore-eos --max-concurrency 16 --seed 7}

pid=""
stop() { [ -n "$pid" ] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }; pid=""; }
trap stop EXIT

run=0
for cache in on off off on; do
  run=$((run + 1))
  extra=""
  [ "$cache" = off ] && extra="--no-enable-prefix-caching"
  t0=$(date +%s%N)
  # shellcheck disable=SC2086
  "$bin" serve --model "$model" --port 0 $serve_args $extra >"$out/serve$run.stdout" 2>"$out/serve$run.log" &
  pid=$!
  url=""
  for _ in $(seq 1 1200); do
    url=$(sed -n 's/^moefold serve: listening on \(http:[^ ]*\).*/\1/p' "$out/serve$run.stdout" | head -1)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || { echo "serve (run $run) exited:"; tail -20 "$out/serve$run.log"; exit 1; }
    sleep 0.5
  done
  [ -n "$url" ] || { echo "serve (run $run) did not start"; tail -20 "$out/serve$run.log"; exit 1; }
  echo "run $run (cache $cache): serve listening on $url after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  # shellcheck disable=SC2086
  "$bin" bench serve --base-url "$url" --tokenizer "$model" --json "$out/run$run.json" --disable-tqdm \
    $bench_args "$@" >"$out/bench$run.txt" 2>&1 || { echo "bench serve (run $run) failed:"; tail -30 "$out/bench$run.txt"; exit 1; }
  grep -E "Successful requests|Failed requests|Prefix cache hit rate|Output token throughput" "$out/bench$run.txt" | sed 's/^/  /'
  stop
done

python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
rows = []
for i, cache in enumerate(["on", "off", "off", "on"], 1):
    r = json.load(open(f"{out}/run{i}.json"))
    rows.append((i, cache, r))
print("\n| run | cache | requests ok / failed | duration s | hit rate | req/s | output tok/s | total tok/s | mean TTFT ms | P99 TTFT ms |")
print("|---|---|---|---|---|---|---|---|---|---|")
for i, cache, r in rows:
    print(f"| {i} | {cache} | {r['completed']} / {r['failed']} | {r['duration']:.2f} | {100 * r.get('prefix_cache_hit_rate', 0):.1f}% "
          f"| {r['request_throughput']:.2f} | {r['output_throughput']:.1f} | {r['total_token_throughput']:.0f} "
          f"| {r['mean_ttft_ms']:.1f} | {r.get('p99_ttft_ms', float('nan')):.1f} |")
on = [r for _, c, r in rows if c == "on"]
off = [r for _, c, r in rows if c == "off"]
avg = lambda rs, k: sum(r[k] for r in rs) / len(rs)
print(f"\noutput tok/s on / off: {avg(on, 'output_throughput') / avg(off, 'output_throughput'):.3f}; "
      f"mean TTFT on / off: {avg(on, 'mean_ttft_ms') / avg(off, 'mean_ttft_ms'):.3f}")
EOF
