"""ReadStream end to end over a real in-process gRPC server.

The server side is the real ``StorageServicer`` + ``StorageOperator.read_stream``;
only ``batch_read`` (the per-batch chunk reading, tested elsewhere) is replaced by
a scripted one so the test controls which request finishes when. The client side
is the real :class:`NodeReadStream` on a real channel of each RPC transport
(grpc.aio and native), both served by the same ``RpcServer``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from fs3.client.storage_client import NodeReadStream
from fs3.errors import Code, FsError, invalid
from fs3.proto import storage_pb2, storage_pb2_grpc
from fs3.rpc.channel import BidiStream, ChannelPool
from fs3.rpc.server import add_servicer, bind, create_server
from fs3.storage.operator import StorageOperator
from fs3.storage.service import StorageServicer

BAD = 666  # chunk index answered with a request-level FsError
BUG = 777  # chunk index whose batch_read raises a non-FsError


class ScriptedOperator(StorageOperator):
    """``read_stream`` as shipped; ``batch_read`` waits on a gate per chunk index."""

    def __init__(self) -> None:  # no targets needed: batch_read is scripted
        self.gates: dict[int, asyncio.Event] = {}
        self.started: list[int] = []
        self.cancelled: list[int] = []

    async def batch_read(
        self, req: storage_pb2.BatchReadRequest, reply: Any = None
    ) -> storage_pb2.BatchReadResponse:
        idx = req.ios[0].chunk.index
        self.started.append(idx)
        try:
            gate = self.gates.get(idx)
            if gate is not None:
                await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(idx)
            raise
        if idx == BAD:
            raise invalid("scripted bad request")
        if idx == BUG:
            raise RuntimeError("scripted bug")
        return storage_pb2.BatchReadResponse(
            results=[storage_pb2.ReadResult(length=io.chunk.index) for io in req.ios]
        )


def _ios(idx: int, n: int = 1) -> list[storage_pb2.ReadIO]:
    return [storage_pb2.ReadIO(chain_id=1, chunk=storage_pb2.ChunkId(inode=5, index=idx))] * n


async def _until(cond: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.005)


TRANSPORTS = pytest.mark.parametrize("transport", ["native", "grpc"])


def _run(
    body: Callable[[ScriptedOperator, Callable[[], NodeReadStream], str], Awaitable[None]],
    transport: str,
) -> None:
    async def go() -> None:
        op = ScriptedOperator()
        server = create_server()
        add_servicer(
            server, storage_pb2_grpc.add_StorageServiceServicer_to_server, StorageServicer(op)
        )
        port = bind(server, "127.0.0.1", 0)
        await server.start()
        address = f"127.0.0.1:{port}"
        pool = ChannelPool(transport)
        stub = storage_pb2_grpc.StorageServiceStub(pool.get(address))  # type: ignore[no-untyped-call]
        streams: list[NodeReadStream] = []

        def open_stream() -> NodeReadStream:
            s = NodeReadStream(lambda: BidiStream(stub.ReadStream, what="test"), address, "cid")
            streams.append(s)
            return s

        try:
            await body(op, open_stream, address)
        finally:
            for s in streams:
                await s.close()
            await pool.close()
            await server.stop(0)
        # Nothing of ours is left running on the loop.
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not [t for t in left if "fs3-read-stream" in t.get_name()]

    asyncio.run(go())


@pytest.mark.timeout(20)
@TRANSPORTS
def test_answers_arrive_out_of_order_by_request_id(transport: str) -> None:
    async def body(
        op: ScriptedOperator, open_stream: Callable[[], NodeReadStream], _a: str
    ) -> None:
        s = open_stream()
        op.gates[1] = asyncio.Event()
        slow = asyncio.ensure_future(s.request(_ios(1, 3), 10))
        await _until(lambda: 1 in op.started, 5, "slow request started")
        fast = await s.request(_ios(2), 10)  # answered while request 1 is still running
        assert [r.length for r in fast.results] == [2]
        assert not slow.done()
        op.gates[1].set()
        assert [r.length for r in (await slow).results] == [1, 1, 1]
        assert not s.dead

    _run(body, transport)


@pytest.mark.timeout(20)
@TRANSPORTS
def test_failed_requests_get_errors_and_the_stream_lives_on(transport: str) -> None:
    async def body(
        op: ScriptedOperator, open_stream: Callable[[], NodeReadStream], _a: str
    ) -> None:
        s = open_stream()
        bad = await s.request(_ios(BAD, 2), 10)
        assert [r.error.code for r in bad.results] == [Code.INVALID_ARGUMENT] * 2
        bug = await s.request(_ios(BUG), 10)
        assert bug.results[0].error.code == Code.INTERNAL
        ok = await s.request(_ios(3), 10)
        assert ok.results[0].length == 3 and not ok.results[0].error.code
        assert not s.dead

    _run(body, transport)


@pytest.mark.timeout(20)
@TRANSPORTS
def test_timeout_is_retryable_and_cancels_the_server_work(transport: str) -> None:
    async def body(
        op: ScriptedOperator, open_stream: Callable[[], NodeReadStream], _a: str
    ) -> None:
        s = open_stream()
        op.gates[4] = asyncio.Event()  # never opened
        with pytest.raises(FsError) as ei:
            await s.request(_ios(4), 0.2)
        assert ei.value.code == Code.TIMEOUT and ei.value.retryable
        await _until(lambda: 4 in op.cancelled, 5, "server task of the timed-out request cancelled")
        assert (await s.request(_ios(5), 10)).results[0].length == 5  # same stream still works
        assert not s.dead

    _run(body, transport)


@pytest.mark.timeout(20)
@TRANSPORTS
def test_client_going_away_cancels_server_tasks_and_fails_pending(transport: str) -> None:
    async def body(
        op: ScriptedOperator, open_stream: Callable[[], NodeReadStream], _a: str
    ) -> None:
        s = open_stream()
        op.gates[6] = asyncio.Event()
        pending = asyncio.ensure_future(s.request(_ios(6), 10))
        await _until(lambda: 6 in op.started, 5, "request started")
        await s.close()
        with pytest.raises(FsError) as ei:
            await pending
        assert ei.value.code == Code.UNAVAILABLE and ei.value.retryable
        assert s.dead
        await _until(lambda: 6 in op.cancelled, 5, "server task cancelled when the client left")
        with pytest.raises(FsError) as ei2:
            await s.request(_ios(7), 1)
        assert ei2.value.retryable

    _run(body, transport)


@pytest.mark.timeout(30)
@TRANSPORTS
def test_server_gone_fails_pending_reads_retryably_and_a_new_stream_works(transport: str) -> None:
    async def go() -> None:
        op = ScriptedOperator()
        server = create_server()
        add_servicer(
            server, storage_pb2_grpc.add_StorageServiceServicer_to_server, StorageServicer(op)
        )
        port = bind(server, "127.0.0.1", 0)
        await server.start()
        address = f"127.0.0.1:{port}"
        pool = ChannelPool(transport)
        stub = storage_pb2_grpc.StorageServiceStub(pool.get(address))  # type: ignore[no-untyped-call]
        died: list[NodeReadStream] = []

        def open_stream() -> NodeReadStream:
            return NodeReadStream(
                lambda: BidiStream(stub.ReadStream, what="test"),
                address,
                "cid",
                on_dead=died.append,
            )

        server2 = None
        s = open_stream()
        try:
            op.gates[8] = asyncio.Event()
            pending = asyncio.ensure_future(s.request(_ios(8), 10))
            await _until(lambda: 8 in op.started, 5, "request started")
            await server.stop(0)  # the node goes away mid-stream
            with pytest.raises(FsError) as ei:
                await pending
            assert ei.value.code == Code.UNAVAILABLE and ei.value.retryable
            await _until(lambda: s.dead, 5, "stream marked dead")
            assert died == [s]
            # The node comes back on the same address: a new stream serves reads.
            op2 = ScriptedOperator()
            server2 = create_server()
            add_servicer(
                server2, storage_pb2_grpc.add_StorageServiceServicer_to_server, StorageServicer(op2)
            )
            assert bind(server2, "127.0.0.1", port) == port
            await server2.start()
            deadline = time.monotonic() + 10
            while True:  # the channel reconnects with backoff; each failure is retryable
                s2 = open_stream()
                try:
                    r = await s2.request(_ios(9), 2)
                    break
                except FsError as e:
                    assert e.retryable
                    await s2.close()
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            assert r.results[0].length == 9
            await s2.close()
        finally:
            await s.close()
            await pool.close()
            if server2 is not None:
                await server2.stop(0)

    asyncio.run(go())
