"""POSIX behaviour beyond pjdfstest, through a real kernel FUSE mount of a real cluster.

fallocate (every mode), O_TMPFILE, mmap of a file opened with O_DIRECT, exec of
an execute-only file, S_ISUID/S_ISGID clearing on O_DIRECT writes, readdir
offsets that stay valid while entries come and go, fstat of an open file
replaced by rename, and buffered reads after an asynchronous O_DIRECT write.
Calls Python cannot issue (telldir/seekdir, Linux AIO) are in c/posix_depth.c,
compiled with gcc when the module starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import random
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fs3.testing.cluster import ProcessCluster
from fs3.testing.faults import list_chunk_files, storage_target_dirs
from fs3.testing.invariants import check_replicas

pytest.register_assert_rewrite("fuse_helpers")
from fuse_helpers import errno_of, needs_fuse, run_as  # noqa: E402 - after register_assert_rewrite

pytest_plugins = ["fuse_helpers"]
pytestmark = [pytest.mark.integration, pytest.mark.fuse, needs_fuse, pytest.mark.timeout(120)]

CHUNK = 1 << 20
NOBODY = 65534
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_COLLAPSE_RANGE = 0x08
FALLOC_FL_ZERO_RANGE = 0x10
FALLOC_FL_INSERT_RANGE = 0x20

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def fallocate(fd: int, mode: int, off: int, length: int) -> None:
    if _libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc")
    out = tmp_path_factory.mktemp("posix-depth") / "posix_depth"
    src = Path(__file__).parent / "c" / "posix_depth.c"
    subprocess.run([gcc, "-O1", "-o", str(out), str(src)], check=True, timeout=60)
    yield str(out)


def _pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(256)) * (n // 256) + bytes(n % 256)


# ---------------------------------------------------------------------------- fallocate


def test_fallocate_default_mode_allocates_and_extends(d: Path) -> None:
    f = d / "alloc"
    fd = os.open(f, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"head", 0)
        fallocate(fd, 0, 0, 2 * CHUNK + 100)
        st = os.fstat(fd)
        assert st.st_size == 2 * CHUNK + 100
        assert st.st_blocks * 512 >= 2 * CHUNK + 100
        assert os.pread(fd, 8, 0) == b"head" + bytes(4)
        assert os.pread(fd, CHUNK, CHUNK) == bytes(CHUNK)
        # Inside the file: nothing changes (no shrink, no zeroing of data).
        fallocate(fd, 0, 0, 10)
        assert os.fstat(fd).st_size == 2 * CHUNK + 100
        assert os.pread(fd, 4, 0) == b"head"
        # KEEP_SIZE past EOF: the size stays.
        fallocate(fd, FALLOC_FL_KEEP_SIZE, 2 * CHUNK + 100, CHUNK)
        assert os.fstat(fd).st_size == 2 * CHUNK + 100
        os.posix_fallocate(fd, 0, 3 * CHUNK)
        assert os.fstat(fd).st_size == 3 * CHUNK
        assert errno_of(fallocate, fd, 0, 0, 0) == errno.EINVAL
        assert errno_of(fallocate, fd, 0, -1, 10) == errno.EINVAL
    finally:
        os.close(fd)
    assert os.stat(f).st_size == 3 * CHUNK
    rfd = os.open(f, os.O_RDONLY)
    try:
        assert errno_of(fallocate, rfd, 0, 0, 10) == errno.EBADF
    finally:
        os.close(rfd)


def test_fallocate_punch_hole_and_zero_range(d: Path) -> None:
    f = d / "punch"
    size = 4 * CHUNK + 1000
    data = _pattern(size, 3)
    f.write_bytes(data)
    want = bytearray(data)
    fd = os.open(f, os.O_RDWR)
    try:
        # PUNCH_HOLE needs KEEP_SIZE (Linux).
        assert errno_of(fallocate, fd, FALLOC_FL_PUNCH_HOLE, 0, 10) == errno.EOPNOTSUPP
        # A hole covering chunk 1 and 2 whole and parts of chunks 0 and 3.
        lo, hi = CHUNK - 300, 3 * CHUNK + 500
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, lo, hi - lo)
        want[lo:hi] = bytes(hi - lo)
        assert os.fstat(fd).st_size == size
        assert os.pread(fd, size, 0) == bytes(want)
        # ZERO_RANGE inside the file, then past EOF (extends) and past EOF with KEEP_SIZE (no change).
        fallocate(fd, FALLOC_FL_ZERO_RANGE, 10, 4000)
        want[10:4010] = bytes(4000)
        fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, size - 10, 5000)
        want[size - 10 : size] = bytes(10)
        assert os.fstat(fd).st_size == size
        fallocate(fd, FALLOC_FL_ZERO_RANGE, size - 20, 2000)
        want[size - 20 :] = bytes(20)
        want += bytes(2000 - 20)
        assert os.fstat(fd).st_size == size - 20 + 2000
        assert os.pread(fd, len(want) + 10, 0) == bytes(want)
        # A punch past EOF changes nothing.
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, len(want) + 10, CHUNK)
        assert os.fstat(fd).st_size == len(want)
        for mode in (FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE):
            assert errno_of(fallocate, fd, mode, 0, 4096) == errno.EOPNOTSUPP
    finally:
        os.close(fd)
    # After close and reopen (page cache dropped by a fresh open), the same bytes.
    with open(f, "rb") as fh:
        assert fh.read() == bytes(want)


def test_fallocate_punched_whole_chunks_are_freed(cluster: ProcessCluster, d: Path) -> None:
    f = d / "freed"
    f.write_bytes(_pattern(4 * CHUNK, 9))
    ino = os.stat(f).st_ino
    assert _chunk_indexes(cluster, ino) == {0, 1, 2, 3}
    fd = os.open(f, os.O_RDWR)
    try:
        fallocate(
            fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, CHUNK // 2, 2 * CHUNK + CHUNK // 2
        )
    finally:
        os.close(fd)
    # Chunks 1 and 2 are gone on every replica; chunk 0 is half zeroed there alike.
    assert _chunk_indexes(cluster, ino) == {0, 3}
    assert check_replicas(cluster) == []
    with open(f, "rb") as fh:
        got = fh.read()
    data = _pattern(4 * CHUNK, 9)
    assert got == data[: CHUNK // 2] + bytes(2 * CHUNK + CHUNK // 2) + data[3 * CHUNK :]


def _chunk_indexes(cluster: ProcessCluster, ino: int) -> set[int]:
    """Indexes of ``ino``'s chunks on storage, over every target (3 replicas each)."""
    out: set[int] = set()
    for tid, path in storage_target_dirs(cluster).items():
        out |= {cf.index for cf in list_chunk_files(path, tid) if cf.inode == ino}
    return out


