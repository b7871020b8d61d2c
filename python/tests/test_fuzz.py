"""Differential fuzzing: random programs, shardings and meshes
(program_generator.py), partitioned by `--ernie-auto-parallel-pipeline` and
run rank by rank on the SPMD simulator, equal the single-device run; in
autodiff mode the loss and every gradient do. Fixed seeds, so a failure
reproduces; raise ERNIE_FUZZ_CASES for a longer run (the default keeps the
suite fast). f64 throughout; only the order of sums differs, hence 1e-9.
"""

import os
import subprocess

import numpy as np
import pytest

from ernie_reference import Interpreter, SpmdSimulator
from program_generator import Gen

CASES = int(os.environ.get("ERNIE_FUZZ_CASES", "150"))

# Constraints, Partial constraints and reshards on every path, the loss's too.
CONFIG = {"forward": {"p_reshard": 0.2},
          "autodiff": {"p_constraint": 0.35, "p_reshard": 0.25}}


def compile_module(ernie_opt, source, *flags):
    result = subprocess.run([str(ernie_opt), "-", *flags, "--mlir-print-op-generic"],
                            input=source, capture_output=True, text=True, timeout=60)
    return result.returncode, result.stdout, result.stderr


def inputs(argspec, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, bound, size=shape) if dtype == "i64"
            else rng.uniform(-0.5, 0.5, size=shape)
            for shape, dtype, bound in argspec]


def failure(ernie_opt, seed, autodiff):
    """None when the case passes (or is not a valid test), else a message."""
    source, name, argspec = Gen(seed, autodiff=autodiff,
                                cfg=dict(CONFIG["autodiff" if autodiff else "forward"])).build()
    flags = ("--ernie-autodiff",) if autodiff else ()
    name = "forward_grad" if autodiff else name
    rc, single, err = compile_module(ernie_opt, source, *flags)
    if rc != 0:
        return f"single-device compile failed (rc {rc}):\n{err[-1500:]}\n{source}"
    rc, partitioned, err = compile_module(ernie_opt, source, *flags,
                                          "--ernie-auto-parallel-pipeline")
    if rc != 0:
        return f"partition failed (rc {rc}):\n{err[-1500:]}\n{source}"
    args = inputs(argspec, seed)
    want = Interpreter(single).run(name, *args)
    # A mean cross-entropy whose labels are all ignored is 0/0: no reference.
    if any(np.isnan(np.asarray(w)).any() for w in want):
        return None
    got = SpmdSimulator(partitioned).run_global(name, *args)
    for i, (g, w) in enumerate(zip(got, want)):
        try:
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)
        except AssertionError as e:
            return f"result {i} differs:\n{e}\n{source}"
    if len(got) != len(want):
        return f"{len(got)} results, expected {len(want)}\n{source}"
    return None


@pytest.mark.parametrize("mode", ["forward", "autodiff"])
def test_random_programs_partition_correctly(ernie_opt, mode):
    failures = []
    for seed in range(CASES):
        message = failure(ernie_opt, seed, mode == "autodiff")
        if message:
            failures.append(f"seed {seed}: {message}")
    assert not failures, f"{len(failures)} of {CASES} failed; first:\n" + failures[0]
