#!/usr/bin/env python
"""Where a large USRBIO read's time goes: disk requests, queue depth and each process's CPU.

Why beside ``benchmarks/ckpt.py``: an ``fs3.ckpt`` load is a raw USRBIO read
plus a little metadata, and when it runs below the disk's ``O_DIRECT`` speed
the question is which part holds it back: the disk (are the reads reaching it
as large ``O_DIRECT`` requests, at what queue depth?), a process's CPU (storage
nodes, the FUSE daemon with the USRBIO agent, this process), or the replica
choice (three replicas on one disk). This script answers that for one cluster,
interleaving in every round:

* ``local``: ``O_DIRECT`` reads of a local file of the same size on the same
  disk, the same I/O size and depth from threads (the disk's speed here);
* one raw USRBIO read of the fs3 file per ``--shapes`` entry (``IO_MiB x in
  flight x rings``), into a registered buffer reused ring-fashion, as
  ``benchmarks/ckpt.py``'s raw read does;

with the page cache dropped before each. For every read it reports GB/s, the
disk's read requests from ``/proc/diskstats`` (count, average size, average
queue depth = time-weighted requests in flight over the elapsed time, merges)
and CPU seconds per GiB of each process (``/proc/PID/stat``).

The cluster is ``benchmarks/ckpt.py``'s (3 storage nodes x 1 target, 3
replicas, fsync on, shm transport, FUSE mount); the file is written through
the mount with 1 MiB writes and fsync'd. Everything it starts is stopped on exit.

    .venv/bin/python benchmarks/ckpt_read_probe.py --size-mib 512 --rounds 3 \
        --shapes 4x32x4,1x8x1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ckpt import usrbio_read  # noqa: E402 - the raw read benchmarks/ckpt.py measures

from fs3.cli.bench import drop_caches  # noqa: E402
from fs3.testing.cluster import ProcessCluster  # noqa: E402

MiB = 1 << 20
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def disk_of(path: str) -> str:
    """The block device name (``/proc/diskstats``) holding ``path``: the whole disk."""
    dev = os.stat(path).st_dev
    name = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve().name
    part = Path(f"/sys/class/block/{name}/partition")
    if part.exists():  # a partition: its disk's queue is the one that matters
        name = Path(f"/sys/class/block/{name}").resolve().parent.name
    return name


def diskstats(name: str) -> tuple[int, int, int, int]:
    """(reads completed, reads merged, sectors read, weighted ms in queue) of ``name``."""
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == name:
                return int(p[3]), int(p[4]), int(p[5]), int(p[13])
    raise LookupError(f"no {name} in /proc/diskstats")


def local_read(path: str, io: int, inflight: int) -> None:
    """Read ``path`` with O_DIRECT, ``io`` bytes per read, ``inflight`` threads."""
    import mmap

    size = os.path.getsize(path)
    offs = list(range(0, size, io))[::-1]
    lock = threading.Lock()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)

    def worker() -> None:
        buf = mmap.mmap(-1, io)  # page aligned
        try:
            while True:
                with lock:
                    if not offs:
                        return
                    off = offs.pop()
                os.preadv(fd, [buf], off)
        finally:
            buf.close()

    try:
        with ThreadPoolExecutor(inflight) as ex:
            for f in [ex.submit(worker) for _ in range(inflight)]:
                f.result()
    finally:
        os.close(fd)


def write_file(path: str, size: int) -> None:
    """``size`` bytes of a fixed pseudo-random pattern, 1 MiB writes, fsync'd."""
    block = os.urandom(MiB)
    with open(path, "wb", buffering=0) as f:
        for off in range(0, size, MiB):
            f.write(block[: min(MiB, size - off)])
        os.fsync(f.fileno())


def parse_shape(s: str) -> tuple[int, int, int]:
    io, inflight, rings = (int(x) for x in s.lower().split("x"))
    return io * MiB, inflight, rings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size-mib", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--shapes", default="4x32x4", help="USRBIO reads, IO_MiB x in flight x rings (comma list)"
    )
    p.add_argument("--local", default="4x8", help="local O_DIRECT read, IO_MiB x threads")
    p.add_argument("--workdir", default=None)
    a = p.parse_args(argv)
    from fs3.usrbio import Iov

    size = a.size_mib * MiB
    shapes = [parse_shape(s) for s in a.shapes.split(",")]
    lio, lthreads = (int(x) for x in a.local.lower().split("x"))
    work = Path(tempfile.mkdtemp(prefix="fs3-ckpt-probe-", dir=a.workdir))
    dev = disk_of(str(work))
    cluster = ProcessCluster(
        work / "cluster",
        storage_nodes=3,
        targets_per_node=1,
        meta=1,
        mgmtd=1,
        transport="shm",
        mount=str(work / "mnt"),
    )
    results: dict[str, list[dict[str, float]]] = {}
    try:
        cluster.start()
        mnt = str(work / "mnt")
        pids = {n: cluster.pid(n) for n in cluster.names if n.startswith(("storage", "fuse"))}
        pids["bench"] = os.getpid()
        fs3_file = os.path.join(mnt, "probe.bin")
        local_file = str(work / "local.bin")
        write_file(fs3_file, size)
        write_file(local_file, size)
        slot_bytes = max(io * inflight for io, inflight, _ in shapes)
        iov = Iov(mnt, slot_bytes)
        iov.buf[:] = bytes(len(iov.buf))  # touched: a warm buffer, as a load's
        reads: dict[str, Any] = {
            f"local {lio}MiBx{lthreads}": lambda: local_read(local_file, lio * MiB, lthreads)
        }
        for io, inflight, rings in shapes:
            reads[f"usrbio {io // MiB}MiBx{inflight}x{rings}"] = (
                lambda io=io, inflight=inflight, rings=rings: usrbio_read(
                    mnt, fs3_file, iov, io, inflight, rings
                )
            )
        for fn in reads.values():  # warm-up (not measured)
            drop_caches()
            fn()
        for r in range(a.rounds):
            names = list(reads)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                drop_caches()
                d0, c0 = diskstats(dev), {k: cpu_seconds(v) for k, v in pids.items()}
                t0 = time.perf_counter()
                reads[name]()
                dt = time.perf_counter() - t0
                d1, c1 = diskstats(dev), {k: cpu_seconds(v) for k, v in pids.items()}
                nreq, merged, sectors, wms = (x1 - x0 for x0, x1 in zip(d0, d1, strict=True))
                gib = size / (1 << 30)
                row = {
                    "GB/s": size / dt / 1e9,
                    "s": dt,
                    "disk reads": nreq,
                    "avg KiB": sectors * 512 / 1024 / max(1, nreq),
                    "merged": merged,
                    "avg queue": wms / 1000 / dt,
                    "load": os.getloadavg()[0],
                }
                for k in pids:
                    row[f"cpu {k}"] = (c1[k] - c0[k]) / gib
                results.setdefault(name, []).append(row)
                print(
                    f"round {r + 1} {name}: " + ", ".join(f"{k}={v:.2f}" for k, v in row.items()),
                    flush=True,
                )
        iov.close()
    finally:
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    cols = list(next(iter(results.values()))[0])
    print(f"\nmedians of {a.rounds} rounds, {a.size_mib} MiB, disk {dev}, CPU-s per GiB:\n")
    print("| read | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, rows in results.items():
        print(
            f"| {name} | "
            + " | ".join(f"{statistics.median(x[c] for x in rows):.2f}" for c in cols)
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
