"""Bulk payloads of native calls land in the buffers the caller names, in place.

A real ``RpcServer`` (both transports on one address) serves a storage
servicer that uses :mod:`fs3.rpc.bulk` the way ``fs3.storage.service`` does;
clients are the generated stubs over a ``ChannelPool``. "In place" is checked
two ways: the destination memoryview the caller passed holds the bytes
afterwards, and tracemalloc sees no allocation of the payload's size while
the call runs (a ``bytes`` copy per I/O would show as one).
"""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import crc32c
import pytest

from fs3.config import RpcSection
from fs3.errors import Code, FsError
from fs3.proto import storage_pb2, storage_pb2_grpc
from fs3.rpc import settings
from fs3.rpc.bulk import can_reply_payload, request_payload, set_reply_payload, with_payload
from fs3.rpc.channel import BidiStream, ChannelPool, call
from fs3.rpc.loop import run
from fs3.rpc.server import add_servicer, bind, create_server

pytestmark = pytest.mark.timeout(60)

MIB = 1 << 20


class BulkStorage(storage_pb2_grpc.StorageServiceServicer):
    """Write: checksums the request payload. BatchRead: answers each io from a
    preallocated source with a payload of the ios' bytes in order."""

    def __init__(self) -> None:
        rng = random.Random(7)
        self.source = bytearray(rng.randbytes(4 * MIB))
        self.seen_payload: list[int] = []

    async def Write(self, request: Any, context: Any) -> Any:
        p = request_payload(context)
        self.seen_payload.append(-1 if p is None else len(p))
        res = storage_pb2.WriteResponse()
        res.result.length = 0 if p is None else len(p)
        res.result.checksum = 0 if p is None else crc32c.crc32c(p)
        return res

    async def BatchRead(self, request: Any, context: Any) -> Any:
        resp = storage_pb2.BatchReadResponse()
        out: list[Any] = []
        src = memoryview(self.source)
        for io in request.ios:
            r = resp.results.add()
            if io.length == 0:
                r.error.code = int(Code.CHUNK_NOT_FOUND)
                continue
            r.length = io.length
            out.append(src[io.offset : io.offset + io.length])
        if can_reply_payload(context):
            set_reply_payload(context, out)
        return resp

    async def ReadStream(self, requests: Any, context: Any) -> Any:
        src = memoryview(self.source)
        async for req in requests:
            resp = storage_pb2.BatchReadResponse(request_id=req.request_id)
            out = []
            for io in req.ios:
                resp.results.add().length = io.length
                out.append(src[io.offset : io.offset + io.length])
            yield with_payload(context, resp, out) if can_reply_payload(context) else resp


class Node:
    def __init__(self, rpc: RpcSection | None = None) -> None:
        self.server = create_server(rpc or RpcSection())
        self.storage = BulkStorage()
        add_servicer(
            self.server, storage_pb2_grpc.add_StorageServiceServicer_to_server, self.storage
        )
        self.address = ""

    async def __aenter__(self) -> Node:
        port = bind(self.server, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{port}"
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)


@pytest.fixture(autouse=True)
def _restore_settings() -> Any:
    yield
    settings.configure(RpcSection())


def _read_req(*ranges: tuple[int, int]) -> Any:
    req = storage_pb2.BatchReadRequest()
    for off, n in ranges:
        io = req.ios.add()
        io.offset, io.length = off, n
    return req


async def _write_and_read(stub: Any, src: bytearray) -> None:
    """A 3 MiB + 5 write and a 2 MiB read into one buffer, checked byte for byte."""
    # write: the payload goes out from the caller's buffer, the server sees it whole
    data = memoryview(src)[: 3 * MIB + 5]
    r = await call(stub.Write, storage_pb2.WriteRequest(), timeout=10, payload=data)
    assert r.result.length == len(data) and r.result.checksum == crc32c.crc32c(data)
    # read into one buffer: returns (response, payload length)
    dest = memoryview(bytearray(2 * MIB))
    resp, n = await call(stub.BatchRead, _read_req((100, 2 * MIB)), timeout=10, into=dest)
    assert n == 2 * MIB and dest == memoryview(src)[100 : 100 + 2 * MIB]
    assert resp.results[0].length == 2 * MIB


