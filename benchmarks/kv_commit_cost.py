#!/usr/bin/env python
"""What one metadata commit costs the SQLite KV: WAL frames, syscalls, CPU; lock hand-over.

    python benchmarks/kv_commit_cost.py frames [--ops 400] [--records 0] [--ids uuid4|ordered]
    python benchmarks/kv_commit_cost.py lock [--trials 200] [--wait poll|sqlite]

``frames``: the meta operator in this process over a fresh SQLite file
(``synchronous=FULL``), no RPC: ``--ops`` creates (O_CREAT|O_EXCL, each ending
the previous file's session as the FUSE mount does), then as many unlinks. Per
operation: CPU (this process's user + system time), WAL frames appended (WAL
checkpoints are off while measuring, so the WAL only grows), read and write
syscalls. ``--records N`` first fills the idempotency table with N creates (as a
server that has run a while holds), ``--ids`` picks how request ids are made: uuid4
(random) or fs3's time-ordered ``new_request_id``.

``lock``: how late a committer takes SQLite's write lock after another process
lets it go. A child process holds the lock 1 to 4.5 ms (a commit's fsync) and
releases it; this process waits either as the engine does
(``SqliteDatabase._begin_write``: ``--wait poll``) or with SQLite's busy handler
(``--wait sqlite``). Prints median and p90 of (taken - released).

Run it with ``PYTHONPATH`` at two trees to compare them.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import resource
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from fs3.client.meta_client import new_request_id
from fs3.config import MetaSection
from fs3.kv import open_database
from fs3.kv.sqlite import SqliteDatabase
from fs3.meta.layout import StaticChainTables
from fs3.meta.operator import MetaOperator
from fs3.proto import common_pb2, meta_pb2

USER = common_pb2.UserInfo(uid=0, gid=0)
FRAME = 4096 + 24  # a WAL frame: page + header (the default page size)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _syscalls() -> tuple[int, int]:
    f = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(f["syscr"]), int(f["syscw"])


def frames(ops: int, records: int, ids: str) -> None:
    logging.getLogger("fs3").setLevel(logging.ERROR)
    make_id = new_request_id if ids == "ordered" else (lambda: uuid.uuid4().hex)
    work = Path(tempfile.mkdtemp(prefix="fs3-kvcost-"))
    try:
        db = open_database(f"sqlite://{work}/kv.db")
        op = MetaOperator(db, MetaSection(), StaticChainTables({1: [1, 2, 3, 4, 5, 6]}))
        d = op.mkdir(
            meta_pb2.MkdirRequest(user=USER, request_id="d", parent=1, name=b"d", mode=0o755)
        ).attr.inode
        prev: Any = None

        def create(i: int) -> None:
            nonlocal prev
            req = meta_pb2.CreateRequest(
                user=USER,
                request_id=make_id(),
                parent=d,
                name=b"f%d" % i,
                mode=0o644,
                flags=os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                client_id="c",
            )
            if prev is not None:
                req.close_sessions.add(inode=prev.attr.inode, session_id=prev.session_id)
            prev = op.create(req)

        for i in range(records + 50):
            create(i)
        wal = f"{work}/kv.db-wal"
        assert isinstance(db, SqliteDatabase)
        with db._group.exclusive():  # nobody commits: checkpoint, then keep the WAL growing
            conns = [*db._pool, *([db._writer] if db._writer else [])]
            for c in conns:
                c.execute("PRAGMA wal_autocheckpoint=0")
            conns[0].execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connect = db._connect

        def no_checkpoints() -> sqlite3.Connection:
            c = connect()
            c.execute("PRAGMA wal_autocheckpoint=0")
            return c

        db._connect = no_checkpoints  # type: ignore[method-assign]
        base = records + 50
        phases = (
            ("create+close", lambda i: create(base + i)),
            (
                "unlink",
                lambda i: op.unlink(
                    meta_pb2.RemoveRequest(
                        user=USER, request_id=make_id(), parent=d, name=b"f%d" % (base + i)
                    )
                ),
            ),
        )
        for name, fn in phases:
            w0, (r0, s0), c0 = os.path.getsize(wal), _syscalls(), _cpu()
            for i in range(ops):
                fn(i)
            c1, (r1, s1), w1 = _cpu(), _syscalls(), os.path.getsize(wal)
            print(
                f"{name}: {(c1 - c0) / ops * 1e3:.3f} ms CPU, {(w1 - w0) / FRAME / ops:.2f} WAL "
                f"frames, {(r1 - r0) / ops:.1f} read + {(s1 - s0) / ops:.1f} write syscalls per op "
                f"({records} records before, {ids} ids; load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
        db.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _holder(path: str, holds: list[float], pipe: Any) -> None:
    c = sqlite3.connect(path, isolation_level=None, timeout=10)
    for h in holds:
        pipe.recv()
        c.execute("BEGIN IMMEDIATE")
        pipe.send("held")
        time.sleep(h / 1000)
        released = time.monotonic()
        c.execute("ROLLBACK")
        pipe.send(released)


def lock(trials: int, wait: str) -> None:
    work = tempfile.mkdtemp(prefix="fs3-kvlock-")
    path = f"{work}/kv.db"
    try:
        db = SqliteDatabase(path)
        holds = [1 + (i % 8) * 0.5 for i in range(trials)]  # 1 .. 4.5 ms
        mine, theirs = mp.Pipe()
        child = mp.Process(target=_holder, args=(path, holds, theirs))
        child.start()
        if wait == "poll":
            conn = db._writer_conn()

            def begin() -> None:
                db._begin_write(conn)
        else:
            conn = sqlite3.connect(path, isolation_level=None, timeout=10)

            def begin() -> None:
                conn.execute("BEGIN IMMEDIATE")

        late = []
        for _ in holds:
            mine.send("go")
            assert mine.recv() == "held"
            begin()
            taken = time.monotonic()
            conn.execute("ROLLBACK")
            late.append((taken - mine.recv()) * 1000)
        child.join()
        db.close()
        late.sort()
        print(
            f"{wait}: write lock taken {statistics.median(late):.2f} ms (median), "
            f"{late[int(0.9 * len(late))]:.2f} ms (p90) after the other process released it "
            f"({trials} trials; load {os.getloadavg()[0]:.1f})"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    f = sub.add_parser("frames")
    f.add_argument("--ops", type=int, default=400)
    f.add_argument("--records", type=int, default=0)
    f.add_argument("--ids", choices=["uuid4", "ordered"], default="uuid4")
    lk = sub.add_parser("lock")
    lk.add_argument("--trials", type=int, default=200)
    lk.add_argument("--wait", choices=["poll", "sqlite"], default="poll")
    a = p.parse_args(argv)
    if a.what == "frames":
        frames(a.ops, a.records, a.ids)
    else:
        lock(a.trials, a.wait)
    return 0


if __name__ == "__main__":
    sys.exit(main())
