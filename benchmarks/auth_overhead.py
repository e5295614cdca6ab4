"""What authentication costs per call: the same server with and without the cluster secret.

    .venv/bin/python benchmarks/auth_overhead.py [--calls 6000] [--batch 200] [--out FILE.md]

Two server processes (``RpcServer`` serving a scripted ``MetaService.StatFs`` that
answers at once, so the transport and the guard are all that is measured): one
without ``[rpc] secret_file`` (no authentication), one with it. The client (this
process, uvloop) makes ``--calls`` sequential calls to each with a user token whose
identity matches the request (so the identity check runs too) over native TCP,
native Unix socket and gRPC, alternating between the servers every ``--batch``
calls (the shared machine's speed drifts; alternating keeps both sides in the same
conditions); the figure is the median batch calls/s of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SERVER = r"""
import asyncio, sys
from fs3.config import RpcSection
from fs3.proto import meta_pb2, meta_pb2_grpc, mgmtd_pb2
from fs3.rpc.loop import run
from fs3.rpc.server import add_servicer, bind, create_server

class Meta(meta_pb2_grpc.MetaServiceServicer):
    async def StatFs(self, request, context):
        return meta_pb2.StatFsResponse(block_size=4096)

async def main():
    server = create_server(RpcSection(secret_file=sys.argv[1]))
    if server.auth is not None:
        rec = mgmtd_pb2.UserRecord(name="bench", uid=1000, gid=1000, groups=[1000], token_id="b")
        async def lookup(name):
            return rec if name == "bench" else None
        server.auth.lookup = lookup
    add_servicer(server, meta_pb2_grpc.add_MetaServiceServicer_to_server, Meta())
    port = bind(server, "127.0.0.1", 0)
    await server.start()
    print(f"127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()

run(main())
"""


def _start(secret_file: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen(
        [sys.executable, "-c", SERVER, secret_file],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert p.stdout is not None
    return p, p.stdout.readline().strip()


async def _compare(
    transport: str, plain: str, authd: str, token: str, batches: int, batch: int
) -> tuple[list[float], list[float]]:
    """Calls/s of alternating batches to the plain and the authenticated server."""
    from fs3.config import RpcSection
    from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc
    from fs3.rpc import auth, settings
    from fs3.rpc.channel import ChannelPool, call

    settings.configure(RpcSection(unix_sockets=transport != "native-tcp"))
    kind = "grpc" if transport == "grpc" else "native"
    pools = [ChannelPool(kind, auth.Credential(token=token)) for _ in range(2)]
    stubs = [
        meta_pb2_grpc.MetaServiceStub(p.get(a)) for p, a in zip(pools, (plain, authd), strict=False)
    ]
    req = meta_pb2.StatFsRequest(user=common_pb2.UserInfo(uid=1000, gid=1000, groups=[1000]))
    rates: tuple[list[float], list[float]] = ([], [])
    try:
        for stub in stubs:  # connect, warm up
            for _ in range(100):
                await call(stub.StatFs, req, timeout=10)
        for _ in range(batches):
            for i, stub in enumerate(stubs):
                t0 = time.perf_counter()
                for _ in range(batch):
                    await call(stub.StatFs, req, timeout=10)
                rates[i].append(batch / (time.perf_counter() - t0))
    finally:
        for p in pools:
            await p.close()
    return rates


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    from fs3.rpc.loop import run
    from fs3.security.keys import create_secret
    from fs3.security.tokens import Claims, Signer

    tmp = Path(tempfile.mkdtemp(prefix="fs3-authbench-"))
    secret = create_secret(tmp / "fs3.secret")
    token = Signer(secret).sign(
        Claims(kind="user", name="bench", uid=1000, gid=1000, groups=(1000,), token_id="b")
    )
    plain, plain_addr = _start("")
    authd, auth_addr = _start(str(tmp / "fs3.secret"))
    transports = ["native-uds", "native-tcp", "grpc"]
    res: dict[str, tuple[list[float], list[float]]] = {}
    try:
        for t in transports:
            batches = args.calls // args.batch
            res[t] = run(_compare(t, plain_addr, auth_addr, token, batches, args.batch))
    finally:
        for p in (plain, authd):
            p.kill()
            p.wait()
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    load = os.getloadavg()
    lines = [
        f"auth overhead: {args.calls} sequential StatFs calls per server and transport, "
        f"in alternating batches of {args.batch}; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "",
        "| transport | no auth calls/s (median batch) | auth calls/s (median batch) | ratio |",
        "|---|---|---|---|",
    ]
    for t in transports:
        off = statistics.median(res[t][0])
        on = statistics.median(res[t][1])
        lines.append(f"| {t} | {off:,.0f} | {on:,.0f} | {on / off:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