@pytest.mark.parametrize("uds", [True, False], ids=["native-uds", "native-tcp"])
def test_payload_round_trips_into_given_buffers(uds: bool) -> None:
    async def main() -> None:
        settings.configure(RpcSection(unix_sockets=uds))
        async with Node() as node:
            pool = ChannelPool("native")
            stub = storage_pb2_grpc.StorageServiceStub(pool.get(node.address))
            src = node.storage.source
            await _write_and_read(stub, src)
            # scatter: each io's bytes land in its own buffer (laid out from the answer)
            bufs = [memoryview(bytearray(k)) for k in (4096, 1 * MIB, 7, 64 * 1024)]
            ranges = [(0, 4096), (5000, 1 * MIB), (3 * MIB, 7), (0, 0), (9, 64 * 1024)]
            dests = [bufs[0], bufs[1], bufs[2], None, bufs[3]]

            def layout(body: Any, length: int) -> list[memoryview] | None:
                rs = storage_pb2.BatchReadResponse.FromString(bytes(body)).results
                return [d[: r.length] for d, r in zip(dests, rs, strict=True) if d is not None]

            resp, n = await call(stub.BatchRead, _read_req(*ranges), timeout=10, into=layout)
            assert n == 4096 + MIB + 7 + 64 * 1024
            assert resp.results[3].error.code == Code.CHUNK_NOT_FOUND
            for d, (off, k) in zip(bufs, [r for r in ranges if r[1]], strict=True):
                assert d == memoryview(src)[off : off + k]
            await pool.close()

    run(main())


def test_reads_allocate_no_payload_sized_object() -> None:
    """Many 1 MiB reads into one buffer: no allocation near the payload size."""

    async def main() -> None:
        settings.configure(RpcSection())
        async with Node() as node:
            pool = ChannelPool("native")
            stub = storage_pb2_grpc.StorageServiceStub(pool.get(node.address))
            dest = memoryview(bytearray(MIB))
            req = _read_req((0, MIB))
            await call(stub.BatchRead, req, timeout=10, into=dest)  # connect, warm up
            tracemalloc.start()
            try:
                for _ in range(20):
                    _, n = await call(stub.BatchRead, req, timeout=10, into=dest)
                    assert n == MIB
                _cur, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < MIB // 4, f"peak {peak} bytes traced during 20 reads of 1 MiB"
            assert dest == memoryview(node.storage.source)[:MIB]
            await pool.close()

    run(main())


def test_refused_layout_drops_the_payload_and_keeps_the_connection() -> None:
    async def main() -> None:
        settings.configure(RpcSection())
        async with Node() as node:
            pool = ChannelPool("native")
            ch = pool.get(node.address)
            stub = storage_pb2_grpc.StorageServiceStub(ch)
            dest = memoryview(bytearray(4096))
            # a layout that does not add up is refused: the bytes go to a scratch buffer
            _, n = await call(
                stub.BatchRead,
                _read_req((0, 4096)),
                timeout=10,
                into=lambda body, length: [dest[:10]],
            )
            assert n == 4096 and bytes(dest) == bytes(4096)
            # an `into` smaller than the payload: likewise left untouched
            small = memoryview(bytearray(100))
            _, n = await call(stub.BatchRead, _read_req((0, 4096)), timeout=10, into=small)
            assert n == 4096 and bytes(small) == bytes(100)
            # the same connection still serves
            _, n = await call(stub.BatchRead, _read_req((0, 4096)), timeout=10, into=dest)
            assert n == 4096 and dest == memoryview(node.storage.source)[:4096]
            assert node.server.native.connections == 1
            await pool.close()

    run(main())


