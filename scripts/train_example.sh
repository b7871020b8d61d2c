#!/usr/bin/env bash
# train_example.sh — the README's training job: ernie's own documentation
# tokenized (a BPE trained here), then a small Llama trained on it by
# `python -m ernie.train` as 2 processes x 1 rank (dp 2, Gloo over
# loopback). Writes build/train-example/{metrics.jsonl, tensorboard/, ckpt/}.
# Extra arguments go to ernie.train (--training.steps 50, ...).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${ERNIE_BUILD_DIR:-$ROOT/build}"
PY="${ERNIE_VENV:-$ROOT/.venv}/bin/python"
export PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"
if [ ! -f build/train-example/docs.bin ]; then
  "$PY" examples/train/prepare_docs.py build/train-example
fi
exec "$PY" -m ernie.distributed.launch --nproc-per-node 2 \
  -m ernie.train --config examples/train/llama_tiny.toml "$@"
