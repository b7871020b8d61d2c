"""Shared fixtures of the Python tests: where the built tools are."""

import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The package as the build tree has it (build/python/ernie), unless an
# installed one is asked for (ERNIE_USE_INSTALLED=1 after `pip install .`).
if not os.environ.get("ERNIE_USE_INSTALLED"):
    sys.path.insert(0, str(Path(os.environ.get("ERNIE_BUILD_DIR", REPO / "build")) / "python"))


@pytest.fixture(scope="session")
def build_dir() -> Path:
    path = Path(os.environ.get("ERNIE_BUILD_DIR", REPO / "build"))
    if not (path / "bin" / "ernie-opt").exists():
        pytest.fail(f"ernie-opt is not built in {path}; run scripts/setup.sh")
    return path


@pytest.fixture(scope="session")
def ernie_opt(build_dir: Path) -> Path:
    return build_dir / "bin" / "ernie-opt"


@pytest.fixture(scope="session")
def ernie_translate(build_dir: Path) -> Path:
    return build_dir / "bin" / "ernie-translate"


@pytest.fixture(scope="session")
def ernie_run(build_dir: Path) -> Path:
    return build_dir / "bin" / "ernie-run"


@pytest.fixture(autouse=True)
def _single_process_job():
    """Tests that call init_parallel_env() with a launch environment make
    this pytest process "process r of a job" for later tests too: reset it."""
    yield
    from ernie.distributed import env
    env._CURRENT = None


@contextmanager
def taken_port():
    """A loopback port someone listens on while the block runs: a rendezvous
    store address that is in use."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]
