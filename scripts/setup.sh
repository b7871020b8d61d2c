#!/usr/bin/env bash
# setup.sh — everything a fresh Debian 12 machine needs to build and test
# ernie: the Debian packages (installed when missing, as root or via sudo),
# a Python virtual environment in .venv, and a configured, built tree in
# build/. Safe to run again: each step is skipped when already done.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${ERNIE_BUILD_DIR:-$ROOT/build}"
VENV="${ERNIE_VENV:-$ROOT/.venv}"
JOBS="${ERNIE_JOBS:-2}"

APT_PACKAGES=(
  llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools
  cmake ninja-build ccache g++ python3 python3-venv python3-dev libgtest-dev libgloo-dev
  libopenblas-dev libflatbuffers-dev flatbuffers-compiler nlohmann-json3-dev libssl-dev
  libxxhash-dev
)

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$pkg")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root or sudo to install ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating the virtual environment $VENV"
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import pytest, numpy, pybind11, safetensors, matplotlib, tokenizers, tensorboard" 2>/dev/null; then
  log "installing Python test dependencies"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r "$ROOT/python/requirements-dev.txt"
fi

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  log "configuring $BUILD_DIR"
  cmake -G Ninja -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
    -DPython3_EXECUTABLE="$VENV/bin/python"
fi
log "building (-j$JOBS)"
cmake --build "$BUILD_DIR" -j "$JOBS"
