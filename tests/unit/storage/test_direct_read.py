"""Large reads of cold chunks into page-aligned memory go to the disk with O_DIRECT.

(fs3/storage/chunk_data.py, ChunkDataStore._read_blocks.) The bytes must be
exactly those a buffered read returns, cached chunks must still be served
from the page cache, and a corrupted file must still fail its checksum.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random
from pathlib import Path

import pytest

from fs3.errors import Code, FsError
from fs3.storage import chunk_data
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine
from tests.unit.storage.test_write_path import _has_o_direct

pytestmark = pytest.mark.timeout(30)

CS = 1 << 20
BS = 64 << 10


def _evict(path: str) -> None:
    """Drop the file's clean pages from the page cache (as after a cache drop)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _committed(tmp_path: Path, seed: int, k: ChunkKey) -> tuple[FileChunkEngine, mmap.mmap, str]:
    """An engine holding one full chunk ``k`` of random bytes (written direct), evicted."""
    if not _has_o_direct(tmp_path):
        pytest.skip("no O_DIRECT on this file system")
    e = FileChunkEngine(tmp_path / "t", block_size=BS, direct_write=True)
    src = mmap.mmap(-1, CS)
    src[:] = random.Random(seed).randbytes(CS)
    e.commit(e.stage_write(k, 0, memoryview(src), update_ver=1, chain_ver=1, chunk_size=CS))
    meta = e.get(k)
    assert meta is not None
    path = e.data.path(meta.file)
    _evict(path)
    return e, src, path


def test_cold_aligned_read_is_direct_and_exact(tmp_path: Path) -> None:
    k = ChunkKey(9, 0)
    e, src, path = _committed(tmp_path, 11, k)
    dst = mmap.mmap(-1, 2 * CS)  # page aligned, like a client's registered region
    try:
        view = memoryview(dst)
        assert e.read_into(k, 0, CS, view[:CS])[1] == CS
        assert e.data.direct_reads == 1
        assert dst[:CS] == src[:]
        # a range inside the chunk on page and block boundaries: direct too
        _evict(path)
        assert e.read_into(k, 4 * BS, 8 * BS, view[CS : CS + 8 * BS])[1] == 8 * BS
        assert e.data.direct_reads == 2
        assert dst[CS : CS + 8 * BS] == src[4 * BS : 12 * BS]
        # memory not on a page: buffered, same bytes
        _evict(path)
        odd = bytearray(CS + 1)
        assert e.read_into(k, 0, CS, memoryview(odd)[1:])[1] == CS
        assert e.data.direct_reads == 2 and odd[1:] == src[:]
        # small reads never go direct
        _evict(path)
        assert e.read_into(k, 0, BS, view[:BS])[1] == BS
        assert e.data.direct_reads == 2
        # read again (not cached: the direct reads filled no page): the same bytes
        dst[:CS] = bytes(CS)
        assert e.read_into(k, 0, CS, view[:CS])[1] == CS
        assert dst[:CS] == src[:]
        view.release()
    finally:
        src.close()
        e.close()  # dst: unmapped when the views the reads made of it are gone


def test_direct_read_sees_dirty_cached_bytes_and_checks_them(tmp_path: Path) -> None:
    """A page changed in the cache but not yet written back is what an O_DIRECT read
    returns (the kernel writes the range back first): a corruption is still caught."""
    k = ChunkKey(10, 0)
    e, src, path = _committed(tmp_path, 12, k)
    dst = mmap.mmap(-1, CS)
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, b"\xff" * 4096, 3 * BS)  # one dirty page; the rest cold
        finally:
            os.close(fd)
        view = memoryview(dst)
        with pytest.raises(FsError) as ei:
            e.read_into(k, 0, CS, view)
        assert ei.value.code == Code.CHECKSUM_MISMATCH
        assert dst[3 * BS : 3 * BS + 4096] == b"\xff" * 4096
        view.release()
    finally:
        src.close()
        e.close()  # dst: unmapped when the views the reads made of it are gone


def _resident_pages(path: str) -> int:
    """Pages of ``path`` in the page cache, by ``mincore`` on a mapping of it (an
    independent count: the store asks ``cachestat``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    page = mmap.PAGESIZE
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # writable view: an address
    try:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        vec = (ctypes.c_ubyte * (-(-size // page)))()
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec):
            pytest.skip(f"mincore: errno {ctypes.get_errno()}")
        return sum(v & 1 for v in vec)
    finally:
        m.close()


def test_cold_direct_read_reads_the_disk_once(tmp_path: Path) -> None:
    """A cold large read goes to the disk once, with O_DIRECT: asking whether the range
    is cached must not start readahead of it (a ``RWF_NOWAIT`` read does, and the disk
    then read every cold byte twice). So no page of the chunk is cached after it."""
    k = ChunkKey(11, 0)
    e, src, path = _committed(tmp_path, 13, k)
    dst = mmap.mmap(-1, CS)
    try:
        assert _resident_pages(path) == 0
        view = memoryview(dst)
        assert e.read_into(k, 0, CS, view)[1] == CS
        assert e.data.direct_reads == 1 and dst[:] == src[:]
        assert _resident_pages(path) == 0
        view.release()
    finally:
        src.close()
        e.close()


def test_cached_range_is_copied_from_the_page_cache(tmp_path: Path) -> None:
    """A range the page cache holds whole is served from it (no disk read); one only
    partly cached goes direct and still returns the exact bytes."""
    k = ChunkKey(12, 0)
    e, src, path = _committed(tmp_path, 14, k)
    dst = mmap.mmap(-1, CS)
    try:
        with open(path, "rb") as f:  # half the chunk into the page cache (not readahead's more)
            assert f.read(CS // 2) == src[: CS // 2]
            os.posix_fadvise(f.fileno(), CS // 2, CS // 2, os.POSIX_FADV_DONTNEED)
        assert _resident_pages(path) == CS // 2 // mmap.PAGESIZE
        view = memoryview(dst)
        assert e.read_into(k, 0, CS // 2, view[: CS // 2])[1] == CS // 2
        assert e.data.direct_reads == 0 and dst[: CS // 2] == src[: CS // 2]
        dst[:] = bytes(CS)
        assert e.read_into(k, 0, CS, view)[1] == CS
        assert e.data.direct_reads == 1 and dst[:] == src[:]
        view.release()
    finally:
        src.close()
        e.close()


def test_without_cachestat_the_cache_is_asked_by_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel without ``cachestat``: the page cache is asked with a ``RWF_NOWAIT``
    read, so a cold range still goes direct and a cached one is copied, the same
    bytes either way."""
    monkeypatch.setattr(chunk_data, "_SYS_CACHESTAT", 0)
    k = ChunkKey(13, 0)
    e, src, path = _committed(tmp_path, 15, k)
    dst = mmap.mmap(-1, CS)
    try:
        view = memoryview(dst)
        assert e.read_into(k, 0, CS, view)[1] == CS
        assert e.data.direct_reads == 1 and dst[:] == src[:]
        with open(path, "rb") as f:  # all cached now
            assert f.read() == src[:]
        dst[:] = bytes(CS)
        assert e.read_into(k, 0, CS, view)[1] == CS
        assert e.data.direct_reads == 1 and dst[:] == src[:]
        view.release()
    finally:
        src.close()
        e.close()
