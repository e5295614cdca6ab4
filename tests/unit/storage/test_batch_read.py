"""A storage node's batch read: the reads that need the disk go to the I/O pool in groups.

Against a real :class:`FileChunkEngine` whose page-cache tries are made to miss
(``RWF_NOWAIT`` on a test machine would mostly hit), with the I/O pool counted:

* a batch of reads that all need the disk costs one pool job per ``READ_GROUP``
  reads, every read answered with its own bytes, checksum and (per-io) error;
* reads into shared memory (USRBIO) land in the destination view, verified;
* after a streak of misses only one small read in ``_COLD_PROBE`` tries the page
  cache first, and one hit brings every read back to trying it.
"""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fs3.errors import Code
from fs3.proto import storage_pb2
from fs3.storage import operator as O
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine, crc32c

pytestmark = pytest.mark.timeout(30)

CS = 1 << 20
BS = 64 << 10


class _ColdEngine(FileChunkEngine):
    """A file engine whose page-cache tries miss while ``cold`` (counted)."""

    cold = True
    tries = 0

    def read(self, key: Any, offset: int, length: int, *, nowait: bool = False) -> Any:
        if nowait:
            self.tries += 1
            if self.cold:
                raise BlockingIOError
        return super().read(key, offset, length, nowait=nowait)

    def read_into(
        self, key: Any, offset: int, length: int, dest: Any, *, nowait: bool = False
    ) -> Any:
        if nowait:
            self.tries += 1
            if self.cold:
                raise BlockingIOError
        return super().read_into(key, offset, length, dest, nowait=nowait)


class _Target:
    target_id = 7
    chain_id = 1
    chain_version = 1
    serving = True

    def __init__(self, engine: FileChunkEngine) -> None:
        self.engine = engine


class _Targets:
    def __init__(self, t: _Target) -> None:
        self.t = t

    def resolve(self, chain_id: int, target_id: int = 0) -> _Target:
        return self.t


class _ShmPayload:
    """Destinations named by offset into one client buffer (a stand-in for a USRBIO Iov)."""

    def __init__(self, size: int) -> None:
        self.buf = bytearray(size)

    def shm_dest_view(self, ref: Any) -> memoryview | None:
        if ref.WhichOneof("kind") != "shm":
            return None
        return memoryview(self.buf)[ref.shm.offset : ref.shm.offset + ref.shm.length]


class _Rep:
    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.executor = ThreadPoolExecutor(4)
        self.jobs = 0

    def check_version(self, t: Any, v: int) -> None:
        pass

    def note_disk_error(self, fn: Any, e: Any) -> None:
        pass

    async def run_blocking(self, fn: Any, *args: Any) -> Any:
        self.jobs += 1
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


def _setup(
    tmp_path: Path, payload: Any = None
) -> tuple[O.StorageOperator, _ColdEngine, _Rep, bytes]:
    e = _ColdEngine(tmp_path / "t", fsync=False, block_size=BS)
    data = random.Random(3).randbytes(CS)
    e.commit(e.stage_write(ChunkKey(5, 0), 0, data, update_ver=1, chain_ver=1, chunk_size=CS))
    rep = _Rep(payload)
    op = O.StorageOperator(1, _Targets(_Target(e)), rep, None, lambda: None)  # type: ignore[arg-type]
    return op, e, rep, data


def _io(offset: int, length: int, index: int = 0) -> storage_pb2.ReadIO:
    io = storage_pb2.ReadIO(chain_id=1, chain_version=1, offset=offset, length=length, target_id=7)
    io.chunk.inode, io.chunk.index = 5, index
    io.dest.inline = b""
    return io


def test_disk_reads_of_a_batch_go_to_the_pool_in_groups(tmp_path: Path) -> None:
    op, e, rep, data = _setup(tmp_path)
    try:
        offs = [random.Random(4).randrange(CS - 4096) for _ in range(10)]
        ios = [_io(o, 4096) for o in offs]
        ios.insert(3, _io(0, 4096, index=9))  # no such chunk: its own error only
        resp = asyncio.run(op.batch_read(storage_pb2.BatchReadRequest(ios=ios)))
        assert rep.jobs == -(-len(ios) // O.READ_GROUP)  # one pool job per group
        assert len(resp.results) == len(ios)
        assert resp.results[3].error.code == Code.CHUNK_NOT_FOUND
        got = [r for k, r in enumerate(resp.results) if k != 3]
        for o, r in zip(offs, got, strict=True):
            assert not r.error.code
            assert r.data == data[o : o + 4096] and r.checksum == crc32c(r.data)
    finally:
        e.close()
        rep.executor.shutdown()


def test_large_disk_reads_go_one_per_job_so_the_disk_sees_them_together(tmp_path: Path) -> None:
    """A job's reads run one after another: grouping MiB-sized reads would cut the
    disk's queue depth, so each large read is a job of its own (small ones still
    share jobs)."""
    op, e, rep, data = _setup(tmp_path)
    try:
        big = O.INLINE_READ_MAX * 2
        ios = [_io(k * big, big) for k in range(3)] + [_io(k * 4096, 4096) for k in range(5)]
        resp = asyncio.run(op.batch_read(storage_pb2.BatchReadRequest(ios=ios)))
        assert rep.jobs == 3 + -(-5 // O.READ_GROUP)
        for io, r in zip(ios, resp.results, strict=True):
            assert not r.error.code
            assert r.data == data[io.offset : io.offset + io.length]
    finally:
        e.close()
        rep.executor.shutdown()


def test_shared_memory_destinations_are_read_in_place(tmp_path: Path) -> None:
    payload = _ShmPayload(8 * 4096)
    op, e, rep, data = _setup(tmp_path, payload)
    try:
        offs = [k * 70_000 for k in range(8)]
        ios = []
        for k, o in enumerate(offs):
            io = _io(o, 4096)
            io.dest.shm.offset, io.dest.shm.length = k * 4096, 4096
            ios.append(io)
        resp = asyncio.run(op.batch_read(storage_pb2.BatchReadRequest(ios=ios)))
        assert rep.jobs == -(-len(ios) // O.READ_GROUP)
        for k, (o, r) in enumerate(zip(offs, resp.results, strict=True)):
            assert not r.error.code and r.length == 4096 and not r.data
            assert payload.buf[k * 4096 : (k + 1) * 4096] == data[o : o + 4096]
            assert r.checksum == crc32c(data[o : o + 4096])
    finally:
        e.close()
        rep.executor.shutdown()


def test_page_cache_tries_back_off_after_misses_and_resume_on_a_hit(tmp_path: Path) -> None:
    op, e, rep, data = _setup(tmp_path)
    try:

        def one() -> storage_pb2.ReadResult:
            resp = asyncio.run(op.batch_read(storage_pb2.BatchReadRequest(ios=[_io(4096, 4096)])))
            assert resp.results[0].data == data[4096:8192]
            return resp.results[0]

        for _ in range(O._COLD_STREAK):
            one()
        assert e.tries == O._COLD_STREAK  # every read tried the page cache and missed
        for _ in range(2 * O._COLD_PROBE):
            one()
        assert e.tries == O._COLD_STREAK + 2  # then one in _COLD_PROBE
        e.cold = False
        jobs = rep.jobs
        for _ in range(O._COLD_PROBE):
            one()  # the next probe hits ...
        before = e.tries
        for _ in range(5):
            one()
        assert e.tries == before + 5  # ... and every read tries the page cache again
        assert rep.jobs < jobs + O._COLD_PROBE  # hits need no pool job
    finally:
        e.close()
        rep.executor.shutdown()
