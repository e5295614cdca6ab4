"""Flow control of the native transport under a slow or stalled peer.

The client cases speak to a scripted raw-frame server (it answers only what a
case tells it to, and can stop reading), the server case to a real
``RpcServer`` through a socket read at a steady, slow rate.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from test_native import Node  # the same scripted server

from fs3.config import RpcSection
from fs3.errors import Code, FsError
from fs3.proto import common_pb2, mgmtd_pb2, mgmtd_pb2_grpc, storage_pb2, storage_pb2_grpc
from fs3.rpc.loop import run
from fs3.rpc.native import endpoints, wire
from fs3.rpc.native.client import ClientConnection, NativeChannel
from fs3.rpc.native.methods import BY_PATH

pytestmark = pytest.mark.timeout(60)

LEADER = BY_PATH["/fs3.v1.MgmtdService/GetLeader"].id
HEARTBEAT = BY_PATH["/fs3.v1.MgmtdService/Heartbeat"].id
WATCH = BY_PATH["/fs3.v1.MgmtdService/WatchRoutingInfo"].id
ROUTING = BY_PATH["/fs3.v1.MgmtdService/GetRoutingInfo"].id

Frame = tuple[int, int, int, int]  # kind, method id, request id, timeout_ms
Script = Callable[[asyncio.StreamWriter, Frame], Awaitable[None]]


class RawPeer:
    """A native server made of raw frames: records every frame, runs ``script``
    on each; ``read=False``: accepts connections and never reads from them."""

    def __init__(self, script: Script | None = None, *, read: bool = True) -> None:
        self.script = script
        self.read = read
        self.frames: list[Frame] = []
        self.arrived = asyncio.Condition()
        self.address = ""
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RawPeer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for w in self._writers:
            w.transport.abort()
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        if not self.read:
            return
        with_eof = (asyncio.IncompleteReadError, ConnectionError)
        try:
            await reader.readexactly(len(wire.PREFACE))
            while True:
                head = await reader.readexactly(wire.HEADER_SIZE)
                kind, _f, _r, mid, rid, tmo, blen, plen = wire.HEADER.unpack(head)
                await reader.readexactly(blen + plen)
                async with self.arrived:
                    self.frames.append((kind, mid, rid, tmo))
                    self.arrived.notify_all()
                if self.script is not None:
                    await self.script(writer, (kind, mid, rid, tmo))
        except with_eof:
            pass

    async def wait_frames(self, n: int) -> None:
        async with self.arrived:
            await self.arrived.wait_for(lambda: len(self.frames) >= n)


def _channel(peer: RawPeer, **kw: Any) -> NativeChannel:
    return NativeChannel(peer.address, prefer_uds=False, **kw)


async def _until(cond: Callable[[], bool], timeout: float = 10) -> None:  # noqa: ASYNC109
    """Flags set inside the transport's callbacks have no event to wait on: poll them."""
    async with asyncio.timeout(timeout):
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


def _conn(ch: NativeChannel) -> ClientConnection:
    assert ch._conn is not None
    return ch._conn


# -- 1. the deadline runs from the call's start -------------------------------------


def test_a_call_waiting_for_a_slot_times_out_and_sends_what_remains() -> None:
    async def main() -> None:
        async with RawPeer() as peer:  # never answers a call
            ch = _channel(peer, max_inflight_calls=1)
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(ch)
            req = mgmtd_pb2.HeartbeatRequest(node_id=1)
            await ch.connection()
            # the only slot is held by a call without a deadline: the queued call
            # fails on its own deadline
            holder = asyncio.ensure_future(stub.Heartbeat(req))
            await peer.wait_frames(1)
            with pytest.raises(FsError) as ei:
                await asyncio.wait_for(stub.Heartbeat(req, timeout=0.2), 10)
            assert ei.value.code == Code.TIMEOUT
            holder.cancel()
            await peer.wait_frames(2)  # its CANCEL; the timed-out call never went out
            assert [f[0] for f in peer.frames] == [wire.CALL, wire.CANCEL]
            # a slot freed after 0.4 s: the waiting call goes out with the ~0.6 s left
            first = asyncio.ensure_future(stub.Heartbeat(req, timeout=0.4))
            second = asyncio.ensure_future(stub.Heartbeat(req, timeout=1.0))
            for fut in (first, second):
                with pytest.raises(FsError) as ei:
                    await asyncio.wait_for(fut, 10)
                assert ei.value.code == Code.TIMEOUT
            calls = [f for f in peer.frames if f[0] == wire.CALL]
            assert len(calls) == 3
            assert 1 <= calls[2][3] <= 700, f"sent with {calls[2][3]} ms of a 1 s deadline"
            await ch.close()

    run(main())


