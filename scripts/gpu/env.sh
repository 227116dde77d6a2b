# Source on the GPU machine: `source scripts/gpu/env.sh BUILD` unpacks BUILD/lib.tar.xz (made by
# scripts/gpu/build.sh) and puts it and the CUDA libraries on LD_LIBRARY_PATH.
_b=${1:-build-cuda}
mkdir -p /tmp/moefold-lib && tar xJf "$_b/lib.tar.xz" -C /tmp/moefold-lib
export LD_LIBRARY_PATH=/tmp/moefold-lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
