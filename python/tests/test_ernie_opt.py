"""ernie-opt as a user drives it from a script: the example model, the
pipeline registry, and the exit codes on bad input."""

import subprocess
from pathlib import Path

from conftest import REPO

EXAMPLE = REPO / "examples" / "llama_block.mlir"


def run(tool: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool), *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_example_model_simplifies_and_keeps_its_interface(ernie_opt):
    result = run(ernie_opt, str(EXAMPLE), "--ernie-simplify-pipeline")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # The loss function survives with its parameters named for the parallel plan.
    assert "func.func @forward" in out
    assert 'ernie.param = "llama.layers.0.self_attn.qkv_proj.weight"' in out
    assert out.count("ernie.matmul") == 5
    assert "ernie.cross_entropy" in out


def test_printed_module_reparses_to_itself(ernie_opt):
    first = run(ernie_opt, str(EXAMPLE))
    assert first.returncode == 0, first.stderr
    second = run(ernie_opt, "-", stdin=first.stdout)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout


def test_pipelines_are_registered(ernie_opt):
    result = run(ernie_opt, "--help")
    assert result.returncode == 0
    for flag in ("--ernie-simplify-pipeline", "--ernie-check-static-program"):
        assert flag in result.stdout


def test_bad_input_is_an_error_with_a_location_and_exit_1(ernie_opt):
    bad = "func.func @f(%x: tensor<2x3xf32>) {\n  %0 = ernie.transpose %x, perm = [0, 0] : tensor<2x3xf32> -> tensor<2x2xf32>\n  return\n}\n"
    result = run(ernie_opt, "-", stdin=bad)
    assert result.returncode == 1
    assert "<stdin>:2:8: error: perm [0, 0] is not a permutation of 2 dimensions" in result.stderr
