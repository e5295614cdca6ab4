"""Two mounts of one cluster (consistency) and the daemon's lifecycle (detach, signals, stale mounts)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fs3.fuse.main import mount_state
from fs3.testing.cluster import ProcessCluster

pytest.register_assert_rewrite("fuse_helpers")  # shared helpers + the fuse_cluster plugin
from fuse_helpers import FS3, Mount, alive, mounted, needs_fuse, wait_until, world_dir  # noqa: E402 - after register_assert_rewrite

pytest_plugins = ["fuse_helpers"]  # the shared cluster fixture ``fuse_cluster``
pytestmark = [pytest.mark.integration, pytest.mark.fuse, needs_fuse, pytest.mark.timeout(90)]


@pytest.fixture
def cluster(fuse_cluster: ProcessCluster) -> ProcessCluster:
    return fuse_cluster


@pytest.fixture(scope="module")
def two(fuse_cluster: ProcessCluster) -> Iterator[tuple[Path, Path]]:
    """Mount A is the launcher's (``--foreground``); mount B is made with ``fs3 mount`` (daemon)."""
    base = world_dir("fs3-fuse-two-")
    try:
        with mounted(fuse_cluster.cluster_file, base / "b") as b:
            a = Path(str(fuse_cluster.mountpoint)) / f"two-{os.getpid()}"
            a.mkdir()
            yield a, b.mountpoint / a.name
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_close_to_open_between_mounts(two: tuple[Path, Path]) -> None:
    a, b = two
    (a / "shared").write_bytes(b"version 1")
    assert (b / "shared").read_bytes() == b"version 1"
    # rewrite on A (longer, then shorter): B sees exactly the new bytes after open
    for content in (b"version 2 is longer than one" * 1000, b"v3", os.urandom(3 << 20)):
        with open(a / "shared", "wb") as f:
            f.write(content)
        with open(b / "shared", "rb") as f:
            assert f.read() == content
    # in-place overwrite of the same length (only mtime/contents change)
    with open(a / "shared", "r+b") as f:
        f.write(b"XY")
    with open(b / "shared", "rb") as f:
        assert f.read(2) == b"XY"


def test_namespace_changes_visible_within_timeouts(two: tuple[Path, Path]) -> None:
    a, b = two
    (a / "d").mkdir()
    (a / "d" / "f").write_bytes(b"x")
    wait_until(lambda: (b / "d" / "f").exists(), 5, "new file visible on B")
    os.rename(a / "d" / "f", a / "d" / "g")
    wait_until(lambda: sorted(os.listdir(b / "d")) == ["g"], 5, "rename visible on B")
    os.chmod(a / "d" / "g", 0o600)
    wait_until(lambda: (os.stat(b / "d" / "g").st_mode & 0o777) == 0o600, 5, "chmod visible on B")
    os.unlink(b / "d" / "g")
    wait_until(lambda: not (a / "d" / "g").exists(), 5, "unlink visible on A")


def test_open_unlinked_on_other_mount_keeps_data(two: tuple[Path, Path]) -> None:
    a, b = two
    (a / "keep").write_bytes(b"still here")
    fd = os.open(a / "keep", os.O_RDONLY)
    try:
        os.unlink(b / "keep")
        assert os.pread(fd, 100, 0) == b"still here"
    finally:
        os.close(fd)


def test_fsync_on_one_mount_then_read_on_other_while_open(two: tuple[Path, Path]) -> None:
    a, b = two
    data = os.urandom(2 << 20)
    fd = os.open(a / "live", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
        with open(b / "live", "rb") as f:
            assert f.read() == data
    finally:
        os.close(fd)


def test_sigterm_unmounts_cleanly(cluster: ProcessCluster) -> None:
    base = world_dir("fs3-fuse-sig-")
    m = Mount(cluster.cluster_file, base / "m")
    try:
        assert m.ok, m.result.stderr
        assert "log:" in m.result.stdout and m.pid > 0  # says where its log is
        (base / "m" / "sig-f").write_bytes(b"data before the signal")
        fd = os.open(base / "m" / "sig-open-at-exit", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"buffered when the signal came")
        os.kill(m.pid, signal.SIGTERM)
        wait_until(lambda: mount_state(str(base / "m")) == "absent", 20, "unmount after SIGTERM")
        wait_until(lambda: not alive(m.pid), 20, "daemon exit")
        with contextlib.suppress(OSError):
            os.close(fd)  # its mount is gone (ENOTCONN); the data was written at the signal
        assert "signal 15" in Path(m.log).read_text()
        shared = Path(str(cluster.mountpoint))
        assert (shared / "sig-f").read_bytes() == b"data before the signal"
        assert (shared / "sig-open-at-exit").read_bytes() == b"buffered when the signal came"
    finally:
        m.close()
        shutil.rmtree(base, ignore_errors=True)


def test_read_only_mount_and_fusermount_u_stops_the_daemon(cluster: ProcessCluster) -> None:
    base = world_dir("fs3-fuse-umount-")
    m = Mount(cluster.cluster_file, base / "m", "ro,attr_timeout_s=2")
    try:
        assert m.ok, m.result.stderr
        assert os.listdir(base / "m") is not None
        with pytest.raises(OSError) as ei:
            (base / "m" / "nope").write_bytes(b"")
        assert ei.value.errno == errno.EROFS
        subprocess.run(["fusermount3", "-u", str(base / "m")], check=True, timeout=30)
        wait_until(lambda: not alive(m.pid), 20, "daemon exit after fusermount3 -u")
        assert mount_state(str(base / "m")) == "absent"
    finally:
        m.close()
        shutil.rmtree(base, ignore_errors=True)


def test_stale_mount_is_cleared_by_next_mount(cluster: ProcessCluster) -> None:
    base = world_dir("fs3-fuse-stale-")
    m = Mount(cluster.cluster_file, base / "m")
    try:
        assert m.ok, m.result.stderr
        os.kill(m.pid, signal.SIGKILL)  # a crashed daemon leaves its mount behind
        wait_until(lambda: mount_state(str(base / "m")) == "stale", 20, "stale mount")
        m2 = Mount(cluster.cluster_file, base / "m")
        try:
            assert m2.ok, m2.result.stderr
            assert "stale" in m2.result.stderr
            assert mount_state(str(base / "m")) == "mounted"
            assert os.listdir(base / "m") is not None
        finally:
            m2.close()
    finally:
        m.close()
        shutil.rmtree(base, ignore_errors=True)


def test_mount_errors_are_clear(
    cluster: ProcessCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fs3.fuse.main import main

    assert main(["--cluster", str(tmp_path / "nope"), str(tmp_path)]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["--cluster", cluster.cluster_file, str(tmp_path / "missing-dir")]) == 1
    assert "not a directory" in capsys.readouterr().err
    assert (
        main(["--cluster", cluster.cluster_file, str(cluster.mountpoint)]) == 1
    )  # already mounted
    assert "already a mount point" in capsys.readouterr().err
    # a cluster nobody serves: the command fails (after the client's deadline) instead of hanging
    bad = tmp_path / "bad.cluster"
    bad.write_text("fs3@127.0.0.1:1\n")
    (tmp_path / "mnt").mkdir()
    r = subprocess.run(
        [*FS3, "mount", "--cluster", str(bad), str(tmp_path / "mnt")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(
            os.environ, FS3_CLIENT_RETRY_DEADLINE_S="2", FS3_FUSE_LOG_FILE=str(tmp_path / "l.log")
        ),
    )
    assert r.returncode != 0 and "cannot connect" in r.stderr
    assert mount_state(str(tmp_path / "mnt")) == "absent"
