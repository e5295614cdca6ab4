"""``fs3 admin fsck``: the namespace checker as a command (clean, broken, bad input)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fs3.kv import open_database
from fs3.meta import schema as S
from fs3.meta.layout import StaticChainTables
from fs3.meta.operator import MetaOperator
from fs3.proto import common_pb2, meta_pb2

pytestmark = pytest.mark.timeout(60)

ROOT = common_pb2.UserInfo(uid=0, gid=0)


def _kv(tmp_path: Path) -> tuple[str, int]:
    """A SQLite KV holding a small valid namespace; returns (url, inode of /a)."""
    url = f"sqlite://{tmp_path / 'kv.db'}"
    db = open_database(url)
    op = MetaOperator(db, chains=StaticChainTables({1: [1]}))
    a = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, parent=1, name=b"a", mode=0o755)).attr
    f = op.create(
        meta_pb2.CreateRequest(user=ROOT, parent=a.inode, name=b"f", mode=0o644, flags=os.O_RDONLY)
    )
    op.close(meta_pb2.CloseRequest(user=ROOT, inode=f.attr.inode, session_id=f.session_id))
    db.close()  # type: ignore[attr-defined]
    return url, a.inode


def fsck(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fs3.cli.main", "admin", "fsck", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "FS3_KV_URL"},
    )


def test_clean_namespace(tmp_path: Path) -> None:
    url, _ = _kv(tmp_path)
    r = fsck("--kv", url)
    assert r.returncode == 0, r.stderr
    assert "clean" in r.stdout and "inodes=" in r.stdout
    r = fsck("--kv", url, "--json")
    got = json.loads(r.stdout)
    assert got["ok"] is True and got["problems"] == [] and got["directories"] >= 2


def test_broken_namespace_exits_1_and_names_the_problem(tmp_path: Path) -> None:
    url, a = _kv(tmp_path)
    db = open_database(url)
    db.run(lambda tr: tr.set(S.dentry_key(a, b"ghost"), S.encode_dentry(999999, 0o100000)))
    db.close()  # type: ignore[attr-defined]
    r = fsck("--kv", url)
    assert r.returncode == 1
    assert "missing inode 999999" in r.stdout


def test_bad_input_is_a_clear_error_and_creates_nothing(tmp_path: Path) -> None:
    r = fsck()
    assert r.returncode == 2 and "--kv URL" in r.stderr
    missing = tmp_path / "nope" / "kv.db"
    r = fsck("--kv", f"sqlite://{missing}")
    assert r.returncode == 2 and "no SQLite KV" in r.stderr
    assert not missing.parent.exists()
    r = fsck("--kv", "bogus://x")
    assert r.returncode == 2 and "fs3 admin fsck" in r.stderr
