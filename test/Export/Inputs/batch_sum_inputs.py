"""Inputs for run-pipeline-batch-sum.mlir, written to DIR: a global batch
of 32 rows (four micro-batches of 8), initial weights, and expected.npy,
the count numpy makes of positive units of x @ tied over the whole batch
(what the state holds after one step)."""

import sys
from pathlib import Path

import numpy as np

out = Path(sys.argv[1])
rng = np.random.default_rng(7)
x = rng.standard_normal((32, 16)).astype(np.float32)
tied = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
np.save(out / "input0.npy", x)
np.save(out / "input1.npy", rng.integers(0, 16, 32))
np.save(out / "tied.npy", tied)
np.save(out / "w1.npy", (rng.standard_normal((16, 16)) / 4).astype(np.float32))
np.save(out / "expected.npy", ((x @ tied) > 0).sum(axis=0).astype(np.float32))
