"""Contract of ChunkEngine, run over every implementation (and fsync on/off).

What every engine must do: COW staging (the committed copy stays readable until
commit), one atomic commit, correct content and checksums for every update
kind, verified reads, clean refusal of bad input with nothing changed, and
recovery (committed state survives reopening, orphans are swept).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fs3.errors import Code, FsError
from fs3.storage.chunk_engine import ChunkEngine, ChunkKey, FileChunkEngine, crc32c

pytestmark = pytest.mark.timeout(30)

CS = 1 << 20
K = ChunkKey(0x0100_0000_0000_0042, 3)

Factory = Callable[[Path], ChunkEngine]

FACTORIES: dict[str, Factory] = {
    "file-fsync": lambda p: FileChunkEngine(p, fsync=True, block_size=4096),
    "file-nofsync": lambda p: FileChunkEngine(p, fsync=False),
}


@pytest.fixture(params=sorted(FACTORIES))
def factory(request: pytest.FixtureRequest) -> Factory:
    return FACTORIES[request.param]


@pytest.fixture
def engine(factory: Factory, tmp_path: Path) -> Iterator[ChunkEngine]:
    e = factory(tmp_path / "t")
    yield e
    e.close()


def write(
    e: ChunkEngine, key: ChunkKey, off: int, data: bytes, ver: int, chain_ver: int = 1
) -> None:
    p = e.stage_write(key, off, data, update_ver=ver, chain_ver=chain_ver, chunk_size=CS)
    e.commit(p)


def content(e: ChunkEngine, key: ChunkKey) -> bytes:
    meta, data = e.read(key, 0, CS)
    assert len(data) == meta.length
    assert crc32c(data) == meta.checksum
    return bytes(data)


def test_missing_chunk_is_not_found(engine: ChunkEngine) -> None:
    assert engine.get(K) is None
    with pytest.raises(FsError) as ei:
        engine.read(K, 0, 10)
    assert ei.value.code == Code.CHUNK_NOT_FOUND


def test_write_read_versions(engine: ChunkEngine) -> None:
    write(engine, K, 0, b"a" * 5000, 1)
    m = engine.get(K)
    assert m is not None and (m.commit_ver, m.update_ver, m.length, m.chain_ver) == (1, 1, 5000, 1)
    assert content(engine, K) == b"a" * 5000
    # partial reads, short past the end, empty past the end
    assert engine.read(K, 10, 5)[1] == b"aaaaa"
    assert len(engine.read(K, 4990, 100)[1]) == 10
    assert engine.read(K, 6000, 100)[1] == b""


def test_update_kinds_match_a_model(engine: ChunkEngine) -> None:
    """Random writes/truncates/extends: content and checksum always equal a bytearray model."""
    rng = random.Random(7)
    model = bytearray()
    ver = 0
    for _ in range(120):
        ver += 1
        op = rng.random()
        if op < 0.6:
            off = rng.choice([0, len(model), rng.randrange(0, 70000)])
            data = rng.randbytes(rng.randrange(1, 20000))
            off = min(off, CS - len(data))
            p = engine.stage_write(K, off, data, update_ver=ver, chain_ver=1, chunk_size=CS)
            if off > len(model):
                model.extend(bytes(off - len(model)))
            model[off : off + len(data)] = data
        elif op < 0.8:
            n = rng.randrange(0, len(model) + 1)
            p = engine.stage_truncate(
                K, n, update_ver=ver, chain_ver=1, chunk_size=CS, only_extend=False
            )
            del model[n:]
        else:
            n = rng.randrange(0, 90000)
            p = engine.stage_truncate(
                K, n, update_ver=ver, chain_ver=1, chunk_size=CS, only_extend=True
            )
            if n > len(model):
                model.extend(bytes(n - len(model)))
        engine.commit(p)
        assert content(engine, K) == bytes(model), f"after op {ver}"
        m = engine.get(K)
        assert m is not None and m.commit_ver == ver
    # random partial reads verify blocks
    for _ in range(50):
        off = rng.randrange(0, len(model) + 10)
        n = rng.randrange(0, 30000)
        assert engine.read(K, off, n)[1] == bytes(model[off : off + n])


def test_committed_copy_readable_while_pending(engine: ChunkEngine) -> None:
    write(engine, K, 0, b"old!" * 1000, 1)
    p = engine.stage_write(K, 100, b"NEW" * 100, update_ver=2, chain_ver=1, chunk_size=CS)
    m = engine.get(K)
    assert m is not None and m.commit_ver == 1 and m.update_ver == 2 and m.uncommitted
    assert content(engine, K) == b"old!" * 1000
    assert engine.read_pending_full(K)[100:103] == b"NEW"
    engine.commit(p)
    assert content(engine, K)[100:103] == b"NEW"


def test_append_in_place_keeps_committed_view(engine: ChunkEngine) -> None:
    write(engine, K, 0, b"x" * 100, 1)
    p = engine.stage_write(K, 100, b"y" * 100, update_ver=2, chain_ver=1, chunk_size=CS)
    assert content(engine, K) == b"x" * 100
    engine.abort(K)
    assert content(engine, K) == b"x" * 100
    p = engine.stage_write(K, 100, b"z" * 50, update_ver=2, chain_ver=1, chunk_size=CS)
    engine.commit(p)
    assert content(engine, K) == b"x" * 100 + b"z" * 50


def test_abort_drops_pending(engine: ChunkEngine) -> None:
    write(engine, K, 0, b"keep", 1)
    engine.stage_write(K, 0, b"drop-me-please", update_ver=2, chain_ver=1, chunk_size=CS)
    engine.abort(K)
    assert engine.pending(K) is None
    m = engine.get(K)
    assert m is not None and m.update_ver == 1
    assert content(engine, K) == b"keep"


def test_remove(engine: ChunkEngine) -> None:
    write(engine, K, 0, b"data", 1)
    p = engine.stage_remove(K, update_ver=2, chain_ver=1)
    assert content(engine, K) == b"data"  # still readable until commit
    assert engine.commit(p) is None
    assert engine.get(K) is None
    assert engine.list() == []


def test_replace_all(engine: ChunkEngine) -> None:
    write(engine, K, 0, b"long content here", 1)
    p = engine.stage_write(
        K, 0, b"short", update_ver=5, chain_ver=3, chunk_size=CS, replace_all=True
    )
    m = engine.commit(p)
    assert m is not None and (m.commit_ver, m.chain_ver, m.length) == (5, 3, 5)
    assert content(engine, K) == b"short"


def test_bad_input_changes_nothing(engine: ChunkEngine) -> None:
    write(engine, K, 0, b"v1", 1)
    for kw in (
        {"offset": CS - 1, "data": b"ab", "chunk_size": CS},
        {"offset": -1, "data": b"ab", "chunk_size": CS},
        {"offset": 0, "data": b"ab", "chunk_size": 0},
        {"offset": 0, "data": b"ab", "chunk_size": 1 << 30},
    ):
        with pytest.raises(FsError) as ei:
            engine.stage_write(
                K, kw["offset"], kw["data"], update_ver=2, chain_ver=1, chunk_size=kw["chunk_size"]
            )
        assert ei.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(FsError):
        engine.stage_truncate(
            K, CS + 1, update_ver=2, chain_ver=1, chunk_size=CS, only_extend=False
        )
    assert engine.pending(K) is None
    assert content(engine, K) == b"v1"


def test_list_and_ranges(engine: ChunkEngine) -> None:
    for ino in (5, 6):
        for idx in (3, 0, 7):
            write(engine, ChunkKey(ino, idx), 0, bytes([idx]) * (idx + 1), 1)
    all_ = engine.list()
    assert [m.key for m in all_] == sorted(m.key for m in all_)
    assert [m.key.index for m in engine.list(6)] == [0, 3, 7]
    assert [m.key.index for m in engine.list(6, 1, 7)] == [3]
    sp = engine.space()
    assert sp.chunk_count == 6 and sp.used_bytes == 2 * (1 + 4 + 8)
    assert sp.capacity_bytes > 0


def test_reopen_keeps_committed_and_sweeps_orphans(factory: Factory, tmp_path: Path) -> None:
    e = factory(tmp_path / "t")
    write(e, K, 0, b"committed", 1)
    e.stage_write(K, 0, b"pending-lost", update_ver=2, chain_ver=1, chunk_size=CS)
    k2 = ChunkKey(9, 9)
    e.stage_write(k2, 0, b"never committed", update_ver=1, chain_ver=1, chunk_size=CS)
    # simulate a crash: drop the object without abort/close of pending state
    e._db.close()  # type: ignore[attr-defined]
    e2 = factory(tmp_path / "t")
    try:
        assert content(e2, K) == b"committed"
        assert e2.get(k2) is None
        files = [f for _, _, fs in os.walk(tmp_path / "t" / "data") for f in fs]
        assert len(files) == 1  # only the committed version's file survives
    finally:
        e2.close()


def test_corruption_detected(engine: ChunkEngine, tmp_path: Path) -> None:
    write(engine, K, 0, os.urandom(200_000), 1)
    m = engine.get(K)
    assert m is not None and isinstance(engine, FileChunkEngine)
    path = engine.data_dir / m.file
    with open(path, "r+b") as f:
        f.seek(150_000)
        b = f.read(1)
        f.seek(150_000)
        f.write(bytes([b[0] ^ 0xFF]))
    assert len(engine.read(K, 0, 4096)[1]) == 4096  # untouched block still readable
    with pytest.raises(FsError) as ei:
        engine.read(K, 149_000, 4096)
    assert ei.value.code == Code.CHECKSUM_MISMATCH
    # installing a good copy repairs it
    good = os.urandom(1000)
    from fs3.storage.chunk_engine import ChunkMeta

    engine.install(ChunkMeta(K, 1, 1, len(good), crc32c(good)), good)
    assert content(engine, K) == good


def test_nowait_reads_come_from_the_page_cache_or_refuse(tmp_path: Path) -> None:
    """``nowait`` (the storage event loop's small reads) never waits for the disk."""
    e = FileChunkEngine(tmp_path / "t", fsync=True, block_size=4096)
    try:
        data = random.Random(7).randbytes(64 << 10)
        write(e, K, 0, data, 1)
        meta = e.get(K)
        assert meta is not None
        # just written: cached, so served at once and verified like any read
        assert e.read(K, 4096, 8192, nowait=True)[1] == data[4096 : 4096 + 8192]
        dest = memoryview(bytearray(4096))
        got = e.read_into(K, 8192, 4096, dest, nowait=True)
        assert got is not None and bytes(dest) == data[8192:12288]
        # evicted (clean pages after the fsync): the disk is needed, so it refuses rather
        # than wait. RWF_NOWAIT promises no wait, not a refusal: the refused read starts
        # the kernel's readahead, which a fast disk may finish before the page is looked
        # at again, and then the read is served (verified, so the bytes must be right).
        fd = os.open(e.data_dir / meta.file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        try:
            got_bytes = e.read(K, 16384, 4096, nowait=True)[1]
        except BlockingIOError:
            pass
        else:
            assert got_bytes == data[16384:20480]
        try:
            n = e.read_into(K, 20480, 4096, dest, nowait=True)
        except BlockingIOError:
            pass
        else:
            assert n is not None and bytes(dest) == data[20480:24576]
        assert e.read(K, 16384, 4096)[1] == data[16384:20480]  # without nowait: from the disk
    finally:
        e.close()