def test_grpc_calls_have_no_payload() -> None:
    """Over gRPC the handler sees no request payload and cannot attach one."""

    async def main() -> None:
        async with Node() as node:
            pool = ChannelPool("grpc")
            stub = storage_pb2_grpc.StorageServiceStub(pool.get(node.address))
            r = await call(stub.Write, storage_pb2.WriteRequest(), timeout=10)
            assert r.result.length == 0 and node.storage.seen_payload == [-1]
            resp = await call(stub.BatchRead, _read_req((0, 10)), timeout=10)
            assert resp.results[0].length == 10
            await pool.close()

    run(main())


def test_frame_ref_bounds() -> None:
    from fs3.transport import frame_ref, frame_slice

    ref = frame_ref(10)
    with pytest.raises(FsError) as ei:
        frame_slice(ref, None)
    assert ei.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(FsError):
        frame_slice(ref, memoryview(bytes(9)))
    assert bytes(frame_slice(ref, memoryview(bytes(range(12))))) == bytes(range(10))


def test_stream_messages_scatter_into_each_requests_buffers() -> None:
    """ReadStream answers carry their bytes as payloads laid out per message."""

    async def main() -> None:
        settings.configure(RpcSection())
        async with Node() as node:
            pool = ChannelPool("native")
            stub = storage_pb2_grpc.StorageServiceStub(pool.get(node.address))
            src = memoryview(node.storage.source)
            bufs = {rid: [memoryview(bytearray(n)) for n in (4096, 300_000)] for rid in (1, 2)}

            def layout(body: Any, length: int) -> list[memoryview] | None:
                resp = storage_pb2.BatchReadResponse.FromString(bytes(body))
                return bufs[resp.request_id]

            bidi = BidiStream(stub.ReadStream)
            assert bidi.set_payload_layout(layout)
            for rid in (1, 2):
                req = _read_req((rid * 10, 4096), (rid * 1000, 300_000))
                req.request_id = rid
                await bidi.write(req)
            await bidi.done_writing()
            got = [r.request_id async for r in bidi.responses()]
            assert sorted(got) == [1, 2]
            for rid in (1, 2):
                assert bufs[rid][0] == src[rid * 10 : rid * 10 + 4096]
                assert bufs[rid][1] == src[rid * 1000 : rid * 1000 + 300_000]
            await pool.close()

    run(main())


def test_answer_payload_above_the_limit_fails_alone() -> None:
    """The server refuses to send an answer payload its peer would drop the connection for."""

    async def main() -> None:
        settings.configure(RpcSection())
        async with Node(RpcSection(max_payload_bytes=MIB)) as node:
            pool = ChannelPool("native")
            stub = storage_pb2_grpc.StorageServiceStub(pool.get(node.address))
            dest = memoryview(bytearray(2 * MIB))
            with pytest.raises(FsError) as ei:
                await call(stub.BatchRead, _read_req((0, 2 * MIB)), timeout=10, into=dest)
            assert ei.value.code == Code.INVALID_ARGUMENT and "exceeds" in ei.value.message
            _, n = await call(stub.BatchRead, _read_req((0, MIB)), timeout=10, into=dest)
            assert n == MIB and node.server.native.connections == 1
            await pool.close()

    run(main())


