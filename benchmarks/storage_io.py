#!/usr/bin/env python3
"""Storage I/O benchmark: the chunk path with 3 replicas on one host, per transport.

For each transport (auto, grpc, shm; tcp is an alias of grpc) it starts one
``fs3 mgmtd`` and three ``fs3 storage`` processes (fsync on, one target each,
one 3-replica chain), then through :class:`fs3.client.chunk_client.ChunkClient`
(the production storage client, chunk by chunk):

- sequential write of SIZE in 1 MiB requests (1 MiB chunks, ``--depth`` in flight),
- sequential read of the same data in 1 MiB requests,
- random 4 KiB reads for ``--rand-seconds`` (``--rand-depth`` in flight, 64 by default),

and the CPU seconds each process spent per GiB (per 4 KiB read for the random
phase): this client and the storage nodes, read from /proc/<pid>/stat.

For shm and auto the buffers are slices of one registered shared-memory region,
as with USRBIO Iovs (the zero-copy path); grpc uses ordinary buffers (over the
native RPC its bytes are the frame's payload, received straight into them). And,
in the same run on the same disk, the direct baseline with os.pwrite
(+ fdatasync per 1 MiB, the durability the storage path gives) and os.pread.
Reads are page-cache warm on both sides (no cache dropping: other work shares
this host). Prints MB/s, IOPS and the ratio to the direct figures.

With ``--runs N`` everything (direct baseline included) runs N times and the
median of each figure is reported (the host may be shared: medians are steadier).

Usage: python benchmarks/storage_io.py [--size-mb 1024] [--transports auto,grpc,shm]
       [--depth 8] [--rand-seconds 10] [--rand-depth 64] [--runs 1] [--dir /tmp] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fs3.client.chunk_client import ChunkClient
from fs3.client.mgmtd_client import MgmtdClient
from fs3.errors import Code, FsError
from fs3.routing import SERVING, Routing
from fs3.testing.procs import MiniCluster
from fs3.transport import ShmRegion

MiB = 1 << 20
INODE = 0x0100_0000_0000_0001


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class CpuMeter:
    """CPU seconds each process (this client, every storage node) spent in a phase."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start: dict[str, float] = {}

    def start(self) -> None:
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) - self._start[name] for name, pid in self.pids.items()}


def cpu_figures(prefix: str, used: dict[str, float], per: float) -> dict[str, float]:
    """``used`` CPU seconds divided by ``per`` (GiB or I/Os): the client's and the storage nodes' sum."""
    storage = sum(v for k, v in used.items() if k.startswith("storage"))
    return {f"{prefix}_client": used["client"] / per, f"{prefix}_storage": storage / per}


