"""Chunk files stay open between reads (fs3/storage/chunk_data.py, ReadFds).

A data file's descriptor is kept after a read, so the next read of the chunk
costs one ``preadv`` instead of ``open`` + ``preadv`` + ``close``. Each way a
file stops being a committed version (rewrite into a new file, remove, a
growing truncate, an aborted staging) must close its kept descriptor, and a
read that holds one must never see it closed under it. Also here: a cold large
read into page-aligned memory asks the page cache with ``cachestat`` and leaves
the range uncached (no readahead started by the asking).
"""

from __future__ import annotations

import mmap
import os
import random
from pathlib import Path

import pytest

from fs3.errors import Code, FsError
from fs3.storage import chunk_data
from fs3.storage.chunk_data import ReadFds
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine
from tests.unit.storage.test_write_path import _has_o_direct

pytestmark = pytest.mark.timeout(30)

CS = 1 << 20
BS = 64 << 10


def _engine(tmp_path: Path, **kw: object) -> FileChunkEngine:
    return FileChunkEngine(tmp_path / "t", fsync=False, block_size=BS, **kw)  # type: ignore[arg-type]


def _write(e: FileChunkEngine, k: ChunkKey, data: bytes, ver: int, offset: int = 0) -> None:
    e.commit(
        e.stage_write(
            k,
            offset,
            data,
            update_ver=ver,
            chain_ver=1,
            chunk_size=CS,
            replace_all=offset == 0 and ver > 0 and len(data) == CS,
        )
    )


def _open_paths() -> list[str]:
    """What every descriptor of this process names (deleted files end in ' (deleted)')."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def _held(e: FileChunkEngine) -> list[str]:
    """This engine's data files some descriptor of the process names."""
    d = str(e.data.dir)
    return [p for p in _open_paths() if p.startswith(d)]


def test_repeated_small_reads_open_the_file_once(tmp_path: Path) -> None:
    e = _engine(tmp_path)
    k = ChunkKey(1, 0)
    data = random.Random(1).randbytes(CS)
    _write(e, k, data, 1)
    for off in range(0, CS, 4096 * 7):
        assert e.read(k, off, 4096)[1] == data[off : off + 4096]
    dest = bytearray(4096)
    assert e.read_into(k, 8192, 4096, memoryview(dest)) is not None
    assert bytes(dest) == data[8192 : 8192 + 4096]
    assert e.data.read_fds.opens == 1
    assert len(_held(e)) == 1
    e.close()
    assert _held(e) == []


