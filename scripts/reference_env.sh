#!/usr/bin/env bash
# reference_env.sh — the reference environment of the parity tests: a
# separate virtual environment with PyPI's `torch` (its CUDA build, used on
# the CPU) and a `transformers` recent enough for every family ernie.models
# reads (Qwen3 and Qwen3-MoE need 4.51). Neither is ever a dependency of
# ernie nor part of scripts/setup.sh: the tests that compare against
# `transformers` run their reference side in this environment's interpreter
# (a subprocess) when it exists, and skip with a note when it does not.
#
#   scripts/reference_env.sh            # makes $ERNIE_REFERENCE_VENV (/work/.refenv)
#   ERNIE_REFERENCE_VENV=/some/dir scripts/reference_env.sh
#
# The download is large (torch with its CUDA libraries is a few GB). The
# versions installed are written to $VENV/reference-versions.txt, which the
# tests print beside the numbers they compare. Safe to run again.
set -euo pipefail

VENV="${ERNIE_REFERENCE_VENV:-/work/.refenv}"
PYTHON="${PYTHON:-python3}"
# The oldest transformers with every family the parity tests read.
MIN_TRANSFORMERS="4.51"

log() { printf '\033[1m[reference_env]\033[0m %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if ! "$VENV/bin/python" - "$MIN_TRANSFORMERS" <<'PY' 2>/dev/null
import sys
import torch, transformers, numpy, safetensors  # noqa: F401
from packaging.version import Version
sys.exit(Version(transformers.__version__) < Version(sys.argv[1]))
PY
then
  log "installing torch, transformers >= $MIN_TRANSFORMERS, numpy, safetensors (a large download)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q torch "transformers>=$MIN_TRANSFORMERS" numpy safetensors
fi

"$VENV/bin/python" - > "$VENV/reference-versions.txt" <<'PY'
import platform
import numpy, safetensors, torch, transformers
print(f"python {platform.python_version()}")
for m in (torch, transformers, numpy, safetensors):
    print(f"{m.__name__} {m.__version__}")
PY
log "ready: $VENV/bin/python"
cat "$VENV/reference-versions.txt"
