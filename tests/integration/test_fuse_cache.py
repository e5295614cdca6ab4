"""Kernel caching of a mount, its consistency with other mounts, and parallel clients.

* close-to-open: a file written and closed through one mount is read whole, with
  its new size and mtime, after open on another mount, even when that mount may
  keep attributes and names cached for 30 s (only the open revalidates);
* names changed elsewhere (rename, unlink) show within the entry timeout;
* changes made through a mount show on that mount at once, whatever its timeouts;
* four mounts and two Python clients creating and removing names in one
  directory at the same time (conflicting meta transactions) all succeed.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fs3.testing.cluster import ProcessCluster

pytest.register_assert_rewrite("fuse_helpers")
from fuse_helpers import fresh_dir, mounted, needs_fuse, run_as, wait_until, world_dir  # noqa: E402

pytest_plugins = ["fuse_helpers"]
pytestmark = [pytest.mark.integration, pytest.mark.fuse, needs_fuse, pytest.mark.timeout(180)]

NOBODY = 65534
LONG = "attr_timeout_s=30,entry_timeout_s=30,dir_entry_timeout_s=30"


@pytest.fixture(scope="module")
def long_mount(fuse_cluster: ProcessCluster) -> Iterator[Path]:
    """A second mount of the cluster that may cache attributes and names for 30 s."""
    base = world_dir("fs3-fuse-cache-")
    with mounted(fuse_cluster.cluster_file, base / "long", LONG) as m:
        yield m.mountpoint


@pytest.fixture(scope="module")
def default_mount(fuse_cluster: ProcessCluster) -> Iterator[Path]:
    """A second mount with the default timeouts (1 s)."""
    base = world_dir("fs3-fuse-cache-")
    with mounted(fuse_cluster.cluster_file, base / "default") as m:
        yield m.mountpoint


def _on(mount: Path, path: Path, cluster: ProcessCluster) -> Path:
    """``path`` (under the cluster's own mount) as seen through ``mount``."""
    assert cluster.mountpoint
    return mount / path.relative_to(cluster.mountpoint)


def _rewrite(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _read_after_open(path: Path) -> tuple[os.stat_result, bytes]:
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return st, b"".join(chunks)
    finally:
        os.close(fd)


def test_close_to_open_with_30s_caches_on_the_reader(
    fuse_cluster: ProcessCluster, long_mount: Path
) -> None:
    d = fresh_dir(fuse_cluster)
    a = d / "f"
    b = _on(long_mount, a, fuse_cluster)
    _rewrite(a, b"v1")
    assert b.read_bytes() == b"v1"
    assert os.stat(b).st_size == 2  # B now caches size 2 (for up to 30 s)
    for data in (os.urandom(3 << 20), b"short", os.urandom(70_000)):
        _rewrite(a, data)  # written and closed on A
        want = os.stat(a)
        st, got = _read_after_open(b)
        assert st.st_size == len(data) and st.st_mtime_ns == want.st_mtime_ns
        assert got == data
        assert os.stat(b).st_size == len(data)  # and stat(2) after the open agrees
    # same length, new bytes: only mtime tells; the reader's cached pages must go
    with open(a, "r+b") as f:
        f.write(b"XYZ")
    want = os.stat(a)
    st, got = _read_after_open(b)
    assert got[:3] == b"XYZ" and st.st_mtime_ns == want.st_mtime_ns


def test_an_overwrite_still_buffered_by_an_api_writer_is_not_announced_to_a_mount(
    fuse_cluster: ProcessCluster,
) -> None:
    """A mount keeps its cached pages while meta's (size, mtime) is what it last saw at
    open, so a writer may announce a new mtime only once the data is on storage.

    The periodic length report of a long writer (``length_report_interval_s``) used to
    send the mtime of an overwrite still buffered (or in flight): a mount opening the
    file meanwhile read the old bytes from storage and cached them under the new mtime;
    the writer's fsync then announced the same mtime again, so the next open kept the
    cache and read the old bytes after the overwrite was acknowledged (a stale read)."""
    from fs3 import config as fs3config

    cfg = fs3config.load(fs3config.ClientConfig, None, env={})
    cfg.rpc = fs3config.load(fs3config.ClientConfig, None).rpc  # the tier's RPC transport
    cfg.client.length_report_interval_s = 0.2  # report often ...
    cfg.fuse.write_buffer_age_s = 120.0  # ... while the overwrite sits in the write buffer
    d = fresh_dir(fuse_cluster)
    path = d / "f"
    assert fuse_cluster.mountpoint
    rel = "/" + str(path.relative_to(fuse_cluster.mountpoint))
    old, new = os.urandom(64 << 10), os.urandom(64 << 10)
    c = fuse_cluster.connect(config=cfg)
    try:
        with c.open(rel, "wb") as f:
            f.write(old)
        st_old, got = _read_after_open(path)
        assert got == old  # the mount caches the old pages
        w = c.open(rel, "r+b", buffering=0)
        try:
            w.write(new)  # same length: only the mtime can tell a reader
            h = w.handle
            before = h.last_report
            wait_until(lambda: h.last_report > before, 30, "a periodic report of the writer")
            st_mid, got = _read_after_open(path)
            assert got == old  # not written yet: the old bytes are right
            w.fsync()  # on storage, then announced
            st, got = _read_after_open(path)
            assert got == new, "the mount served its cached old bytes after the fsync"
            assert st_mid.st_mtime_ns == st_old.st_mtime_ns, "mtime announced before the data"
            assert st.st_mtime_ns != st_old.st_mtime_ns
        finally:
            w.close()
    finally:
        c.close()


def _visible_within(cond: Callable[[], bool], limit: float, what: str) -> float:
    """Seconds until ``cond`` holds; fails if that takes longer than ``limit``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"{what}: not visible after {limit:.1f} s")
        time.sleep(0.02)
    return time.monotonic() - t0


def test_rename_and_unlink_elsewhere_show_within_the_entry_timeout(
    fuse_cluster: ProcessCluster, default_mount: Path
) -> None:
    """Default timeouts are 1 s: a cached name on B follows A's change within ~1 s."""
    slack = 2.0  # scheduling on a loaded machine; the kernel's own bound is the timeout
    d = fresh_dir(fuse_cluster)
    (d / "sub").mkdir()
    (d / "sub" / "f").write_bytes(b"x")
    bd = _on(default_mount, d, fuse_cluster)
    assert (bd / "sub" / "f").read_bytes() == b"x"  # B caches sub and sub/f
    os.rename(d / "sub" / "f", d / "sub" / "g")
    _visible_within(
        lambda: not (bd / "sub" / "f").exists() and (bd / "sub" / "g").exists(),
        1.0 + slack,
        "rename of a file",
    )
    os.rename(d / "sub", d / "sub2")
    _visible_within(
        lambda: not (bd / "sub").exists() and (bd / "sub2" / "g").exists(),
        1.0 + slack,
        "rename of a directory",
    )
    os.unlink(d / "sub2" / "g")
    _visible_within(lambda: not (bd / "sub2" / "g").exists(), 1.0 + slack, "unlink")
    # a listing is never cached: it is exact at once
    assert os.listdir(bd / "sub2") == []


def test_own_changes_show_at_once_with_30s_caches(
    fuse_cluster: ProcessCluster, long_mount: Path
) -> None:
    """No change made through a mount may be hidden by that mount's own caches."""
    d = _on(long_mount, fresh_dir(fuse_cluster), fuse_cluster)
    f = d / "f"
    f.write_bytes(b"12345")
    assert os.stat(f).st_size == 5
    os.chmod(f, 0o600)
    assert os.stat(f).st_mode & 0o777 == 0o600
    with open(f, "ab") as fh:
        fh.write(b"6789")
    assert os.stat(f).st_size == 9
    os.truncate(f, 2)
    assert os.stat(f).st_size == 2 and f.read_bytes() == b"12"
    os.link(f, d / "hard")
    assert os.stat(f).st_nlink == 2 and os.stat(d / "hard").st_nlink == 2
    (d / "other").write_bytes(b"other")
    ino = os.stat(d / "other").st_ino
    os.rename(d / "other", d / "hard")  # replaces one of f's names
    assert os.stat(d / "hard").st_ino == ino and (d / "hard").read_bytes() == b"other"
    assert os.stat(f).st_nlink == 1
    assert not (d / "other").exists()
    os.unlink(d / "hard")
    assert not (d / "hard").exists()
    with pytest.raises(FileNotFoundError):
        os.stat(d / "hard")
    os.setxattr(f, "user.k", b"v1")
    assert os.getxattr(f, "user.k") == b"v1"
    os.utime(f, ns=(1_000_000_000, 2_000_000_123))
    assert os.stat(f).st_mtime_ns == 2_000_000_123
    links = os.stat(d).st_nlink
    (d / "sub").mkdir()
    assert os.stat(d).st_nlink == links + 1
    os.rmdir(d / "sub")
    assert os.stat(d).st_nlink == links and not (d / "sub").exists()
    os.symlink("f", d / "ln")
    assert os.readlink(d / "ln") == "f" and (d / "ln").read_bytes() == b"12"
    assert sorted(os.listdir(d)) == ["f", "ln"]


def test_negative_timeout_option_caches_no_such_entry(fuse_cluster: ProcessCluster) -> None:
    """-o negative_timeout_s=N: a name created elsewhere stays hidden up to N s, then shows."""
    base = world_dir("fs3-fuse-neg-")
    with mounted(fuse_cluster.cluster_file, base / "neg", "negative_timeout_s=2") as m:
        d = fresh_dir(fuse_cluster)
        nd = _on(m.mountpoint, d, fuse_cluster)
        assert not (nd / "late").exists()  # cached as absent on this mount
        (d / "late").write_bytes(b"x")  # created through the other mount
        t = _visible_within(lambda: (nd / "late").exists(), 2.0 + 3.0, "negative entry expiry")
        assert t > 0.5, "the negative entry was not cached at all"
        # a create through this mount replaces its own negative entry at once
        assert not (nd / "mine").exists()
        (nd / "mine").write_bytes(b"y")
        assert (nd / "mine").read_bytes() == b"y"


# ---------------------------------------------------------------------- parallel clients


@pytest.fixture(scope="module")
def four_mounts(fuse_cluster: ProcessCluster) -> Iterator[list[Path]]:
    base = world_dir("fs3-fuse-par-")
    assert fuse_cluster.mountpoint
    with (
        mounted(fuse_cluster.cluster_file, base / "m2") as m2,
        mounted(fuse_cluster.cluster_file, base / "m3") as m3,
        mounted(fuse_cluster.cluster_file, base / "m4") as m4,
    ):
        yield [Path(fuse_cluster.mountpoint), m2.mountpoint, m3.mountpoint, m4.mountpoint]


def test_four_mounts_and_two_clients_change_one_directory_at_once(
    fuse_cluster: ProcessCluster, four_mounts: list[Path]
) -> None:
    """Every create, rename and unlink succeeds though all of them conflict on one directory."""
    d = fresh_dir(fuse_cluster)
    rel = "/" + str(d.relative_to(fuse_cluster.mountpoint or "/"))
    per = 60
    errors: list[str] = []
    start = threading.Barrier(6)

    def posix_worker(k: int, mount: Path) -> None:
        pd = mount / d.name
        try:
            start.wait(30)
            for i in range(per):
                p = pd / f"m{k}-{i}"
                os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            for i in range(0, per, 2):
                os.rename(pd / f"m{k}-{i}", pd / f"m{k}-{i}.r")
            for i in range(1, per, 2):
                os.unlink(pd / f"m{k}-{i}")
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(f"mount {k}: {type(e).__name__}: {e}")

    def client_worker(k: int, client: Any) -> None:
        try:
            start.wait(30)
            for i in range(per):
                with client.open(f"{rel}/c{k}-{i}", "xb"):
                    pass
            for i in range(0, per, 2):
                client.rename(f"{rel}/c{k}-{i}", f"{rel}/c{k}-{i}.r")
            for i in range(1, per, 2):
                client.unlink(f"{rel}/c{k}-{i}")
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(f"client {k}: {type(e).__name__}: {e}")

    clients = [fuse_cluster.connect(), fuse_cluster.connect()]
    try:
        threads = [
            threading.Thread(target=posix_worker, args=(k, m)) for k, m in enumerate(four_mounts)
        ] + [threading.Thread(target=client_worker, args=(k, c)) for k, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        assert not any(t.is_alive() for t in threads), "a worker hung"
        assert errors == []
        want = sorted(
            [f"m{k}-{i}.r" for k in range(4) for i in range(0, per, 2)]
            + [f"c{k}-{i}.r" for k in range(2) for i in range(0, per, 2)]
        )
        for m in four_mounts:  # listings are exact on every mount at once
            assert sorted(os.listdir(m / d.name)) == want
        assert sorted(clients[0].listdir(rel)) == want
        assert os.stat(d).st_nlink == 2
        with pytest.raises(FileExistsError):  # O_EXCL still means it after the storm
            os.open(d / want[0], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    finally:
        for c in clients:
            c.close()


def test_opendir_still_refuses_a_directory_without_read_permission(
    fuse_cluster: ProcessCluster,
) -> None:
    """opendir no longer asks meta for access (the kernel checks): the refusal must stay."""
    d = fresh_dir(fuse_cluster)
    (d / "x").write_bytes(b"")
    locked = d / "locked"
    locked.mkdir()
    locked.chmod(0o711)
    assert run_as(NOBODY, NOBODY, [], f"result = os.listdir({str(locked)!r})") == {
        "errno": errno.EACCES
    }
    got = run_as(NOBODY, NOBODY, [], f"result = sorted(os.listdir({str(d)!r}))")
    assert got == ["locked", "x"]
