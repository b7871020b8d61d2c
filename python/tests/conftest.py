"""Shared fixtures of the Python tests: where the built tools are."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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
