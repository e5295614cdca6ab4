"""RPC plane benchmark: gRPC vs the native transport (TCP and Unix socket), one run, one table.

    .venv/bin/python benchmarks/rpc.py [--calls 3000] [--mib 200] [--out FILE.md]

What it measures (client on uvloop, servers in their own processes):

* sequential small calls: calls/s and client CPU µs per call of a real fs3 method,
  meta ``GetAttr`` of the root inode on a real ``fs3 meta`` process (memory KV),
  over gRPC direct (``[rpc] grpc_port``), gRPC through the main port's relay,
  native over TCP and native over the server's Unix socket;
* 64 calls in flight on one connection (64 tasks calling in a loop): calls/s;
* 1 MiB payloads, sequential write and read: MB/s over the native transport
  (the payload travels as the frame's bulk payload, received into the
  destination buffer) against a plain Python blocking-socket ``sendall`` /
  ``recv_into`` loop on the same loopback in the same run (the ratio is the figure).
  The bulk server is a scripted StorageService (Write keeps the payload, BatchRead
  answers 1 MiB from a buffer) on the real ``RpcServer``: it measures the transport,
  not the chunk engine.

Every figure of one run comes from the same machine state; the machine is
shared, so run it several times and compare medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
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
    """A StorageService whose Write keeps the payload and BatchRead answers 1 MiB."""
    from fs3.rpc.server import add_servicer, bind, create_server

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
        bind(server, "127.0.0.1", port)
        await server.start()
        await asyncio.Event().wait()

    run(main())


def serve_plain(port: int) -> None:
    """Plain blocking sockets: 'W' n -> recv_into n bytes, ack; 'R' n -> sendall n bytes."""
    buf = bytearray(MIB)
    view = memoryview(buf)
    ls = socket.create_server(("127.0.0.1", port))
    while True:
        conn, _ = ls.accept()
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


# ----------------------------------------------------------------- measurements


async def seq_calls(stub: Any, n: int) -> tuple[float, float]:
    req = meta_pb2.GetAttrRequest(user=common_pb2.UserInfo(uid=0, gid=0), inode=1)
    for _ in range(50):  # connect, warm up
        await stub.GetAttr(req, timeout=10)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        await stub.GetAttr(req, timeout=10)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    return n / dt, dc / n * 1e6


async def inflight_calls(stub: Any, n: int, depth: int = 64) -> float:
    req = meta_pb2.GetAttrRequest(user=common_pb2.UserInfo(uid=0, gid=0), inode=1)
    await stub.GetAttr(req, timeout=10)
    per = n // depth

    async def worker() -> None:
        for _ in range(per):
            await stub.GetAttr(req, timeout=30)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(depth)))
    return per * depth / (time.perf_counter() - t0)


async def bulk_native(stub: Any, mib: int) -> tuple[float, float]:
    data = memoryview(os.urandom(MIB))
    dest = memoryview(bytearray(MIB))
    wreq = storage_pb2.WriteRequest()
    rreq = storage_pb2.BatchReadRequest()
    rreq.ios.add().length = MIB
    for _ in range(5):
        await stub.Write(wreq, timeout=30, payload=data)
        await stub.BatchRead(rreq, timeout=30, into=dest)
    t0 = time.perf_counter()
    for _ in range(mib):
        resp = await stub.Write(wreq, timeout=30, payload=data)
        assert resp.result.length == MIB
    w = mib / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(mib):
        _resp, n = await stub.BatchRead(rreq, timeout=30, into=dest)
        assert n == MIB
    r = mib / (time.perf_counter() - t0)
    assert bytes(dest[:16]) != bytes(16)
    return w * MIB / 1e6, r * MIB / 1e6


def bulk_plain(port: int, mib: int) -> tuple[float, float]:
    data = memoryview(os.urandom(MIB))
    dest = memoryview(bytearray(MIB))
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
    t0 = time.perf_counter()
    for _ in range(mib):
        one_write()
    w = mib / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(mib):
        one_read()
    r = mib / (time.perf_counter() - t0)
    s.close()
    return w * MIB / 1e6, r * MIB / 1e6


def spawn(args: list[str], **kw: Any) -> subprocess.Popen[Any]:
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000, help="sequential calls per transport")
    ap.add_argument("--inflight-calls", type=int, default=12800)
    ap.add_argument("--mib", type=int, default=200, help="1 MiB transfers per direction")
    ap.add_argument("--out", help="append the table to this markdown file")
    ap.add_argument("--serve-bulk", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-plain", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_bulk:
        serve_bulk(args.serve_bulk)
        return 0
    if args.serve_plain:
        serve_plain(args.serve_plain)
        return 0

    procs: list[subprocess.Popen[Any]] = []
    tmp = tempfile.TemporaryDirectory(prefix="fs3-rpcbench-")
    try:
        meta_port, grpc_port, bulk_port, plain_port = (free_port() for _ in range(4))
        cfg = Path(tmp.name) / "meta.toml"
        cfg.write_text(
            f'[node]\nport = {meta_port}\n[kv]\nurl = "memory://"\n'
            f'[log]\nlevel = "WARNING"\n[rpc]\ngrpc_port = {grpc_port}\n'
        )
        procs.append(spawn(["-m", "fs3.cli.main", "meta", "--config", str(cfg)]))
        procs.append(spawn([__file__, "--serve-bulk", str(bulk_port)]))
        procs.append(spawn([__file__, "--serve-plain", str(plain_port)]))
        for port, p in zip((meta_port, bulk_port, plain_port), procs, strict=True):
            wait_port(port, p)
        meta_addr = f"127.0.0.1:{meta_port}"
        bulk_addr = f"127.0.0.1:{bulk_port}"
        rows: dict[str, Any] = {}

        async def measure() -> None:
            # gRPC: direct port and through the main port's relay
            for name, addr in (("grpc", f"127.0.0.1:{grpc_port}"), ("grpc-relay", meta_addr)):
                ch = insecure_channel(addr)
                stub = meta_pb2_grpc.MetaServiceStub(ch)
                cps, cpu = await seq_calls(stub, max(500, args.calls // 4))
                inflight = await inflight_calls(stub, max(640, args.inflight_calls // 8))
                rows[name] = {"seq": cps, "cpu": cpu, "inflight": inflight}
                await ch.close()
            for name, uds in (("native-tcp", False), ("native-uds", True)):
                settings.configure(RpcSection(unix_sockets=uds))
                pool = ChannelPool("native")
                ch = pool.get(meta_addr)
                stub = meta_pb2_grpc.MetaServiceStub(ch)
                cps, cpu = await seq_calls(stub, args.calls)
                inflight = await inflight_calls(stub, args.inflight_calls)
                assert ch.via == ("unix" if uds else "tcp"), ch.via
                bstub = storage_pb2_grpc.StorageServiceStub(pool.get(bulk_addr))
                w, r = await bulk_native(bstub, args.mib)
                rows[name] = {"seq": cps, "cpu": cpu, "inflight": inflight, "w": w, "r": r}
                await pool.close()

        run(measure())
        pw, pr = bulk_plain(plain_port, args.mib)
        rows["plain-socket"] = {"w": pw, "r": pr}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        tmp.cleanup()

    g = rows["grpc"]["seq"]
    lines = [
        f"RPC benchmark {time.strftime('%Y-%m-%d %H:%M:%S')} (commit {_commit()}), client on uvloop, "
        f"{args.calls} sequential meta GetAttr, {args.inflight_calls} with 64 in flight, "
        f"{args.mib} x 1 MiB each way",
        "",
        "| transport | seq calls/s | × grpc | client CPU µs/call | 64 in flight calls/s | 1 MiB write MB/s | 1 MiB read MB/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("grpc", "grpc-relay", "native-tcp", "native-uds", "plain-socket"):
        r = rows[name]
        seq = f"{r['seq']:,.0f}" if "seq" in r else "-"
        ratio = f"{r['seq'] / g:.1f}" if "seq" in r else "-"
        cpu = f"{r['cpu']:.0f}" if "cpu" in r else "-"
        infl = f"{r['inflight']:,.0f}" if "inflight" in r else "-"
        w = (
            f"{r['w']:,.0f} ({r['w'] / pw:.2f}× plain)"
            if "w" in r and name != "plain-socket"
            else (f"{r['w']:,.0f}" if "w" in r else "-")
        )
        rd = (
            f"{r['r']:,.0f} ({r['r'] / pr:.2f}× plain)"
            if "r" in r and name != "plain-socket"
            else (f"{r['r']:,.0f}" if "r" in r else "-")
        )
        lines.append(f"| {name} | {seq} | {ratio} | {cpu} | {infl} | {w} | {rd} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")
    return 0


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
