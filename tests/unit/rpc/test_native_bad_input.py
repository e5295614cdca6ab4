"""Bad input on the native wire: the connection closes with one clear log line,
the server keeps serving everyone else, memory stays bounded.

Each case speaks raw bytes to a real ``RpcServer`` (the one every fs3 service
runs) over TCP, then checks the server with a well-behaved native client.
"""

from __future__ import annotations

import asyncio
import logging
import tracemalloc
from typing import Any

import pytest
from test_native import Node  # the same scripted server

from fs3.config import RpcSection
from fs3.errors import Code
from fs3.proto import common_pb2, mgmtd_pb2, mgmtd_pb2_grpc
from fs3.rpc.channel import ChannelPool, call
from fs3.rpc.loop import run
from fs3.rpc.native import wire
from fs3.rpc.native.methods import BY_PATH

pytestmark = pytest.mark.timeout(60)

LEADER = BY_PATH["/fs3.v1.MgmtdService/GetLeader"].id
ROUTING = BY_PATH["/fs3.v1.MgmtdService/GetRoutingInfo"].id


def _frame(
    kind: int, mid: int, rid: int, body: bytes, *, blen: int | None = None, plen: int = 0
) -> bytes:
    n = len(body) if blen is None else blen
    return wire.HEADER.pack(kind, wire.HAS_MESSAGE, 0, mid, rid, 0, n, plen) + body


async def _still_serving(node: Node) -> None:
    pool = ChannelPool("native")
    stub = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(node.address))
    r = await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
    assert r.node_id == 7
    await pool.close()


async def _wait_closed(node: Node, timeout: float = 10) -> None:  # noqa: ASYNC109
    async with asyncio.timeout(timeout):
        while node.server.native.connections:  # noqa: ASYNC110 - a count, no event to wait on
            await asyncio.sleep(0.01)


def _warnings(caplog: Any) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "fs3.rpc.native" and r.levelno >= logging.WARNING
    ]


CASES = {
    "bad-kind": (_frame(99, LEADER, 1, b""), "bad frame kind 99"),
    "bad-length": (_frame(wire.CALL, LEADER, 1, b"", blen=0xFFFFFFF0), "exceeds the maximum"),
    "payload-above-max": (
        _frame(wire.CALL, LEADER, 1, b"", plen=(64 << 20) + 1),
        "payload of 67108865 bytes exceeds the maximum",
    ),
    "undecodable-body": (
        _frame(wire.CALL, LEADER, 1, b"\xff\xff\xff\xff\xff"),
        "undecodable /fs3.v1.MgmtdService/GetLeader request",
    ),
    "unknown-method": (_frame(wire.CALL, 0xDEADBEEF, 1, b""), "unknown method id 0xdeadbeef"),
    "server-frame-from-client": (_frame(wire.REPLY, LEADER, 1, b""), "a client sent a REPLY frame"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_frame_closes_only_that_connection(case: str, caplog: Any) -> None:
    data, expect = CASES[case]
    caplog.set_level(logging.WARNING, logger="fs3.rpc.native")

    async def main() -> None:
        async with Node() as node:
            host, port = node.address.rsplit(":", 1)
            # a well-behaved connection that lives through the bad one
            pool = ChannelPool("native")
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(node.address))
            await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
            tracemalloc.start()
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(wire.PREFACE + data)
            await writer.drain()
            got = await asyncio.wait_for(reader.read(), 10)  # EOF: the server closed it
            _size, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            writer.close()
            assert peak < 16 << 20, f"server allocated {peak} bytes for a bad frame"
            if case == "unknown-method":
                # the caller learns why before the connection closes
                kind, *_rest, blen, _plen = wire.HEADER.unpack_from(got)
                assert kind == wire.ERROR
                d = common_pb2.ErrorDetail.FromString(
                    got[wire.HEADER_SIZE : wire.HEADER_SIZE + blen]
                )
                assert d.code == Code.NOT_IMPLEMENTED
            # the other connection still works, and so do new ones
            await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
            await _still_serving(node)
            await pool.close()

    run(main())
    lines = _warnings(caplog)
    assert len(lines) == 1, lines
    assert "closing native connection from" in lines[0] and expect in lines[0], lines[0]


def test_bad_preface(caplog: Any) -> None:
    caplog.set_level(logging.WARNING, logger="fs3.rpc.native")

    async def main() -> None:
        async with Node() as node:
            host, port = node.address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            await _still_serving(node)

    run(main())
    lines = _warnings(caplog)
    assert len(lines) == 1 and "not an fs3 connection" in lines[0], lines


def test_truncated_frame_then_hangup(caplog: Any) -> None:
    """A frame cut off by the peer's hang-up is dropped; nothing is served from it."""
    caplog.set_level(logging.WARNING, logger="fs3.rpc.native")

    async def main() -> None:
        async with Node() as node:
            host, port = node.address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(wire.PREFACE + _frame(wire.CALL, LEADER, 1, b"\x08\x01", blen=1000))
            await writer.drain()
            writer.close()
            await _wait_closed(node)
            await _still_serving(node)

    run(main())
    assert _warnings(caplog) == []


def test_peer_that_stops_reading_is_disconnected(caplog: Any) -> None:
    """Requests with big answers from a peer that never reads: the server stops
    reading (backpressure), keeps its buffered replies bounded and closes the
    connection after ``stall_timeout_s`` with one log line."""
    caplog.set_level(logging.WARNING, logger="fs3.rpc.native")
    rpc = RpcSection(write_buffer_bytes=64 << 10, stall_timeout_s=0.5, max_inflight_calls=16)

    async def main() -> None:
        async with Node(rpc) as node:
            host, port = node.address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 16)
            body = mgmtd_pb2.GetRoutingInfoRequest(known_version=1).SerializeToString()
            # 2,000 requests whose answers (~230 KB each) would be ~460 MB
            writer.write(wire.PREFACE)
            for rid in range(1, 2001):
                writer.write(_frame(wire.CALL, ROUTING, rid, body))
            await _wait_closed(node, 20)
            writer.transport.abort()
            await _still_serving(node)

    run(main())
    lines = _warnings(caplog)
    assert len(lines) == 1 and "peer stopped reading" in lines[0], lines
    unsent = int(lines[0].split("(")[1].split()[0])
    assert unsent < 8 << 20, f"{unsent} bytes buffered for a peer that does not read"


@pytest.mark.timeout(10)
def test_a_receive_buffer_full_of_unparsed_frames_still_gives_the_transport_room() -> None:
    """Frames that arrive while parsing is paused fill the buffer; when reading resumes
    before the deferred parse runs, get_buffer must still hand out space (an empty buffer
    makes the transport close the connection: seen as resets between storage nodes)."""
    from fs3.rpc.native import wire

    async def main() -> None:
        got: list[int] = []

        class Rx(wire.FrameReceiver):
            def frame_received(self, kind, flags, method_id, request_id, timeout_ms, body, payload):  # type: ignore[no-untyped-def]
                got.append(request_id)

        rx = Rx()
        rx._parse_paused = True
        frame = wire.pack(wire.MESSAGE, wire.HAS_MESSAGE, 1, 7, 0, b"x" * 1000, 0)
        sent = 0
        while True:
            buf = rx.get_buffer(-1)
            assert len(buf) > 0
            n = min(len(buf), len(frame) - sent % len(frame))
            buf[:n] = frame[sent % len(frame) : sent % len(frame) + n]
            rx.buffer_updated(n)
            sent += n
            if sent >= 2 * wire.RECV_BUFFER_BYTES:
                break
        rx.resume_parsing()
        assert len(got) == sent // len(frame)

    asyncio.run(main())
