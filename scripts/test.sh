#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs dependencies, builds (CUDA code too when nvcc is
# present), runs the C++ tests with CTest (GPU tests skip without a GPU) and the Python end-to-end tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
build=${MOEFOLD_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)"
(cd "$build" && ctest --output-on-failure -j"$(nproc)")
if compgen -G "tests/e2e/test_*.py" >/dev/null; then
  MOEFOLD_BINARY="$root/$build/moefold" .venv/bin/python -m pytest -q tests/e2e
fi
