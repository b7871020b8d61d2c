#!/usr/bin/env bash
# demo.sh — set up and build, then run the main job. Today that is the
# compiler on the example models: ernie-opt checks and simplifies a one-layer
# Llama, then compiles a transformer block with a dp x mp plan into the
# per-rank program and reports its collectives. (The training demo replaces
# this once autodiff, the runtime and Python land.)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${ERNIE_BUILD_DIR:-$ROOT/build}"
export ERNIE_BUILD_DIR="$BUILD_DIR"
"$ROOT/scripts/setup.sh"
OPT="$BUILD_DIR/bin/ernie-opt"

MODEL="$ROOT/examples/llama_block.mlir"
echo
echo "== 1. ernie-opt --ernie-simplify-pipeline examples/llama_block.mlir =="
"$OPT" "$MODEL" --ernie-simplify-pipeline --mlir-timing \
  -o "$BUILD_DIR/llama_block.simplified.mlir"
echo "ops in the model:"
"$OPT" "$MODEL" --mlir-print-op-generic \
  | grep -o '"ernie\.[a-z_]*"' | sort | uniq -c | sort -rn | sed 's/^/  /'
echo "parameters:"
grep -o 'ernie.param = "[^"]*"' "$BUILD_DIR/llama_block.simplified.mlir" \
  | sed 's/ernie.param = /  /'

BLOCK="$ROOT/examples/transformer_block_dp_mp.mlir"
OUT="$BUILD_DIR/transformer_block_dp_mp.partitioned.mlir"
echo
echo "== 2. ernie-opt --ernie-auto-parallel-pipeline examples/transformer_block_dp_mp.mlir =="
"$OPT" "$BLOCK" --ernie-auto-parallel-pipeline=partition=false \
  -o "$BUILD_DIR/transformer_block_dp_mp.propagated.mlir"
"$OPT" "$BLOCK" --ernie-auto-parallel-pipeline --mlir-timing -o "$OUT"
echo "placements the compiler chose (propagated IR):"
grep -oE '(ernie\.[a-z_]+|ernie\.reshard) .*#ernie.sharding<[^>]*>' \
  "$BUILD_DIR/transformer_block_dp_mp.propagated.mlir" \
  | sed -E 's/^(ernie\.[a-z_]+) .*(#ernie.sharding<[^>]*>)$/  \1  \2/; s/^(ernie\.reshard) [^<]*(<[^>]*>)/  \1  \2/' \
  | grep -v '^  ernie.sharding ' | head -30
echo "communication in the per-rank program:"
grep -oE 'ernie\.(all_reduce|all_gather|reduce_scatter|all_to_all|shard_slice|partial_init) [^:]*: [^ ]*' "$OUT" \
  | sed 's/^/  /' || echo "  (none)"
echo
echo "written: $BUILD_DIR/llama_block.simplified.mlir, $OUT"
