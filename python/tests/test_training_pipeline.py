"""The training pipeline is C++ (`buildTrainingPipeline`, registered as
`--ernie-training-pipeline`): `ernie-opt` with a compiled program's
pipeline options, on its traced module, writes the program file
`ernie.compile` wrote, byte for byte, for every configuration of
compile_configs (each pipeline option is reached by one of them)."""

import subprocess

import pytest

from compile_configs import CONFIGS, compile_config


def _ernie_opt_program(build_dir, prog, tmp_path):
    traced = tmp_path / "traced.mlir"
    # With its locations (the user's lines), which the program file keeps.
    traced.write_text(prog.traced_module.text(debug_info=True))
    options = str(prog.pipeline_options)
    opt = subprocess.run([str(build_dir / "bin" / "ernie-opt"), str(traced),
                          f"--ernie-training-pipeline={options}", "--mlir-print-debuginfo"],
                         capture_output=True, text=True, timeout=300)
    assert opt.returncode == 0, opt.stderr
    out = tmp_path / "program.ernie"
    translate = subprocess.run([str(build_dir / "bin" / "ernie-translate"), "--ernie-to-program",
                                "-o", str(out)], input=opt.stdout, capture_output=True,
                               text=True, timeout=300)
    assert translate.returncode == 0, translate.stderr
    return out.read_bytes()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_ernie_opt_runs_what_compile_runs(name, build_dir, tmp_path):
    prog = compile_config(name)
    assert _ernie_opt_program(build_dir, prog, tmp_path) == prog.program_file


def test_the_options_print_as_ernie_opt_takes_them():
    prog = compile_config("fp8-delayed")
    text = str(prog.pipeline_options)
    assert not text.startswith("{")
    for option in ("optimizer=adamw", "clip-norm=1", "fp8=true", "fp8-recipe=delayed",
                   "fp8-history-length=4", "partition=true", "bucket-bytes=26214400"):
        assert option in text, text


def test_compiling_leaves_the_traced_module_unchanged():
    prog = compile_config("dp2")
    assert "ernie.all_reduce" not in prog.traced_mlir
    assert "@train_step" in prog.mlir and "@train_step" not in prog.traced_mlir
