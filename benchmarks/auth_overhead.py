"""What authentication costs per call: the same server with and without the cluster secret.

    .venv/bin/python benchmarks/auth_overhead.py [--calls 3000] [--rounds 3] [--out FILE.md]

Two server processes (``RpcServer`` serving a scripted ``MetaService.StatFs`` that
answers at once, so the transport and the guard are all that is measured): one
without ``[rpc] secret_file`` (no authentication), one with it. The client (this
process, uvloop) makes ``--calls`` sequential calls with a user token whose
identity matches the request (so the identity check runs too) over native TCP,
native Unix socket and gRPC, alternating servers round by round; the figure is the
median calls/s of each and the ratio authenticated / unauthenticated.
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


async def _calls(transport: str, address: str, token: str, n: int) -> float:
    from fs3.config import RpcSection
    from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc
    from fs3.rpc import auth, settings
    from fs3.rpc.channel import ChannelPool, call

    settings.configure(RpcSection(unix_sockets=transport != "native-tcp"))
    pool = ChannelPool("grpc" if transport == "grpc" else "native", auth.Credential(token=token))
    try:
        stub = meta_pb2_grpc.MetaServiceStub(pool.get(address))
        req = meta_pb2.StatFsRequest(user=common_pb2.UserInfo(uid=1000, gid=1000, groups=[1000]))
        for _ in range(50):  # connect, warm up
            await call(stub.StatFs, req, timeout=10)
        t0 = time.perf_counter()
        for _ in range(n):
            await call(stub.StatFs, req, timeout=10)
        return n / (time.perf_counter() - t0)
    finally:
        await pool.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
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
    res: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(args.rounds):
            for t in transports:
                for kind, addr in (("off", plain_addr), ("on", auth_addr)):
                    res.setdefault((t, kind), []).append(run(_calls(t, addr, token, args.calls)))
    finally:
        for p in (plain, authd):
            p.kill()
            p.wait()
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    load = os.getloadavg()
    lines = [
        f"auth overhead: {args.calls} sequential StatFs calls x {args.rounds} rounds, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "",
        "| transport | no auth calls/s | auth calls/s | ratio |",
        "|---|---|---|---|",
    ]
    for t in transports:
        off = statistics.median(res[(t, "off")])
        on = statistics.median(res[(t, "on")])
        lines.append(f"| {t} | {off:,.0f} | {on:,.0f} | {on / off:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
