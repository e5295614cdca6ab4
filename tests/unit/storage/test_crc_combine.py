"""A read's answer checksum from the verified block CRCs (fs3/storage/crc_combine.py).

The combined CRC must equal a pass over the bytes for every block size, start
block and tail length; and a storage node answering a read on checksum-block
boundaries must give the same checksum as before without checksumming the bytes
again (counted), while unaligned reads still get a pass.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from fs3.proto import storage_pb2
from fs3.storage import operator as O
from fs3.storage.chunk_data import block_crcs
from fs3.storage.chunk_engine import ChunkKey, crc32c
from fs3.storage.crc_combine import combined_crc
from tests.unit.storage.test_batch_read import _ColdEngine as _Engine
from tests.unit.storage.test_batch_read import _io, _Rep, _ShmPayload, _Target, _Targets

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("bs", [512, 4096, 64 << 10])
def test_combined_equals_a_pass_over_the_bytes(bs: int) -> None:
    rnd = random.Random(bs)
    for _ in range(40):
        n = rnd.randrange(1, 20 * bs)
        data = rnd.randbytes(n)
        crcs = block_crcs(data, bs)
        nblocks = -(-n // bs)
        first = rnd.randrange(nblocks)
        count = rnd.randrange(1, nblocks - first + 1)
        last = first + count - 1
        last_len = min(bs, n - last * bs)
        want = crc32c(data[first * bs : last * bs + last_len])
        assert combined_crc(crcs, first, count, bs, last_len) == want


def test_aligned_reads_are_answered_without_a_second_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bs = 64 << 10
    size = 10 * bs + 1000  # a chunk with a short tail block
    payload = _ShmPayload(size)
    e = _Engine(tmp_path / "t", fsync=False, block_size=bs)
    e.cold = False
    data = random.Random(5).randbytes(size)
    e.commit(e.stage_write(ChunkKey(5, 0), 0, data, update_ver=1, chain_ver=1, chunk_size=1 << 20))
    rep = _Rep(payload)
    op = O.StorageOperator(1, _Targets(_Target(e)), rep, None, lambda: None)  # type: ignore[arg-type]
    passes: list[int] = []
    real = O.crc32c

    def counted(buf: Any, value: int = 0) -> int:
        passes.append(len(buf))
        return real(buf, value)

    monkeypatch.setattr(O, "crc32c", counted)
    aligned = [(0, 4 * bs), (2 * bs, 3 * bs), (8 * bs, 2 * bs + 1000), (9 * bs, 5 * bs), (bs, bs)]
    unaligned = [(100, 2 * bs), (bs, bs + 7)]
    try:
        for shm in (False, True):
            ios = []
            for off, n in aligned + unaligned:
                io = _io(off, n)
                if shm:
                    io.dest.shm.offset, io.dest.shm.length = 0, size
                ios.append(io)
            for io in ios:  # one at a time: the shm destination is shared
                passes.clear()
                resp = asyncio.run(op.batch_read(storage_pb2.BatchReadRequest(ios=[io])))
                r = resp.results[0]
                end = min(size, io.offset + io.length)
                got = bytes(payload.buf[: end - io.offset]) if shm else r.data
                assert not r.error.code and got == data[io.offset : end]
                assert r.checksum == crc32c(data[io.offset : end])
                if (io.offset, io.length) in aligned:
                    assert passes == []  # the verified blocks' CRCs, combined
                else:
                    assert passes == [end - io.offset]
    finally:
        e.close()
        rep.executor.shutdown()
