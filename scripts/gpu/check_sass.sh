#!/usr/bin/env bash
# Scans the sm_90a SASS of the CUDA backend's objects built since the last scan (or the objects given)
# for an encoding a compiler bug produced before: a 64-bit memory descriptor in an odd uniform register
# (`desc[UR<odd>]`). CUDA 13.0's ptxas emitted it for cache-hinted cp.async copies (LDGSTS) whose shared
# address it kept in a uniform register, and the H200 stops there with an illegal instruction
# (docs/benchmarks.md, "Session 15"). cuobjdump and nvdisasm come from PyPI (nvidia-cuda-cuobjdump,
# nvidia-cuda-nvdisasm) into .venv on first use. Exit 1 names each offending kernel and instruction.
# Usage: scripts/gpu/check_sass.sh [BUILD [objects...]]   (MOEFOLD_SASS_CHECK=0 skips the scan)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build-cuda}
shift || true
[ "${MOEFOLD_SASS_CHECK:-1}" = 0 ] && exit 0
case "$build" in /*) ;; *) build=$root/$build ;; esac
py=$root/.venv/bin/python
[ -x "$py" ] || { echo "check_sass: run scripts/setup.sh first (no .venv)" >&2; exit 1; }
bin_dir() {
  "$py" - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("nvidia")
for base in (spec.submodule_search_locations if spec else []):
    for b in sorted(pathlib.Path(base).glob("cu*/bin")):
        if (b / "cuobjdump").exists() and (b / "nvdisasm").exists():
            print(b)
            raise SystemExit
PY
}
dir=$(bin_dir || true)
if [ -z "$dir" ]; then
  "$root/.venv/bin/pip" install -q --disable-pip-version-check nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  dir=$(bin_dir)
fi
stamp=$build/.sass-checked
if [ $# -gt 0 ]; then
  objects=("$@")
else
  newer=()
  [ -f "$stamp" ] && newer=(-newer "$stamp")
  mapfile -t objects < <(find "$build/CMakeFiles/moefold_cuda.dir" -name '*.cu.o' "${newer[@]}" | sort)
fi
bad=0
for o in "${objects[@]}"; do
  out=$(PATH="$dir:$PATH" "$dir/cuobjdump" -sass "$o" |
    awk '/Function :/ {f = $3} /desc\[UR[0-9]*[13579]\]/ {sub(/^[ \t]*/, ""); print "  " f ": " $0}')
  if [ -n "$out" ]; then
    echo "check_sass: $o has a memory descriptor in an odd uniform register (illegal on the GPU):" >&2
    echo "$out" | head -8 >&2
    bad=1
  fi
done
[ $bad = 0 ] || exit 1
[ $# -gt 0 ] || touch "$stamp"
echo "check_sass: ${#objects[@]} object(s) clean"
