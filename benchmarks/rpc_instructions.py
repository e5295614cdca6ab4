#!/usr/bin/env python
"""N calls of one native RPC path in process, untimed: for counting instructions.

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.N \\
        python benchmarks/rpc_instructions.py server-meta|server-fixed|client N

Why: on a shared VM without hardware counters (``perf stat -e instructions`` is
unsupported here) and with a load that swings 3-4x, timings cannot show a
change of a few per cent; callgrind's instruction count of the same work can.
Run it for two N (say 200 and 1,200) and divide the difference of the totals
by the difference of N: the per-call count, without start-up and imports.

The paths are those of ``benchmarks/rpc.py --paths`` (which times them):
``server-*`` feeds a meta GetAttr CALL frame from a loop callback into a
``ServerConnection`` serving ``guard_servicer`` of the meta servicer (memory KV)
or of a handler answering a fixed message, and waits for the REPLY it writes;
``client`` calls a stub ``GetAttr`` over a ``ClientConnection`` whose CALL is
answered with a REPLY frame from a loop callback. The harness's own feeding and
loop turn are included in the count (the same in every tree compared). It runs
on asyncio's own loop (``asyncio.run``), as the figures in
benchmarks/results/rpc-20261202-5.md were counted: the count is of the Python
path; uvloop's C loop would add the same in every tree.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rpc import _feed, _PathTransport  # noqa: E402

from fs3.kv.memory import MemoryDatabase  # noqa: E402
from fs3.meta.operator import MetaOperator  # noqa: E402
from fs3.meta.service import MetaServicer  # noqa: E402
from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc  # noqa: E402
from fs3.rpc.native import wire  # noqa: E402
from fs3.rpc.native.client import ClientConnection, NativeChannel  # noqa: E402
from fs3.rpc.native.methods import BY_PATH  # noqa: E402
from fs3.rpc.native.server import NativeServer, ServerConnection  # noqa: E402
from fs3.rpc.server import guard_servicer  # noqa: E402

MODES = ("server-meta", "server-fixed", "client")


async def calls(mode: str, n: int) -> None:
    loop = asyncio.get_running_loop()
    req = meta_pb2.GetAttrRequest(user=common_pb2.UserInfo(uid=0, gid=0), inode=1)
    body = req.SerializeToString()
    mid = BY_PATH["/fs3.v1.MetaService/GetAttr"].id
    op = MetaOperator(MemoryDatabase())
    root = op.read_once("getattr", req)
    if mode == "client":
        reply_body = meta_pb2.AttrResponse().SerializeToString()
        channel = NativeChannel("127.0.0.1:1")
        cconn = ClientConnection(channel)

        def answer(data: bytes) -> None:
            rid = wire.HEADER.unpack_from(data)[4]
            frame = wire.pack(wire.REPLY, wire.HAS_MESSAGE, mid, rid, 0, reply_body)
            loop.call_soon(_feed, cconn, frame)

        cconn.connection_made(_PathTransport(answer))
        channel._conn = cconn
        stub = meta_pb2_grpc.MetaServiceStub(channel)
        for _ in range(n):
            await stub.GetAttr(req, timeout=10)
        return

    class Fixed(meta_pb2_grpc.MetaServiceServicer):
        async def GetAttr(self, request: Any, context: Any) -> Any:
            return root

    server = NativeServer()
    servicer = Fixed() if mode == "server-fixed" else MetaServicer(op)
    server.add_servicer("fs3.v1.MetaService", guard_servicer(servicer))
    sconn = ServerConnection(server)
    st = _PathTransport()
    sconn.connection_made(st)
    _feed(sconn, wire.PREFACE)
    for i in range(n):
        st.written = loop.create_future()
        # from a loop callback, as a socket read would come (the first step runs inline)
        loop.call_soon(
            _feed, sconn, wire.pack(wire.CALL, wire.HAS_MESSAGE, mid, i + 1, 10_000, body)
        )
        await st.written


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in MODES:
        print(__doc__)
        return 2
    asyncio.run(calls(sys.argv[1], int(sys.argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