def test_a_call_waiting_for_a_backed_up_connection_times_out() -> None:
    async def main() -> None:
        async with RawPeer(read=False) as peer:  # the peer reads nothing
            ch = _channel(peer, write_buffer_bytes=64 << 10)
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(ch)
            sstub = storage_pb2_grpc.StorageServiceStub(ch)
            await ch.connection()
            # more than the kernel's socket buffers hold: the transport pauses writing
            big = asyncio.ensure_future(
                stub.GetLeader(mgmtd_pb2.GetLeaderRequest(), payload=bytes(32 << 20))
            )
            await _until(lambda: _conn(ch)._write_paused)
            with pytest.raises(FsError) as ei:
                await asyncio.wait_for(
                    stub.Heartbeat(mgmtd_pb2.HeartbeatRequest(node_id=1), timeout=0.2), 10
                )
            assert ei.value.code == Code.TIMEOUT
            # a stream's write waits the same way, within the stream's deadline
            stream = sstub.ReadStream(timeout=0.3)
            with pytest.raises(FsError) as ei:
                await asyncio.wait_for(stream.write(storage_pb2.BatchReadRequest()), 10)
            assert ei.value.code == Code.TIMEOUT
            with pytest.raises(FsError) as ei:  # its reader learns the same
                await asyncio.wait_for(stream.__anext__(), 10)
            assert ei.value.code == Code.TIMEOUT
            big.cancel()
            await ch.close()
            with pytest.raises((FsError, asyncio.CancelledError)):
                await big

    run(main())


# -- 2. a stream that ends unread gives back its share of the connection ------------


def _routing_message(v: int) -> bytes:
    info = mgmtd_pb2.RoutingInfo(version=v)
    info.nodes.add(node_id=v, address="x" * 1000)
    return info.SerializeToString()


def _streaming_peer(messages: int, end: int | None) -> RawPeer:
    """A WatchRoutingInfo call gets ``messages`` ~1 KiB messages and ``end`` (END,
    ERROR or None: nothing); a GetLeader call an answer."""

    async def script(w: asyncio.StreamWriter, f: Frame) -> None:
        kind, mid, rid, _tmo = f
        if kind != wire.CALL:
            return
        if mid == WATCH:
            for v in range(messages):
                w.write(wire.pack(wire.MESSAGE, wire.HAS_MESSAGE, mid, rid, 0, _routing_message(v)))
            if end == wire.END:
                w.write(wire.pack(wire.END, 0, mid, rid, 0, b""))
            elif end == wire.ERROR:
                err = common_pb2.ErrorDetail(
                    code=Code.LEASE_LOST, message="gone"
                ).SerializeToString()
                w.write(wire.pack(wire.ERROR, wire.HAS_MESSAGE, mid, rid, 0, err))
        elif mid == LEADER:
            body = mgmtd_pb2.GetLeaderResponse(node_id=7).SerializeToString()
            w.write(wire.pack(wire.REPLY, wire.HAS_MESSAGE, mid, rid, 0, body))
        await w.drain()

    return RawPeer(script)


