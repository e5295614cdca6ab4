"""Shared helpers for the FUSE integration tests (a real cluster and real kernel mounts)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fs3.fuse.main import mount_fstype, mount_state
from fs3.testing.cluster import ProcessCluster

FS3 = [sys.executable, "-m", "fs3.cli.main"]

# Speed: chunk data is not fsynced by storage in these tests (durability against
# power loss is not what they check; commit on all replicas still is). 1 MiB chunks
# (not the 4 MiB default): the tests cross chunk boundaries with small files.
FAST = {
    "storage": {"storage": {"fsync": False}},
    "meta": {"meta": {"default_chunk_size": 1 << 20}},
}

needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None or os.geteuid() != 0,
    reason="needs /dev/fuse, fusermount3 and root (allow_other, other uids)",
)

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def renameat2(old: str, new: str, flags: int) -> None:
    r = _libc.renameat2(
        AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), ctypes.c_uint(flags)
    )
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), old)


def utimensat(path: str, atime: tuple[int, int], mtime: tuple[int, int]) -> None:
    ts = (_Timespec * 2)(_Timespec(*atime), _Timespec(*mtime))
    r = _libc.utimensat(AT_FDCWD, os.fsencode(path), ts, 0)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)


def world_dir(prefix: str) -> Path:
    """A temp dir other uids can traverse (the mount point must be reachable by uid 65534)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o755)
    return d


def wait_until(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        r = cond()
        if r:
            return r
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def run_as(uid: int, gid: int, groups: list[int], code: str, timeout: float = 30) -> Any:
    """Run ``code`` (Python; sets ``result``) as another user; returns ``result`` (JSON).

    An OSError escaping ``code`` comes back as {"errno": N}.
    """
    prog = (
        "import os, json, errno, sys\n"
        f"os.setgroups({groups!r}); os.setresgid({gid}, {gid}, {gid}); os.setresuid({uid}, {uid}, {uid})\n"
        "result = None\n"
        "try:\n"
        + "".join(f"    {line}\n" for line in code.strip().splitlines())
        + "except OSError as e:\n    result = {'errno': e.errno}\n"
        "print(json.dumps(result))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", prog], capture_output=True, text=True, timeout=timeout, check=False
    )
    if r.returncode != 0:
        raise AssertionError(f"run_as failed: {r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


class Mount:
    """A mount made with ``fs3 mount`` (daemon mode), unmounted and killed on close."""

    def __init__(
        self, cluster_file: str, mountpoint: Path, *opts: str, env: dict[str, str] | None = None
    ) -> None:
        self.mountpoint = mountpoint
        with contextlib.suppress(OSError):  # a stale mount there answers ENOTCONN
            mountpoint.mkdir(parents=True, exist_ok=True)
        self.log = str(mountpoint.parent / f"{mountpoint.name}.log")
        full_env = dict(os.environ, FS3_FUSE_LOG_FILE=self.log, **(env or {}))
        args = [*FS3, "mount", "--cluster", cluster_file, str(mountpoint)]
        for o in opts:
            args += ["-o", o]
        self.result = subprocess.run(
            args, capture_output=True, text=True, timeout=90, env=full_env, check=False
        )
        self.pid = 0
        for word in self.result.stdout.replace(")", " ").split():
            if word.isdigit():
                self.pid = int(word)
                break

    @property
    def ok(self) -> bool:
        return self.result.returncode == 0

    def close(self) -> None:
        if mount_fstype(str(self.mountpoint)) is not None:
            subprocess.run(
                ["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, check=False
            )
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                wait_until(lambda: not _alive(self.pid), 20, f"daemon {self.pid} exit")
            with contextlib.suppress(ProcessLookupError, TimeoutError):
                os.kill(self.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not our child: reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def alive(pid: int) -> bool:
    return _alive(pid)


@contextlib.contextmanager
def mounted(cluster_file: str, mountpoint: Path, *opts: str) -> Iterator[Mount]:
    m = Mount(cluster_file, mountpoint, *opts)
    try:
        assert m.ok, f"fs3 mount failed: {m.result.stdout} {m.result.stderr}"
        assert mount_state(str(mountpoint)) == "mounted"
        yield m
    finally:
        m.close()


# ---------------------------------------------------------------------------- the shared cluster

_shared: dict[str, Any] = {}
FIXTURE = "fuse_cluster"


@pytest.fixture(scope="module")
def fuse_cluster(request: pytest.FixtureRequest) -> Iterator[ProcessCluster]:
    """One cluster (mgmtd×1, meta×2, storage×3, 3 replicas) with a mount, shared by the FUSE test modules.

    Started by the first module that asks for it and stopped after the last
    collected test that uses it, so the FUSE tier pays for one cluster start.
    """
    c = _shared.get("cluster")
    if c is None:
        base = world_dir("fs3-fuse-")
        c = ProcessCluster(
            base / "cluster",
            storage_nodes=3,
            targets_per_node=1,
            replicas=3,
            meta=2,
            mgmtd=1,
            mount=str(base / "mnt"),
            overrides=FAST,
        )
        try:
            c.start()
        except BaseException:
            c.close(failed=True)
            shutil.rmtree(base, ignore_errors=True)
            raise
        _shared.update(cluster=c, base=base, failed_at_start=request.session.testsfailed)
    yield c
    items = request.session.items
    mine = [i for i, it in enumerate(items) if getattr(it, "module", None) is request.module]
    rest = items[max(mine) + 1 :] if mine else []
    if not any(FIXTURE in getattr(it, "fixturenames", ()) for it in rest):
        failed = request.session.testsfailed > _shared.get("failed_at_start", 0)
        _shared.clear()
        c.close(failed=failed)
        if not failed:
            shutil.rmtree(base_of(c), ignore_errors=True)


def base_of(c: ProcessCluster) -> Path:
    return c.dir.parent


@pytest.fixture
def cluster(fuse_cluster: ProcessCluster) -> ProcessCluster:
    """The shared FUSE cluster under the name the FUSE test modules use."""
    return fuse_cluster


@pytest.fixture
def d(fuse_cluster: ProcessCluster) -> Path:
    """A fresh directory on the mount, writable by everyone (tests drop privileges)."""
    return fresh_dir(fuse_cluster)


def errno_of(fn: object, *args: object) -> int:
    """The errno ``fn(*args)`` fails with (0 if it succeeds)."""
    try:
        fn(*args)  # type: ignore[operator]
    except OSError as e:
        return e.errno or 0
    return 0


def fresh_dir(c: ProcessCluster) -> Path:
    """A new directory on the shared mount, writable by everyone (tests drop privileges)."""
    import uuid

    assert c.mountpoint
    p = Path(c.mountpoint) / f"t-{uuid.uuid4().hex[:10]}"
    p.mkdir()
    p.chmod(0o777)
    return p
