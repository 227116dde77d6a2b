# Sourced by the scripts/gpu/*_check.sh scripts.
# step NAME SECONDS COMMAND...: runs COMMAND under a time limit into $out/NAME.log, appends one line to
# $out/table.txt (exit status, CONTRACT PASS / FAIL counts, gtest and sanitizer summaries) and returns
# COMMAND's exit status (124: the time limit).
step() {
  local name=$1 secs=$2
  shift 2
  timeout "$secs" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc pass=$(grep -c '=PASS' "$out/$name.log") fail=$(grep -c '=FAIL' "$out/$name.log")" \
    "$(grep -E '^\[  (PASS|FAIL)ED  \]|ERROR SUMMARY' "$out/$name.log" | tr '\n' ' ' | cut -c1-100)" >>"$out/table.txt"
  return $rc
}

# summary NAME RC LOG: one line for a test binary's run (gtest summary, CONTRACT PASS / FAIL counts), then its
# first failures.
summary() {
  echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED)  \]' "$3" | tr '\n' ' ' | cut -c1-120) CONTRACT pass=$(grep -c 'verdict=PASS' "$3") fail=$(grep -c 'verdict=FAIL' "$3")"
  grep -E 'verdict=FAIL|Failure$|FAILED  \] [A-Z]' "$3" | head -4 | cut -c1-220
}