@pytest.mark.parametrize("how", ["rewrite", "partial", "remove", "grow", "shrink"])
def test_a_superseded_file_is_closed_and_reads_see_the_new_version(
    tmp_path: Path, how: str
) -> None:
    e = _engine(tmp_path)
    k = ChunkKey(2, 3)
    rnd = random.Random(2)
    old = rnd.randbytes(CS // 2)
    _write(e, k, old, 1)
    assert e.read(k, 0, 4096)[1] == old[:4096]
    m1 = e.get(k)
    assert m1 is not None and len(_held(e)) == 1
    if how == "rewrite":
        new = rnd.randbytes(CS)
        _write(e, k, new, 2)
    elif how == "partial":  # copy-on-write into a new file
        patch = rnd.randbytes(4096)
        _write(e, k, patch, 2, offset=0)
        new = patch + old[4096:]
    elif how == "remove":
        e.commit(e.stage_remove(k, update_ver=2, chain_ver=1))
        new = b""
    elif how == "grow":
        e.commit(
            e.stage_truncate(k, CS, update_ver=2, chain_ver=1, chunk_size=CS, only_extend=False)
        )
        new = old + bytes(CS - len(old))
    else:  # shrink: the committed file is shared, only the length changes
        e.commit(
            e.stage_truncate(k, 10_000, update_ver=2, chain_ver=1, chunk_size=CS, only_extend=False)
        )
        new = old[:10_000]
    # no descriptor of a deleted data file is left (its blocks would never be freed)
    assert [p for p in _held(e) if p.endswith("(deleted)")] == []
    if how == "remove":
        with pytest.raises(FsError) as ei:
            e.read(k, 0, 4096)
        assert ei.value.code == Code.CHUNK_NOT_FOUND
    else:
        m2 = e.get(k)
        assert m2 is not None
        assert e.read(k, 0, CS)[1] == new
        assert e.read(k, 4096, 4096)[1] == new[4096:8192]
        if how == "shrink":
            assert m2.file == m1.file and e.data.read_fds.opens == 1  # still the kept one
        else:
            assert m2.file != m1.file
    e.close()


def test_append_in_place_is_seen_through_the_kept_descriptor(tmp_path: Path) -> None:
    e = _engine(tmp_path)
    k = ChunkKey(3, 0)
    a = random.Random(3).randbytes(BS)
    _write(e, k, a, 1)
    assert e.read(k, 0, BS)[1] == a
    b = random.Random(4).randbytes(BS)
    _write(e, k, b, 2, offset=BS)  # a pure append writes into the committed file
    assert e.read(k, 0, 2 * BS)[1] == a + b
    assert e.data.read_fds.opens == 1
    e.close()


def test_aborted_staging_file_is_not_kept_open(tmp_path: Path) -> None:
    e = _engine(tmp_path)
    k = ChunkKey(4, 0)
    _write(e, k, b"x" * BS, 1)
    e.read(k, 0, 10)
    p = e.stage_write(k, 0, b"y" * CS, update_ver=2, chain_ver=1, chunk_size=CS, replace_all=True)
    e.abort(k)
    assert not os.path.exists(e.data.path(p.file))
    assert [x for x in _held(e) if x.endswith("(deleted)")] == []
    assert e.read(k, 0, 10)[1] == b"x" * 10
    e.close()


def test_kept_descriptors_are_bounded(tmp_path: Path) -> None:
    e = _engine(tmp_path, read_fds=3)
    for i in range(8):
        _write(e, ChunkKey(5, i), bytes([i]) * 4096, 1)
    for _ in range(2):
        for i in range(8):
            assert e.read(ChunkKey(5, i), 0, 4096)[1] == bytes([i]) * 4096
    assert len(e.data.read_fds) == 3
    assert len(_held(e)) == 3
    e.close()
    assert _held(e) == []


def test_no_kept_descriptors_when_disabled(tmp_path: Path) -> None:
    e = _engine(tmp_path, read_fds=0)
    _write(e, ChunkKey(6, 0), b"z" * 4096, 1)
    for _ in range(3):
        assert e.read(ChunkKey(6, 0), 0, 4096)[1] == b"z" * 4096
    assert e.data.read_fds.opens == 3 and _held(e) == []
    e.close()


def test_a_held_descriptor_is_closed_only_by_its_last_user(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    fds = ReadFds(str(tmp_path) + os.sep, 4)
    h1 = fds.acquire("a")
    h2 = fds.acquire("a")
    assert h1 is h2 is not None and fds.opens == 1
    os.unlink(tmp_path / "a")
    fds.forget("a")  # a read still holds it: stays open
    assert os.pread(h1.fd, 3, 0) == b"abc"
    fds.release(h1)
    assert os.pread(h2.fd, 3, 0) == b"abc"
    fds.release(h2)
    with pytest.raises(OSError):
        os.fstat(h2.fd)  # closed by the last release
    assert fds.acquire("a") is None  # gone
    # eviction by the bound while held: closed on release, not before
    for n in "bcde":
        (tmp_path / n).write_bytes(n.encode())
    hb = fds.acquire("b")
    assert hb is not None
    for n in "cdeb":
        h = fds.acquire(n)
        assert h is not None
        fds.release(h)
    fds2 = ReadFds(str(tmp_path) + os.sep, 1)
    x = fds2.acquire("c")
    y = fds2.acquire("d")  # evicts c, which x still holds
    assert x is not None and y is not None
    assert os.pread(x.fd, 1, 0) == b"c"
    fds2.release(x)
    with pytest.raises(OSError):
        os.fstat(x.fd)
    fds2.release(y)
    fds.release(hb)
    fds.clear()
    fds2.clear()


def test_an_open_racing_an_unlink_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file opened just before it was unlinked (and forgotten) must not stay cached."""
    (tmp_path / "a").write_bytes(b"abc")
    fds = ReadFds(str(tmp_path) + os.sep, 4)
    real_open = os.open

    def racing_open(path: str, flags: int, *a: object) -> int:
        fd = real_open(path, flags, *a)
        os.unlink(path)  # another thread supersedes the file meanwhile
        fds.forget("a")
        return fd

    monkeypatch.setattr(chunk_data.os, "open", racing_open)
    h = fds.acquire("a")
    monkeypatch.setattr(chunk_data.os, "open", real_open)
    assert h is not None and os.pread(h.fd, 3, 0) == b"abc"
    assert len(fds) == 0
    fds.release(h)
    with pytest.raises(OSError):
        os.fstat(h.fd)


def test_cold_direct_read_starts_no_readahead(tmp_path: Path) -> None:
    """Asking the page cache before an O_DIRECT read must not fill it (cachestat, not
    ``RWF_NOWAIT``, whose miss starts the file's readahead: the disk then reads the
    range twice and more)."""
    if not _has_o_direct(tmp_path):
        pytest.skip("no O_DIRECT on this file system")
    e = FileChunkEngine(tmp_path / "t", block_size=BS, direct_write=True)
    k = ChunkKey(7, 0)
    src = mmap.mmap(-1, CS)
    src[:] = random.Random(7).randbytes(CS)
    e.commit(e.stage_write(k, 0, memoryview(src), update_ver=1, chain_ver=1, chunk_size=CS))
    meta = e.get(k)
    assert meta is not None
    path = e.data.path(meta.file)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if chunk_data._all_cached(fd, 0, CS) is None:
            pytest.skip("no cachestat(2) on this kernel")
        assert chunk_data._all_cached(fd, 0, CS) is False
        dst = mmap.mmap(-1, CS)
        view = memoryview(dst)
        got = e.read_into(k, 0, CS // 2, view[: CS // 2])
        assert got is not None and got[1] == CS // 2
        assert e.data.direct_reads == 1 and dst[: CS // 2] == src[: CS // 2]
        assert chunk_data._all_cached(fd, 0, 4096) is False  # nothing was read buffered
        assert chunk_data._all_cached(fd, CS // 2, CS // 2) is False
        # once cached, a read is served from the page cache (no direct read)
        os.pread(fd, CS, 0)
        assert chunk_data._all_cached(fd, 0, CS) is True
        assert e.read_into(k, 0, CS // 2, view[: CS // 2]) is not None
        assert e.data.direct_reads == 1
        view.release()
        dst.close()
    finally:
        os.close(fd)
        e.close()


def test_read_descriptor_budget_is_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept descriptors of all targets together stay within a quarter of the soft
    RLIMIT_NOFILE, so a node with many targets under a 1,024 limit keeps room for
    its sockets, SQLite and staging files."""
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 1 << 20))
    assert chunk_data.read_fds_per_target(1) == 256
    assert chunk_data.read_fds_per_target(4) == 64
    assert chunk_data.read_fds_per_target(16) * 16 <= 256
    assert chunk_data.read_fds_per_target(0) == 256
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (200_000, 1 << 20))
    assert chunk_data.read_fds_per_target(8) == chunk_data.READ_FDS