def test_fallocate_command(d: Path) -> None:
    f = d / "tool"
    subprocess.run(["fallocate", "-l", "3M", str(f)], check=True, timeout=30)
    assert os.stat(f).st_size == 3 * CHUNK
    f.write_bytes(b"x" * (3 * CHUNK))
    subprocess.run(["fallocate", "-p", "-o", "1M", "-l", "1M", str(f)], check=True, timeout=30)
    subprocess.run(["fallocate", "-z", "-o", "0", "-l", "4096", str(f)], check=True, timeout=30)
    got = f.read_bytes()
    assert got == bytes(4096) + b"x" * (CHUNK - 4096) + bytes(CHUNK) + b"x" * CHUNK
    r = subprocess.run(
        ["fallocate", "-c", "-o", "0", "-l", "1M", str(f)], capture_output=True, text=True
    )
    assert r.returncode != 0 and "not supported" in r.stderr.lower(), r.stderr


# ---------------------------------------------------------------------------- O_TMPFILE


def test_o_tmpfile(d: Path) -> None:
    """O_TMPFILE: either a working unnamed file, or EOPNOTSUPP (what applications fall back on).

    Which one depends on the kernel (FUSE_TMPFILE), see fs3/fuse/ops.py.
    """
    try:
        fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o600)
    except OSError as e:
        assert e.errno == errno.EOPNOTSUPP, os.strerror(e.errno or 0)
        assert os.listdir(d) == []
        return
    try:
        os.write(fd, b"unnamed")
        assert os.listdir(d) == []
        os.link(f"/proc/self/fd/{fd}", d / "named", follow_symlinks=True)
        assert (d / "named").read_bytes() == b"unnamed"
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- O_DIRECT


def test_mmap_of_file_opened_with_o_direct(d: Path) -> None:
    f = d / "dmap"
    f.write_bytes(b"a" * 8192)
    fd = os.open(f, os.O_RDWR | os.O_DIRECT)
    try:
        m = mmap.mmap(fd, 8192)
        try:
            assert m[:4] == b"aaaa"
            m[0:4096] = b"m" * 4096
            m.flush()
            buf = mmap.mmap(-1, 4096)
            assert os.preadv(fd, [buf], 0) == 4096
            assert buf[:] == b"m" * 4096, "O_DIRECT read does not see the mapped write"
            buf[:] = b"w" * 4096
            assert os.pwritev(fd, [buf], 4096) == 4096
            assert m[4096:8192] == b"w" * 4096, "the mapping does not see the O_DIRECT write"
        finally:
            m.close()
    finally:
        os.close(fd)
    assert f.read_bytes() == b"m" * 4096 + b"w" * 4096


