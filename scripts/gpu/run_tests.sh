#!/usr/bin/env bash
# Runs every GPU contract test binary (one per tests/cuda/*_test.{cu,cc} source, built into
# BUILD/tests/) on the GPU machine, then compute-sanitizer memcheck and racecheck over each binary's
# small cases (GoogleTest filter *Small*), and prints one table of every CONTRACT line (format:
# tests/cuda/README.md) plus the sanitizer verdicts. Exit status 0 only if every binary passed,
# every CONTRACT line says PASS and the sanitizers found no error.
#
# Usage: scripts/gpu/run_tests.sh [BUILD] [options]
#   BUILD                 build folder (default build-cuda), made by scripts/gpu/build.sh
#   --no-sanitizer        skip the compute-sanitizer pass
#   --perf                also run the DISABLED_*Perf* timing tests and print their PERF lines
#                         ("PERF kernel=<k> shape=<s> us=<t> <metric>") as a second table
#   --only NAME[,NAME]    run only these test binaries (e.g. core_ops_test,attention_test)
#   --gtest-filter F      passed to the full runs (default: all tests)
#   --sanitizer-filter F  GoogleTest filter of the sanitizer pass (default *Small*)
#   --logs DIR            where the per-binary logs go (default $OUT/gpu-test-logs if $OUT is set,
#                         else BUILD/gpu-test-logs)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=build-cuda
sanitize=1
perf=0
only=""
gfilter=""
sfilter='*Small*'
logs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-sanitizer) sanitize=0 ;;
    --perf) perf=1 ;;
    --only) only=$2; shift ;;
    --gtest-filter) gfilter=$2; shift ;;
    --sanitizer-filter) sfilter=$2; shift ;;
    --logs) logs=$2; shift ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
case "$build" in /*) ;; *) build="$root/$build" ;; esac
if [ -z "$logs" ]; then
  if [ -n "${OUT:-}" ]; then logs="$OUT/gpu-test-logs"; else logs="$build/gpu-test-logs"; fi
fi
mkdir -p "$logs"
[ -f "$build/lib.tar.xz" ] && source "$root/scripts/gpu/env.sh" "$build"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}

sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'

names=()
for src in "$root"/tests/cuda/*_test.cu "$root"/tests/cuda/*_test.cc; do
  [ -e "$src" ] || continue
  n=$(basename "$src"); n=${n%.*}
  if [ -n "$only" ] && [[ ",$only," != *",$n,"* ]]; then continue; fi
  names+=("$n")
done

status=0
extra=()   # "binary kernel shape rel_err tol verdict" rows added by this script
for n in "${names[@]}"; do
  bin="$build/tests/$n"
  if [ ! -x "$bin" ]; then
    echo "== $n: MISSING ($bin not built)"
    extra+=("$n gtest_binary missing - - FAIL")
    status=1
    continue
  fi
  echo "== $n"
  start=$(date +%s)
  "$bin" --gtest_color=no ${gfilter:+--gtest_filter="$gfilter"} >"$logs/$n.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$logs/$n.log" | sed 's/^/   /'
  fails=$(grep -c '^\[  FAILED  \].*(' "$logs/$n.log" || true)
  skipped=$(grep -c '^\[  SKIPPED \].*(' "$logs/$n.log" || true)
  v=PASS; [ $rc -ne 0 ] && v=FAIL && status=1
  extra+=("$n gtest exit=$rc,failed=$fails,skipped=$skipped,${secs}s - - $v")
  if [ $rc -ne 0 ] && ! grep -q '^CONTRACT ' "$logs/$n.log"; then tail -20 "$logs/$n.log" | sed 's/^/   | /'; fi

  if [ $sanitize -eq 1 ]; then
    if [ -z "$sanitizer" ]; then
      extra+=("$n sanitizer not_found - - FAIL"); status=1
    else
      for tool in memcheck racecheck; do
        slog="$logs/$n.$tool.log"
        "$sanitizer" --tool "$tool" --error-exitcode 99 "$bin" --gtest_color=no --gtest_filter="$sfilter" >"$slog" 2>&1
        src=$?
        errs=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$slog" | tail -1 | grep -Eo '[0-9]+$' || echo "?")
        hazards=$(grep -Eo 'RACECHECK SUMMARY: [0-9]+ hazard' "$slog" | grep -Eo '[0-9]+' | head -1 || true)
        [ -n "$hazards" ] && errs="$hazards"
        ncases=$(grep -c '^\[       OK \]' "$slog" || true)
        sv=PASS
        if [ $src -ne 0 ] || [ "$errs" != "0" ] || [ "$ncases" = "0" ]; then sv=FAIL; status=1; fi
        extra+=("$n sanitizer_$tool filter=$sfilter,cases=$ncases,exit=$src ${errs:-?} 0 $sv")
      done
    fi
  fi
done

if [ $perf -eq 1 ]; then
  for n in "${names[@]}"; do
    bin="$build/tests/$n"
    [ -x "$bin" ] || continue
    echo "== $n (perf)"
    "$bin" --gtest_color=no --gtest_also_run_disabled_tests --gtest_filter='*Perf*' >"$logs/$n.perf.log" 2>&1 || {
      extra+=("$n perf_run exit=$? - - FAIL"); status=1; }
  done
fi

echo
echo "==================================== GPU contract table ===================================="
printf '%-16s %-30s %-96s %-10s %-8s %s\n' binary kernel shape rel_err tol verdict
npass=0; nfail=0
for n in "${names[@]}"; do
  [ -f "$logs/$n.log" ] || continue
  while read -r _ k s e t v; do
    printf '%-16s %-30s %-96s %-10s %-8s %s\n' "$n" "${k#kernel=}" "${s#shape=}" "${e#rel_err=}" "${t#tol=}" "${v#verdict=}"
    if [ "${v#verdict=}" = PASS ]; then npass=$((npass + 1)); else nfail=$((nfail + 1)); status=1; fi
  done < <(grep -E '^CONTRACT ' "$logs/$n.log")
done
for row in "${extra[@]}"; do
  read -r b k s e t v <<<"$row"
  printf '%-16s %-30s %-96s %-10s %-8s %s\n' "$b" "$k" "$s" "$e" "$t" "$v"
  if [ "$v" = PASS ]; then npass=$((npass + 1)); else nfail=$((nfail + 1)); fi
done
echo "--------------------------------------------------------------------------------------------"
echo "rows: $npass PASS, $nfail FAIL; logs in $logs"
if [ $perf -eq 1 ]; then
  echo
  echo "==================================== GPU timings (median, CUDA events) ======================"
  printf '%-16s %-22s %-50s %-10s %s\n' binary kernel shape us metric
  for n in "${names[@]}"; do
    [ -f "$logs/$n.perf.log" ] || continue
    while read -r _ k s u rest; do
      printf '%-16s %-22s %-50s %-10s %s\n' "$n" "${k#kernel=}" "${s#shape=}" "${u#us=}" "$rest"
    done < <(grep -E '^PERF ' "$logs/$n.perf.log")
  done
fi
[ $status -eq 0 ] && echo "ALL PASS" || echo "SOME FAILED"
exit $status
