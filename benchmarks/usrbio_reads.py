#!/usr/bin/env python3
"""USRBIO read phases alone on one fs3 cluster, with each process's CPU per phase.

Why beside ``read_path.py``: comparing two trees (``PYTHONPATH=<tree>``) on a
shared host needs short interleaved runs, and the per-I/O CPU of every process
on the path (the application, the FUSE daemon with the USRBIO agent, each
storage node) shows where a change moved cost; ``read_path.py`` reports only
the daemon and the nodes, over all USRBIO phases together.

It starts a ``ProcessCluster`` (3 storage nodes x 2 targets, 3 replicas, fsync
on, transport ``--transport``, FUSE mount), writes one file of ``SIZE`` through
the mount, then per round, with the page cache dropped before each phase:

- sequential read of the file through a USRBIO ring, 1 MiB x 8 in flight,
- 4 KiB random reads for ``SECONDS`` with 64 in flight (seeded),

printing MiB/s or IOPS and CPU seconds per GiB (sequential) or microseconds per
I/O (random) of each process, and the medians at the end.

Usage: python benchmarks/usrbio_reads.py [--size 256M] [--rounds 3] [--seconds 5]
       [--transport auto]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from read_path import cpu_snapshot  # noqa: E402
from run_all import Cleanup, fs3_up  # noqa: E402

from fs3.cli.bench import drop_caches, parse_size  # noqa: E402
from fs3.usrbio import Ior, Iov, dereg_fd, prep_io, reg_fd, submit_ios, wait_for_ios  # noqa: E402

MiB = 1 << 20


def seq_read(mnt: str, path: str, size: int, bs: int = MiB, depth: int = 8) -> float:
    """MiB/s of one pass over the file with ``depth`` reads of ``bs`` in flight."""
    fd = os.open(path, os.O_RDONLY)
    iov, ior = Iov(mnt, bs * depth), Ior(mnt, entries=depth, for_read=True)
    reg_fd(fd)
    try:
        n, nxt, done, free = size // bs, 0, 0, list(range(depth))
        t = time.perf_counter()
        while done < n:
            while free and nxt < n:
                s = free.pop()
                prep_io(ior, iov, s * bs, fd, nxt * bs, bs, userdata=s)
                nxt += 1
            submit_ios(ior)
            for c in wait_for_ios(ior, max_results=depth, min_results=1, timeout=60):
                if c.result != bs:
                    raise OSError(f"usrbio read: result {c.result}")
                free.append(c.userdata)
                done += 1
        return size / MiB / (time.perf_counter() - t)
    finally:
        dereg_fd(fd)
        ior.close()
        iov.close()
        os.close(fd)


def rand_read(mnt: str, path: str, size: int, secs: float, seed: int) -> tuple[float, int]:
    """(IOPS, reads) of 4 KiB random reads with 64 in flight for ``secs``."""
    rsz, depth = 4096, 64
    rng, slots = random.Random(seed), size // rsz
    fd = os.open(path, os.O_RDONLY)
    iov, ior = Iov(mnt, rsz * depth), Ior(mnt, entries=depth, for_read=True)
    reg_fd(fd)
    try:
        free, inflight, count = list(range(depth)), 0, 0
        t = time.perf_counter()
        end = t + secs
        while True:
            now = time.perf_counter()
            while free and now < end:
                s = free.pop()
                prep_io(ior, iov, s * rsz, fd, rng.randrange(slots) * rsz, rsz, userdata=s)
                inflight += 1
            if inflight == 0:
                break
            submit_ios(ior)
            for c in wait_for_ios(ior, max_results=depth, min_results=1, timeout=60):
                if c.result != rsz:
                    raise OSError(f"usrbio random read: result {c.result}")
                free.append(c.userdata)
                inflight -= 1
                count += 1
        return count / (time.perf_counter() - t), count
    finally:
        dereg_fd(fd)
        ior.close()
        iov.close()
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--transport", default="auto", choices=["auto", "grpc", "tcp", "shm"])
    ap.add_argument("--workdir", default="/var/tmp")
    a = ap.parse_args(argv)
    size = parse_size(a.size)
    base = Path(tempfile.mkdtemp(prefix="fs3-usrbio-reads-", dir=a.workdir))
    cleanup = Cleanup()
    res: dict[str, list[float]] = {"seq_MiB_s": [], "rand_iops": []}
    try:
        cluster, mnt = fs3_up(base, a.transport, cleanup)
        pids = {n: cluster.pid(n) for n in cluster.names if n.startswith(("storage", "fuse"))}
        pids["app"] = os.getpid()
        path = str(mnt / "big")
        block = os.urandom(MiB)
        with open(path, "wb") as f:
            for _ in range(size // MiB):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        gib = size / (1 << 30)
        for r in range(a.rounds):
            drop_caches()
            before = cpu_snapshot(pids)
            mbs = seq_read(str(mnt), path, size)
            after = cpu_snapshot(pids)
            cpu = " ".join(f"{k}={(after[k] - before[k]) / gib:.2f}" for k in pids)
            print(f"round {r} load {os.getloadavg()[0]:.1f} seq {mbs:.0f} MiB/s  cpu s/GiB {cpu}")
            drop_caches()
            before = cpu_snapshot(pids)
            iops, n = rand_read(str(mnt), path, size, a.seconds, r)
            after = cpu_snapshot(pids)
            cpu = " ".join(f"{k}={(after[k] - before[k]) / n * 1e6:.0f}" for k in pids)
            print(f"round {r} load {os.getloadavg()[0]:.1f} rand {iops:.0f} IOPS  cpu us/io {cpu}")
            res["seq_MiB_s"].append(mbs)
            res["rand_iops"].append(iops)
        print("medians", {k: round(statistics.median(v)) for k, v in res.items()})
    finally:
        cleanup.run_all()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
