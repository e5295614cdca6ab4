#!/usr/bin/env python3
"""Metadata operation throughput through gRPC: create, stat, readdir, rename, unlink.

Starts 1 and then 2 real ``fs3 meta`` processes on one fresh SQLite KV file each
time, and drives them from this (separate) client process with grpc.aio,
``--concurrency`` requests in flight, spread round-robin over the servers.
Two layouts: all files in one directory, and spread over ``--dirs`` directories.

Phases (one RPC per op):
  create   Mknod of a regular file (a create without an open session)
  stat     Lookup of each name (what FUSE sends per path component)
  readdir  ReadDir with attributes, pages of 1024, whole directories; ops/s counts entries
  rename   Rename of each file to a new name in its directory
  unlink   Unlink of each file

Usage: python benchmarks/meta_ops.py [--files 10000] [--dirs 100] [--servers 1,2]
                                     [--concurrency 32] [--kv-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fs3.errors import FsError
from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc
from fs3.rpc.channel import call, insecure_channel

USER = common_pb2.UserInfo(uid=0, gid=0)


def start_servers(n: int, workdir: Path) -> tuple[list[subprocess.Popen[str]], list[str]]:
    db = workdir / "kv.db"
    procs: list[subprocess.Popen[str]] = []
    addrs: list[str] = []
    for i in range(n):
        cfg = workdir / f"meta{i}.toml"
        cfg.write_text(
            f'[node]\nid = {100 + i}\nport = 0\n[kv]\nurl = "sqlite://{db}"\n'
            f'[log]\nlevel = "WARNING"\nfile = "{workdir}/meta{i}.log"\n'
        )
        p = subprocess.Popen(
            [sys.executable, "-m", "fs3.cli.main", "meta", "--config", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert p.stdout is not None
        line = p.stdout.readline()
        if "listening on" not in line:
            p.kill()
            raise SystemExit(f"meta server {i} did not start: {line!r}")
        procs.append(p)
        addrs.append(line.rsplit(" ", 1)[1].strip())
    return procs, addrs


def stop_servers(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Driver:
    def __init__(self, addrs: list[str], concurrency: int) -> None:
        self.channels = [insecure_channel(a) for a in addrs]
        self.stubs = [meta_pb2_grpc.MetaServiceStub(c) for c in self.channels]  # type: ignore[no-untyped-call]
        self.concurrency = concurrency
        self.i = 0
        self.retries = 0

    async def rpc(self, method: str, req: Any) -> Any:
        while True:
            stub = self.stubs[self.i % len(self.stubs)]
            self.i += 1
            try:
                return await call(getattr(stub, method), req, timeout=30)
            except FsError as e:
                if not e.retryable:
                    raise
                self.retries += 1

    async def run(self, jobs: list[Callable[[], Awaitable[int]]]) -> tuple[int, float]:
        """Run jobs with bounded concurrency; returns (ops counted, seconds)."""
        queue = list(reversed(jobs))
        done = 0

        async def lane() -> None:
            nonlocal done
            while queue:
                n = await queue.pop()()  # not `done += await ...`: that loses updates
                done += n

        t0 = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(self.concurrency)))
        return done, time.perf_counter() - t0

    async def close(self) -> None:
        for c in self.channels:
            await c.close()


async def bench_layout(d: Driver, files: int, ndirs: int, label: str) -> dict[str, float]:
    top = await d.rpc(
        "Mkdir",
        meta_pb2.MkdirRequest(
            user=USER, request_id=uuid.uuid4().hex, parent=1, name=label.encode(), mode=0o755
        ),
    )
    dirs = []
    for i in range(ndirs):
        r = await d.rpc(
            "Mkdir",
            meta_pb2.MkdirRequest(
                user=USER,
                request_id=uuid.uuid4().hex,
                parent=top.attr.inode,
                name=b"d%03d" % i,
                mode=0o755,
            ),
        )
        dirs.append(r.attr.inode)
    placement = [(dirs[i % ndirs], b"file-%06d" % i) for i in range(files)]
    results: dict[str, float] = {}

    def job(method: str, make: Callable[[int, bytes], Any]) -> list[Callable[[], Awaitable[int]]]:
        def one(parent: int, name: bytes) -> Callable[[], Awaitable[int]]:
            async def go() -> int:
                await d.rpc(method, make(parent, name))
                return 1

            return go

        return [one(p, n) for p, n in placement]

    async def phase(name: str, jobs: list[Callable[[], Awaitable[int]]]) -> None:
        n, dt = await d.run(jobs)
        results[name] = n / dt
        print(f"  {label:>10} {name:<8} {n:>7} ops in {dt:6.2f}s = {n / dt:8.0f} ops/s", flush=True)

    await phase(
        "create",
        job(
            "Mknod",
            lambda p, n: meta_pb2.MknodRequest(
                user=USER, request_id=uuid.uuid4().hex, parent=p, name=n, mode=stat.S_IFREG | 0o644
            ),
        ),
    )
    await phase(
        "stat", job("Lookup", lambda p, n: meta_pb2.LookupRequest(user=USER, parent=p, name=n))
    )

    def lister(ino: int) -> Callable[[], Awaitable[int]]:
        async def go() -> int:
            count, cursor = 0, b""
            while True:
                r = await d.rpc(
                    "ReadDir",
                    meta_pb2.ReadDirRequest(
                        user=USER, inode=ino, cursor=cursor, limit=1024, with_attrs=True
                    ),
                )
                count += len(r.entries)
                if not r.more:
                    return count
                cursor = r.entries[-1].name

        return go

    await phase("readdir", [lister(i) for i in dirs])
    await phase(
        "rename",
        job(
            "Rename",
            lambda p, n: meta_pb2.RenameRequest(
                user=USER,
                request_id=uuid.uuid4().hex,
                parent=p,
                name=n,
                new_parent=p,
                new_name=n + b".r",
            ),
        ),
    )
    placement = [(p, n + b".r") for p, n in placement]
    await phase(
        "unlink",
        job(
            "Unlink",
            lambda p, n: meta_pb2.RemoveRequest(
                user=USER, request_id=uuid.uuid4().hex, parent=p, name=n
            ),
        ),
    )
    return results


async def bench(
    addrs: list[str], files: int, ndirs: int, concurrency: int
) -> dict[str, dict[str, float]]:
    d = Driver(addrs, concurrency)
    try:
        out = {
            "1 dir": await bench_layout(d, files, 1, "one-dir"),
            f"{ndirs} dirs": await bench_layout(d, files, ndirs, f"{ndirs}-dirs"),
        }
        if d.retries:
            print(f"  (transient errors retried: {d.retries})")
        return out
    finally:
        await d.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--dirs", type=int, default=100)
    ap.add_argument("--servers", default="1,2", help="comma-separated server counts to run")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument(
        "--kv-dir", default="", help="where to put the SQLite files (default: a temp dir)"
    )
    args = ap.parse_args(argv)
    print(
        f"fs3 meta benchmark: {args.files} files, concurrency {args.concurrency}, sqlite KV, "
        f"{os.cpu_count()} cpus",
        flush=True,
    )
    table: dict[int, dict[str, dict[str, float]]] = {}
    for n in [int(x) for x in args.servers.split(",") if x]:
        work = Path(tempfile.mkdtemp(prefix="fs3-metabench-", dir=args.kv_dir or None))
        procs: list[subprocess.Popen[str]] = []
        try:
            procs, addrs = start_servers(n, work)
            print(f"{n} meta server(s): {', '.join(addrs)}", flush=True)
            table[n] = asyncio.run(bench(addrs, args.files, args.dirs, args.concurrency))
        finally:
            stop_servers(procs)
            shutil.rmtree(work, ignore_errors=True)
    phases = ["create", "stat", "readdir", "rename", "unlink"]
    print("\nops/s " + "".join(f"{p:>10}" for p in phases))
    for n, layouts in table.items():
        for layout, res in layouts.items():
            print(f"{n} srv {layout:<8}" + "".join(f"{res.get(p, 0):>10.0f}" for p in phases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
