"""RPC plane benchmark: gRPC vs the native transport (TCP and Unix socket), one run, one table.

    .venv/bin/python benchmarks/rpc.py [--calls 3000] [--rounds 3] [--mib 200] [--out FILE.md]

What it measures (client on uvloop, servers in their own processes):

* sequential small calls: calls/s and client and server CPU µs per call of a real
  fs3 method, meta ``GetAttr`` of the root inode on a real ``fs3 meta`` process
  (memory KV), over gRPC direct (``[rpc] grpc_port``), gRPC through the main
  port's relay, native over TCP and native over the server's Unix socket; server
  CPU is the meta process's (all threads, from ``/proc/PID/task/*/schedstat``);
* native-fixed: the same GetAttr over native TCP to a server that answers a
  fixed message (the root's attributes, the same bytes): the transport and its
  dispatch without the meta work, to tell the two apart in one run;
* the floor beside them: a bare length-prefixed 200-byte echo on uvloop
  ``asyncio.Protocol`` in both processes (no protobuf, no handler: the
  ``tools/floors/rpcbench.py`` probe), measured in the same run;
* 64 calls in flight on one connection (64 tasks calling in a loop): calls/s;
* 1 MiB payloads, sequential write and read: MB/s and client and server CPU µs
  per MiB over the native transport (the payload travels as the frame's bulk
  payload, received into the destination buffer) against a plain Python
  blocking-socket ``sendall`` / ``recv_into`` loop on the same loopback, over TCP
  and over a Unix socket; every round measures all four one after the other and
  a ratio is the median of the per-round ratios (the VM's speed swings between
  rounds far more than between two transfers of one round).
  The bulk server is a scripted StorageService (Write keeps the payload, BatchRead
  answers 1 MiB from a buffer) on the real ``RpcServer``: it measures the transport,
  not the chunk engine.

The sequential, 64-in-flight and 1 MiB measurements run in ``--rounds`` rounds, each
round measuring every transport one after the other (interleaved, so a change
of machine load between two transports is as likely either way); the table
gives each figure's median over the rounds, and "× grpc" is the median of the
per-round ratios (each round's figures are printed below the table: a round
that is slower for every transport, the floor included, is the machine). The
machine is shared, so run it several times and compare medians.

Two other modes: ``--paths N`` times the Python side of one call in process
(no sockets: framing alone, the meta servicer on the memory and the SQLite KV,
the client), and ``--growth N [--uds]`` checks that nothing grows per call
over N calls on one connection, with both ends in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fs3.config import RpcSection  # noqa: E402
from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc, storage_pb2, storage_pb2_grpc  # noqa: E402
from fs3.rpc import settings  # noqa: E402
from fs3.rpc.channel import ChannelPool, insecure_channel  # noqa: E402
from fs3.rpc.loop import run  # noqa: E402

MIB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[Any], timeout: float = 60) -> None:  # noqa: ASYNC109
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"server on port {port} did not come up")


# ----------------------------------------------------------------- servers (subprocesses)


def serve_bulk(port: int) -> None:
    """A StorageService whose Write keeps the payload and BatchRead answers 1 MiB,
    and a MetaService whose GetAttr answers a fixed message: the root's attributes
    as the meta servicer gives them (the same bytes as the native rows' calls),
    so the native-fixed row is the transport and dispatch without the meta work."""
    from fs3.kv.memory import MemoryDatabase
    from fs3.meta.operator import MetaOperator
    from fs3.rpc.server import add_servicer, bind, create_server

    root = MetaOperator(MemoryDatabase()).read_once("getattr", _getattr_request())

    class Fixed(meta_pb2_grpc.MetaServiceServicer):
        async def GetAttr(self, request: Any, context: Any) -> Any:
            return root

    reply = memoryview(os.urandom(MIB))

    class Bulk(storage_pb2_grpc.StorageServiceServicer):
        async def Write(self, request: Any, context: Any) -> Any:
            n = len(context.payload) if getattr(context, "payload", None) is not None else 0
            return storage_pb2.WriteResponse(result=storage_pb2.IOResult(length=n))

        async def BatchRead(self, request: Any, context: Any) -> Any:
            n = request.ios[0].length
            context.reply_payload = reply[:n]
            resp = storage_pb2.BatchReadResponse()
            resp.results.add().length = n
            return resp

    async def main() -> None:
        server = create_server()
        add_servicer(server, storage_pb2_grpc.add_StorageServiceServicer_to_server, Bulk())
        add_servicer(server, meta_pb2_grpc.add_MetaServiceServicer_to_server, Fixed())
        bind(server, "127.0.0.1", port)
        await server.start()
        stop = asyncio.Event()  # SIGTERM (the benchmark ending): remove the socket files
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(0)

    run(main())


def _getattr_request() -> Any:
    return meta_pb2.GetAttrRequest(user=common_pb2.UserInfo(uid=0, gid=0), inode=1)


def serve_plain(port: int, uds: str) -> None:
    """Plain blocking sockets: 'W' n -> recv_into n bytes, ack; 'R' n -> sendall n bytes."""
    import threading

    ls = socket.create_server(("127.0.0.1", port))
    us = socket.socket(socket.AF_UNIX)
    us.bind(uds)
    us.listen(4)
    threading.Thread(target=_plain_loop, args=(us,), daemon=True).start()
    _plain_loop(ls)


def _plain_loop(ls: socket.socket) -> None:
    buf = bytearray(MIB)
    view = memoryview(buf)
    while True:
        conn, _ = ls.accept()
        if conn.family != socket.AF_UNIX:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hdr = bytearray(5)
        try:
            while True:
                if _recv_exact(conn, memoryview(hdr)) == 0:
                    break
                op, n = struct.unpack("<cI", hdr)
                if op == b"W":
                    _recv_exact(conn, view[:n])
                    conn.sendall(b"k")
                else:
                    conn.sendall(view[:n])
        finally:
            conn.close()


def _recv_exact(conn: socket.socket, dest: memoryview) -> int:
    got = 0
    while got < len(dest):
        n = conn.recv_into(dest[got:])
        if n == 0:
            return got
        got += n
    return got


FLOOR_HDR = struct.Struct("<IQ")


class _FloorProtocol(asyncio.Protocol):
    """Length-prefixed frames ``<u32 len><u64 id><body>`` on a bare Protocol (tools/floors/rpcbench.py)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiters: dict[int, asyncio.Future[bytes]] = {}

    def connection_made(self, transport: Any) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 12:
            n, rid = FLOOR_HDR.unpack_from(self.buf)
            if len(self.buf) < 12 + n:
                break
            body = bytes(self.buf[12 : 12 + n])
            del self.buf[: 12 + n]
            self.frame(rid, body)

    def frame(self, rid: int, body: bytes) -> None:  # the client side: an answer
        self.waiters.pop(rid).set_result(body)


class _FloorEcho(_FloorProtocol):
    def frame(self, rid: int, body: bytes) -> None:
        self.t.write(FLOOR_HDR.pack(len(body), rid) + body)


def serve_floor(port: int) -> None:
    """The floor: a length-prefixed echo on a bare uvloop Protocol (tools/floors/rpcbench.py)."""

    async def main() -> None:
        await asyncio.get_running_loop().create_server(_FloorEcho, "127.0.0.1", port)
        await asyncio.Event().wait()

    run(main())


class FloorStub:
    """Sequential 200-byte echo calls, shaped like a stub method for :func:`seq_calls`."""

    def __init__(self, proto: _FloorProtocol) -> None:
        self.p = proto
        self.i = 0
        self.payload = b"x" * 200

    async def GetAttr(self, request: Any, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        self.i += 1
        fut = asyncio.get_running_loop().create_future()
        self.p.waiters[self.i] = fut
        self.p.t.write(FLOOR_HDR.pack(len(self.payload), self.i) + self.payload)
        return await fut


def process_cpu_s(pid: int) -> float:
    """CPU seconds of every thread of process ``pid`` (nanosecond schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    return total / 1e9


# ----------------------------------------------------------------- measurements


async def seq_calls(stub: Any, n: int, server_pid: int) -> tuple[float, float, float]:
    """calls/s, client CPU µs/call, server CPU µs/call."""
    req = _getattr_request()
    for _ in range(50):  # connect, warm up
        await stub.GetAttr(req, timeout=10)
    t0, c0, s0 = time.perf_counter(), time.process_time(), process_cpu_s(server_pid)
    for _ in range(n):
        await stub.GetAttr(req, timeout=10)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    ds = process_cpu_s(server_pid) - s0
    return n / dt, dc / n * 1e6, ds / n * 1e6


async def inflight_calls(stub: Any, n: int, depth: int = 64) -> float:
    req = _getattr_request()
    await stub.GetAttr(req, timeout=10)
    per = n // depth

    async def worker() -> None:
        for _ in range(per):
            await stub.GetAttr(req, timeout=30)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(depth)))
    return per * depth / (time.perf_counter() - t0)


def _timed(fn: Any, mib: int, server_pid: int) -> tuple[float, float, float]:
    """MB/s, client and server CPU µs per MiB of ``mib`` runs of ``fn`` (one 1 MiB transfer)."""
    t0, c0, s0 = time.perf_counter(), time.process_time(), process_cpu_s(server_pid)
    fn()
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    ds = process_cpu_s(server_pid) - s0
    return mib * MIB / dt / 1e6, dc / mib * 1e6, ds / mib * 1e6


async def _atimed(coro: Any, mib: int, server_pid: int) -> tuple[float, float, float]:
    t0, c0, s0 = time.perf_counter(), time.process_time(), process_cpu_s(server_pid)
    await coro
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    ds = process_cpu_s(server_pid) - s0
    return mib * MIB / dt / 1e6, dc / mib * 1e6, ds / mib * 1e6


# one round of 1 MiB transfers: write and read, each (MB/s, client CPU µs/MiB, server CPU µs/MiB)
Bulk = dict[str, tuple[float, float, float]]


async def bulk_native(stub: Any, mib: int, server_pid: int) -> Bulk:
    data = memoryview(os.urandom(MIB))
    dest = memoryview(bytearray(MIB))
    wreq = storage_pb2.WriteRequest()
    rreq = storage_pb2.BatchReadRequest()
    rreq.ios.add().length = MIB
    for _ in range(5):
        await stub.Write(wreq, timeout=30, payload=data)
        await stub.BatchRead(rreq, timeout=30, into=dest)

    async def writes() -> None:
        for _ in range(mib):
            resp = await stub.Write(wreq, timeout=30, payload=data)
            assert resp.result.length == MIB

    async def reads() -> None:
        for _ in range(mib):
            _resp, n = await stub.BatchRead(rreq, timeout=30, into=dest)
            assert n == MIB

    out = {
        "w": await _atimed(writes(), mib, server_pid),
        "r": await _atimed(reads(), mib, server_pid),
    }
    assert bytes(dest[:16]) != bytes(16)
    return out


def bulk_plain(port: int, mib: int, server_pid: int, uds: str = "") -> Bulk:
    data = memoryview(os.urandom(MIB))
    dest = memoryview(bytearray(MIB))
    if uds:
        s = socket.socket(socket.AF_UNIX)
        s.connect(uds)
    else:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ack = memoryview(bytearray(1))
    w_hdr = struct.pack("<cI", b"W", MIB)
    r_hdr = struct.pack("<cI", b"R", MIB)

    def one_write() -> None:
        s.sendall(w_hdr)
        s.sendall(data)
        _recv_exact(s, ack)

    def one_read() -> None:
        s.sendall(r_hdr)
        _recv_exact(s, dest)

    for _ in range(5):
        one_write()
        one_read()

    def writes() -> None:
        for _ in range(mib):
            one_write()

    def reads() -> None:
        for _ in range(mib):
            one_read()

    out = {"w": _timed(writes, mib, server_pid), "r": _timed(reads, mib, server_pid)}
    s.close()
    return out


def spawn(args: list[str], **kw: Any) -> subprocess.Popen[Any]:
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw
    )


# ----------------------------------------------------------------- in-process paths


class _PathTransport:
    """A transport without a socket: what the protocol writes is counted (server)
    or answered from a loop callback (client), so only Python-side work is timed."""

    def __init__(self, answer: Any = None) -> None:
        self.answer = answer
        self.written: asyncio.Future[None] | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes) -> None:
        if self.written is not None and not self.written.done():
            self.written.set_result(None)
        if self.answer is not None and len(data) >= 28:
            self.answer(data)

    def writelines(self, bufs: Any) -> None:
        self.write(b"".join(bufs))

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def _feed(proto: Any, data: bytes | memoryview) -> None:
    """Hand ``data`` to a buffered protocol as reads into its buffers would."""
    data = memoryview(data)
    while len(data):
        view = proto.get_buffer(len(data))
        k = min(len(view), len(data))
        view[:k] = data[:k]
        proto.buffer_updated(k)
        data = data[k:]


async def path_costs(n: int) -> tuple[float, float, float, float, float]:
    """CPU µs per call of the native server's and client's Python paths, no sockets.

    Server: a CALL frame of meta GetAttr fed from a loop callback, answered by a
    handler that returns a fixed message; then the same through the real meta
    servicer (MetaServicer over a MetaOperator on the memory KV: what the meta
    process of the sequential rows runs for GetAttr of the root; and on a SQLite
    KV in a temporary directory, the default engine). Client: a stub GetAttr whose CALL is
    answered with a REPLY frame from a loop callback. Median of 5 rounds each;
    the loop's own cost of one callback and one wake-up per call is included.
    Last, the server receiving a 1 MiB storage Write payload (``n // 10`` calls):
    the frame fed in 256 KiB pieces as socket reads would bring it, the
    handler answering its length: receive buffers, copies, no kernel.
    """
    from fs3.kv.memory import MemoryDatabase
    from fs3.kv.sqlite import SqliteDatabase
    from fs3.meta.operator import MetaOperator
    from fs3.meta.service import MetaServicer
    from fs3.rpc.native import wire
    from fs3.rpc.native.client import ClientConnection, NativeChannel
    from fs3.rpc.native.methods import BY_PATH
    from fs3.rpc.native.server import NativeServer, ServerConnection
    from fs3.rpc.server import guard_servicer

    loop = asyncio.get_running_loop()
    resp = meta_pb2.AttrResponse()
    resp.attr.inode = 1
    reply_body = resp.SerializeToString()
    req = meta_pb2.GetAttrRequest(user=common_pb2.UserInfo(uid=0, gid=0), inode=1)
    mid = BY_PATH["/fs3.v1.MetaService/GetAttr"].id

    class Fixed(meta_pb2_grpc.MetaServiceServicer):
        async def GetAttr(self, request: Any, context: Any) -> Any:
            return resp

    def connection(servicer: Any) -> tuple[ServerConnection, _PathTransport]:
        server = NativeServer()
        server.add_servicer("fs3.v1.MetaService", guard_servicer(servicer))
        sconn = ServerConnection(server)
        st = _PathTransport()
        sconn.connection_made(st)
        _feed(sconn, wire.PREFACE)
        return sconn, st

    sconn, st = connection(Fixed())
    body = req.SerializeToString()

    def rounds(fn: Any) -> Any:
        async def run_rounds() -> float:
            res = []
            for _ in range(5):
                c0 = time.process_time()
                await fn()
                res.append((time.process_time() - c0) / n * 1e6)
            return sorted(res)[2]

        return run_rounds()

    rid = [0]

    async def server_round() -> None:
        for _ in range(n):
            rid[0] += 1
            st.written = loop.create_future()
            loop.call_soon(
                _feed, sconn, wire.pack(wire.CALL, wire.HAS_MESSAGE, mid, rid[0], 10000, body)
            )
            await st.written

    server_us = await rounds(server_round)
    sconn, st = connection(MetaServicer(MetaOperator(MemoryDatabase())))
    meta_us = await rounds(server_round)
    with tempfile.TemporaryDirectory(prefix="fs3-rpcpaths-") as tmp:
        db = SqliteDatabase(str(Path(tmp) / "kv.db"))
        sconn, st = connection(MetaServicer(MetaOperator(db)))
        sqlite_us = await rounds(server_round)
        db.close()

    channel = NativeChannel("127.0.0.1:1")
    cconn = ClientConnection(channel)

    def answer(data: bytes) -> None:
        kind, _f, _r, m, r, _t, _b, _p = wire.HEADER.unpack_from(data)
        if kind == wire.CALL:
            loop.call_soon(
                _feed, cconn, wire.pack(wire.REPLY, wire.HAS_MESSAGE, m, r, 0, reply_body)
            )

    cconn.connection_made(_PathTransport(answer))
    channel._conn = cconn
    stub = meta_pb2_grpc.MetaServiceStub(channel)

    async def client_round() -> None:
        for _ in range(n):
            await stub.GetAttr(req, timeout=10)

    client_us = await rounds(client_round)

    class Sink(storage_pb2_grpc.StorageServiceServicer):
        async def Write(self, request: Any, context: Any) -> Any:
            return storage_pb2.WriteResponse(
                result=storage_pb2.IOResult(length=len(context.payload))
            )

    server = NativeServer()
    server.add_servicer("fs3.v1.StorageService", guard_servicer(Sink()))
    wconn = ServerConnection(server)
    wt = _PathTransport()
    wconn.connection_made(wt)
    _feed(wconn, wire.PREFACE)
    wmid = BY_PATH["/fs3.v1.StorageService/Write"].id
    wbody = storage_pb2.WriteRequest().SerializeToString()
    payload = os.urandom(MIB)
    piece = 256 << 10

    def feed_write(frame: bytes) -> None:
        view = memoryview(frame)
        for at in range(0, len(frame), piece):
            _feed(wconn, view[at : at + piece])

    async def bulk_round() -> None:
        # one frame for the round: each call is answered before the next one
        # arrives, so its request id is free again
        rid[0] += 1
        frame = wire.pack(wire.CALL, wire.HAS_MESSAGE, wmid, rid[0], 10000, wbody, MIB) + payload
        for _ in range(max(1, n // 10)):
            wt.written = loop.create_future()
            loop.call_soon(feed_write, frame)
            await wt.written

    async def bulk_rounds() -> float:
        res = []
        for _ in range(5):
            c0 = time.process_time()
            await bulk_round()
            res.append((time.process_time() - c0) / max(1, n // 10) * 1e6)
        return sorted(res)[2]

    bulk_us = await bulk_rounds()
    return server_us, meta_us, sqlite_us, client_us, bulk_us


def serve_meta_thread() -> dict[str, Any]:
    """The meta servicer (memory KV) served natively on a daemon thread of this process.

    Returns ``port``, ``server`` and ``db`` (the KV) once it listens.
    """
    import threading

    from fs3.kv.memory import MemoryDatabase
    from fs3.meta.operator import MetaOperator
    from fs3.meta.service import MetaServicer
    from fs3.rpc.server import add_servicer, bind, create_server

    ready = threading.Event()
    state: dict[str, Any] = {}

    def serve() -> None:
        async def main() -> None:
            server = create_server()
            svc = MetaServicer(MetaOperator(MemoryDatabase()))
            add_servicer(server, meta_pb2_grpc.add_MetaServiceServicer_to_server, svc)
            state["port"] = bind(server, "127.0.0.1", 0)
            await server.start()
            state.update(server=server, db=svc.op.db)
            ready.set()
            await asyncio.Event().wait()

        run(main())

    threading.Thread(target=serve, daemon=True).start()
    if not ready.wait(60):
        raise SystemExit("meta server thread did not start")
    return state


def growth(n: int, uds: bool) -> None:
    """Does anything grow per call? ``n`` sequential GetAttr on one native connection.

    The meta servicer (memory KV) is served on a thread of this process so both
    ends can be inspected: every fifth of the calls prints the number of objects
    the collector tracks, the RSS, and the per-connection maps of the client
    (pending calls, deadlines, destinations, streams) and the server (calls in
    flight, their bytes) and the KV's transaction bookkeeping. A per-call leak
    shows as a count that keeps rising.
    """
    import gc

    state = serve_meta_thread()

    def rss_mib() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    async def calls() -> None:
        settings.configure(RpcSection(unix_sockets=uds))
        pool = ChannelPool("native")
        ch = pool.get(f"127.0.0.1:{state['port']}")
        stub = meta_pb2_grpc.MetaServiceStub(ch)
        req = meta_pb2.GetAttrRequest(user=common_pb2.UserInfo(uid=0, gid=0), inode=1)
        for _ in range(2000):
            await stub.GetAttr(req, timeout=10)
        gc.collect()
        base = len(gc.get_objects())
        print(
            f"growth over {n} calls via {ch.via}: {base} objects, RSS {rss_mib():.1f} MiB at the start"
        )
        for seg in range(5):
            t0 = time.perf_counter()
            for _ in range(n // 5):
                await stub.GetAttr(req, timeout=10)
            c = ch._conn
            sc = next(iter(state["server"].native._connections))
            db = state["db"]
            print(
                f"  {(seg + 1) * (n // 5):>7} calls ({n // 5 / (time.perf_counter() - t0):,.0f}/s): "
                f"objects {len(gc.get_objects()) - base:+d}, RSS {rss_mib():.1f} MiB; client "
                f"pending {len(c._pending)} deadlines {len(c._deadlines)} dests {len(c._dests)} "
                f"streams {len(c._streams)}; server calls {len(sc._calls)} bytes "
                f"{sc._inflight_bytes}; kv active {len(db._active)} commits {len(db._commits)}"
            )
        await pool.close()

    run(calls())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000, help="sequential calls per transport")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians reported)")
    ap.add_argument("--inflight-calls", type=int, default=12800)
    ap.add_argument("--mib", type=int, default=200, help="1 MiB transfers per direction")
    ap.add_argument("--out", help="append the table to this markdown file")
    ap.add_argument("--serve-bulk", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-plain", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--plain-uds", help=argparse.SUPPRESS)
    ap.add_argument("--serve-floor", type=int, help=argparse.SUPPRESS)
    ap.add_argument(
        "--growth",
        type=int,
        metavar="N",
        help="only check that nothing grows per call: N GetAttr on one connection (--uds: Unix)",
    )
    ap.add_argument("--uds", action="store_true", help="with --growth: over the Unix socket")
    ap.add_argument(
        "--paths",
        type=int,
        metavar="N",
        help="only the in-process per-call cost of the server and client paths (N calls x 5)",
    )
    args = ap.parse_args()
    if args.paths:
        server_us, meta_us, sqlite_us, client_us, bulk_us = run(path_costs(args.paths))
        print(
            f"native paths (commit {_commit()}, in process, no sockets, load "
            f"{os.getloadavg()[0]:.1f}): server {server_us:.2f} µs/call (fixed answer), "
            f"{meta_us:.2f} µs/call (meta servicer, memory KV), {sqlite_us:.2f} µs/call "
            f"(meta servicer, SQLite KV), client {client_us:.2f} µs/call, "
            f"server receiving a 1 MiB payload {bulk_us:.1f} µs/call"
        )
        return 0
    if args.growth:
        growth(args.growth, args.uds)
        return 0
    if args.serve_bulk:
        serve_bulk(args.serve_bulk)
        return 0
    if args.serve_plain:
        serve_plain(args.serve_plain, args.plain_uds)
        return 0
    if args.serve_floor:
        serve_floor(args.serve_floor)
        return 0

    load0 = os.getloadavg()[0]
    procs: list[subprocess.Popen[Any]] = []
    tmp = tempfile.TemporaryDirectory(prefix="fs3-rpcbench-")
    try:
        meta_port, grpc_port, bulk_port, plain_port, floor_port = (free_port() for _ in range(5))
        plain_uds = str(Path(tmp.name) / "plain.sock")
        cfg = Path(tmp.name) / "meta.toml"
        cfg.write_text(
            f'[node]\nport = {meta_port}\n[kv]\nurl = "memory://"\n'
            f'[log]\nlevel = "WARNING"\n[rpc]\ngrpc_port = {grpc_port}\n'
        )
        procs.append(spawn(["-m", "fs3.cli.main", "meta", "--config", str(cfg)]))
        procs.append(spawn([__file__, "--serve-bulk", str(bulk_port)]))
        procs.append(spawn([__file__, "--serve-plain", str(plain_port), "--plain-uds", plain_uds]))
        procs.append(spawn([__file__, "--serve-floor", str(floor_port)]))
        for port, p in zip((meta_port, bulk_port, plain_port, floor_port), procs, strict=True):
            wait_port(port, p)
        meta_pid, bulk_pid, plain_pid, floor_pid = (p.pid for p in procs)
        meta_addr = f"127.0.0.1:{meta_port}"
        bulk_addr = f"127.0.0.1:{bulk_port}"
        rows: dict[str, Any] = {}

        async def measure() -> None:
            # every transport's stub, opened once; the rounds interleave them
            grpc_channels = [
                insecure_channel(f"127.0.0.1:{grpc_port}"),
                insecure_channel(meta_addr),
            ]
            pools = {}
            stubs: dict[str, Any] = {
                "grpc": meta_pb2_grpc.MetaServiceStub(grpc_channels[0]),
                "grpc-relay": meta_pb2_grpc.MetaServiceStub(grpc_channels[1]),
            }
            bulk_stubs = {}
            for name, uds in (("native-tcp", False), ("native-uds", True)):
                settings.configure(RpcSection(unix_sockets=uds))  # read as channels are made
                pools[name] = ChannelPool("native")
                stubs[name] = meta_pb2_grpc.MetaServiceStub(pools[name].get(meta_addr))
                bulk_stubs[name] = storage_pb2_grpc.StorageServiceStub(pools[name].get(bulk_addr))
            t, proto = await asyncio.get_running_loop().create_connection(
                _FloorProtocol, "127.0.0.1", floor_port
            )
            stubs["native-fixed"] = meta_pb2_grpc.MetaServiceStub(
                pools["native-tcp"].get(bulk_addr)
            )
            stubs["floor-echo"] = FloorStub(proto)
            pids = {name: meta_pid for name in stubs} | {
                "native-fixed": bulk_pid,
                "floor-echo": floor_pid,
            }
            seq: dict[str, list[tuple[float, float, float]]] = {name: [] for name in stubs}
            inflight: dict[str, list[float]] = {name: [] for name in stubs if name != "floor-echo"}
            for _ in range(args.rounds):
                for name, stub in stubs.items():
                    n = max(500, args.calls // 4) if name.startswith("grpc") else args.calls
                    seq[name].append(await seq_calls(stub, n, pids[name]))
            for _ in range(args.rounds):
                for name in inflight:
                    n = args.inflight_calls
                    if name.startswith("grpc"):
                        n = max(640, n // 8)
                    inflight[name].append(await inflight_calls(stubs[name], n))
            for name in ("native-tcp", "native-uds"):
                via = pools[name].get(meta_addr).via
                assert via == ("unix" if name == "native-uds" else "tcp"), via
            for name, per in seq.items():
                rows[name] = {
                    "seq": median([x[0] for x in per]),
                    "cpu": median([x[1] for x in per]),
                    "scpu": median([x[2] for x in per]),
                    "ratios": [x[0] / g[0] for x, g in zip(per, seq["grpc"], strict=True)],
                    "per": per,
                }
                if name in inflight:
                    rows[name]["inflight"] = median(inflight[name])
                    rows[name]["inflight_runs"] = inflight[name]
            t.close()
            for ch in grpc_channels:
                await ch.close()
            # 1 MiB transfers, interleaved like the calls: every round measures the
            # native transports and the plain loops one after the other
            for name, pool in pools.items():
                await bulk_native(bulk_stubs[name], 5, bulk_pid)  # connect, warm up
                assert pool.get(bulk_addr).via == pool.get(meta_addr).via
            for _ in range(args.rounds):
                for name in pools:
                    bulk[name].append(await bulk_native(bulk_stubs[name], args.mib, bulk_pid))
                bulk["plain-socket"].append(bulk_plain(plain_port, args.mib, plain_pid))
                bulk["plain-uds"].append(bulk_plain(plain_port, args.mib, plain_pid, plain_uds))
            for pool in pools.values():
                await pool.close()

        bulk: dict[str, list[Bulk]] = {name: [] for name in BULK_NAMES}
        run(measure())
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        tmp.cleanup()

    lines = [
        f"RPC benchmark {time.strftime('%Y-%m-%d %H:%M:%S')} (commit {_commit()}), client on uvloop, "
        f"{args.rounds} interleaved rounds (medians) of {args.calls} sequential meta GetAttr "
        f"and {args.inflight_calls} with 64 in flight, "
        f"{args.mib} x 1 MiB each way per round, load {load0:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end",
        "",
        "| transport | seq calls/s | × grpc | client CPU µs/call | server CPU µs/call "
        "| 64 in flight calls/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    names = ("grpc", "grpc-relay", "native-tcp", "native-uds", "native-fixed", "floor-echo")
    for name in names:
        r = rows[name]
        infl = f"{r['inflight']:,.0f}" if "inflight" in r else "-"
        lines.append(
            f"| {name} | {r['seq']:,.0f} | {median(r['ratios']):.1f} | {r['cpu']:.0f} "
            f"| {r['scpu']:.0f} | {infl} |"
        )
    lines.append("")
    for name in names:
        r = rows[name]
        lines.append(
            f"* {name}: sequential calls/s per round: "
            + ", ".join(f"{x[0]:,.0f}" for x in r["per"])
            + "; server CPU µs/call per round: "
            + ", ".join(f"{x[2]:.0f}" for x in r["per"])
        )
    for name in names[1:]:
        r = rows[name]
        per = ", ".join(f"{x:.1f}" for x in r["ratios"])
        extra = ""
        if "inflight_runs" in r:
            extra = "; 64 in flight calls/s per round: " + ", ".join(
                f"{x:,.0f}" for x in r["inflight_runs"]
            )
        lines.append(f"* {name}: × grpc per round: {per}{extra}")
    lines += ["", *bulk_table(bulk, args.mib)]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")
    return 0


BULK_NAMES = ("native-tcp", "native-uds", "plain-socket", "plain-uds")


def bulk_table(bulk: dict[str, list[Bulk]], mib: int) -> list[str]:
    """The 1 MiB rows: medians over the rounds; a ratio is the median of the
    per-round ratios (both figures of a ratio come from the same round)."""

    def ratio(name: str, base: str, op: str) -> float:
        return median(a[op][0] / b[op][0] for a, b in zip(bulk[name], bulk[base], strict=True))

    lines = [
        f"1 MiB transfers, {len(bulk['plain-socket'])} interleaved rounds of {mib} each way "
        "(CPU: client / server µs per MiB)",
        "",
        "| transport | write MB/s | × plain | × plain-uds | write CPU | read MB/s | × plain "
        "| × plain-uds | read CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in BULK_NAMES:
        cells = [name]
        for op in ("w", "r"):
            runs = bulk[name]
            cells.append(f"{median(x[op][0] for x in runs):,.0f}")
            for base in ("plain-socket", "plain-uds"):
                cells.append("-" if name == base else f"{ratio(name, base, op):.2f}")
            cpu_c = median(x[op][1] for x in runs)
            cpu_s = median(x[op][2] for x in runs)
            cells.append(f"{cpu_c:.0f} / {cpu_s:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for name in BULK_NAMES[:2]:
        for op, what in (("w", "write"), ("r", "read")):
            runs = bulk[name]
            lines.append(
                f"* {name} {what}: MB/s per round: "
                + ", ".join(f"{x[op][0]:,.0f}" for x in runs)
                + "; × plain per round: "
                + ", ".join(
                    f"{a[op][0] / b[op][0]:.2f}"
                    for a, b in zip(runs, bulk["plain-socket"], strict=True)
                )
                + "; × plain-uds per round: "
                + ", ".join(
                    f"{a[op][0] / b[op][0]:.2f}"
                    for a, b in zip(runs, bulk["plain-uds"], strict=True)
                )
            )
    return lines


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
