"""deploy/*.toml must match fs3/config.py (run scripts/gen_deploy_configs.py) and load cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fs3 import config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
def test_deploy_templates_are_current() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_deploy_configs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "name, cls",
    [
        ("mgmtd", config.MgmtdConfig),
        ("meta", config.MetaConfig),
        ("storage", config.StorageConfig),
        ("client", config.ClientConfig),
    ],
)
def test_template_loads_and_lists_every_key_with_a_comment(name: str, cls: type) -> None:
    path = ROOT / "deploy" / f"{name}.toml"
    cfg = config.load(cls, path, env={})
    assert cfg == cls(), "a template holds the defaults"
    lines: dict[tuple[str, str], str] = {}
    section = ""
    for ln in path.read_text().splitlines():
        if ln.startswith("["):
            section = ln.strip("[]")
        elif " = " in ln and not ln.startswith("#"):
            lines[(section, ln.split(" = ", 1)[0])] = ln
    for sec in cfg.__dataclass_fields__:
        for key in getattr(cfg, sec).__dataclass_fields__:
            line = lines.get((sec, key))
            assert line is not None and "  # " in line, (
                f"[{sec}] {key} missing or without a comment"
            )
