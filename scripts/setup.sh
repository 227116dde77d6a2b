#!/usr/bin/env bash
# Installs everything moefold needs to build and test on a fresh Debian/Ubuntu machine.
# Idempotent: re-running skips what is already present. Python test tooling goes into .venv.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

deb_pkgs=(build-essential cmake ninja-build pkg-config python3-venv
  libopenblas-dev nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libpcre2-dev
  libgtest-dev libgmock-dev libbenchmark-dev libfmt-dev libssl-dev zlib1g-dev libutf8proc-dev)
missing=()
for p in "${deb_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python test tooling (no torch: CI compares against committed fixtures).
if [ ! -x "$root/.venv/bin/python" ]; then
  python3 -m venv "$root/.venv"
fi
stamp="$root/.venv/.moefold-reqs"
if ! cmp -s "$root/scripts/requirements-test.txt" "$stamp" 2>/dev/null; then
  "$root/.venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/requirements-test.txt"
  cp "$root/scripts/requirements-test.txt" "$stamp"
fi

# xgrammar (structured output: runtime/grammar_constraint.h): its C++ core, built from the PyPI source
# distribution without the Python bindings into .deps/xgrammar (a static library + headers; it vendors
# picojson and dlpack). Skipped when that version is already installed there.
xgrammar_version=0.2.8
xg_prefix="$root/.deps/xgrammar"
xg_stamp="$xg_prefix/.moefold-xgrammar-$xgrammar_version"
if [ ! -f "$xg_stamp" ]; then
  xg_src="$root/.deps/src"
  mkdir -p "$xg_src"
  sdist="$xg_src/xgrammar-$xgrammar_version.tar.gz"
  if [ ! -f "$sdist" ]; then
    # --no-binary xgrammar: the sdist; pip still prepares its metadata (build deps as wheels).
    "$root/.venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary xgrammar \
      -d "$xg_src" "xgrammar==$xgrammar_version"
  fi
  rm -rf "$xg_src/xgrammar-$xgrammar_version" "$root/.deps/build-xgrammar"
  tar xzf "$sdist" -C "$xg_src"
  mkdir -p "$root/.deps/build-xgrammar"
  # Its cmake/config.cmake turns the Python bindings on; a config.cmake in the build folder wins.
  printf 'set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)\nset(XGRAMMAR_BUILD_CXX_TESTS OFF)\nset(XGRAMMAR_ENABLE_CPPTRACE OFF)\n' \
    > "$root/.deps/build-xgrammar/config.cmake"
  launcher=(); command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # -fno-lto: its default -flto=auto objects would need the LTO plugin wherever moefold links;
  # -Wno-error: its -Werror is for its own CI's compilers.
  cmake -S "$xg_src/xgrammar-$xgrammar_version" -B "$root/.deps/build-xgrammar" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="-fno-lto -Wno-error" "${launcher[@]}" \
    -DCMAKE_INSTALL_PREFIX="$xg_prefix" >/dev/null
  cmake --build "$root/.deps/build-xgrammar" -j"$(nproc)"
  rm -rf "$xg_prefix"
  cmake --install "$root/.deps/build-xgrammar" >/dev/null
  touch "$xg_stamp"
fi