def test_no_descriptor_is_kept_after_close(tmp_path: Path) -> None:
    """A read still in flight when the engine shuts down gets a descriptor that is
    closed when it is done, not one kept (nothing would close it later)."""
    e = _engine(tmp_path)
    k = ChunkKey(8, 0)
    _write(e, k, b"q" * 4096, 1)
    assert e.read(k, 0, 4096)[1] == b"q" * 4096
    e.data.close()
    assert _held(e) == []
    meta = e.get(k)
    assert meta is not None
    held = e.data.read_fds.acquire(meta.file)
    assert held is not None and len(e.data.read_fds) == 0
    e.data.read_fds.release(held)
    assert _held(e) == []
    e.close()


def test_cachestat_counts_pages_of_an_unaligned_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range that starts inside a page spans one page more than its length says:
    all of them must be cached for it to count as cached."""
    p = tmp_path / "f"
    p.write_bytes(b"x" * (3 * 4096))
    fd = os.open(p, os.O_RDONLY)
    try:
        if chunk_data._all_cached(fd, 0, 4096) is None:
            pytest.skip("no cachestat(2) on this kernel")

        def two_pages(*args: object) -> int:
            st = args[3]._obj  # type: ignore[attr-defined]
            st.nr_cache = 2
            return 0

        monkeypatch.setattr(chunk_data._libc, "syscall", two_pages)
        page = chunk_data._PAGE
        assert chunk_data._all_cached(fd, 0, 2 * page) is True
        assert chunk_data._all_cached(fd, page // 2, 2 * page) is False  # spans 3 pages
    finally:
        os.close(fd)


def test_cachestat_refused_by_seccomp_is_not_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ctypes
    import errno

    calls = []

    def refused(*args: object) -> int:
        calls.append(args)
        ctypes.set_errno(errno.EPERM)
        return -1

    monkeypatch.setattr(chunk_data, "_SYS_CACHESTAT", 451)
    monkeypatch.setattr(chunk_data._libc, "syscall", refused)
    p = tmp_path / "f"
    p.write_bytes(b"x" * 4096)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert chunk_data._all_cached(fd, 0, 4096) is None
        assert chunk_data._all_cached(fd, 0, 4096) is None
        assert len(calls) == 1
    finally:
        os.close(fd)
