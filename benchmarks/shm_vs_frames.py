#!/usr/bin/env python3
"""4 KiB random reads over shm (one-sided) and over native frames, on one cluster, interleaved.

Why: a USRBIO read lands in a registered region, which ``auto`` moves one-sided
(the storage node ``preadv``s into the client's shared memory) and ``tcp`` moves
as the native RPC frame's payload. The one-sided path should never cost more
per read than the frame path; this measures both in the same run against the
same storage processes (``fs3.testing.procs.MiniCluster``: 3 nodes, one
3-replica chain, fsync on) through the production storage client
(:class:`fs3.client.chunk_client.ChunkClient`), page-cache warm, with 64 reads
in flight, and prints per round: IOPS, median latency, CPU microseconds per
read of this client and of the storage nodes together, reads per batch.

Usage: python benchmarks/shm_vs_frames.py [--seconds 4] [--rounds 3] [--chunks 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from storage_io import INODE, MiB, cpu_seconds, wait_serving  # noqa: E402

from fs3.client.chunk_client import ChunkClient  # noqa: E402
from fs3.client.mgmtd_client import MgmtdClient  # noqa: E402
from fs3.testing.procs import MiniCluster  # noqa: E402
from fs3.transport import ShmRegion  # noqa: E402

DEPTH = 64


async def rand_reads(
    cl: ChunkClient, chain: int, chunks: int, bufs: list[memoryview], secs: float, seed: int
) -> tuple[float, float, int]:
    """(IOPS, median latency in s, reads) of DEPTH readers of 4 KiB for ``secs``."""
    rng = random.Random(seed)
    lat: list[float] = []
    stop = time.perf_counter() + secs

    async def reader(k: int) -> None:
        while time.perf_counter() < stop:
            i, off = rng.randrange(chunks), rng.randrange(0, MiB // 4096) * 4096
            t = time.perf_counter()
            data, _ = await cl.read(chain, INODE, i, off, 4096, into=bufs[k])
            if len(data) != 4096:
                raise OSError(f"short read {len(data)}")
            lat.append(time.perf_counter() - t)

    t = time.perf_counter()
    await asyncio.gather(*(reader(k) for k in range(DEPTH)))
    return len(lat) / (time.perf_counter() - t), statistics.median(lat), len(lat)


async def run(secs: float, rounds: int, chunks: int, workdir: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="fs3-shm-vs-frames-", dir=workdir))
    try:
        with MiniCluster(root, nodes=3, transport="auto", fsync=True) as mc:
            nodes = {n: p.pid for n, p in mc.running.items() if n.startswith("storage")}
            admin = MgmtdClient.from_cluster_file(
                str(mc.cluster_file), timeout_s=5.0, retry_deadline_s=30.0
            )
            clients = {
                k: ChunkClient(admin, k, retry_deadline_s=60, rpc_timeout_s=60)
                for k in ("auto", "tcp")
            }
            region = ShmRegion.create(DEPTH * 4096, prefix="fs3-bench")
            try:
                chain = (await wait_serving(admin)).chains()[0].chain_id
                for c in clients.values():
                    await c.refresh()
                block = os.urandom(MiB)
                for i in range(chunks):
                    await clients["tcp"].write(chain, INODE, i, 0, block, chunk_size=MiB)
                await clients["auto"].transport.register_region(region)
                bufs = {
                    "auto": [region.buf[k * 4096 : (k + 1) * 4096] for k in range(DEPTH)],
                    "tcp": [memoryview(bytearray(4096)) for _ in range(DEPTH)],
                }
                res: dict[str, list[float]] = {k: [] for k in clients}
                for r in range(rounds):
                    for kind, cl in clients.items():
                        me, before = (
                            cpu_seconds(os.getpid()),
                            {n: cpu_seconds(p) for n, p in nodes.items()},
                        )
                        st0 = cl.storage.read_batch_stats()
                        iops, lat, n = await rand_reads(cl, chain, chunks, bufs[kind], secs, r)
                        st1 = cl.storage.read_batch_stats()
                        client_us = (cpu_seconds(os.getpid()) - me) / n * 1e6
                        storage_us = (
                            sum(cpu_seconds(p) - before[x] for x, p in nodes.items()) / n * 1e6
                        )
                        per = (st1["ios"] - st0["ios"]) / max(1, st1["rpcs"] - st0["rpcs"])
                        res[kind].append(iops)
                        print(
                            f"round {r} {kind:4s} {iops:8.0f} IOPS  median {lat * 1e3:6.2f} ms  "
                            f"client {client_us:4.0f} us/io  storage {storage_us:4.0f} us/io  "
                            f"ios/batch {per:5.1f}  load {os.getloadavg()[0]:.1f}",
                            flush=True,
                        )
                for kind, v in res.items():
                    print(kind, "median IOPS", round(statistics.median(v)))
            finally:
                for c in clients.values():
                    await c.close()
                await admin.close()
                region.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=32, help="1 MiB chunks written first")
    ap.add_argument("--workdir", default="/tmp")
    a = ap.parse_args(argv)
    asyncio.run(run(a.seconds, a.rounds, a.chunks, a.workdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
