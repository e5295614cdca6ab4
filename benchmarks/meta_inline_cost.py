#!/usr/bin/env python
"""What a lone mutation costs on the meta server's loop vs on a worker thread, in process.

    python benchmarks/meta_inline_cost.py [--ops 300] [--rounds 3] [--kv-dir DIR]

One :class:`fs3.meta.service.MetaServicer` over a SQLite KV (``synchronous=FULL``)
on an asyncio loop with the meta server's worker threads (``use_op_threads``),
driven like one sequential client: Create (O_CREAT|O_EXCL, with a request id),
one at a time. Two servicers on the same operator take turns in blocks of
``--ops`` creates: ``inline`` (a lone mutation commits on the loop,
:meth:`MetaOperator.write_once`) and ``thread`` (``inline_reads=False``: every
mutation through ``asyncio.to_thread``, the path before). Each block reports
wall µs and process CPU µs per create (every thread of the process, so the
worker thread's share counts); the figures are medians over ``--rounds``
blocks of each. ``LONE_GAP_S`` is 0 here: this client's next create follows at
once, with no network round trip that the server's gap rule would see. No RPC and no FUSE: only the dispatch and the commit differ.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fs3.kv import open_database  # noqa: E402
from fs3.meta import service  # noqa: E402
from fs3.meta.layout import StaticChainTables  # noqa: E402
from fs3.meta.operator import MetaOperator  # noqa: E402
from fs3.meta.server import use_op_threads  # noqa: E402
from fs3.meta.service import MetaServicer  # noqa: E402
from fs3.proto import common_pb2, meta_pb2  # noqa: E402

ROOT = common_pb2.UserInfo(uid=0, gid=0)


async def block(svc: MetaServicer, prefix: str, n: int) -> tuple[float, float]:
    """``n`` sequential creates; (wall µs, CPU µs) per create."""
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    reqs = [
        meta_pb2.CreateRequest(
            user=ROOT,
            request_id=uuid.uuid4().hex,
            parent=1,
            name=f"{prefix}-{i}".encode(),
            mode=0o644,
            flags=flags,
            client_id="bench",
        )
        for i in range(n)
    ]
    c0, t0 = time.process_time(), time.perf_counter()
    for r in reqs:
        await svc.Create(r, None)
        await asyncio.sleep(0)  # a client's round trip lets the loop turn
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return 1e6 * wall / n, 1e6 * cpu / n


async def main_async(ops: int, rounds: int, kv_dir: str) -> None:
    use_op_threads(asyncio.get_running_loop())
    # One client, one create at a time, nothing else running: every create is lone. The
    # gap rule (service.LONE_GAP_S) tells that from timing, and a client in this process
    # sends the next create microseconds after the last, not a network round trip later.
    service.LONE_GAP_S = 0.0
    db = open_database(f"sqlite://{kv_dir}/kv.db")
    op = MetaOperator(db, chains=StaticChainTables({1: [1, 2, 3]}))
    kinds = {"inline": MetaServicer(op), "thread": MetaServicer(op, inline_reads=False)}
    await block(kinds["thread"], "warm", 50)
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for r in range(rounds):
        order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
        for k in order:
            got = await block(kinds[k], f"{k}{r}", ops)
            out[k].append(got)
            print(f"round {r + 1} {k:6s} wall {got[0]:7.1f} us  cpu {got[1]:7.1f} us per create")
    print(f"\n{ops} creates per block, median of {rounds} blocks; load {os.getloadavg()[0]:.2f}")
    print("| path | wall us per create | process CPU us per create |\n|---|---:|---:|")
    for k, v in out.items():
        wall = statistics.median(x[0] for x in v)
        cpu = statistics.median(x[1] for x in v)
        print(f"| {k} | {wall:.1f} | {cpu:.1f} |")
    print(f"inline mutations: {kinds['inline'].writes_inline} of {ops * rounds}")
    db.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kv-dir", default="", help="where the SQLite file goes (default: a temp dir)")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fs3-inline-", dir=a.kv_dir or None) as d:
        print(f"load {os.getloadavg()[0]:.2f}", flush=True)
        asyncio.run(main_async(a.ops, a.rounds, d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