def test_write_payloads_land_in_reused_memory_and_kept_ones_stay_intact() -> None:
    """Request payloads are received into pooled memory (fs3.rpc.native.pool): a
    run of 1 MiB writes allocates nothing payload-sized and reuses one buffer,
    and a payload a handler keeps is never handed to a later call."""

    class Keeping(BulkStorage):
        def __init__(self) -> None:
            super().__init__()
            self.kept: list[memoryview] = []
            self.keep = False

        async def Write(self, request: Any, context: Any) -> Any:
            if self.keep:
                p = request_payload(context)
                assert p is not None
                self.kept.append(p[10:20])  # a slice of it is enough to hold it
            return await super().Write(request, context)

    async def main() -> None:
        settings.configure(RpcSection())
        async with Node() as node:
            storage = Keeping()
            node.server.native.handlers.clear()
            node.server.native.add_servicer("fs3.v1.StorageService", storage)
            payload_pool = node.server.native.payload_pool
            pool = ChannelPool("native")
            stub = storage_pb2_grpc.StorageServiceStub(pool.get(node.address))
            req = storage_pb2.WriteRequest()
            datas = [bytes([i]) * MIB for i in range(3)]
            await call(stub.Write, req, timeout=10, payload=datas[0])  # connect, warm up
            tracemalloc.start()
            try:
                for i in range(20):
                    r = await call(stub.Write, req, timeout=10, payload=datas[i % 2])
                    assert r.result.checksum == crc32c.crc32c(datas[i % 2])
                _cur, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < MIB // 4, f"peak {peak} bytes traced during 20 writes of 1 MiB"
            assert payload_pool.cached_bytes == MIB  # one buffer, reused by every write
            storage.keep = True
            await call(stub.Write, req, timeout=10, payload=datas[1])
            storage.keep = False
            for _ in range(3):
                r = await call(stub.Write, req, timeout=10, payload=datas[2])
                assert r.result.checksum == crc32c.crc32c(datas[2])
            assert bytes(storage.kept[0]) == b"\x01" * 10  # not overwritten by later writes
            assert payload_pool.cached_bytes == 2 * MIB  # the kept one, and one reused
            storage.kept.clear()
            await call(stub.Write, req, timeout=10, payload=datas[0])
            assert payload_pool.cached_bytes == 2 * MIB  # released: reused, not a third
            await pool.close()

    run(main())


def test_a_payload_after_a_small_first_read_goes_straight_to_its_destination() -> None:
    """An idle receiver offers a small first read (fs3.rpc.native.wire.RECV_IDLE_BYTES):
    only that much of a payload passes through the shared buffer (and is copied
    from it); every later read lands in the destination itself."""
    from fs3.rpc.native import wire

    payload = random.Random(3).randbytes(MIB)
    dest = memoryview(bytearray(MIB))
    got: list[tuple[Any, ...]] = []

    class Receiver(wire.FrameReceiver):
        def payload_buffer(self, kind: int, rid: int, length: int, body: Any) -> Any:
            return dest[:length]

        def frame_received(self, *frame: Any) -> None:
            got.append(frame)

        def violation(self, message: str) -> None:
            raise AssertionError(message)

    async def main() -> None:
        r = Receiver()
        data = memoryview(wire.pack(wire.CALL, wire.HAS_MESSAGE, 1, 9, 0, b"body", MIB) + payload)
        reads = []
        while len(data):  # a socket with everything queued fills each buffer it is given
            view = r.get_buffer(-1)
            k = min(len(view), len(data))
            view[:k] = data[:k]
            reads.append((k, view.obj is dest.obj))
            r.buffer_updated(k)
            data = data[k:]
        assert reads[0] == (wire.RECV_IDLE_BYTES, False)
        assert all(into_dest for _k, into_dest in reads[1:]), reads
        assert len(got) == 1 and got[0][3] == 9 and bytes(got[0][5]) == b"body"
        assert dest == memoryview(payload)

    run(main())


