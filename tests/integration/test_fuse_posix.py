"""POSIX behaviour through a real kernel FUSE mount of a real cluster (os.* calls only).

One cluster (mgmtd×1, meta×2, storage×3, 3 replicas) mounted by the launcher
(``fs3 mount --foreground``) serves every FUSE test module (``fuse_cluster`` in
fuse_helpers); each test works in its own directory. Permission checks run in subprocesses that switch to
uid 65534 (with chosen supplementary groups), which needs ``allow_other``.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from fs3.testing.cluster import ProcessCluster

pytest.register_assert_rewrite("fuse_helpers")  # shared helpers + the fuse_cluster plugin
from fuse_helpers import (  # noqa: E402 - after register_assert_rewrite
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    UTIME_NOW,
    UTIME_OMIT,
    errno_of,
    needs_fuse,
    renameat2,
    run_as,
    utimensat,
)

pytest_plugins = ["fuse_helpers"]  # the shared cluster fixture ``fuse_cluster``
pytestmark = [pytest.mark.integration, pytest.mark.fuse, needs_fuse, pytest.mark.timeout(60)]

CHUNK = 1 << 20
NOBODY = 65534


# ---------------------------------------------------------------------------- files


def test_create_write_read_stat(d: Path) -> None:
    f = d / "a"
    fd = os.open(f, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o640)
    assert os.write(fd, b"hello world") == 11
    assert os.pread(fd, 5, 6) == b"world"
    os.close(fd)
    st = os.stat(f)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
    assert st.st_size == 11 and st.st_nlink == 1 and st.st_uid == 0
    assert f.read_bytes() == b"hello world"
    assert errno_of(os.open, f, os.O_CREAT | os.O_EXCL | os.O_WRONLY) == errno.EEXIST
    assert errno_of(os.open, f, os.O_RDONLY | os.O_DIRECTORY) == errno.ENOTDIR
    assert errno_of(os.open, d, os.O_WRONLY) == errno.EISDIR
    assert errno_of(os.open, d / "missing", os.O_RDONLY) == errno.ENOENT
    assert errno_of(os.stat, d / "a" / "x") == errno.ENOTDIR
    # O_TRUNC
    fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
    os.close(fd)
    assert os.stat(f).st_size == 0 and f.read_bytes() == b""


def test_mode_zero_and_umask_and_all_types(d: Path) -> None:
    fd = os.open(d / "zero", os.O_CREAT | os.O_WRONLY, 0)
    os.close(fd)
    assert stat.S_IMODE(os.stat(d / "zero").st_mode) == 0
    os.mkfifo(d / "fifo", 0o640)
    assert stat.S_ISFIFO(os.stat(d / "fifo").st_mode)
    os.mknod(d / "chr", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    st = os.stat(d / "chr")
    assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 1 and os.minor(st.st_rdev) == 3
    os.mknod(d / "blk", 0o600 | stat.S_IFBLK, os.makedev(7, 9))
    assert os.minor(os.stat(d / "blk").st_rdev) == 9
    os.mknod(d / "reg", 0o600 | stat.S_IFREG)
    assert stat.S_ISREG(os.stat(d / "reg").st_mode)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(d / "sock"))
        assert stat.S_ISSOCK(os.stat(d / "sock").st_mode)
    finally:
        s.close()
    # a FIFO on fs3 works as a FIFO (the kernel serves it)
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(open(d / "fifo", "rb").read()))
    t.start()
    with open(d / "fifo", "wb") as w:
        w.write(b"through the pipe")
    t.join(10)
    assert got == [b"through the pipe"]


def test_name_too_long_everywhere(d: Path) -> None:
    long = "x" * 256
    ok = "y" * 255
    (d / ok).write_bytes(b"1")  # 255 bytes is fine
    assert errno_of(os.open, d / long, os.O_CREAT | os.O_WRONLY) == errno.ENAMETOOLONG
    assert errno_of(os.mkdir, d / long) == errno.ENAMETOOLONG
    assert errno_of(os.mknod, d / long) == errno.ENAMETOOLONG
    assert errno_of(os.symlink, "t", d / long) == errno.ENAMETOOLONG
    assert errno_of(os.link, d / ok, d / long) == errno.ENAMETOOLONG
    assert errno_of(os.rename, d / ok, d / long) == errno.ENAMETOOLONG
    assert errno_of(os.stat, d / long) == errno.ENAMETOOLONG
    assert os.statvfs(d).f_namemax == 255
    assert os.pathconf(d, "PC_NAME_MAX") == 255


def test_statfs(d: Path) -> None:
    sv = os.statvfs(d)
    assert sv.f_bsize > 0 and sv.f_blocks > 0 and sv.f_bavail <= sv.f_blocks
    assert sv.f_files > 0 and sv.f_namemax == 255


# ---------------------------------------------------------------------------- directories


def test_mkdir_rmdir_and_link_counts(d: Path) -> None:
    os.mkdir(d / "p", 0o755)
    assert os.stat(d / "p").st_nlink == 2
    os.mkdir(d / "p" / "c1")
    os.mkdir(d / "p" / "c2")
    (d / "p" / "f").write_bytes(b"")
    assert os.stat(d / "p").st_nlink == 4
    assert errno_of(os.rmdir, d / "p") == errno.ENOTEMPTY
    assert errno_of(os.mkdir, d / "p") == errno.EEXIST
    assert errno_of(os.rmdir, d / "p" / "f") == errno.ENOTDIR
    os.mkdir(d / "q")
    os.rename(d / "p" / "c1", d / "q" / "c1")  # nlink follows renames between parents
    assert os.stat(d / "p").st_nlink == 3 and os.stat(d / "q").st_nlink == 3
    os.rmdir(d / "p" / "c2")
    assert os.stat(d / "p").st_nlink == 2
    assert sorted(os.listdir(d / "p")) == ["f"]


def test_setgid_directory_inheritance(d: Path) -> None:
    os.mkdir(d / "g", 0o775)
    os.chown(d / "g", 0, 4321)
    os.chmod(d / "g", 0o2775)
    (d / "g" / "f").write_bytes(b"")
    os.mkdir(d / "g" / "sub")
    assert os.stat(d / "g" / "f").st_gid == 4321
    st = os.stat(d / "g" / "sub")
    assert st.st_gid == 4321 and st.st_mode & stat.S_ISGID


def test_readdir_large_with_concurrent_changes(d: Path) -> None:
    n = 150
    for i in range(n):
        (d / f"f{i:04d}").write_bytes(b"")
    keep = {f"f{i:04d}" for i in range(n) if i % 3}
    # Remove and add entries while a listing pages through the directory: every
    # entry that exists throughout is returned exactly once.
    seen: list[str] = []
    with os.scandir(d) as it:
        for k, e in enumerate(it):
            seen.append(e.name)
            if k == 30:
                for i in range(0, n, 3):
                    os.unlink(d / f"f{i:04d}")
                for i in range(20):
                    (d / f"new{i}").write_bytes(b"")
    assert len(seen) == len(set(seen)), "an entry was returned twice"
    assert keep <= set(seen), f"missing: {sorted(keep - set(seen))[:5]}"
    names = os.listdir(d)
    assert set(names) == keep | {f"new{i}" for i in range(20)}
    assert len(names) == len(set(names))


def test_readdir_dot_entries_and_seek(d: Path) -> None:
    os.mkdir(d / "s")
    for i in range(5):
        (d / "s" / f"e{i}").write_bytes(b"")
    fd = os.open(d / "s", os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = [e.name for e in os.scandir(fd)]
    finally:
        os.close(fd)
    assert sorted(names) == [f"e{i}" for i in range(5)]
    import subprocess

    out = subprocess.run(
        ["ls", "-a", str(d / "s")], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[:2] == [".", ".."] and len(out) == 7
    assert os.stat(d / "s" / "..").st_ino == os.stat(d).st_ino


# ---------------------------------------------------------------------------- links


def test_unlink_and_open_unlinked_file(d: Path) -> None:
    f = d / "u"
    f.write_bytes(b"keep me")
    fd = os.open(f, os.O_RDWR)
    os.unlink(f)
    assert not f.exists()
    assert os.fstat(fd).st_nlink == 0
    assert os.pread(fd, 100, 0) == b"keep me"
    os.pwrite(fd, b"more data", 7)
    os.fsync(fd)
    assert os.pread(fd, 100, 0) == b"keep memore data"
    os.close(fd)
    assert errno_of(os.unlink, f) == errno.ENOENT
    assert errno_of(os.unlink, d) in (errno.EISDIR, errno.EPERM)


def test_hard_links_and_symlinks(d: Path) -> None:
    f = d / "f"
    f.write_bytes(b"data")
    os.link(f, d / "l1")
    os.link(f, d / "l2")
    assert os.stat(f).st_nlink == 3 and os.stat(d / "l1").st_ino == os.stat(f).st_ino
    ctime = os.stat(f).st_ctime_ns
    time.sleep(0.01)
    os.unlink(d / "l2")
    st = os.stat(f)
    assert st.st_nlink == 2 and st.st_ctime_ns > ctime
    assert errno_of(os.link, d, d / "dl") in (errno.EPERM, errno.EISDIR)
    assert errno_of(os.link, f, d / "l1") == errno.EEXIST
    os.symlink("f", d / "s")
    os.symlink("nowhere", d / "dangling")
    os.symlink(str(d / "loop2"), d / "loop1")
    os.symlink(str(d / "loop1"), d / "loop2")
    assert os.readlink(d / "s") == "f"
    assert (d / "s").read_bytes() == b"data"
    assert stat.S_ISLNK(os.lstat(d / "s").st_mode) and os.lstat(d / "s").st_size == 1
    assert errno_of(os.stat, d / "dangling") == errno.ENOENT
    assert errno_of(os.stat, d / "loop1") == errno.ELOOP
    assert errno_of(os.readlink, f) == errno.EINVAL
    target = "t" * 4000
    os.symlink(target, d / "longlink")
    assert os.readlink(d / "longlink") == target


# ---------------------------------------------------------------------------- rename


def test_rename_rules(d: Path) -> None:
    (d / "a").write_bytes(b"A")
    (d / "b").write_bytes(b"B")
    ino_a = os.stat(d / "a").st_ino
    os.rename(d / "a", d / "b")  # file over file
    assert (
        (d / "b").read_bytes() == b"A"
        and os.stat(d / "b").st_ino == ino_a
        and not (d / "a").exists()
    )
    os.mkdir(d / "d1")
    os.mkdir(d / "d2")
    (d / "d1" / "x").write_bytes(b"x")
    os.rename(d / "d1", d / "d2")  # dir over empty dir
    assert (d / "d2" / "x").exists() and not (d / "d1").exists()
    os.mkdir(d / "d3")
    assert errno_of(os.rename, d / "d3", d / "d2") in (errno.ENOTEMPTY, errno.EEXIST)
    assert errno_of(os.rename, d / "b", d / "d3") == errno.EISDIR
    assert errno_of(os.rename, d / "d3", d / "b") == errno.ENOTDIR
    assert errno_of(os.rename, d / "d2", d / "d2" / "sub") == errno.EINVAL
    assert errno_of(os.rename, d / "missing", d / "z") == errno.ENOENT
    # open file survives being renamed over
    (d / "victim").write_bytes(b"old")
    fd = os.open(d / "victim", os.O_RDONLY)
    (d / "new").write_bytes(b"new")
    os.rename(d / "new", d / "victim")
    assert os.pread(fd, 10, 0) == b"old"
    os.close(fd)
    assert (d / "victim").read_bytes() == b"new"


def test_renameat2_flags(d: Path) -> None:
    (d / "x").write_bytes(b"X")
    (d / "y").write_bytes(b"Y")
    with pytest.raises(OSError) as ei:
        renameat2(str(d / "x"), str(d / "y"), RENAME_NOREPLACE)
    assert ei.value.errno == errno.EEXIST
    renameat2(str(d / "x"), str(d / "z"), RENAME_NOREPLACE)
    os.mkdir(d / "dd")
    renameat2(str(d / "z"), str(d / "dd"), RENAME_EXCHANGE)
    assert stat.S_ISDIR(os.stat(d / "z").st_mode) and (d / "dd").read_bytes() == b"X"
    with pytest.raises(OSError) as ei:
        renameat2(str(d / "y"), str(d / "nothere"), RENAME_EXCHANGE)
    assert ei.value.errno == errno.ENOENT


# ---------------------------------------------------------------------------- attributes


def test_chmod_chown_utimens(d: Path) -> None:
    f = d / "f"
    f.write_bytes(b"")
    c0 = os.stat(f).st_ctime_ns
    time.sleep(0.01)
    os.chmod(f, 0o4751)
    st = os.stat(f)
    assert stat.S_IMODE(st.st_mode) == 0o4751 and st.st_ctime_ns > c0
    os.chown(f, 1000, 2000)
    st = os.stat(f)
    assert (st.st_uid, st.st_gid) == (1000, 2000)
    assert not st.st_mode & stat.S_ISUID  # chown clears set-user-ID
    os.utime(f, ns=(1_000_000_123, 2_000_000_456))
    st = os.stat(f)
    assert st.st_atime_ns == 1_000_000_123 and st.st_mtime_ns == 2_000_000_456
    utimensat(str(f), (0, UTIME_OMIT), (5, 7))
    st = os.stat(f)
    assert st.st_atime_ns == 1_000_000_123 and st.st_mtime_ns == 5_000_000_007
    before = time.time_ns()
    utimensat(str(f), (0, UTIME_NOW), (0, UTIME_OMIT))
    st = os.stat(f)
    assert st.st_atime_ns >= before - 10**9 and st.st_mtime_ns == 5_000_000_007


def test_timestamps_follow_changes(d: Path) -> None:
    f = d / "f"
    f.write_bytes(b"1")
    dm = os.stat(d).st_mtime_ns
    st0 = os.stat(f)
    time.sleep(0.02)
    with open(f, "r+b") as fh:  # overwrite in place: same length, new mtime
        fh.write(b"2")
    st1 = os.stat(f)
    assert st1.st_mtime_ns > st0.st_mtime_ns and st1.st_ctime_ns > st0.st_ctime_ns
    time.sleep(0.02)
    os.truncate(f, 0)
    st2 = os.stat(f)
    assert st2.st_mtime_ns > st1.st_mtime_ns and st2.st_size == 0
    time.sleep(0.02)
    (d / "g").write_bytes(b"")
    assert os.stat(d).st_mtime_ns > dm
    # mtime set explicitly after writing (cp -a, tar) survives close
    fd = os.open(d / "h", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"x" * 10000)
    os.utime(fd, ns=(123_000_000_000, 456_000_000_000))
    os.close(fd)
    assert os.stat(d / "h").st_mtime_ns == 456_000_000_000
    assert os.stat(d / "h").st_size == 10000


def test_xattrs(d: Path) -> None:
    f = d / "f"
    f.write_bytes(b"")
    os.setxattr(f, "user.a", b"1")
    os.setxattr(f, "user.b", b"\x00binary\xff")
    assert os.getxattr(f, "user.b") == b"\x00binary\xff"
    assert sorted(os.listxattr(f)) == ["user.a", "user.b"]
    assert errno_of(os.setxattr, f, "user.a", b"2", os.XATTR_CREATE) == errno.EEXIST
    assert errno_of(os.setxattr, f, "user.c", b"2", os.XATTR_REPLACE) == errno.ENODATA
    os.setxattr(f, "user.a", b"2", os.XATTR_REPLACE)
    assert os.getxattr(f, "user.a") == b"2"
    os.removexattr(f, "user.a")
    assert errno_of(os.getxattr, f, "user.a") == errno.ENODATA
    assert errno_of(os.removexattr, f, "user.a") == errno.ENODATA
    os.mkdir(d / "dx")
    os.setxattr(d / "dx", "user.dir", b"v")
    assert os.getxattr(d / "dx", "user.dir") == b"v"


# ---------------------------------------------------------------------------- data


def test_sparse_files_and_holes(d: Path) -> None:
    f = d / "sparse"
    fd = os.open(f, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"end", 3 * CHUNK + 100)  # far past EOF
        assert os.fstat(fd).st_size == 3 * CHUNK + 103
        assert os.pread(fd, 4096, CHUNK) == b"\0" * 4096
        assert os.pread(fd, 3, 3 * CHUNK + 100) == b"end"
        os.pwrite(fd, b"a" * 5000, 0)
        os.ftruncate(fd, 10)  # down ...
        os.ftruncate(fd, 20000)  # ... and up: the cut part reads as zeros
        assert os.pread(fd, 20000, 0) == b"a" * 10 + b"\0" * 19990
    finally:
        os.close(fd)
    assert f.read_bytes() == b"a" * 10 + b"\0" * 19990
    # a huge truncate is a sparse file or EFBIG, never an allocation
    g = d / "huge"
    g.write_bytes(b"")
    try:
        os.truncate(g, 999_999_999_999_999)
    except OSError as e:
        assert e.errno == errno.EFBIG
    else:
        assert os.stat(g).st_size == 999_999_999_999_999
        with open(g, "rb") as fh:
            fh.seek(999_999_999_999_999 - 10)
            assert fh.read() == b"\0" * 10
    # past 2 GiB
    h = d / "big-offset"
    with open(h, "wb") as fh:
        fh.seek((2 << 30) + 5)
        fh.write(b"Z")
    assert os.stat(h).st_size == (2 << 30) + 6
    with open(h, "rb") as fh:
        fh.seek(2 << 30)
        assert fh.read() == b"\0" * 5 + b"Z"


def test_appends_from_two_fds(d: Path) -> None:
    f = d / "log"
    a = os.open(f, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    b = os.open(f, os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(50):
            os.write(a if i % 2 == 0 else b, f"line {i:03d}\n".encode())
    finally:
        os.close(a)
        os.close(b)
    assert f.read_bytes() == b"".join(f"line {i:03d}\n".encode() for i in range(50))


def test_mmap_reads_and_writes(d: Path) -> None:
    f = d / "m"
    f.write_bytes(b"\0" * 3 * 4096)
    with open(f, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
        mm[100:105] = b"hello"
        mm[8000:8003] = b"abc"
        mm.flush()
        mm.close()
    data = f.read_bytes()
    assert data[100:105] == b"hello" and data[8000:8003] == b"abc" and len(data) == 3 * 4096
    with open(f, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
        assert mm[100:105] == b"hello"
        mm.close()
    # mmap writes after a truncate: the region past the old end reads as zeros
    with open(f, "r+b") as fh:
        fh.truncate(4096)
        fh.truncate(8192)
        mm = mmap.mmap(fh.fileno(), 0)
        assert mm[4096:8192] == b"\0" * 4096
        mm[5000:5004] = b"wxyz"
        mm.close()
    data = f.read_bytes()
    assert data[5000:5004] == b"wxyz" and data[4096:5000] == b"\0" * 904 and len(data) == 8192


def test_large_file_across_chunks(d: Path) -> None:
    rng = random.Random(6)
    data = rng.randbytes(5 * CHUNK + 12345)
    f = d / "big"
    with open(f, "wb") as fh:
        for i in range(0, len(data), 65536 + 7):  # unaligned writes crossing chunk boundaries
            fh.write(data[i : i + 65536 + 7])
    assert os.stat(f).st_size == len(data)
    assert f.read_bytes() == data
    fd = os.open(f, os.O_RDONLY)
    try:
        for _ in range(20):
            off = rng.randrange(0, len(data))
            n = rng.randrange(1, 3 * CHUNK)
            assert os.pread(fd, n, off) == data[off : off + n]
    finally:
        os.close(fd)
    # random overwrites, then verify after close and reopen
    fd = os.open(f, os.O_RDWR)
    buf = bytearray(data)
    try:
        for _ in range(30):
            off = rng.randrange(0, len(data) - 5000)
            piece = rng.randbytes(rng.randrange(1, 5000))
            os.pwrite(fd, piece, off)
            buf[off : off + len(piece)] = piece
    finally:
        os.close(fd)
    assert f.read_bytes() == bytes(buf)


def test_fsync_makes_data_visible_to_other_clients(cluster: ProcessCluster, d: Path) -> None:
    f = d / "durable"
    payload = os.urandom(CHUNK + 777)
    fd = os.open(f, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, payload)
        os.fsync(fd)
        # the length is recorded in meta and the data is on the chains: a
        # separate client (Python API) sees it before the file is closed
        client = cluster.connect()
        try:
            rel = f"/{d.name}/durable"
            assert client.stat(rel).st_size == len(payload)
            with client.open(rel, "rb") as fh:
                assert fh.read() == payload
        finally:
            client.close()
    finally:
        os.close(fd)


def test_direct_io(d: Path) -> None:
    f = d / "direct"
    block = mmap.mmap(-1, 8192)
    block.write(os.urandom(8192))
    fd = os.open(f, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
    try:
        assert os.pwrite(fd, block, 0) == 8192
        out = mmap.mmap(-1, 8192)
        assert os.preadv(fd, [out], 0) == 8192
        assert out[:] == block[:]
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- permissions


def test_permissions_as_other_user(d: Path) -> None:
    secret = d / "secret"
    secret.write_bytes(b"root only")
    secret.chmod(0o600)
    assert run_as(NOBODY, NOBODY, [], f"result = open({str(secret)!r}, 'rb').read().decode()") == {
        "errno": errno.EACCES
    }
    assert run_as(NOBODY, NOBODY, [], f"result = os.access({str(secret)!r}, os.R_OK)") is False
    assert run_as(NOBODY, NOBODY, [], f"result = os.access({str(d)!r}, os.W_OK | os.X_OK)") is True
    # supplementary groups count
    grp = d / "grp"
    grp.write_bytes(b"group data")
    os.chown(grp, 0, 4242)
    grp.chmod(0o640)
    code = f"result = open({str(grp)!r}, 'rb').read().decode()"
    assert run_as(NOBODY, NOBODY, [4242], code) == "group data"
    assert run_as(NOBODY, NOBODY, [], code) == {"errno": errno.EACCES}
    # no search permission on a directory hides its entries
    closed = d / "closed"
    closed.mkdir(mode=0o700)
    (closed / "inner").write_bytes(b"")
    assert run_as(NOBODY, NOBODY, [], f"result = os.stat({str(closed / 'inner')!r}).st_size") == {
        "errno": errno.EACCES
    }
    assert run_as(NOBODY, NOBODY, [], f"result = os.listdir({str(closed)!r})") == {
        "errno": errno.EACCES
    }
    # no write permission on a directory: no create, no unlink
    ro = d / "ro"
    ro.mkdir(mode=0o755)
    (ro / "x").write_bytes(b"")
    assert run_as(NOBODY, NOBODY, [], f"open({str(ro / 'new')!r}, 'wb')") == {"errno": errno.EACCES}
    assert run_as(NOBODY, NOBODY, [], f"os.unlink({str(ro / 'x')!r})") == {"errno": errno.EACCES}
    assert run_as(NOBODY, NOBODY, [], f"os.mkdir({str(ro / 'nd')!r})") == {"errno": errno.EACCES}


def test_ownership_rules_as_other_user(d: Path) -> None:
    f = d / "owned"
    f.write_bytes(b"")
    os.chown(f, NOBODY, NOBODY)
    f.chmod(0o644)
    # owner may chmod, may change the group only to one of its groups, never the owner
    assert run_as(NOBODY, NOBODY, [777], f"os.chmod({str(f)!r}, 0o600); result = 'ok'") == "ok"
    assert run_as(NOBODY, NOBODY, [777], f"os.chown({str(f)!r}, -1, 777); result = 'ok'") == "ok"
    assert os.stat(f).st_gid == 777
    assert run_as(NOBODY, NOBODY, [777], f"os.chown({str(f)!r}, -1, 778)") == {"errno": errno.EPERM}
    assert run_as(NOBODY, NOBODY, [777], f"os.chown({str(f)!r}, 0, -1)") == {"errno": errno.EPERM}
    # a non-owner may not chmod, nor set explicit times, but may touch (UTIME_NOW) with write permission
    g = d / "rootfile"
    g.write_bytes(b"")
    g.chmod(0o666)
    assert run_as(NOBODY, NOBODY, [], f"os.chmod({str(g)!r}, 0o777)") == {"errno": errno.EPERM}
    assert run_as(NOBODY, NOBODY, [], f"os.utime({str(g)!r}, (1, 2))") == {"errno": errno.EPERM}
    assert run_as(NOBODY, NOBODY, [], f"os.utime({str(g)!r}); result = 'ok'") == "ok"
    g.chmod(0o644)
    assert run_as(NOBODY, NOBODY, [], f"os.utime({str(g)!r})") == {"errno": errno.EACCES}


def test_sticky_directory(d: Path) -> None:
    t = d / "tmp"
    t.mkdir()
    t.chmod(0o1777)
    (t / "roots").write_bytes(b"")
    assert run_as(NOBODY, NOBODY, [], f"os.unlink({str(t / 'roots')!r})") == {"errno": errno.EPERM}
    assert run_as(NOBODY, NOBODY, [], f"os.rename({str(t / 'roots')!r}, {str(t / 'x')!r})") == {
        "errno": errno.EPERM
    }
    code = f"open({str(t / 'mine')!r}, 'wb').close(); os.unlink({str(t / 'mine')!r}); result = 'ok'"
    assert run_as(NOBODY, NOBODY, [], code) == "ok"


def test_write_by_non_owner_clears_setuid(d: Path) -> None:
    f = d / "suid"
    f.write_bytes(b"#!/bin/sh\n")
    f.chmod(0o6777)
    assert (
        run_as(NOBODY, NOBODY, [], f"open({str(f)!r}, 'ab').write(b'echo\\n'); result = 'ok'")
        == "ok"
    )
    mode = stat.S_IMODE(os.stat(f).st_mode)
    assert not mode & stat.S_ISUID and not mode & stat.S_ISGID, oct(mode)
    assert f.read_bytes() == b"#!/bin/sh\necho\n"


def test_files_created_by_other_user_are_theirs(d: Path) -> None:
    code = f"os.mkdir({str(d / 'nd')!r}); open({str(d / 'nf')!r}, 'wb').close(); result = 'ok'"
    assert run_as(NOBODY, 4000, [], code) == "ok"
    for n in ("nd", "nf"):
        st = os.stat(d / n)
        assert (st.st_uid, st.st_gid) == (NOBODY, 4000)


# ---------------------------------------------------------------------------- USRBIO (hosted by the daemon)


def test_usrbio_through_the_mount_daemon(cluster: ProcessCluster, d: Path) -> None:
    from fs3.errors import FsError
    from fs3.usrbio import Ior, Iov, dereg_fd, prep_io, reg_fd, submit_ios, wait_for_ios

    mnt = str(cluster.mountpoint)
    data = random.Random(8).randbytes(4 * CHUNK)
    (d / "u.bin").write_bytes(data)
    with Iov(mnt, 4 * CHUNK) as iov:
        fd = os.open(d / "u.bin", os.O_RDWR)
        reg_fd(fd)
        try:
            with Ior(mnt, entries=8, for_read=True) as rd:
                for i in range(4):
                    prep_io(rd, iov, i * CHUNK, fd, i * CHUNK, CHUNK, userdata=i)
                submit_ios(rd)
                done = wait_for_ios(rd, max_results=4, min_results=4, timeout=30)
                assert sorted(c.userdata for c in done) == [0, 1, 2, 3]
                assert all(c.result == CHUNK for c in done), [c.result for c in done]
                assert bytes(iov.buf) == data
            # write through the ring; the mount sees it (kernel cache dropped)
            iov.buf[:CHUNK] = b"W" * CHUNK
            with Ior(mnt, entries=4, for_read=False) as wr:
                prep_io(wr, iov, 0, fd, CHUNK // 2, CHUNK, userdata="w")
                submit_ios(wr)
                (c,) = wait_for_ios(wr, max_results=1, min_results=1, timeout=30)
                assert c.result == CHUNK
        finally:
            dereg_fd(fd)
            os.close(fd)
        expect = data[: CHUNK // 2] + b"W" * CHUNK + data[CHUNK // 2 + CHUNK :]
        assert (d / "u.bin").read_bytes() == expect
        # a ring I/O on an inode this mount has not open is refused (-EBADF), not served
        other = d / "closed.bin"
        other.write_bytes(b"x" * 4096)
        fd2 = os.open(other, os.O_RDONLY)
        reg_fd(fd2)
        with Ior(mnt, entries=2, for_read=True) as rd:
            prep_io(rd, iov, 0, fd2, 0, 4096)
            os.close(fd2)  # the pin (dup) keeps it open ...
            submit_ios(rd)
            (c,) = wait_for_ios(rd, max_results=1, min_results=1, timeout=30)
            assert c.result == 4096  # ... so this still works
        dereg_fd(fd2)
    with pytest.raises(FsError):
        Iov(str(d), 4096)  # not a mount point: no agent there


# ---------------------------------------------------------------------------- locks and concurrency


def test_flock_and_fcntl_locks_exclude_on_one_mount(d: Path) -> None:
    import fcntl

    f = d / "lockfile"
    f.write_bytes(b"")
    holder = os.open(f, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        code = (
            "import fcntl\n"
            f"fd = os.open({str(f)!r}, os.O_RDWR)\n"
            "try:\n"
            "    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
            "    result = 'got flock'\n"
            "except BlockingIOError:\n"
            "    result = 'flock busy'\n"
            "try:\n"
            "    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)\n"
            "    result += ', got lockf'\n"
            "except OSError:\n"
            "    result += ', lockf busy'\n"
        )
        fcntl.lockf(holder, fcntl.LOCK_EX, 10, 0)
        assert run_as(0, 0, [], code) == "flock busy, lockf busy"
        fcntl.flock(holder, fcntl.LOCK_UN)
        fcntl.lockf(holder, fcntl.LOCK_UN, 10, 0)
        assert run_as(0, 0, [], code) == "got flock, got lockf"
    finally:
        os.close(holder)


def test_concurrent_writers(d: Path) -> None:
    rng = random.Random(9)
    blobs = {f"w{i}": rng.randbytes(rng.randrange(1, 3 * CHUNK)) for i in range(4)}
    shared = d / "shared"
    piece = 300_000
    fd = os.open(shared, os.O_CREAT | os.O_RDWR, 0o644)
    errors: list[BaseException] = []

    def own_file(name: str) -> None:
        try:
            with open(d / name, "wb") as fh:
                data = blobs[name]
                for i in range(0, len(data), 100_000):
                    fh.write(data[i : i + 100_000])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def region(k: int) -> None:
        try:
            for i in range(0, piece, 7000):
                os.pwrite(fd, bytes([65 + k]) * min(7000, piece - i), k * piece + i)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=own_file, args=(n,)) for n in blobs]
    threads += [threading.Thread(target=region, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    os.close(fd)
    assert not errors, errors
    for name, data in blobs.items():
        assert (d / name).read_bytes() == data
    assert shared.read_bytes() == b"".join(bytes([65 + k]) * piece for k in range(4))


def test_directory_attrs_after_entry_changes(d: Path) -> None:
    """The kernel re-reads a directory's attributes after every entry change; the daemon
    answers the first such GetAttr from the op's reply: it must match meta exactly,
    and a chmod/xattr/rename through this mount must never be hidden by it."""
    sub = d / "s"
    sub.mkdir()
    st = os.stat(sub)
    for i in range(3):
        time.sleep(0.01)
        (sub / f"f{i}").write_bytes(b"")
        now = os.stat(sub)
        assert now.st_mtime_ns > st.st_mtime_ns and now.st_nlink == 2
        st = now
    (sub / "c").mkdir()
    assert os.stat(sub).st_nlink == 3
    os.chmod(sub, 0o700)
    (sub / "g").write_bytes(b"")  # reply carries the chmod'ed parent
    assert stat.S_IMODE(os.stat(sub).st_mode) == 0o700
    os.chmod(sub, 0o755)  # no entry change after it: the kernel keeps the setattr reply
    assert stat.S_IMODE(os.stat(sub).st_mode) == 0o755
    os.rmdir(sub / "c")
    assert os.stat(sub).st_nlink == 2
    time.sleep(0.01)
    before = os.stat(sub).st_mtime_ns
    os.unlink(sub / "f0")
    assert os.stat(sub).st_mtime_ns > before
    os.rename(sub / "f1", d / "moved")
    assert os.stat(sub).st_mtime_ns >= before and sorted(os.listdir(sub)) == ["f2", "g"]
