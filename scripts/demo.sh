#!/usr/bin/env bash
# demo.sh — set up and build, then run the main job: ernie-opt checks and
# simplifies a one-layer Llama and compiles a transformer block with a dp x mp
# plan into the per-rank program; then the Llama layer is trained by the
# runtime (ernie-run) and the partitioned block runs on 4 ranks, as threads
# and as Gloo processes, and is compared with the single-rank run; last, the
# Python frontend trains a small Llama with tied embeddings on 8 thread ranks
# (dp x pp x mp = 2 x 2 x 2: tensor, data and pipeline parallelism) and
# prints its loss curve, plan and memory per rank.
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

TRANSLATE="$BUILD_DIR/bin/ernie-translate"
RUN="$BUILD_DIR/bin/ernie-run"
WORK="$BUILD_DIR/demo"
mkdir -p "$WORK"
echo
echo "== 3. train the Llama layer: ernie-opt --ernie-autodiff=optimizer=adamw | ernie-translate | ernie-run =="
"$OPT" "$MODEL" "--ernie-autodiff=optimizer=adamw" --ernie-auto-parallel-pipeline \
  | "$TRANSLATE" --ernie-to-program -o "$WORK/llama_train.ernie"
"$OPT" "$MODEL" "--ernie-autodiff=optimizer=adamw" --ernie-auto-parallel-pipeline \
  --ernie-memory-plan -o /dev/null 2>&1 | grep -o 'memory plan: .*' | sed 's/^/  @train_step /' | head -1
"$RUN" "$WORK/llama_train.ernie" --steps 30 --lr 0.01

echo
echo "== 4. the dp x mp block on 4 ranks: threads, then Gloo processes, against 1 rank =="
"$TRANSLATE" --ernie-to-program "$OUT" -o "$WORK/block_4ranks.ernie"
# The single-rank reference: the same plan on a 1 x 1 mesh.
sed 's/ernie.mesh @mesh(dp = 2, mp = 2)/ernie.mesh @mesh(dp = 1, mp = 1)/' "$BLOCK" \
  | "$OPT" --ernie-auto-parallel-pipeline \
  | "$TRANSLATE" --ernie-to-program -o "$WORK/block_1rank.ernie"
"$RUN" "$WORK/block_1rank.ernie" --outputs "$WORK/out_1rank"
"$RUN" "$WORK/block_4ranks.ernie" --ranks 4 --outputs "$WORK/out_threads"
"$RUN" "$WORK/block_4ranks.ernie" --ranks 4 --backend gloo --outputs "$WORK/out_gloo"
"${ERNIE_VENV:-$ROOT/.venv}/bin/python" - "$WORK" <<'PY'
import sys, numpy as np
w = sys.argv[1]
one, thr, gloo = (np.load(f"{w}/out_{k}/result0.npy") for k in ("1rank", "threads", "gloo"))
print(f"  4 ranks (threads) vs 1 rank: max relative difference {np.max(np.abs(thr - one)) / np.max(np.abs(one)):.2e}")
print(f"  Gloo vs threads: {'bit for bit identical' if thr.tobytes() == gloo.tobytes() else 'DIFFERENT'}")
PY

echo
echo "== 5. Python: train a small Llama on 8 thread ranks, dp=2 x pp=2 x mp=2 with tied embeddings (examples/train_llama.py) =="
PYTHONPATH="$BUILD_DIR/python" "${ERNIE_VENV:-$ROOT/.venv}/bin/python" \
  "$ROOT/examples/train_llama.py" --steps "${ERNIE_DEMO_STEPS:-200}" --work "$WORK"

echo
echo "written: $BUILD_DIR/llama_block.simplified.mlir, $OUT, $WORK/*.ernie, $WORK/train_llama_report.json"