def test_a_cancelled_stream_releases_its_queued_bytes() -> None:
    async def main() -> None:
        async with _streaming_peer(200, None) as peer:
            ch = _channel(peer, max_inflight_bytes=64 << 10)
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(ch)
            stream = stub.WatchRoutingInfo(mgmtd_pb2.WatchRoutingInfoRequest())
            await _until(lambda: ch._conn is not None and ch._conn._reading_paused)
            stream.cancel()
            r = await asyncio.wait_for(stub.GetLeader(mgmtd_pb2.GetLeaderRequest(), timeout=5), 10)
            assert r.node_id == 7
            assert _conn(ch)._queued_bytes >= 0 and not _conn(ch)._reading_paused
            await ch.close()

    run(main())


@pytest.mark.parametrize("end", ["END", "ERROR"])
def test_streams_ended_with_unread_messages_do_not_pause_the_connection(end: str) -> None:
    kind = wire.END if end == "END" else wire.ERROR

    async def main() -> None:
        async with _streaming_peer(40, kind) as peer:
            ch = _channel(peer, max_inflight_bytes=64 << 10)
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(ch)
            # three streams of ~40 KiB each end unread: together above the limit
            for _ in range(3):
                stream = stub.WatchRoutingInfo(mgmtd_pb2.WatchRoutingInfoRequest())
                await _until(lambda s=stream: s._st is not None and s._st.done)
            r = await asyncio.wait_for(stub.GetLeader(mgmtd_pb2.GetLeaderRequest(), timeout=5), 10)
            assert r.node_id == 7
            # what the last one queued is still there for a reader that wants it
            got = []
            with pytest.raises((StopAsyncIteration, FsError)) as ei:
                while True:
                    got.append((await stream.__anext__()).version)
            assert got == list(range(40))
            if kind == wire.ERROR:
                assert isinstance(ei.value, FsError) and ei.value.code == Code.LEASE_LOST
            assert _conn(ch)._queued_bytes == 0
            await ch.close()

    run(main())


# -- 3. the server's stall timer counts progress, not the drain to the low mark -----


def test_a_slow_reader_that_keeps_reading_is_not_disconnected(caplog: Any) -> None:
    """Answers of ~1 MB over a slow link (a small kernel send buffer) to a peer
    reading ~800 KB/s: each answer takes longer than ``stall_timeout_s`` to drain
    below the low mark, but bytes leave the write buffer all the time."""
    caplog.set_level(logging.WARNING, logger="fs3.rpc.native")
    rpc = RpcSection(write_buffer_bytes=64 << 10, stall_timeout_s=0.5, max_inflight_calls=16)
    calls = 2

    async def main() -> None:
        async with Node(rpc) as node:
            node.mgmtd.routing_nodes = 10_000
            path = endpoints.uds_path(node.address, rpc.socket_dir)
            reader, writer = await asyncio.open_unix_connection(path, limit=8 << 10)
            writer.write(wire.PREFACE)
            await _until(lambda: bool(node.server.native._connections))
            (server_side,) = node.server.native._connections
            assert server_side._transport is not None
            # the slow link: the kernel holds a few KiB of the answers, the rest waits
            # in the server's write buffer, where the stall timer watches it
            sock = server_side._transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 10)
            body = mgmtd_pb2.GetRoutingInfoRequest(known_version=1).SerializeToString()
            for rid in range(1, calls + 1):
                writer.write(wire.pack(wire.CALL, wire.HAS_MESSAGE, ROUTING, rid, 0, body))
            buf = bytearray()
            replies = 0
            async with asyncio.timeout(40):
                while replies < calls:
                    chunk = await reader.read(8 << 10)
                    assert chunk, f"server closed the connection after {replies} answers"
                    buf += chunk
                    while len(buf) >= wire.HEADER_SIZE:
                        kind, *_r, blen, plen = wire.HEADER.unpack_from(buf)
                        if len(buf) < wire.HEADER_SIZE + blen + plen:
                            break
                        assert kind == wire.REPLY
                        del buf[: wire.HEADER_SIZE + blen + plen]
                        replies += 1
                    await asyncio.sleep(0.01)  # the reader's pace: 8 KiB per 10 ms
            writer.transport.abort()

    run(main())
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any("stopped reading" in m for m in lines), lines