def test_buffered_read_after_async_o_direct_write(d: Path, helper: str) -> None:
    r = subprocess.run(
        [helper, "aio_direct", str(d / "aio")], capture_output=True, text=True, timeout=60
    )
    assert r.stdout.strip() == "ok", r.stdout + r.stderr


def _as_nobody(helper: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helper, "as", str(NOBODY), *args], capture_output=True, text=True, timeout=60
    )


def test_o_direct_write_by_non_owner_clears_setuid(d: Path, helper: str) -> None:
    f = d / "suid-direct"
    f.write_bytes(b"x" * 8192)
    f.chmod(0o6777)
    r = _as_nobody(helper, "direct_write", str(f), "4096")
    assert r.stdout.strip() == "ok", r.stdout + r.stderr
    mode = stat.S_IMODE(os.stat(f).st_mode)
    assert mode == 0o777, oct(mode)
    assert f.read_bytes() == b"x" * 4096 + b"y" * 4096
    # ftruncate by a non-owner clears them too.
    f.chmod(0o6777)
    code = (
        f"fd = os.open({str(f)!r}, os.O_WRONLY); os.ftruncate(fd, 10); os.close(fd); result = 'ok'"
    )
    assert run_as(NOBODY, NOBODY, [], code) == "ok"
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o777
    assert os.stat(f).st_size == 10


# ---------------------------------------------------------------------------- exec


def test_exec_of_execute_only_file(d: Path, helper: str) -> None:
    f = d / "true-x"
    shutil.copyfile(shutil.which("true") or "/bin/true", f)
    f.chmod(0o711)
    r = _as_nobody(helper, "exec", str(f))
    assert r.returncode == 0, r.stdout + r.stderr
    # Reading it stays forbidden, and exec still needs the execute bit.
    assert run_as(NOBODY, NOBODY, [], f"open({str(f)!r}, 'rb'); result = 'read'") == {
        "errno": errno.EACCES
    }
    f.chmod(0o744)
    r = _as_nobody(helper, "exec", str(f))
    assert (r.returncode, r.stdout.strip()) == (126, "EACCES"), r.stdout + r.stderr


# ---------------------------------------------------------------------------- readdir / fstat


def test_readdir_offsets_stable_across_changes(d: Path, helper: str) -> None:
    r = subprocess.run([helper, "seekdir", str(d)], capture_output=True, text=True, timeout=90)
    assert r.stdout.strip() == "ok", r.stdout + r.stderr


def test_readdir_offsets_are_per_entry_cookies(d: Path) -> None:
    """The same entry has the same offset in every pass over one handle (lseek to it resumes there)."""
    for i in range(40):
        (d / f"n{i:03d}").write_bytes(b"")
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        first = _dir_offsets(fd)
        os.unlink(d / "n005")
        (d / "n0055").write_bytes(b"")
        second = _dir_offsets(fd)  # _dir_offsets rewinds first
        common = set(first) & set(second)
        assert len(common) >= 39 and all(first[n] == second[n] for n in common)
    finally:
        os.close(fd)


def _dir_offsets(fd: int) -> dict[str, int]:
    """name -> d_off of every entry, read with getdents64 from the start of ``fd``."""
    buf = ctypes.create_string_buffer(1 << 16)
    os.lseek(fd, 0, os.SEEK_SET)
    out: dict[str, int] = {}
    while True:
        n = _libc.syscall(217, fd, buf, len(buf))  # SYS_getdents64 (x86_64)
        if n < 0:
            raise OSError(ctypes.get_errno(), "getdents64")
        if n == 0:
            return out
        raw = buf.raw[:n]
        pos = 0
        while pos < n:
            d_off = int.from_bytes(raw[pos + 8 : pos + 16], "little")
            reclen = int.from_bytes(raw[pos + 16 : pos + 18], "little")
            name = raw[pos + 19 : pos + reclen].split(b"\0", 1)[0].decode()
            out[name] = d_off
            pos += reclen


AT_EMPTY_PATH = 0x1000
AT_STATX_FORCE_SYNC = 0x2000
STATX_BASIC_STATS = 0x7FF


def statx_synced(fd: int) -> tuple[int, int, int]:
    """(ino, nlink, size) of ``fd`` fetched from the file system, not the kernel's cache."""
    buf = ctypes.create_string_buffer(256)
    r = _libc.statx(fd, b"", AT_EMPTY_PATH | AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, buf)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    raw = buf.raw
    nlink = int.from_bytes(raw[16:20], "little")
    ino = int.from_bytes(raw[32:40], "little")
    size = int.from_bytes(raw[40:48], "little")
    return ino, nlink, size


