"""The chunk engine's fast-path pieces: zero-copy verified reads, spare files, deferred sync."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from fs3.errors import Code, FsError
from fs3.storage.chunk_engine import SPARE_BATCH, ChunkKey, FileChunkEngine, crc32c

pytestmark = pytest.mark.timeout(30)

CS = 1 << 20
BS = 64 << 10


def _engine(tmp_path: Path, fsync: bool = True) -> FileChunkEngine:
    return FileChunkEngine(tmp_path / "t", fsync=fsync, block_size=BS)


def test_read_into_matches_read_and_verifies(tmp_path: Path) -> None:
    e = _engine(tmp_path)
    try:
        k = ChunkKey(9, 1)
        data = random.Random(1).randbytes(CS - 1000)  # last block is partial
        e.commit(e.stage_write(k, 0, data, update_ver=1, chain_ver=1, chunk_size=CS))
        dest = memoryview(bytearray(CS))
        for off, n in [(0, CS), (0, BS), (BS, 3 * BS), (15 * BS, CS)]:
            got = e.read_into(k, off, n, dest)
            assert got is not None
            meta, m = got
            want = data[off : off + n]
            assert m == len(want) and bytes(dest[:m]) == want and meta.commit_ver == 1
        # not block aligned: the covering blocks are verified, the range copied out
        for off, n in [(100, 4096), (0, BS + 1), (BS - 10, 20), (CS - 1500, 1000), (5, CS)]:
            got = e.read_into(k, off, n, dest)
            assert got is not None
            want = data[off : off + n]
            assert got[1] == len(want) and bytes(dest[: got[1]]) == want
            assert e.read(k, off, n)[1] == want
        # past the end: nothing
        assert e.read_into(k, CS, 10, dest) == (e.get(k), 0)
        with pytest.raises(FsError) as ei:
            e.read_into(ChunkKey(9, 2), 0, BS, dest)
        assert ei.value.code == Code.CHUNK_NOT_FOUND
        with pytest.raises(FsError) as ei:
            e.read_into(k, 0, CS, dest[:10])
        assert ei.value.code == Code.INVALID_ARGUMENT
        # flip one byte in block 3 on disk: an aligned read covering it fails, others still work
        meta = e.get(k)
        assert meta is not None
        fd = os.open(e.data_dir / meta.file, os.O_RDWR)
        try:
            b = os.pread(fd, 1, 3 * BS + 7)
            os.pwrite(fd, bytes([b[0] ^ 0xFF]), 3 * BS + 7)
        finally:
            os.close(fd)
        with pytest.raises(FsError) as ei:
            e.read_into(k, 0, CS, dest)
        assert ei.value.code == Code.CHECKSUM_MISMATCH
        got = e.read_into(k, 4 * BS, BS, dest)
        assert got is not None and bytes(dest[:BS]) == data[4 * BS : 5 * BS]
        # an unaligned range inside the bad block fails too (its whole block is verified)
        for read in (
            lambda: e.read_into(k, 3 * BS + 4096, 4096, dest),
            lambda: e.read(k, 3 * BS + 4096, 4096),
        ):
            with pytest.raises(FsError) as ei:
                read()
            assert ei.value.code == Code.CHECKSUM_MISMATCH
        got = e.read_into(k, 4 * BS + 100, 4096, dest)
        assert got is not None and bytes(dest[:4096]) == data[4 * BS + 100 : 4 * BS + 4196]
    finally:
        e.close()


def test_spare_files_are_empty_and_swept(tmp_path: Path) -> None:
    e = _engine(tmp_path)
    files = lambda: {str(p.relative_to(e.data_dir)) for p in e.data_dir.rglob("*") if p.is_file()}  # noqa: E731
    n = SPARE_BATCH + 3  # crosses a batch boundary
    for i in range(n):
        e.commit(
            e.stage_write(
                ChunkKey(1, i), 0, b"x" * (i + 1), update_ver=1, chain_ver=1, chunk_size=CS
            )
        )
    committed = {m.file for m in e.list()}
    spares = e.spare_files()
    assert len(committed) == n and not committed & spares
    assert files() == committed | spares
    assert all((e.data_dir / f).stat().st_size == 0 for f in spares)
    # an aborted stage's file goes away; the spare it used is not reused
    e.stage_write(ChunkKey(2, 0), 0, b"abort me", update_ver=1, chain_ver=1, chunk_size=CS)
    e.abort(ChunkKey(2, 0))
    assert files() == committed | e.spare_files()
    e.close()
    assert files() == committed  # close removes unused spares
    # a crash leaves spares behind: the next start deletes them (not named by any row)
    e2 = _engine(tmp_path)
    e2.stage_write(ChunkKey(3, 0), 0, b"never committed", update_ver=1, chain_ver=1, chunk_size=CS)
    left = files()
    e2._db.close()  # simulate a crash: no close(), pending and spares stay on disk
    assert left > committed
    e3 = _engine(tmp_path)
    try:
        assert files() == committed
        for i in range(n):
            assert e3.read(ChunkKey(1, i), 0, CS)[1] == b"x" * (i + 1)
    finally:
        e3.close()


def test_deferred_sync_is_completed_by_commit(tmp_path: Path) -> None:
    e = _engine(tmp_path)
    try:
        k = ChunkKey(4, 0)
        data = os.urandom(3 * BS)
        p = e.stage_write(k, 0, data, update_ver=1, chain_ver=1, chunk_size=CS, sync=False)
        assert not p.synced
        calls: list[str] = []
        real = os.fdatasync

        def spy(fd: int) -> None:
            calls.append("sync")
            real(fd)

        os.fdatasync = spy  # type: ignore[assignment]
        try:
            meta = e.commit(p)  # commit syncs the data before the row is written
        finally:
            os.fdatasync = real  # type: ignore[assignment]
        assert calls == ["sync"] and p.synced
        assert meta is not None and meta.checksum == crc32c(data)
        # an explicit sync first: commit does not sync again
        p2 = e.stage_write(
            k, len(data), b"tail", update_ver=2, chain_ver=1, chunk_size=CS, sync=False
        )
        e.sync_pending(p2)
        assert p2.synced
        e.commit(p2)
        assert e.read(k, 0, CS)[1] == data + b"tail"
        # without fsync there is nothing to wait for
        e_nf = FileChunkEngine(tmp_path / "nf", fsync=False)
        try:
            assert e_nf.stage_write(
                k, 0, b"a", update_ver=1, chain_ver=1, chunk_size=CS, sync=False
            ).synced
        finally:
            e_nf.close()
    finally:
        e.close()
