"""The install: quiet, only when needed, and an ``import fs3`` that works from anywhere.

* ``scripts/install.sh`` runs pip only when ``.venv`` or what it was built from
  changed (a stamp holds their hash); otherwise it prints nothing and returns at once.
* ``pyproject.toml`` builds without setuptools warnings (SPDX ``license``).
* The editable install is one ``.pth`` line naming the repository, so a script
  saved next to any folder called ``fs3`` (e.g. the clone itself) still imports
  this package rather than that folder as a namespace package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def _project_copy(tmp_path: Path) -> Path:
    """pyproject.toml, README.md and a minimal fs3 package: enough for setuptools to build."""
    proj = tmp_path / "proj"
    (proj / "fs3").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, proj / name)
    (proj / "fs3" / "__init__.py").write_text("def connect():\n    pass\n")
    (proj / "fs3" / "py.typed").write_text("")
    return proj


def test_pyproject_builds_an_editable_pth_without_warnings(tmp_path: Path) -> None:
    proj = _project_copy(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('error')\n"  # any setuptools deprecation fails the build
        "import setuptools.build_meta as b\n"
        "print(b.build_editable(sys.argv[1]))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=proj,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "deprecated" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    wheel = out / r.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        pth = [n for n in names if n.endswith(".pth")]
        assert len(pth) == 1, names
        assert z.read(pth[0]).decode().strip() == str(proj)  # a path entry, not a finder hook
        assert not any("finder" in n for n in names), names
        meta = next(n for n in names if n.endswith("METADATA"))
        assert "License-Expression: MIT" in z.read(meta).decode()


def test_a_snippet_next_to_a_folder_named_fs3_imports_the_package(tmp_path: Path) -> None:
    (tmp_path / "fs3").mkdir()  # e.g. the clone itself, checked out as ./fs3
    (tmp_path / "snippet.py").write_text(
        "import fs3\nprint(fs3.__file__)\nprint(callable(fs3.connect))\n"
    )
    r = subprocess.run(
        [sys.executable, "snippet.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(ROOT / "fs3" / "__init__.py"), "True"], r.stdout


def test_install_is_silent_and_quick_when_nothing_changed() -> None:
    # scripts/test.sh installs the dev and ckpt extras; check the same install.
    extras = "dev,ckpt"
    stamp = ROOT / ".venv" / f".fs3-install-stamp-{extras}"
    if not stamp.exists() or Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("this interpreter was not installed by scripts/install.sh in this checkout")
    t0 = time.monotonic()
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "FS3_EXTRAS": extras},
        timeout=100,
        check=False,
    )
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    if "installing fs3" in r.stdout:
        pytest.skip("pyproject.toml or install.sh changed since the last install: it reinstalled")
    assert (r.stdout, r.stderr) == ("", "")
    assert took < 5, took
