"""The tree stays ruff-clean, ruff-formatted and mypy-clean (generated code excluded)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed (it is a dev dependency: pip install -e '.[dev]')")
    return found


@pytest.mark.timeout(120)
def test_ruff_lint_and_format() -> None:
    ruff = _tool("ruff")
    for args in (["check", "fs3", "tests"], ["format", "--check", "fs3", "tests"]):
        r = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True, timeout=100)
        assert r.returncode == 0, f"ruff {' '.join(args)}:\n{r.stdout}{r.stderr}"


@pytest.mark.timeout(300)
def test_mypy() -> None:
    r = subprocess.run(
        [_tool("mypy"), "fs3"], cwd=ROOT, capture_output=True, text=True, timeout=280
    )
    assert r.returncode == 0, r.stdout + r.stderr
