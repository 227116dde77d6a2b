#!/usr/bin/env bash
# libFuzzer targets for moefold's parsers of untrusted input (docs/fuzzing.md).
#   scripts/fuzz.sh --ci              build every target, run each for FUZZ_CI_SECONDS (default 5) over its
#                                     committed seed corpus; fails on any crash, leak, timeout or OOM
#   scripts/fuzz.sh TARGET SECONDS    one long run (TARGET: config, safetensors, tokenizer, chat_template,
#                                     chat_messages, request); new inputs go to build-fuzz/corpus/TARGET,
#                                     crashes to build-fuzz/artifacts/TARGET/
#   scripts/fuzz.sh --list            the target names
# Needs clang with libFuzzer and the sanitizer runtimes (Debian 12: clang, libclang-rt-14-dev); installed
# here when missing. Extra libFuzzer flags: FUZZ_FLAGS="-jobs=2 -workers=2".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
targets=(config safetensors tokenizer chat_template chat_messages request)
build=${FUZZ_BUILD_DIR:-build-fuzz}

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
if [ "$1" = --list ]; then printf '%s\n' "${targets[@]}"; exit 0; fi

ensure_clang() {
  if command -v clang++ >/dev/null && echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer,address,undefined -o /dev/null - 2>/dev/null; then
    return
  fi
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev
}

build_targets() {
  ensure_clang
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S fuzz -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" >/dev/null
  cmake --build "$build" -j"$(nproc)" --target "$@"
}

# run TARGET SECONDS [extra libFuzzer flags]: fuzzes over a scratch corpus seeded by fuzz/corpus/TARGET.
run() {
  local t=$1 secs=$2; shift 2
  local work="$build/corpus/$t" art="$build/artifacts/$t/"
  mkdir -p "$work" "$art"
  # -timeout: one input may take at most 10 s (the renderer's own budget is 2 s); -rss_limit_mb: 2 GB.
  # shellcheck disable=SC2086
  "$build/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$art" "$@" ${FUZZ_FLAGS:-} "$work" "fuzz/corpus/$t"
}

if [ "$1" = --ci ]; then
  build_targets "${targets[@]/#/fuzz_}"
  secs=${FUZZ_CI_SECONDS:-5}
  for t in "${targets[@]}"; do
    echo "== fuzz_$t: ${secs}s over fuzz/corpus/$t"
    log="$build/fuzz_$t.log"
    if ! run "$t" "$secs" >"$log" 2>&1; then
      tail -n 40 "$log"
      echo "fuzz_$t failed (log: $log, inputs: $build/artifacts/$t/)"
      exit 1
    fi
    grep -E '^(Done|stat::new_units_added|stat::peak_rss_mb)' "$log" || true
  done
  exit 0
fi

[ $# -eq 2 ] || usage
t=$1 secs=$2
printf '%s\n' "${targets[@]}" | grep -qx "$t" || { echo "unknown target '$t' (scripts/fuzz.sh --list)"; exit 2; }
build_targets "fuzz_$t"
run "$t" "$secs"