def test_reads_after_the_receive_buffer_grew_land_in_the_grown_buffer() -> None:
    """While parsing is paused a full buffer of unparsed frames makes the receiver
    take a larger one; the small first read of an idle receiver must then be a
    view of that new buffer (frames read into the old one would be lost)."""
    from fs3.rpc.native import wire

    got: list[int] = []

    class Receiver(wire.FrameReceiver):
        def frame_received(self, *frame: Any) -> None:
            got.append(frame[3])  # the request id

        def violation(self, message: str) -> None:
            raise AssertionError(message)

    def feed(r: Receiver, data: bytes) -> None:
        view = memoryview(data)
        while len(view):
            buf = r.get_buffer(-1)
            k = min(len(buf), len(view))
            buf[:k] = view[:k]
            r.buffer_updated(k)
            view = view[k:]

    async def main() -> None:
        r = Receiver()
        body = b"x" * (4096 - wire.HEADER_SIZE)
        frames = b"".join(
            wire.pack(wire.CALL, wire.HAS_MESSAGE, 1, rid, 0, body)
            for rid in range(1, wire.RECV_BUFFER_BYTES // 4096 + 1)
        )
        r._parse_paused = True  # as a subclass that stopped reading does
        feed(r, frames)  # fills the whole receive buffer, nothing parsed
        r.get_buffer(-1)  # the transport reads on: the buffer grows
        r.resume_parsing()
        n = len(got)
        assert n == wire.RECV_BUFFER_BYTES // 4096
        feed(r, wire.pack(wire.CALL, wire.HAS_MESSAGE, 1, 7777, 0, b"after"))
        assert got[n:] == [7777]

    run(main())


def test_tcp_payloads_wake_the_reader_once_whole_and_the_mark_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over TCP a large payload sets SO_RCVLOWAT to its bytes still to come, on the
    receiving side (server for a write, client for a read), and 1 again once it is in:
    small calls after it are answered at once, the bytes are intact."""
    import socket

    from fs3.rpc.native import wire

    marks: list[tuple[str, int]] = []
    watched: list[Any] = []
    real_set = wire.FrameReceiver._set_lowat
    real_watch = wire.FrameReceiver.watch_payloads

    def set_spy(self: Any, n: int) -> None:
        real_set(self, n)
        marks.append((type(self).__name__, self._lowat))  # the mark set

    def watch_spy(self: Any, sock: Any, *, tls: bool) -> None:
        real_watch(self, sock, tls=tls)
        watched.append(self)

    monkeypatch.setattr(wire.FrameReceiver, "_set_lowat", set_spy)
    monkeypatch.setattr(wire.FrameReceiver, "watch_payloads", watch_spy)

    async def main() -> None:
        settings.configure(RpcSection(unix_sockets=False))
        async with Node() as node:
            pool = ChannelPool("native")
            stub = storage_pb2_grpc.StorageServiceStub(pool.get(node.address))
            src = node.storage.source
            await _write_and_read(stub, src)
            for _ in range(3):  # small ones after: nobody waits for bytes that never come
                r = await call(stub.Write, storage_pb2.WriteRequest(), timeout=5, payload=b"x")
                assert r.result.length == 1
                small = memoryview(bytearray(10))
                _, n = await call(stub.BatchRead, _read_req((0, 10)), timeout=5, into=small)
                assert n == 10 and small == memoryview(src)[:10]
            sides = {who for who, n in marks if n >= wire.LOWAT_MIN}
            assert sides == {"ServerConnection", "ClientConnection"}, marks
            assert max(n for _, n in marks) == wire.LOWAT_MAX  # the 3 MiB write, capped
            assert len(watched) == 2
            for conn in watched:
                assert conn._lowat == 1
                assert conn._lowat_sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
            await pool.close()

    run(main())


def test_tls_payloads_are_received_without_a_low_water_mark(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under TLS the kernel holds ciphertext, and the TLS layer may keep part of a
    record it already read: a mark of the plaintext still to come could exceed the
    bytes that will ever arrive, and the reader would never wake. So TLS connections
    are not watched, and megabyte payloads go both ways."""
    from fs3.rpc import auth
    from fs3.rpc.native import wire
    from fs3.security import tls

    watched: list[Any] = []
    real_watch = wire.FrameReceiver.watch_payloads

    def watch_spy(self: Any, sock: Any, *, tls: bool) -> None:
        real_watch(self, sock, tls=tls)
        watched.append((tls, self))

    monkeypatch.setattr(wire.FrameReceiver, "watch_payloads", watch_spy)
    ca, _ = tls.ensure_ca(tmp_path / "tls")
    cert, key = tls.issue(tmp_path / "tls", "node-1")

    async def main() -> None:
        settings.configure(RpcSection(unix_sockets=False))
        async with Node(
            RpcSection(unix_sockets=False, tls_cert=str(cert), tls_key=str(key))
        ) as node:
            pool = ChannelPool("native", credential=auth.Credential(tls_ca=str(ca)))
            stub = storage_pb2_grpc.StorageServiceStub(pool.get(node.address))
            for _ in range(3):
                await _write_and_read(stub, node.storage.source)
            assert len(watched) == 2 and all(t for t, _ in watched), watched
            assert all(conn._lowat_sock is None for _, conn in watched)
            await pool.close()

    run(main())
