"""The README's launcher synopsis matches the parser: bracketed options are optional, others required."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fs3.cli.cluster import build_parser
from fs3.launcher import DEFAULT_DIR

pytestmark = pytest.mark.timeout(10)

README = Path(__file__).resolve().parents[3] / "README.md"


def _synopsis() -> dict[str, str]:
    """``{subcommand: its synopsis text}`` from the code block under "The local cluster launcher"."""
    text = README.read_text()
    section = text[text.index("## The local cluster launcher") :]
    block = section.split("```", 2)[1]
    out: dict[str, str] = {}
    cmd = ""
    for line in block.splitlines():
        line = line.split("#", 1)[0]
        m = re.match(r"fs3 cluster (\w+)(.*)", line.strip())
        if m:
            cmd = m.group(1)
            out[cmd] = m.group(2)
        elif cmd and line.strip():
            out[cmd] += " " + line.strip()
    return out


def _split(text: str) -> tuple[set[str], set[str]]:
    """(options inside [...], options outside any brackets)."""
    optional = set(re.findall(r"--[\w-]+", " ".join(re.findall(r"\[[^\]]*\]", text))))
    required = set(re.findall(r"--[\w-]+", re.sub(r"\[[^\]]*\]", "", text)))
    return optional, required


def test_synopsis_agrees_with_the_parser() -> None:
    syn = _synopsis()
    assert {"up", "status", "down", "kill", "restart"} <= set(syn)
    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    assert sub.choices is not None
    for cmd, text in syn.items():
        actions = {
            o: a
            for a in sub.choices[cmd]._actions  # type: ignore[index]
            for o in a.option_strings
        }
        optional, required = _split(text)
        for o in optional | required:
            assert o in actions, f"README shows fs3 cluster {cmd} {o}, which does not exist"
        for o in optional:
            assert not actions[o].required, f"fs3 cluster {cmd} {o} is required; README brackets it"
        for o in required:
            assert actions[o].required, f"README shows fs3 cluster {cmd} {o} as required; it is not"
        assert "--dir" in optional, cmd


def test_readme_names_the_default_dir() -> None:
    assert f"`--dir` defaults to `{DEFAULT_DIR}`" in README.read_text()
