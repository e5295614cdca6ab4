"""ReadBatcher: reads submitted in one event-loop turn go to a storage node as one BatchRead."""

from __future__ import annotations

import asyncio

import pytest

from fs3.client.storage_client import ReadBatcher
from fs3.errors import Code, FsError
from fs3.proto import storage_pb2


def _io(i: int) -> storage_pb2.ReadIO:
    return storage_pb2.ReadIO(chain_id=1, offset=i, length=4096)


class FakeNode:
    """Answers each io with its offset as the length, after a loop turn; can fail a call."""

    def __init__(self, fail: FsError | None = None, short: bool = False) -> None:
        self.calls: list[tuple[list[int], float]] = []
        self.fail = fail
        self.short = short

    async def send(
        self,
        ios: list[storage_pb2.ReadIO],
        timeout_s: float,
        dests: list[memoryview | None] | None = None,
    ) -> storage_pb2.BatchReadResponse:
        self.calls.append(([io.offset for io in ios], timeout_s))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        results = [storage_pb2.ReadResult(length=io.offset) for io in ios]
        return storage_pb2.BatchReadResponse(results=results[:-1] if self.short else results)


@pytest.mark.timeout(10)
def test_same_turn_reads_share_one_rpc_and_keep_their_results() -> None:
    async def go() -> None:
        node = FakeNode()
        b = ReadBatcher(node.send, max_ios=4)
        futs = [b.submit(_io(i), timeout_s=1.0 + i) for i in range(10)]
        res = await asyncio.gather(*futs)
        assert [r.length for r in res] == list(range(10))
        assert [c[0] for c in node.calls] == [
            [0, 1, 2, 3],
            [4, 5, 6, 7],
            [8, 9],
        ]  # split at max_ios
        assert [c[1] for c in node.calls] == [4.0, 8.0, 10.0]  # the longest timeout of each batch
        assert b.stats == {"rpcs": 3, "ios": 10}
        # a read in a later turn is a new batch
        r = await b.submit(_io(42), timeout_s=1.0)
        assert r.length == 42 and node.calls[-1][0] == [42]

    asyncio.run(go())


@pytest.mark.timeout(10)
def test_rpc_failure_fails_every_read_of_the_batch_with_its_own_error() -> None:
    async def go() -> None:
        node = FakeNode(fail=FsError(Code.UNAVAILABLE, "node down", retryable=True))
        b = ReadBatcher(node.send)
        futs = [b.submit(_io(i), timeout_s=1.0) for i in range(3)]
        errs = await asyncio.gather(*futs, return_exceptions=True)
        assert all(
            isinstance(e, FsError) and e.code == Code.UNAVAILABLE and e.retryable for e in errs
        )
        assert len({id(e) for e in errs}) == 3
        short = ReadBatcher(FakeNode(short=True).send)
        with pytest.raises(FsError) as ei:
            await asyncio.gather(short.submit(_io(1), 1.0), short.submit(_io(2), 1.0))
        assert ei.value.code == Code.INTERNAL

    asyncio.run(go())


@pytest.mark.timeout(10)
def test_cancelled_reader_does_not_disturb_the_others() -> None:
    async def go() -> None:
        node = FakeNode()
        b = ReadBatcher(node.send)
        f1, f2 = b.submit(_io(1), 1.0), b.submit(_io(2), 1.0)
        f1.cancel()
        assert (await f2).length == 2
        assert node.calls[0][0] == [2]  # the cancelled read was not sent

    asyncio.run(go())


@pytest.mark.timeout(10)
def test_batches_are_cut_by_bytes_too() -> None:
    """A batch asks for at most max_bytes (its answer's payload stays under the frame limit)."""

    async def go() -> None:
        node = FakeNode()
        b = ReadBatcher(node.send, max_bytes=100)
        futs = [b.submit(storage_pb2.ReadIO(offset=i, length=40), 1.0) for i in range(5)]
        await asyncio.gather(*futs)
        assert [offs for offs, _ in node.calls] == [[0, 1], [2, 3], [4]]

    asyncio.run(go())


def test_scatter_lays_the_payload_over_each_reads_buffer() -> None:
    from fs3.transport import frame_ref
    from fs3.transport.base import batch_read_scatter as _scatter

    ios = [storage_pb2.ReadIO(length=8, dest=frame_ref(8)) for _ in range(3)]
    dests = [memoryview(bytearray(8)) for _ in range(3)]
    resp = storage_pb2.BatchReadResponse()
    resp.results.add().length = 8
    resp.results.add().error.code = 5  # failed io: no bytes in the payload
    resp.results.add().length = 3  # short chunk
    laid = [False]
    views = _scatter(ios, dests, laid)(resp.SerializeToString(), 11)
    assert views is not None and [len(v) for v in views] == [8, 3] and laid[0]
    assert views[1].obj is dests[2].obj  # the caller's own buffer, not a copy
    laid = [False]
    assert _scatter(ios, dests, laid)(resp.SerializeToString(), 12) is None and not laid[0]
    resp.results[2].length = 9  # more than the destination holds
    assert _scatter(ios, dests, [False])(resp.SerializeToString(), 17) is None
