#!/usr/bin/env bash
# Serving benchmark on one machine: starts `moefold serve` (any serve options via SERVE_ARGS), waits
# until it listens, runs `moefold bench serve` against it with the remaining arguments, prints the
# server's startup time and stops it. The server's log goes to OUT_DIR/serve.log, the report's JSON
# to OUT_DIR/bench_serve.json.
# Usage: SERVE_ARGS="--device cuda --load-format dummy ..." \
#        scripts/gpu/serve_bench.sh MOEFOLD_BIN MODEL_DIR OUT_DIR [bench serve args...]
set -euo pipefail
bin=$1 model=$2 out=$3
shift 3
mkdir -p "$out"
t0=$(date +%s%N)
# shellcheck disable=SC2086
"$bin" serve --model "$model" --port 0 ${SERVE_ARGS:-} >"$out/serve.stdout" 2>"$out/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
url=""
for _ in $(seq 1 1200); do
  url=$(sed -n 's/^moefold serve: listening on \(http:[^ ]*\).*/\1/p' "$out/serve.stdout" | head -1)
  [ -n "$url" ] && break
  kill -0 $pid 2>/dev/null || { echo "serve exited:"; cat "$out/serve.log"; exit 1; }
  sleep 0.5
done
[ -n "$url" ] || { echo "serve did not start"; cat "$out/serve.log"; exit 1; }
echo "serve: listening on $url after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
"$bin" bench serve --base-url "$url" --json "$out/bench_serve.json" --disable-tqdm "$@"
