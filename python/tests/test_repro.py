"""The Python crash reproducers of issue 18 (test/Tools/Inputs/repro/*.py,
copied from the report) end in a ValueError naming the problem, never a
signal; and the checks behind them, called directly: ProcessMesh's shape,
ids and names, and the optimizers' hyper-parameters (rejected when built,
not when the compiled step first computes NaN from them)."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ernie.distributed as dist
from ernie import optimizer

REPRO = Path(__file__).resolve().parents[2] / "test" / "Tools" / "Inputs" / "repro"


def run_repro(name, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, str(REPRO / name), *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.parametrize("name, message", [
    ("P2-tracer-matmul-one-operand.py", "'ernie.matmul' takes 2 operands, got 1"),
    ("P3-infer-spmd-empty-mesh.py", "ProcessMesh dimensions must have at least one process, got shape [0]"),
    ("P4-infer-spmd-empty-axis-name.py", "ProcessMesh dimension names must be non-empty strings"),
])
def test_repro_raises(name, message):
    result = run_repro(name)
    # 1: an uncaught Python exception; a signal would be negative.
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError:") and message in last, result.stderr


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "transpose", "split",
                                "concat", "cross_entropy", "cross_entropy_grad", "slice", "pad",
                                "gather", "index_add", "topk", "softmax"])
def test_spmd_repro_runs(op):
    # Each op with its attributes answers; without them (the second
    # argument) it answers or raises a clean ValueError.
    for args in ((op,), (op, "no-attrs")):
        result = run_repro("spmd_repro.py", *args)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(op + " "), result.stdout


@pytest.mark.parametrize("mesh, names, message", [
    ([], ["x"], r"at least one process, got shape \[0\]"),
    ([[], []], ["x", "y"], r"at least one process, got shape \[2, 0\]"),
    ([0, 1], [""], "names must be non-empty strings"),
    ([0, 1], [3], "names must be non-empty strings"),
    ([0.0, 1.0], ["x"], "ids must be integers"),
    ([[0, 1], [2]], ["x", "y"], "rectangular"),
    ([0, 2], ["x"], r"ids must be 0\.\.n-1"),
    (5, None, "at least one dimension"),
])
def test_process_mesh_rejects(mesh, names, message):
    with pytest.raises(ValueError, match=message):
        dist.ProcessMesh(mesh, names)


def test_process_mesh_rank_bound():
    # The compiler's and runtime's bound; the largest mesh is fine.
    assert dist.ProcessMesh(np.arange(1 << 20), ["x"]).size == 1 << 20
    with pytest.raises(ValueError, match=r"1048577 processes; at most 1048576"):
        dist.ProcessMesh(np.arange((1 << 20) + 1), ["x"])


@pytest.mark.parametrize("make, message", [
    (lambda: optimizer.AdamW(math.nan), r"learning_rate must be finite and >= 0, got nan"),
    (lambda: optimizer.AdamW(-1e-3), r"learning_rate must be finite and >= 0, got -0\.001"),
    (lambda: optimizer.SGD(math.inf), "learning_rate must be finite"),
    (lambda: optimizer.AdamW("1e-3"), "learning_rate must be a number"),
    (lambda: optimizer.AdamW(grad_clip=0), r"grad_clip must be positive \(or None for no clipping\), got 0"),
    (lambda: optimizer.AdamW(grad_clip=-1), "grad_clip must be positive"),
    (lambda: optimizer.SGD(grad_clip=math.nan), "grad_clip must be finite, got nan"),
    (lambda: optimizer.AdamW(weight_decay=-0.1), "weight_decay must be finite and >= 0"),
    (lambda: optimizer.AdamW(beta1=1.0), r"beta1 must be in \[0, 1\), got 1\.0"),
    (lambda: optimizer.AdamW(beta2=math.nan), "beta2 must be in"),
    (lambda: optimizer.AdamW(epsilon=-1e-8), "epsilon must be finite and >= 0"),
    (lambda: optimizer.SGD(momentum=1.5), r"momentum must be in \[0, 1\)"),
    (lambda: optimizer.SGD(momentum=True), "momentum must be a number"),
])
def test_optimizer_rejects(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_optimizer_accepts_and_checks_schedules():
    # PyTorch's bounds: 0 is a learning rate (a warm-up's first step), numpy
    # scalars are numbers.
    opt = optimizer.AdamW(np.float32(0.0), grad_clip=np.float64(1.0))
    assert opt.get_lr(1) == 0.0
    assert opt.pass_options()["clip-norm"] == 1.0
    # A schedule is checked at every step, as a constant is once.
    opt = optimizer.SGD(lambda step: 0.1 if step < 3 else math.nan)
    assert opt.get_lr(2) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="learning_rate must be finite and >= 0, got nan"):
        opt.get_lr(3)


@pytest.mark.parametrize("dims, partials, message", [
    ([[""], []], [], "mesh axes are named by non-empty strings"),
    ([["x"], ["x"]], [], "mesh axis 'x' is used twice in one sharding"),
    ([["x"], []], [("x", "sum")], "mesh axis 'x' is used twice in one sharding"),
])
def test_tracer_sharding_names(dims, partials, message):
    # A sharding built from a user's names is checked, not asserted on.
    from ernie import _ernie
    t = _ernie.Tracer("f")
    with pytest.raises(ValueError, match=message):
        t.argument([4, 8], "f32", None, ("mesh", dims, partials), None)


@pytest.mark.parametrize("op, inputs, message", [
    ("add", [((0,), "f32"), ((0,), "f32")],
     r"'ernie.add' op operand #0 has a zero-size dimension \('tensor<0xf32>'\): ernie tensors have no zero-size dimensions"),
    ("matmul", [((4, 0), "f32"), ((0, 8), "f32")],
     r"'lhs' has a zero-size dimension \('tensor<4x0xf32>'\)"),
])
def test_zero_size_is_a_value_error(op, inputs, message):
    # Ernie tensors have no zero-size dimensions, wherever an op is built.
    mesh = dist.ProcessMesh([0, 1], ["x"])
    with pytest.raises(ValueError, match=message):
        dist.infer_spmd(op, inputs, [[-1] * len(s) for s, _ in inputs], mesh)
    from ernie import _ernie
    t = _ernie.Tracer("f")
    ids = [t.argument(list(s), d, None, None, None) for s, d in inputs]
    with pytest.raises(ValueError, match="zero-size dimension"):
        t.op("ernie." + op, ids, {}, None, "")


# ---------------------------------------------------------------------------
# Round 3 (issue 42): checkpoints and weight files. The command-line cases
# run in test/Tools/repro-checkpoints.mlir.
# ---------------------------------------------------------------------------

def test_saving_into_a_directory_with_a_higher_step_keeps_the_new_checkpoint():
    # Exit 3 is the reproducer's "the checkpoint just written was lost".
    result = run_repro("ckpt-keep-loses-new.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "exists: True" in result.stdout
    assert "'step-00000001', 'step-00000005'" in result.stdout


@pytest.mark.parametrize("call", ["load_file", "read_tensors", "file_dtypes"])
def test_a_deeply_nested_safetensors_dtype_is_a_value_error(call):
    path = REPRO / "safetensors-deep-dtype.safetensors"
    args = "['x']" if call == "read_tensors" else ""
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            f"import ernie.weights as w; w.{call}({str(path)!r}{', ' + args if args else ''})")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError:") and "safetensors-deep-dtype.safetensors" in last \
        and "nested deeper than 3" in last, result.stderr
