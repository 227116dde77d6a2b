#!/usr/bin/env bash
# Prints the CUDA architectures the test and quick-start builds compile for (CMAKE_CUDA_ARCHITECTURES).
# With a GPU (nvidia-smi lists one): 90a, the Hopper code moefold's kernels are written for. Without one,
# the kernels cannot run here, so device code is compiled to PTX only (90a-virtual): every kernel still
# goes through nvcc's front end and cicc, and the binaries run on a GPU through the driver's JIT; ptxas,
# ~40% of a kernel file's compile time, runs where a GPU is (and in scripts/gpu/build.sh).
# MOEFOLD_CUDA_ARCHITECTURES overrides.
if [ -n "${MOEFOLD_CUDA_ARCHITECTURES:-}" ]; then
  echo "$MOEFOLD_CUDA_ARCHITECTURES"
elif nvidia-smi -L >/dev/null 2>&1; then
  echo 90a
else
  echo 90a-virtual
fi
