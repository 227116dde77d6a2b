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
