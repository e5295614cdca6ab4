"""Write-path latency pieces of the chunk engine: prepare (durable, unpublished) and O_DIRECT.

``prepare`` makes an update's data and metadata row durable while readers keep
the committed version; ``commit`` afterwards is memory-only. These tests pin the
crash semantics that makes that safe (a prepared update survives a crash like a
committed one; an aborted one leaves the old version on disk) and that direct
writes store exactly the bytes written.
"""

from __future__ import annotations

import mmap
import os
import random
from pathlib import Path

import pytest

from fs3.errors import Code, FsError
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine, crc32c

pytestmark = pytest.mark.timeout(30)

CS = 1 << 20
BS = 64 << 10


def _engine(tmp_path: Path, **kw: object) -> FileChunkEngine:
    return FileChunkEngine(tmp_path / "t", block_size=BS, **kw)  # type: ignore[arg-type]


def _crash(e: FileChunkEngine) -> None:
    """Drop the engine without close(): pending state is lost, the disk keeps what it has."""
    e._db.close()


def test_prepare_is_durable_but_invisible_until_commit(tmp_path: Path) -> None:
    e = _engine(tmp_path)
    k = ChunkKey(1, 0)
    v1, v2 = b"a" * 5000, b"b" * 7000
    e.commit(e.stage_write(k, 0, v1, update_ver=1, chain_ver=3, chunk_size=CS))
    p = e.stage_write(k, 0, v2, update_ver=2, chain_ver=3, chunk_size=CS, sync=False)
    e.prepare(p, 3)
    assert p.prepared and p.synced
    assert e.is_published_cheaply(p, 3) and not e.is_published_cheaply(p, 4)
    meta = e.get(k)
    assert meta is not None and meta.commit_ver == 1 and meta.update_ver == 2
    assert e.read(k, 0, CS)[1] == v1  # readers keep the committed version
    new, old_files = e.publish_prepared(p, 3)
    assert new is not None and new.commit_ver == 2 and new.checksum == crc32c(v2)
    assert old_files == [meta.file]
    assert e.read(k, 0, CS)[1] == v2
    e.drop_files(old_files)
    assert not (e.data_dir / meta.file).exists()
    e.drop_files(old_files)  # already gone: fine
    e.close()


def test_prepared_update_survives_a_crash(tmp_path: Path) -> None:
    e = _engine(tmp_path)
    k = ChunkKey(2, 0)
    e.commit(e.stage_write(k, 0, b"old", update_ver=1, chain_ver=1, chunk_size=CS))
    p = e.stage_write(k, 0, b"new!", update_ver=2, chain_ver=1, chunk_size=CS, sync=False)
    e.prepare(p, 1)
    _crash(e)
    e2 = _engine(tmp_path)
    try:
        meta = e2.get(k)
        # like "committed, then crashed before the predecessor committed": the new version
        assert meta is not None and meta.commit_ver == 2 and not meta.uncommitted
        assert e2.read(k, 0, CS)[1] == b"new!"
    finally:
        e2.close()


@pytest.mark.parametrize("existed", [True, False])
def test_abort_of_a_prepared_update_restores_the_old_row(tmp_path: Path, existed: bool) -> None:
    e = _engine(tmp_path)
    k = ChunkKey(3, 1)
    if existed:
        e.commit(e.stage_write(k, 0, b"x" * 100, update_ver=1, chain_ver=1, chunk_size=CS))
    uv = 2 if existed else 1
    p = e.stage_write(k, 50, b"y" * 100, update_ver=uv, chain_ver=1, chunk_size=CS)
    e.prepare(p, 1)
    e.abort(k)
    assert e.pending(k) is None
    assert not (e.data_dir / p.file).exists()  # its private file is gone, and no row names it
    _crash(e)
    e2 = _engine(tmp_path)
    try:
        meta = e2.get(k)
        if existed:
            assert meta is not None and meta.commit_ver == 1
            assert e2.read(k, 0, CS)[1] == b"x" * 100
        else:
            assert meta is None
    finally:
        e2.close()


