#!/usr/bin/env bash
# demo.sh — set up and build, then run the main job. Today that is the
# compiler's front half on the example model: ernie-opt checks the one-layer
# Llama in examples/, simplifies it, and reports what the program holds.
# (The training demo replaces this once the runtime and Python land.)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${ERNIE_BUILD_DIR:-$ROOT/build}"
export ERNIE_BUILD_DIR="$BUILD_DIR"
"$ROOT/scripts/setup.sh"

MODEL="$ROOT/examples/llama_block.mlir"
echo
echo "== ernie-opt --ernie-simplify-pipeline $MODEL =="
"$BUILD_DIR/bin/ernie-opt" "$MODEL" --ernie-simplify-pipeline \
  --mlir-pass-statistics --mlir-timing -o "$BUILD_DIR/llama_block.simplified.mlir"
echo
echo "== what the program holds =="
"$BUILD_DIR/bin/ernie-opt" "$MODEL" --mlir-print-op-generic \
  | grep -o '"ernie\.[a-z_]*"' | sort | uniq -c | sort -rn
echo
echo "parameters:"
grep -o 'ernie.param = "[^"]*"' "$BUILD_DIR/llama_block.simplified.mlir" | sed 's/ernie.param = /  /'
echo
echo "simplified IR written to $BUILD_DIR/llama_block.simplified.mlir"