def direct_baseline(root: Path, size: int, rand_s: float) -> dict[str, float]:
    path = root / "direct.bin"
    buf = os.urandom(MiB)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t = time.perf_counter()
        for off in range(0, size, MiB):
            os.pwrite(fd, buf, off)
            os.fdatasync(fd)
        w = time.perf_counter() - t
        t = time.perf_counter()
        for off in range(0, size, MiB):
            os.pread(fd, MiB, off)
        r = time.perf_counter() - t
        rng = random.Random(1)
        n = 0
        t = time.perf_counter()
        end = t + rand_s
        while time.perf_counter() < end:
            for _ in range(256):
                os.pread(fd, 4096, rng.randrange(0, size // 4096) * 4096)
            n += 256
        rr = time.perf_counter() - t
    finally:
        os.close(fd)
        path.unlink()
    return {"write_MBps": size / w / 1e6, "read_MBps": size / r / 1e6, "rand4k_iops": n / rr}


async def wait_serving(admin: MgmtdClient, timeout_s: float = 60.0) -> Routing:
    deadline = time.monotonic() + timeout_s
    created = False
    while True:
        info = await admin.get_routing(0)
        r = Routing(info) if info is not None else Routing.empty()
        if not created and all(r.has_target(t) for t in (101, 201, 301)):
            try:
                await admin.create_chain_table(1, 3)
                created = True
            except FsError as e:  # a target registered but its first heartbeat not yet seen
                if e.code != Code.CANNOT_SATISFY:
                    raise
        chains = r.chains()
        if (
            created
            and chains
            and all(
                len(c.targets) == 3 and all(t.public_state == SERVING for t in c.targets)
                for c in chains
            )
        ):
            return r
        if time.monotonic() > deadline:
            raise TimeoutError("cluster did not become serving")
        await asyncio.sleep(0.1)


async def bench_transport(
    root: Path, transport: str, size: int, depth: int, rand_s: float, rand_depth: int = 64
) -> dict[str, float]:
    with MiniCluster(root / transport, nodes=3, transport=transport, fsync=True) as mc:
        admin = MgmtdClient.from_cluster_file(
            str(mc.cluster_file), timeout_s=5.0, retry_deadline_s=30.0
        )
        cl = ChunkClient(admin, transport, retry_deadline_s=60.0, rpc_timeout_s=60.0)
        region: ShmRegion | None = None
        cpu = CpuMeter(
            {"client": os.getpid()}
            | {name: p.pid for name, p in mc.running.items() if name.startswith("storage")}
        )
        try:
            r = await wait_serving(admin)
            chain = r.chains()[0].chain_id
            await cl.refresh()
            n = size // MiB
            sem = asyncio.Semaphore(depth)
            if transport in ("shm", "auto"):  # USRBIO-style: every buffer in one registered region
                region = ShmRegion.create((1 + 2 * depth) * MiB, prefix="fs3-bench")
                await cl.transport.register_region(region)
                slices = [region.buf[i * MiB : (i + 1) * MiB] for i in range(1 + 2 * depth)]
            else:
                slices = [memoryview(bytearray(MiB)) for _ in range(1 + 2 * depth)]
            buf = slices[0]
            buf[:] = os.urandom(MiB)

            async def w(i: int) -> None:
                async with sem:
                    await cl.write(chain, INODE, i, 0, buf, chunk_size=MiB)

            cpu.start()
            t = time.perf_counter()
            await asyncio.gather(*(w(i) for i in range(n)))
            wt = time.perf_counter() - t
            w_cpu = cpu.stop()

            dests = slices[1 : 1 + depth]
            free = list(range(depth))

            async def rd(i: int) -> None:
                async with sem:
                    slot = free.pop()
                    try:
                        data, _ = await cl.read(chain, INODE, i, 0, MiB, into=dests[slot])
                        assert len(data) == MiB
                    finally:
                        free.append(slot)

            cpu.start()
            t = time.perf_counter()
            await asyncio.gather(*(rd(i) for i in range(n)))
            rt = time.perf_counter() - t
            r_cpu = cpu.stop()

            rng = random.Random(2)
            small = [
                s[k * 4096 : (k + 1) * 4096]
                for s in slices[1 + depth :]
                for k in range(MiB // 4096)
            ][:rand_depth]
            count = 0
            stop_at = time.perf_counter() + rand_s

            async def rand_worker(k: int) -> None:
                nonlocal count
                while time.perf_counter() < stop_at:
                    i = rng.randrange(n)
                    off = rng.randrange(0, MiB // 4096) * 4096
                    data, _ = await cl.read(chain, INODE, i, off, 4096, into=small[k])
                    assert len(data) == 4096
                    count += 1

            cpu.start()
            t = time.perf_counter()
            await asyncio.gather(*(rand_worker(k) for k in range(rand_depth)))
            rrt = time.perf_counter() - t
            rr_cpu = cpu.stop()
            batches = cl.storage.read_batch_stats()
            gib = size / (1 << 30)
            return {
                "write_MBps": size / wt / 1e6,
                "read_MBps": size / rt / 1e6,
                "rand4k_iops": count / rrt,
                "ios_per_batch": batches["ios"] / max(1, batches["rpcs"]),
                **cpu_figures("write_cpu_s_per_GiB", w_cpu, gib),
                **cpu_figures("read_cpu_s_per_GiB", r_cpu, gib),
                **cpu_figures(
                    "rand4k_cpu_us_per_io", {k: v * 1e6 for k, v in rr_cpu.items()}, count
                ),
            }
        finally:
            await cl.close()
            await admin.close()
            if region is not None:
                region.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--transports", default="auto,grpc,shm")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--rand-seconds", type=float, default=10.0)
    ap.add_argument("--rand-depth", type=int, default=64, help="4 KiB reads in flight")
    ap.add_argument("--runs", type=int, default=1, help="repeat everything; report medians")
    ap.add_argument(
        "--dir", default=None, help="where targets and the direct file live (default: a temp dir)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    size = args.size_mb * MiB
    root = Path(tempfile.mkdtemp(prefix="fs3-bench-", dir=args.dir))
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        for _ in range(max(1, args.runs)):
            runs.setdefault("direct", []).append(direct_baseline(root, size, args.rand_seconds))
            for tr in [t.strip() for t in args.transports.split(",") if t.strip()]:
                runs.setdefault(tr, []).append(
                    asyncio.run(
                        bench_transport(
                            root, tr, size, args.depth, args.rand_seconds, args.rand_depth
                        )
                    )
                )
                shutil.rmtree(root / tr, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    d = results["direct"]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(
        f"storage_io: {args.size_mb} MiB, 1 MiB requests, depth {args.depth}, 3 replicas, fsync on, "
        f"{os.cpu_count()} cores, median of {max(1, args.runs)} run(s)"
    )
    print(
        f"{'path':8} {'seq write MB/s':>15} {'seq read MB/s':>14} {'4K rand IOPS':>13}   ratios to direct (w/r/iops)"
    )
    for name, v in results.items():
        ratio = (
            ""
            if name == "direct"
            else (
                f"   {v['write_MBps'] / d['write_MBps']:.2f} / {v['read_MBps'] / d['read_MBps']:.3f} / "
                f"{v['rand4k_iops'] / d['rand4k_iops']:.4f}"
            )
        )
        print(
            f"{name:8} {v['write_MBps']:15.1f} {v['read_MBps']:14.1f} {v['rand4k_iops']:13.0f}{ratio}"
        )
    print(
        f"\nCPU per process (client = this process; storage = the three nodes together)\n"
        f"{'path':8} {'write s/GiB c/s':>18} {'read s/GiB c/s':>18} {'4K rand us/io c/s':>20}"
    )
    for name, v in results.items():
        if name == "direct":
            continue
        cols = [
            f"{v[f'{fig}_client']:.2f} / {v[f'{fig}_storage']:.2f}"
            for fig in ("write_cpu_s_per_GiB", "read_cpu_s_per_GiB")
        ]
        rand = f"{v['rand4k_cpu_us_per_io_client']:.0f} / {v['rand4k_cpu_us_per_io_storage']:.0f}"
        print(f"{name:8} {cols[0]:>18} {cols[1]:>18} {rand:>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