def test_restage_replaces_a_prepared_update(tmp_path: Path) -> None:
    """A successor re-staging over a prepared update (a retry) undoes the prepared row."""
    e = _engine(tmp_path)
    k = ChunkKey(4, 0)
    e.commit(e.stage_write(k, 0, b"1" * 10, update_ver=1, chain_ver=1, chunk_size=CS))
    p = e.stage_write(k, 0, b"2" * 10, update_ver=2, chain_ver=1, chunk_size=CS)
    e.prepare(p, 1)
    p2 = e.stage_write(k, 0, b"3" * 10, update_ver=2, chain_ver=1, chunk_size=CS)
    assert not p2.prepared
    meta = e.commit(p2)  # not prepared: the full group commit
    assert meta is not None and e.read(k, 0, CS)[1] == b"3" * 10
    _crash(e)
    e2 = _engine(tmp_path)
    try:
        assert e2.read(k, 0, CS)[1] == b"3" * 10
    finally:
        e2.close()


@pytest.mark.parametrize("prepared", [False, True])
def test_commit_of_a_superseded_stage_is_retryable_not_a_disk_error(
    tmp_path: Path, prepared: bool
) -> None:
    """Regression (found by the power-loss tier): on a syncing target a resync's full-chunk
    write replaced the staged update of a forwarded write; that write's commit then failed
    with INTERNAL/EIO, which the replication layer takes for a disk error, and the whole
    target went offline until restart."""
    e = _engine(tmp_path)
    k = ChunkKey(5, 0)
    e.commit(e.stage_write(k, 0, b"1" * 10, update_ver=1, chain_ver=1, chunk_size=CS))
    p = e.stage_write(k, 0, b"2" * 10, update_ver=2, chain_ver=1, chunk_size=CS)
    if prepared:
        e.prepare(p, 1)
    newer = e.stage_write(
        k, 0, b"3" * 20, update_ver=2, chain_ver=1, chunk_size=CS, replace_all=True
    )
    with pytest.raises(FsError) as ei:
        if prepared:
            e.publish_prepared(p, 1)
        else:
            e.commit(p)
    assert ei.value.code == Code.CHUNK_BUSY and ei.value.retryable, ei.value
    assert e.commit(newer) is not None and e.read(k, 0, CS)[1] == b"3" * 20
    e.close()


def _has_o_direct(d: Path) -> bool:
    try:
        fd = os.open(d / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    os.unlink(d / "probe")
    return True


def test_direct_write_of_aligned_payload(tmp_path: Path) -> None:
    if not _has_o_direct(tmp_path):
        pytest.skip("no O_DIRECT on this file system")
    e = _engine(tmp_path, direct_write=True)
    rng = random.Random(7)
    k = ChunkKey(5, 0)
    m = mmap.mmap(-1, CS)  # page aligned, like a shm region
    try:
        m[:] = rng.randbytes(CS)
        view = memoryview(m)
        p = e.stage_write(k, 0, view[: CS // 2], update_ver=1, chain_ver=1, chunk_size=CS)
        e.commit(p)
        view.release()
        assert e.direct_writes == 1
        assert e.read(k, 0, CS)[1] == bytes(m[: CS // 2])
        # unaligned address (and length): buffered, same result
        data = bytes(m[1 : CS // 2 + 1001])
        e.commit(e.stage_write(k, 0, data, update_ver=2, chain_ver=1, chunk_size=CS))
        assert e.direct_writes == 1
        assert e.read(k, 0, CS)[1] == data
        # a partial overwrite is never direct (copy of the old prefix, then a write)
        e.commit(
            e.stage_write(k, 4096, view2 := m[: 4 * 4096], update_ver=3, chain_ver=1, chunk_size=CS)
        )
        assert e.direct_writes == 1
        assert e.read(k, 0, CS)[1] == data[:4096] + view2 + data[5 * 4096 :]
    finally:
        m.close()
        e.close()
    # without fsync (tests) direct writes are never used
    e2 = FileChunkEngine(tmp_path / "nf", fsync=False, direct_write=True)
    try:
        assert not e2.direct_write
    finally:
        e2.close()