def test_fstat_of_open_file_replaced_by_rename(d: Path) -> None:
    f, g = d / "victim", d / "other"
    f.write_bytes(b"old contents")
    g.write_bytes(b"new")
    fd = os.open(f, os.O_RDONLY)
    try:
        ino = os.fstat(fd).st_ino
        os.rename(g, f)
        st = os.fstat(fd)
        assert st.st_ino == ino and st.st_nlink == 0 and st.st_size == 12
        assert statx_synced(fd) == (ino, 0, 12)
        assert os.pread(fd, 100, 0) == b"old contents"
        assert os.stat(f).st_ino != ino
    finally:
        os.close(fd)
    assert f.read_bytes() == b"new"


def test_fstat_of_open_directory_replaced_by_rename(d: Path) -> None:
    a, b = d / "da", d / "db"
    a.mkdir()
    b.mkdir()
    fd = os.open(a, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ino = os.fstat(fd).st_ino
        os.rename(b, a)
        assert statx_synced(fd)[:2] == (ino, 0)
        assert stat.S_ISDIR(os.fstat(fd).st_mode)
        assert os.listdir(fd) == []
    finally:
        os.close(fd)
    # The same after rmdir of an open directory.
    fd = os.open(a, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ino = os.fstat(fd).st_ino
        os.rmdir(a)
        assert statx_synced(fd)[:2] == (ino, 0)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- all paths at once


def test_random_ops_over_every_io_path_stay_coherent(d: Path) -> None:
    """fsx-style: random buffered, O_DIRECT and mmap I/O, truncate and fallocate on one file.

    Every read (through any path) must match a model of the file. O_DIRECT
    requests are page aligned; mappings are made per operation (a truncate
    must not leave one pointing past the end).
    """
    rng = random.Random(2024)
    f = d / "fsx"
    model = bytearray()
    fd = os.open(f, os.O_CREAT | os.O_RDWR, 0o644)
    dfd = os.open(f, os.O_RDWR | os.O_DIRECT)
    page = 4096
    limit = 3 * CHUNK
    abuf = mmap.mmap(-1, 16 * page)  # page-aligned memory for O_DIRECT

    def put(off: int, data: bytes) -> None:
        if off > len(model):
            model.extend(bytes(off - len(model)))
        model[off : off + len(data)] = data

    try:
        for step in range(400):
            op = rng.choice(
                ["write", "write", "read", "dwrite", "dread", "mread", "mwrite"]
                + ["truncate", "punch", "zero", "alloc"]
            )
            size = len(model)
            what = f"step {step}: {op} (size {size})"
            if op == "write":
                off, n = rng.randrange(limit), rng.randrange(1, 65536)
                data = rng.randbytes(n)
                assert os.pwrite(fd, data, off) == n, what
                put(off, data)
            elif op == "read" and size:
                off = rng.randrange(size)
                n = rng.randrange(1, 65536)
                assert os.pread(fd, n, off) == bytes(model[off : off + n]), what
            elif op == "dwrite":
                off = rng.randrange(limit // page) * page
                n = rng.randrange(1, 17) * page
                data = rng.randbytes(n)
                abuf[:n] = data
                assert os.pwritev(dfd, [memoryview(abuf)[:n]], off) == n, what
                put(off, data)
            elif op == "dread" and size:
                off = rng.randrange(size) // page * page
                n = rng.randrange(1, 17) * page
                got = os.preadv(dfd, [memoryview(abuf)[:n]], off)
                assert abuf[:got] == bytes(model[off : off + n]), what
            elif op in ("mread", "mwrite") and size:
                with mmap.mmap(fd, size) as m:
                    off = rng.randrange(size)
                    n = min(rng.randrange(1, 65536), size - off)
                    if op == "mread":
                        assert m[off : off + n] == bytes(model[off : off + n]), what
                    else:
                        data = rng.randbytes(n)
                        m[off : off + n] = data
                        put(off, data)
                        if rng.random() < 0.5:
                            m.flush()
            elif op == "truncate":
                n = rng.randrange(limit)
                os.ftruncate(fd, n)
                del model[n:]
                model.extend(bytes(n - len(model)))
            elif op in ("punch", "zero", "alloc"):
                off, n = rng.randrange(limit), rng.randrange(1, CHUNK + CHUNK // 2)
                keep = op == "punch" or rng.random() < 0.5
                mode = {"punch": FALLOC_FL_PUNCH_HOLE, "zero": FALLOC_FL_ZERO_RANGE, "alloc": 0}[op]
                fallocate(fd, mode | (FALLOC_FL_KEEP_SIZE if keep else 0), off, n)
                if op != "alloc":
                    end = min(off + n, len(model))
                    if off < end:
                        model[off:end] = bytes(end - off)
                if not keep and off + n > len(model):
                    model.extend(bytes(off + n - len(model)))
            assert os.fstat(fd).st_size == len(model), what
    finally:
        os.close(dfd)
        os.close(fd)
        abuf.close()
    with open(f, "rb") as fh:
        assert fh.read() == bytes(model)
