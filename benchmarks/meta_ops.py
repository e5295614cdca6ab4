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

Cluster mode (``--cluster``): the per-operation budget of one sequential client,
through the FUSE mount (``--mount``) and through the Python API (``fs3.connect``,
no FUSE), in the same run (``--runs`` rounds, medians reported): create+close of
empty files (O_CREAT|O_EXCL), stat, readdir, unlink, each kind in its own fresh
directory, plus the CPU the cluster's meta servers spent per operation
(``/proc/PID/stat`` of the pids in the cluster's state.json). Every phase runs
the two kinds in alternating blocks of ``--block`` operations and reports the
median of the per-block-pair ratios beside the whole-phase one: on a shared
host the machine's speed changes within seconds, and only operations run
side by side compare.

  python benchmarks/meta_ops.py --cluster DIR/fs3.cluster --mount MNT [--files 2000] [--runs 3]
                                [--block 50]

``--loop-too`` adds a third kind, a Python API client with ``[client]
sync_meta`` off (every meta call through its loop thread, the API before
fs3.rpc.native.sync_client), interleaved with the other two.

With ``--hop`` (no mount needed): what the Python API's hand-off to the
client's loop thread costs per stat, the same stats through ``Client.stat``
(meta calls from the calling thread), through ``Client.stat`` with sync_meta
off (through the loop thread) and awaited inside the loop, in alternating blocks.

  python benchmarks/meta_ops.py --cluster DIR/fs3.cluster --mount - --hop [--files 300]

Growth mode (``--growth N``): one meta server; Create (with its open session) and
Lookup latency, medians of ``--probe`` sequential ops, with 1,000 and then N
entries in one directory (filled with Mknod, ``--concurrency`` in flight), and
a ReadDir of all N entries in pages of 1,024 (the first and last page's latency
show whether a page costs the same wherever it starts).

  python benchmarks/meta_ops.py --growth 100000 [--probe 200]

In-process mode (``--inprocess N``): the meta operator and its SQLite KV alone, no
RPC: CPU and wall time per create+close, with the Close as its own transaction
and with the close riding on the next Create (what the client core sends for a
handle that wrote nothing), and per lookup. Subtracting these from the cluster
mode's meta CPU leaves what serving the RPCs costs.

  python benchmarks/meta_ops.py --inprocess 1000
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


# ---------------------------------------------------------------- growth mode


async def growth(addr: str, entries: int, probe: int, concurrency: int) -> dict[str, Any]:
    import random
    import statistics

    d = Driver([addr], concurrency)
    rng = random.Random(7)
    try:
        top = await d.rpc(
            "Mkdir",
            meta_pb2.MkdirRequest(
                user=USER, request_id=uuid.uuid4().hex, parent=1, name=b"growth", mode=0o755
            ),
        )
        ino = top.attr.inode

        def mknod(i: int) -> Callable[[], Awaitable[int]]:
            async def go() -> int:
                await d.rpc(
                    "Mknod",
                    meta_pb2.MknodRequest(
                        user=USER,
                        request_id=uuid.uuid4().hex,
                        parent=ino,
                        name=b"e%08d" % i,
                        mode=stat.S_IFREG | 0o644,
                    ),
                )
                return 1

            return go

        async def measure(n: int) -> dict[str, float]:
            cl, sl = [], []
            for k in range(probe):
                t = time.perf_counter()
                r = await d.rpc(
                    "Create",
                    meta_pb2.CreateRequest(
                        user=USER,
                        request_id=uuid.uuid4().hex,
                        parent=ino,
                        name=b"probe-%d-%d" % (n, k),
                        mode=0o644,
                        flags=os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                        client_id="growth",
                    ),
                )
                cl.append(time.perf_counter() - t)
                await d.rpc(
                    "Close",
                    meta_pb2.CloseRequest(
                        user=USER,
                        request_id=uuid.uuid4().hex,
                        inode=r.attr.inode,
                        session_id=r.session_id,
                    ),
                )
            for _ in range(probe):
                name = b"e%08d" % rng.randrange(n)
                t = time.perf_counter()
                await d.rpc("Lookup", meta_pb2.LookupRequest(user=USER, parent=ino, name=name))
                sl.append(time.perf_counter() - t)
            return {
                "create_ms": round(statistics.median(cl) * 1000, 3),
                "stat_ms": round(statistics.median(sl) * 1000, 3),
            }

        out: dict[str, Any] = {}
        await d.run([mknod(i) for i in range(1000)])
        out["at_1000"] = await measure(1000)
        print(f"  at 1,000 entries: {out['at_1000']}", flush=True)
        t0 = time.perf_counter()
        _, dt = await d.run([mknod(i) for i in range(1000, entries)])
        out["fill_per_s"] = round((entries - 1000) / dt)
        print(f"  filled to {entries:,} entries: {out['fill_per_s']:,} Mknod/s", flush=True)
        out[f"at_{entries}"] = await measure(entries)
        print(f"  at {entries:,} entries: {out[f'at_{entries}']}", flush=True)
        pages: list[float] = []
        count, cursor = 0, b""
        t0 = time.perf_counter()
        while True:
            t = time.perf_counter()
            r = await d.rpc(
                "ReadDir",
                meta_pb2.ReadDirRequest(user=USER, inode=ino, cursor=cursor, limit=1024),
            )
            pages.append(time.perf_counter() - t)
            count += len(r.entries)
            if not r.more:
                break
            cursor = r.entries[-1].name
        total = time.perf_counter() - t0
        out["readdir"] = {
            "entries": count,
            "pages": len(pages),
            "entries_per_s": round(count / total),
            "first_page_ms": round(pages[0] * 1000, 2),
            "last_full_page_ms": round(pages[-2] * 1000, 2) if len(pages) > 1 else None,
            "median_page_ms": round(statistics.median(pages) * 1000, 2),
        }
        print(f"  readdir: {out['readdir']}", flush=True)
        big, small = out[f"at_{entries}"], out["at_1000"]
        out["create_ratio"] = round(big["create_ms"] / small["create_ms"], 3)
        out["stat_ratio"] = round(big["stat_ms"] / small["stat_ms"], 3)
        print(
            f"  create latency at {entries:,} / at 1,000: {out['create_ratio']}; "
            f"stat: {out['stat_ratio']}",
            flush=True,
        )
        return out
    finally:
        await d.close()


# ---------------------------------------------------------------- in-process mode


def inprocess(n: int, kv_dir: str) -> None:
    import logging
    import resource

    from fs3.config import MetaSection
    from fs3.kv import open_database
    from fs3.meta.layout import StaticChainTables
    from fs3.meta.operator import MetaOperator

    logging.getLogger("fs3").setLevel(logging.ERROR)  # "no chain table yet"

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    for mode in ("separate Close", "close rides on next Create"):
        work = Path(tempfile.mkdtemp(prefix="fs3-metaop-", dir=kv_dir or None))
        db = open_database(f"sqlite://{work}/kv.db")
        try:
            op = MetaOperator(db, MetaSection(), StaticChainTables({1: [1, 2, 3, 4, 5, 6]}))
            d = op.mkdir(
                meta_pb2.MkdirRequest(user=USER, request_id="d", parent=1, name=b"d", mode=0o755)
            ).attr.inode
            prev: Any = None
            c0, t0 = cpu(), time.perf_counter()
            for i in range(n):
                req = meta_pb2.CreateRequest(
                    user=USER,
                    request_id=uuid.uuid4().hex,
                    parent=d,
                    name=b"f%d" % i,
                    mode=0o644,
                    flags=flags,
                    client_id="c",
                )
                if mode == "separate Close":
                    r = op.create(req)
                    op.close(
                        meta_pb2.CloseRequest(
                            user=USER,
                            request_id=uuid.uuid4().hex,
                            inode=r.attr.inode,
                            session_id=r.session_id,
                        )
                    )
                else:
                    if prev is not None:
                        req.close_sessions.add(inode=prev.attr.inode, session_id=prev.session_id)
                    prev = op.create(req)
            c1, t1 = cpu(), time.perf_counter()
            print(
                f"create+close ({mode}): {(t1 - t0) / n * 1e3:.3f} ms wall, "
                f"{(c1 - c0) / n * 1e3:.3f} ms CPU",
                flush=True,
            )
            if mode == "separate Close":
                c0, t0 = cpu(), time.perf_counter()
                for i in range(n):
                    op.lookup(meta_pb2.LookupRequest(user=USER, parent=d, name=b"f%d" % i))
                c1, t1 = cpu(), time.perf_counter()
                print(
                    f"lookup: {(t1 - t0) / n * 1e3:.3f} ms wall, {(c1 - c0) / n * 1e3:.3f} ms CPU",
                    flush=True,
                )
        finally:
            db.close()
            shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- cluster mode


def meta_pids(cluster_file: str) -> list[int]:
    """Pids of the meta servers of the local cluster that wrote ``cluster_file``."""
    import json

    state = json.loads((Path(cluster_file).parent / "state.json").read_text())
    return [int(p["pid"]) for p in state["processes"] if p["role"] == "meta"]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / tick


class PosixOps:
    """The phases through the kernel (a FUSE mount)."""

    label = "FUSE"

    def __init__(self, root: str) -> None:
        self.root = root

    def mkdir(self, d: str) -> None:
        os.mkdir(os.path.join(self.root, d))

    def create(self, path: str) -> None:
        os.close(
            os.open(os.path.join(self.root, path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        )

    def stat(self, path: str) -> None:
        os.stat(os.path.join(self.root, path))

    def listdir(self, d: str) -> int:
        with os.scandir(os.path.join(self.root, d)) as it:
            return sum(1 for _ in it)

    def unlink(self, path: str) -> None:
        os.unlink(os.path.join(self.root, path))

    def rmdir(self, d: str) -> None:
        os.rmdir(os.path.join(self.root, d))

    def settle(self) -> None:
        pass


class ApiOps(PosixOps):
    """The phases through the Python API (no FUSE)."""

    label = "Python API"

    def __init__(self, client: Any, label: str = "") -> None:
        self.c = client
        self.root = "/"
        if label:
            self.label = label

    def mkdir(self, d: str) -> None:
        self.c.mkdir("/" + d)

    def create(self, path: str) -> None:
        self.c.open("/" + path, "xb", buffering=0).close()

    def stat(self, path: str) -> None:
        self.c.stat("/" + path)

    def listdir(self, d: str) -> int:
        return len(self.c.listdir("/" + d))

    def unlink(self, path: str) -> None:
        self.c.unlink("/" + path)

    def rmdir(self, d: str) -> None:
        self.c.rmdir("/" + d)

    def settle(self) -> None:
        # sessions of quietly closed handles end in the background: count their CPU too
        flush = getattr(self.c.core, "flush_closes", None)  # older clients close at once
        if flush is not None:
            self.c.bridge.run(flush())


def _timed_blocks(
    kinds: list[PosixOps],
    work: dict[str, list[str]],
    block: int,
    op: Callable[[PosixOps, str], Any],
    pids: list[int],
) -> tuple[dict[str, float], dict[str, float], dict[str, list[float]]]:
    """Run ``op`` over each kind's names in alternating blocks of ``block``.

    Block i of every kind runs back to back (the order flips every block), so
    the figures of a block saw the same machine: on a shared host whose speed
    swings several-fold within seconds, the median of the per-block ratios is
    what compares the kinds, not whole phases run one after another.
    Returns (ops/s per kind, meta CPU ms per op per kind, per-block ratios of
    each other kind's speed to the first kind's, by label).
    """
    secs = {k.label: 0.0 for k in kinds}
    cpu = {k.label: 0.0 for k in kinds}
    ratios: dict[str, list[float]] = {k.label: [] for k in kinds[1:]}
    n = len(work[kinds[0].label])
    for i, lo in enumerate(range(0, n, block)):
        took: dict[str, float] = {}
        for k in kinds if i % 2 == 0 else kinds[::-1]:
            names = work[k.label][lo : lo + block]
            c0 = cpu_seconds(pids)
            t0 = time.perf_counter()
            for name in names:
                op(k, name)
            took[k.label] = time.perf_counter() - t0
            cpu[k.label] += cpu_seconds(pids) - c0
            secs[k.label] += took[k.label]
        for k in kinds[1:]:
            ratios[k.label].append(took[kinds[0].label] / took[k.label])
    return (
        {k: n / v for k, v in secs.items()},
        {k: v / n * 1000 for k, v in cpu.items()},
        ratios,
    )


def budget_round(kinds: list[PosixOps], files: int, block: int, pids: list[int]) -> dict[str, Any]:
    """One round: create, stat, readdir, unlink, each phase block-interleaved over the kinds.

    Each kind works in its own fresh directory. Between the create and stat
    phases the kernel's entry and attribute caches of the mount expire
    (``entry_timeout_s``/``attr_timeout_s``, 1 s by default), as they have for
    most files in the benchmark suite's stat phase (5,000 creates take longer
    than that), so a FUSE stat is a LOOKUP that reaches meta.
    """
    dirs = {k.label: f"mb-{uuid.uuid4().hex[:8]}" for k in kinds}
    for k in kinds:
        k.mkdir(dirs[k.label])
    names = {k.label: [f"{dirs[k.label]}/f{i:06d}" for i in range(files)] for k in kinds}
    out: dict[str, Any] = {}

    def record(
        phase: str, res: tuple[dict[str, float], dict[str, float], dict[str, list[float]]]
    ) -> None:
        rates, cpu, ratios = res
        for label, v in rates.items():
            out.setdefault(label, {})[phase] = v
            out[label][f"meta_cpu_ms_per_{phase}"] = cpu[label]
        for label, r in ratios.items():
            out.setdefault("ratios", {}).setdefault(label, {})[phase] = r

    record("create", _timed_blocks(kinds, names, block, lambda k, n: k.create(n), pids))
    for k in kinds:
        k.settle()
    time.sleep(1.2)  # past the mount's entry/attr timeouts (see the docstring)
    record("stat", _timed_blocks(kinds, names, block, lambda k, n: k.stat(n), pids))
    listed = {}
    for k in kinds:
        t0 = time.perf_counter()
        got = k.listdir(dirs[k.label])
        listed[k.label] = got / (time.perf_counter() - t0)
        assert got == files, (k.label, got, files)
        out[k.label]["readdir"] = listed[k.label]
    for k in kinds[1:]:
        out["ratios"][k.label]["readdir"] = [listed[k.label] / listed[kinds[0].label]]
    record("unlink", _timed_blocks(kinds, names, block, lambda k, n: k.unlink(n), pids))
    for k in kinds:
        k.rmdir(dirs[k.label])
    return out


def bridge_hop(client: Any, files: int, block: int, runs: int, loop_client: Any = None) -> None:
    """What the Python API's thread hand-off costs per stat (``--hop``).

    The same stats, in alternating blocks: through ``Client.stat`` (with
    ``[client] sync_meta``, the default, one Lookup from the calling thread:
    fs3.rpc.native.sync_client), through ``Client.stat`` of ``loop_client``
    (sync_meta off: each call crosses to the client's loop thread and back,
    fs3.client.bridge), and as one bridge call that awaits the core's path
    resolution for the whole block inside the loop (no crossing per stat). All
    send one Lookup RPC per stat.
    """
    import statistics

    d = f"/hop-{uuid.uuid4().hex[:8]}"
    client.mkdir(d)
    names = [f"{d}/f{i:06d}" for i in range(files)]
    for n in names:
        client.open(n, "xb", buffering=0).close()
    core, caller = client.core, client.caller

    async def in_loop(batch: list[str]) -> None:
        for n in batch:
            await core.resolve(caller, n)

    kinds = ["Client.stat", "in the loop"]
    if loop_client is not None:
        kinds.insert(1, "loop path")
    base = kinds[1]  # what the others are compared with
    ratios: dict[str, list[float]] = {k: [] for k in kinds if k != base}
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    load0 = os.getloadavg()
    try:
        for r in range(runs):
            for i, lo in enumerate(range(0, files, block)):
                batch = names[lo : lo + block]
                took = {}
                for kind in kinds[:: 1 if (i + r) % 2 == 0 else -1]:
                    t0 = time.perf_counter()
                    if kind == "Client.stat":
                        for n in batch:
                            client.stat(n)
                    elif kind == "loop path":
                        for n in batch:
                            loop_client.stat(n)
                    else:
                        client.bridge.run(in_loop(batch))
                    took[kind] = time.perf_counter() - t0
                    rates[kind].append(len(batch) / took[kind])
                for kind in ratios:
                    ratios[kind].append(took[base] / took[kind])
    finally:
        for n in names:
            client.unlink(n)
        client.rmdir(d)
    load1 = os.getloadavg()
    print(
        f"\nbridge hop: {files} files x {runs} runs, blocks of {block}; "
        f"load average {load0[0]:.2f} -> {load1[0]:.2f}"
    )
    for kind, v in rates.items():
        print(f"  {kind:<12} median {statistics.median(v):,.0f} stats/s, best block {max(v):,.0f}")
    for kind, v in ratios.items():
        print(
            f"  {kind} speed / {base} speed, median of {len(v)} blocks: {statistics.median(v):.2f}"
        )


def _loop_client(cluster_file: str) -> Any:
    """A Python API client whose meta calls all go through its loop thread
    (``[client] sync_meta`` off: the API before fs3.rpc.native.sync_client)."""
    import fs3
    from fs3 import config as fs3config

    cfg = fs3config.load(fs3config.ClientConfig, None)
    cfg.client.sync_meta = False
    return fs3.connect(cluster_file, config=cfg)


def budget(
    cluster_file: str, mount: str, files: int, runs: int, block: int, loop_too: bool = False
) -> int:
    import statistics

    import fs3

    pids = meta_pids(cluster_file)
    load0 = os.getloadavg()
    client = fs3.connect(cluster_file)
    loop_client = _loop_client(cluster_file) if loop_too else None
    rounds: list[dict[str, Any]] = []
    try:
        kinds: list[PosixOps] = [PosixOps(mount), ApiOps(client)]
        if loop_client is not None:
            kinds.append(ApiOps(loop_client, "API, loop path"))
        for r in range(runs):
            res = budget_round(kinds, files, block, pids)
            rounds.append(res)
            for k in kinds:
                print(
                    f"run {r + 1} {k.label:<10} "
                    + "  ".join(f"{m}={v:,.3f}" for m, v in res[k.label].items()),
                    flush=True,
                )
        for k in kinds:  # meta servers are picked at random per client
            if isinstance(k, ApiOps):
                print(f"{k.label} used meta server {k.c.core.meta._current}")
    finally:
        client.close()
        if loop_client is not None:
            loop_client.close()
    load1 = os.getloadavg()
    phases = ["create", "stat", "readdir", "unlink"]
    metrics = phases + [f"meta_cpu_ms_per_{p}" for p in ("create", "stat", "unlink")]
    labels = [k.label for k in kinds]
    med = {
        label: {m: statistics.median(r[label][m] for r in rounds) for m in metrics}
        for label in labels
    }
    print(
        f"\n{files} files per kind per round, blocks of {block}, {runs} rounds; "
        f"load average {load0[0]:.2f} -> {load1[0]:.2f}"
    )
    others = labels[1:]
    print(
        "| metric | "
        + " | ".join(labels)
        + "".join(f" | {o} / FUSE (whole phases) | {o} / FUSE (median of blocks)" for o in others)
        + " |"
    )
    print("|---|" + "---:|" * (len(labels) + 2 * len(others)))
    for m in metrics:
        f = med["FUSE"][m]
        row = f"| {m} | " + " | ".join(f"{med[lb][m]:,.3f}" for lb in labels)
        for o in others:
            a = med[o][m]
            paired = ""
            if m in phases:
                pairs = [x for r in rounds for x in r["ratios"][o][m]]
                paired = f"{statistics.median(pairs):.2f} ({len(pairs)} blocks)"
            row += f" | {a / f if f else 0:.2f} | {paired}"
        print(row + " |")
    return 0


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
    ap.add_argument("--cluster", default="", help="cluster mode: the cluster file")
    ap.add_argument("--mount", default="", help="cluster mode: the cluster's FUSE mount point")
    ap.add_argument("--runs", type=int, default=3, help="cluster mode: rounds (median)")
    ap.add_argument("--block", type=int, default=50, help="cluster mode: ops per interleaved block")
    ap.add_argument(
        "--hop",
        action="store_true",
        help="cluster mode: only the Python API's per-call thread hand-off cost on stat",
    )
    ap.add_argument(
        "--loop-too",
        action="store_true",
        help="cluster mode: also a Python API client with [client] sync_meta off (its "
        "meta calls through the loop thread), interleaved with the others",
    )
    ap.add_argument("--growth", type=int, default=0, help="growth mode: entries in one directory")
    ap.add_argument("--probe", type=int, default=200, help="growth mode: ops per latency median")
    ap.add_argument("--inprocess", type=int, default=0, help="in-process mode: creates")
    args = ap.parse_args(argv)
    if args.inprocess:
        inprocess(args.inprocess, args.kv_dir)
        return 0
    if args.growth:
        work = Path(tempfile.mkdtemp(prefix="fs3-metagrowth-", dir=args.kv_dir or None))
        procs: list[subprocess.Popen[str]] = []
        try:
            procs, addrs = start_servers(1, work)
            print(f"growth: 1 meta server {addrs[0]}, load {os.getloadavg()[0]:.2f}", flush=True)
            asyncio.run(growth(addrs[0], args.growth, args.probe, args.concurrency))
            print(f"load {os.getloadavg()[0]:.2f}")
        finally:
            stop_servers(procs)
            shutil.rmtree(work, ignore_errors=True)
        return 0
    if args.cluster:
        if not args.mount:
            ap.error("--cluster needs --mount")
        if args.hop:
            import fs3

            client = fs3.connect(args.cluster)
            loop_client = _loop_client(args.cluster)
            try:
                bridge_hop(client, args.files, args.block, args.runs, loop_client)
            finally:
                client.close()
                loop_client.close()
            return 0
        return budget(
            args.cluster, args.mount, args.files, args.runs, args.block, loop_too=args.loop_too
        )
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
