"""The GEMM kernels are chosen on purpose: by the CPU's features, the same
rule in the runtime (preferredGemmKernels) and in `import ernie` (which must
decide before OpenBLAS loads), unless the user set OPENBLAS_CORETYPE."""

import os
import subprocess
import sys

import pytest

import ernie
from ernie import _ernie

PROBE = ("import ernie; from ernie import _ernie; "
         "print(_ernie.gemm_library()['kernels'])")


def test_python_and_runtime_rules_agree():
    assert ernie._preferred_gemm_kernels() == _ernie.preferred_gemm_kernels()


def _without_coretype():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return env


@pytest.mark.skipif(not _ernie.preferred_gemm_kernels(), reason="no x86 kernel family to choose")
def test_import_and_ernie_run_pick_the_preferred_kernels(ernie_translate, ernie_run, tmp_path):
    want = _ernie.preferred_gemm_kernels().lower()
    out = subprocess.run([sys.executable, "-c", PROBE], env=_without_coretype(),
                         capture_output=True, text=True, check=True).stdout
    assert out.strip().lower() == want
    src = tmp_path / "p.mlir"
    src.write_text("func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
                   "  %y = ernie.exp %x : tensor<4xf32>\n  return %y : tensor<4xf32>\n}\n")
    subprocess.run([ernie_translate, "--ernie-to-program", src, "-o", tmp_path / "p.ernie"],
                   check=True)
    run = subprocess.run([ernie_run, tmp_path / "p.ernie"], env=_without_coretype(),
                         capture_output=True, text=True, check=True)
    banner = next(line for line in run.stdout.splitlines() if line.startswith("GEMM:"))
    assert banner.lower().endswith(f"{want} kernels")
    assert "warning" not in run.stderr


def test_the_users_choice_stands():
    """OPENBLAS_CORETYPE set by the user is kept, and not warned about: the
    warning is for a family OpenBLAS fell back to by itself."""
    env = {**_without_coretype(), "OPENBLAS_CORETYPE": "Prescott"}
    probe = PROBE.replace("['kernels']", "['kernels'], _ernie.gemm_library()['warning']")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip().lower() == "prescott"
