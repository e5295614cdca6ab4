"""Storage read bounds: request sizes are refused before any read, and a ReadStream
whose client stops reading stops pulling requests (no queue growing without bound)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fs3.errors import Code, FsError
from fs3.limits import MAX_CHUNK_SIZE, MAX_READ_BATCH_BYTES, MAX_READ_IOS
from fs3.proto import storage_pb2
from fs3.storage import operator as O

pytestmark = pytest.mark.timeout(30)


def req(n: int, length: int, rid: int = 0) -> storage_pb2.BatchReadRequest:
    return storage_pb2.BatchReadRequest(
        ios=[storage_pb2.ReadIO(chain_id=1, length=length) for _ in range(n)], request_id=rid
    )


@pytest.mark.parametrize(
    ("n", "length", "ok"),
    [
        (MAX_READ_IOS, 1, True),
        (MAX_READ_IOS + 1, 1, False),
        (1, MAX_CHUNK_SIZE, True),
        (1, MAX_CHUNK_SIZE + 1, False),
        (1, 0xFFFFFFFF, False),
        (2, MAX_READ_BATCH_BYTES // 2, True),
        (2, MAX_READ_BATCH_BYTES // 2 + 1, False),
        (1024, 64 << 20, False),  # the 1024 x 64 MiB batch: 64 GiB asked
    ],
)
def test_read_request_limits(n: int, length: int, ok: bool) -> None:
    if ok:
        assert O.read_bytes_asked(req(n, length)) == n * length
        return
    with pytest.raises(FsError) as e:
        O.read_bytes_asked(req(n, length))
    assert e.value.code == Code.INVALID_ARGUMENT


def test_oversized_batch_read_is_refused_before_reading() -> None:
    op = O.StorageOperator(1, None, None, None, lambda: None)  # type: ignore[arg-type]
    touched: list[Any] = []
    op._read_start = lambda *a: touched.append(a)  # type: ignore[method-assign,assignment,return-value]
    with pytest.raises(FsError):
        asyncio.run(op.batch_read(req(1024, 64 << 20)))
    assert touched == []


def test_byte_budget_waits_in_order_and_survives_cancellation() -> None:
    async def main() -> None:
        b = O.ByteBudget(100)
        assert await b.acquire(60) == 60
        t1 = asyncio.create_task(b.acquire(50))
        t2 = asyncio.create_task(b.acquire(10))
        await asyncio.sleep(0)
        assert not t1.done() and not t2.done()  # FIFO: the small one waits behind the big one
        t1.cancel()
        await asyncio.gather(t1, return_exceptions=True)
        assert await t2 == 10 and b.free == 30
        big = asyncio.create_task(b.acquire(10_000))  # more than the total: waits for all of it
        await asyncio.sleep(0)
        assert not big.done()
        b.release(60)
        b.release(10)
        assert await big == 100 and b.free == 0
        b.release(100)
        assert b.free == b.total

    asyncio.run(main())


def _stream_op(delay: bool = False) -> O.StorageOperator:
    op = O.StorageOperator(1, None, None, None, lambda: None)  # type: ignore[arg-type]

    async def fake_batch_read(
        r: storage_pb2.BatchReadRequest, reply: Any = None
    ) -> storage_pb2.BatchReadResponse:
        return storage_pb2.BatchReadResponse(
            results=[storage_pb2.ReadResult(length=io.length) for io in r.ios]
        )

    op.batch_read = fake_batch_read  # type: ignore[method-assign,assignment]
    return op


@pytest.mark.parametrize(
    ("max_inflight", "length", "in_flight_bound"),
    [
        (4, 1, 4),  # bounded by the request count
        (64, MAX_READ_BATCH_BYTES, O.READ_STREAM_MAX_BYTES // MAX_READ_BATCH_BYTES),  # by bytes
    ],
)
def test_read_stream_stops_pulling_when_the_client_stops_reading(
    max_inflight: int, length: int, in_flight_bound: int
) -> None:
    pulled = 0

    async def requests() -> AsyncIterator[storage_pb2.BatchReadRequest]:
        nonlocal pulled
        rid = 0
        while True:  # an endless stream of requests
            rid += 1
            pulled += 1
            yield req(1, length, rid)

    async def main() -> int:
        gen = _stream_op().read_stream(requests(), max_inflight=max_inflight)
        await gen.__anext__()  # take one answer, then stop reading
        for _ in range(2000):  # let every task run as far as it can
            await asyncio.sleep(0)
        seen = pulled
        await gen.aclose()
        return seen

    seen = asyncio.run(main())
    # in flight or answered-unsent, plus the one taken, plus the one the pump holds
    assert seen <= in_flight_bound + 2, seen


@pytest.mark.parametrize("method", ["truncate_chunks", "remove_chunks", "query_last_chunk"])
def test_op_count_limit(method: str) -> None:
    from fs3.limits import MAX_CHUNK_OPS

    op = O.StorageOperator(1, None, None, None, lambda: None)  # type: ignore[arg-type]
    cls = {
        "truncate_chunks": (storage_pb2.TruncateChunksRequest, storage_pb2.TruncateChunkOp),
        "remove_chunks": (storage_pb2.RemoveChunksRequest, storage_pb2.RemoveChunksOp),
        "query_last_chunk": (storage_pb2.QueryLastChunkRequest, storage_pb2.QueryLastChunkOp),
    }[method]
    r = cls[0](ops=[cls[1]() for _ in range(MAX_CHUNK_OPS + 1)])
    with pytest.raises(FsError) as e:
        asyncio.run(getattr(op, method)(r))
    assert e.value.code == Code.INVALID_ARGUMENT


def test_node_read_budget_makes_concurrent_reads_wait() -> None:
    """Each request is within limits, but together they may not hold more than the budget."""
    op = O.StorageOperator(
        1, None, None, None, lambda: None, read_buffer_bytes=MAX_READ_BATCH_BYTES
    )  # type: ignore[arg-type]
    running = 0
    peak = 0

    async def slow(r: Any, reply: Any = None) -> storage_pb2.BatchReadResponse:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        for _ in range(5):
            await asyncio.sleep(0)
        running -= 1
        return storage_pb2.BatchReadResponse()

    op._batch_read = slow  # type: ignore[method-assign]

    async def main() -> None:
        await asyncio.gather(*(op.batch_read(req(1, MAX_READ_BATCH_BYTES)) for _ in range(4)))
        await asyncio.gather(*(op.batch_read(req(1, 1 << 20)) for _ in range(8)))

    asyncio.run(main())
    assert peak == 8  # the small ones ran together; the large ones one at a time (checked below)
    peak = 0

    async def big() -> None:
        await asyncio.gather(*(op.batch_read(req(1, MAX_READ_BATCH_BYTES)) for _ in range(4)))

    asyncio.run(big())
    assert peak == 1
