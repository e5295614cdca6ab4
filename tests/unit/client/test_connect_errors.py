"""fs3.connect and ``fs3 mount`` against a cluster that is not there: fast, loud, the right types.

A well-formed cluster file whose mgmtd is down must be named at once (which
addresses are waited for) and fail after ``[client] connect_timeout_s``, not
after the established client's minute-long ``retry_deadline_s``. An unreadable
cluster file raises the ``OSError`` subclass ``open`` would.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fs3
from fs3 import config as _config

pytestmark = pytest.mark.timeout(60)


def _closed_port() -> int:
    """A local port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections and never answers (a hung mgmtd)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield int(s.getsockname()[1])
    finally:
        s.close()


def _cfg(connect_timeout_s: float) -> _config.ClientConfig:
    cfg = _config.ClientConfig()
    cfg.client.connect_timeout_s = connect_timeout_s
    return cfg


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_connect_to_down_mgmtd_says_what_it_waits_for_and_fails_fast(
    kind: str, tmp_path: Path, silent_server: int, caplog: pytest.LogCaptureFixture
) -> None:
    p1 = _closed_port() if kind == "refused" else silent_server
    addrs = [f"127.0.0.1:{p1}", f"127.0.0.1:{_closed_port()}"]
    cf = tmp_path / "fs3.cluster"
    cf.write_text(f"down@{','.join(addrs)}\n")
    caplog.set_level(logging.WARNING, logger="fs3.client")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as ei:
        fs3.connect(str(cf), config=_cfg(2.0))
    took = time.monotonic() - t0
    assert 1.9 <= took < 6.0, took  # the connect deadline, not retry_deadline_s (60 s)
    assert ei.value.errno == errno.ETIMEDOUT
    for a in addrs:
        assert a in str(ei.value)
    assert "connect_timeout_s" in str(ei.value)
    waits = [r for r in caplog.records if "waiting up to 2 s" in r.getMessage()]
    assert len(waits) == 1, caplog.text
    assert all(a in waits[0].getMessage() for a in addrs)


def test_connect_timeout_is_configurable_by_env() -> None:
    os.environ["FS3_CLIENT_CONNECT_TIMEOUT_S"] = "3.5"
    try:
        cfg = _config.load(_config.ClientConfig, None)
    finally:
        del os.environ["FS3_CLIENT_CONNECT_TIMEOUT_S"]
    assert cfg.client.connect_timeout_s == 3.5
    assert cfg.client.retry_deadline_s == 60.0  # the established client's deadline is separate
    bad = _config.ClientConfig()
    bad.client.connect_timeout_s = 0
    with pytest.raises(ValueError, match="connect_timeout_s"):
        bad.client.validate()


def test_unreadable_cluster_file_raises_what_open_would(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as ei:
        fs3.connect("/nonexistent")
    assert "cluster file /nonexistent does not exist" in str(ei.value)
    with pytest.raises(FileNotFoundError):
        fs3.connect(tmp_path / "missing.cluster")  # a PathLike works too
    with pytest.raises(IsADirectoryError):
        fs3.connect(str(tmp_path))
    bad = tmp_path / "bad.cluster"
    bad.write_text("no at sign here\n")
    with pytest.raises(OSError) as e2:
        fs3.connect(str(bad))
    assert e2.value.errno == errno.EINVAL and type(e2.value) is OSError
    assert "expected one line" in str(e2.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="chmod 000 stops only non-root readers")
def test_cluster_file_permission_error_as_other_user(tmp_path: Path) -> None:
    """As root, read the file in a child that dropped to nobody: PermissionError."""
    cf = tmp_path / "fs3.cluster"
    cf.write_text("x@127.0.0.1:1\n")
    cf.chmod(0o600)
    tmp_path.chmod(0o755)
    code = (
        "import os, fs3, fs3.client.file_api, fs3.client.mgmtd_client\n"
        # modules the client imports lazily (its loop thread, uvloop): nobody may not read them
        "import concurrent.futures.thread, uvloop, fs3.rpc.loop\n"
        "os.setgid(65534); os.setuid(65534)  # everything imported first: nobody may not read the venv\n"
        "try:\n"
        f"    fs3.connect({str(cf)!r})\n"
        "except PermissionError as e:\n"
        "    print('PermissionError', e)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert r.stdout.startswith("PermissionError"), (r.stdout, r.stderr)


def _mount(cf: Path, mnt: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fs3.cli.main", "mount", "--cluster", str(cf), str(mnt)],
        capture_output=True,
        text=True,
        env=env,
        timeout=40,
        check=False,
    )


def test_mount_with_down_mgmtd_notes_at_once_fails_fast_and_leaves_no_log(
    tmp_path: Path,
) -> None:
    """``fs3 mount`` (detaching) prints the wait note, fails after the deadline, removes its log."""
    addr = f"127.0.0.1:{_closed_port()}"
    cf = tmp_path / "fs3.cluster"
    cf.write_text(f"down@{addr}\n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    logdir = tmp_path / "logs" / "fs3"  # neither directory exists before the mount
    env = {
        **os.environ,
        "FS3_CLIENT_CONNECT_TIMEOUT_S": "2",
        "FS3_FUSE_LOG_FILE": str(logdir / "mount.log"),
    }
    t0 = time.monotonic()
    r = _mount(cf, mnt, env)
    took = time.monotonic() - t0
    assert r.returncode == 1, r
    assert took < 10, took
    lines = r.stderr.splitlines()
    assert any("waiting up to 2 s" in ln and addr in ln for ln in lines), r.stderr
    assert any("no mgmtd leader" in ln for ln in lines), r.stderr
    assert not (tmp_path / "logs").exists(), list((tmp_path / "logs").rglob("*"))


def test_failed_mount_keeps_a_log_that_existed_before(tmp_path: Path) -> None:
    cf = tmp_path / "fs3.cluster"
    cf.write_text(f"down@127.0.0.1:{_closed_port()}\n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "mount.log"
    log.write_text("an earlier mount's lines\n")
    env = {**os.environ, "FS3_CLIENT_CONNECT_TIMEOUT_S": "1", "FS3_FUSE_LOG_FILE": str(log)}
    r = _mount(cf, mnt, env)
    assert r.returncode == 1, r
    assert log.read_text().startswith("an earlier mount's lines\n")
