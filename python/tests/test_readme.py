"""The README's examples run as written: its Python example (with fewer
steps) and its command-line example."""

import os
import re
import subprocess
import sys

from conftest import REPO

README = (REPO / "README.md").read_text()


def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def test_the_python_example_trains(tmp_path):
    code = next(b for b in _blocks("python") if "ernie.compile" in b)
    code = code.replace("range(10)", "range(2)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    losses = [float(line) for line in result.stdout.split()]
    assert len(losses) == 2 and losses[1] < losses[0]


def test_the_command_line_example_runs(build_dir, tmp_path):
    block = next(b for b in _blocks("sh") if "ernie-run" in b)
    script = block.replace("build/bin/", f"{build_dir}/bin/").replace(
        "examples/", f"{REPO}/examples/").replace("--steps 100", "--steps 3")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                            text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "llama.ernie").exists()
