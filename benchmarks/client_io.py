#!/usr/bin/env python
"""Client I/O benchmark: the Python file API per transport vs. os.pread/os.pwrite.

In one run, on one host:

* fs3 through :func:`fs3.connect` (the Python file API), for each transport
  (grpc, tcp, shm): sequential write of SIZE bytes in 1 MiB ``write`` calls
  (then ``fsync``/``close``), sequential read of it in 1 MiB ``readinto`` calls,
  and 4 KiB random reads (unbuffered file object, ``seek`` + ``read``) for a
  fixed time;
* the same I/O with ``os.pwrite``/``os.pread`` on a file on the local disk
  (``fsync`` after the writes; the file's page cache is dropped with
  ``posix_fadvise(DONTNEED)`` before the reads, as fs3's chunks are read by its
  storage servers from their own files).

Prints MB/s, IOPS and the ratio to the local figures. By default it starts its
own cluster (3 storage nodes x 1 target, 3 replicas, fsync on) with
:class:`fs3.testing.cluster.ProcessCluster`; ``--cluster-file`` uses a running one.

    python benchmarks/client_io.py                 # 1 GiB, all transports
    python benchmarks/client_io.py --size-mib 256 --transports shm tcp
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

MiB = 1 << 20


def _fmt(x: float) -> str:
    return f"{x:10.1f}"


def bench_fs3(client: Any, size: int, rand_s: float, seed: int) -> dict[str, float]:
    block = os.urandom(MiB)
    path = f"/bench-{uuid.uuid4().hex[:8]}"
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    with client.open(path, "wb") as f:
        for _ in range(size // MiB):
            f.write(block)
        f.fsync()
    out["write_MBps"] = size / MiB / (time.perf_counter() - t0)
    buf = bytearray(MiB)
    t0 = time.perf_counter()
    total = 0
    with client.open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            total += n
    out["read_MBps"] = total / MiB / (time.perf_counter() - t0)
    if total != size:
        raise SystemExit(f"read back {total} of {size} bytes")
    rng = random.Random(seed)
    blocks = size // 4096
    n = 0
    with client.open(path, "rb", buffering=0) as f:
        t0 = time.perf_counter()
        end = t0 + rand_s
        while time.perf_counter() < end:
            f.seek(rng.randrange(blocks) * 4096)
            if len(f.read(4096)) != 4096:
                raise SystemExit("short random read")
            n += 1
        out["rand4k_iops"] = n / (time.perf_counter() - t0)
    client.unlink(path)
    return out


def bench_local(directory: str, size: int, rand_s: float, seed: int) -> dict[str, float]:
    block = os.urandom(MiB)
    path = os.path.join(directory, f"bench-local-{uuid.uuid4().hex[:8]}")
    out: dict[str, float] = {}
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        for i in range(size // MiB):
            os.pwrite(fd, block, i * MiB)
        os.fsync(fd)
        out["write_MBps"] = size / MiB / (time.perf_counter() - t0)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        total = 0
        for i in range(size // MiB):
            total += len(os.pread(fd, MiB, i * MiB))
        out["read_MBps"] = total / MiB / (time.perf_counter() - t0)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        rng = random.Random(seed)
        blocks = size // 4096
        n = 0
        t0 = time.perf_counter()
        end = t0 + rand_s
        while time.perf_counter() < end:
            os.pread(fd, 4096, rng.randrange(blocks) * 4096)
            n += 1
        out["rand4k_iops"] = n / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return out


@contextlib.contextmanager
def _cluster(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(cluster file, a directory on the storage disk) of a running or fresh cluster."""
    if args.cluster_file:
        yield args.cluster_file, args.local_dir or tempfile.gettempdir()
        return
    from fs3.testing.cluster import ProcessCluster

    with ProcessCluster(
        storage_nodes=3, targets_per_node=1, replicas=args.replicas, meta=1, mgmtd=1
    ) as c:
        yield c.cluster_file, args.local_dir or str(c.dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--size-mib", type=int, default=1024, help="sequential size (default 1024 = 1 GiB)"
    )
    ap.add_argument(
        "--rand-seconds", type=float, default=10.0, help="duration of the 4 KiB random-read phase"
    )
    ap.add_argument("--transports", nargs="+", default=["grpc", "tcp", "shm"])
    ap.add_argument("--cluster-file", help="use this running cluster instead of starting one")
    ap.add_argument(
        "--local-dir",
        help="directory for the os.pread/os.pwrite baseline (default: the cluster dir)",
    )
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    size = args.size_mib * MiB

    import fs3

    results: dict[str, dict[str, float]] = {}
    with _cluster(args) as (cluster_file, local_dir):
        results["local os.pread/pwrite"] = bench_local(
            local_dir, size, args.rand_seconds, args.seed
        )
        for kind in args.transports:
            client = fs3.connect(cluster_file, transport=kind)
            try:
                results[f"fs3 file API / {kind}"] = bench_fs3(
                    client, size, args.rand_seconds, args.seed
                )
            finally:
                client.close()
            print(f"done: {kind}", file=sys.stderr, flush=True)

    base = results["local os.pread/pwrite"]
    print(
        f"\nsequential {args.size_mib} MiB in 1 MiB calls, 4 KiB random reads for {args.rand_seconds:g} s; "
        f"{args.replicas} replicas, one host\n"
    )
    print(
        f"{'path':28} {'write MB/s':>10} {'read MB/s':>10} {'4K IOPS':>10}   {'ratio to local (w / r / iops)':>30}"
    )
    for name, r in results.items():
        ratio = " / ".join(
            f"{r[k] / base[k]:.3f}" for k in ("write_MBps", "read_MBps", "rand4k_iops")
        )
        print(
            f"{name:28} {_fmt(r['write_MBps'])} {_fmt(r['read_MBps'])} {_fmt(r['rand4k_iops'])}   {ratio:>30}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
