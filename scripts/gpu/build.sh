#!/usr/bin/env bash
# Builds the CUDA backend and its GPU tests here (no GPU needed) into BUILD (default build-cuda), for
# carrying to the GPU machine: sm_90a code, static libstdc++, and the non-system shared libraries the
# binaries need packed into BUILD/lib.tar.xz (cuBLASLt and the CUDA runtime are on that machine already).
# On the GPU machine: scripts/gpu/env.sh BUILD unpacks them and sets LD_LIBRARY_PATH.
# Usage: scripts/gpu/build.sh [BUILD] [targets...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build-cuda}; shift || true
cmake -S "$root" -B "$root/$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEFOLD_PORTABLE=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
cmake --build "$root/$build" -j2 ${@:+--target "$@"}
# The SASS of the CUDA objects rebuilt since the last scan, for a known ptxas miscompilation
# (scripts/gpu/check_sass.sh; MOEFOLD_SASS_CHECK=0 skips it).
bash "$root/scripts/gpu/check_sass.sh" "$build"
mkdir -p "$root/$build/lib"
for bin in "$root/$build"/moefold "$root/$build"/tests/*_test; do
  [ -x "$bin" ] || continue
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libgcc_s*|libstdc++*|libcublas*|libcudart*) ;;
      *) cp -Lu "$lib" "$root/$build/lib/" ;;
    esac
  done
done
tar cJf "$root/$build/lib.tar.xz" -C "$root/$build/lib" .
du -sh "$root/$build/lib.tar.xz"
