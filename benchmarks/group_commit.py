#!/usr/bin/env python
"""Group commit throughput: the SQLite KV engine and a storage target's chunk rows.

    python benchmarks/group_commit.py [--threads 8] [--ops 200] [--runs 3] [--trees A,B]

Both stores fsync their WAL on every commit (``synchronous=FULL``), so durable
commits per second are bounded by the disk flush unless concurrent commits
share one (fs3/group_commit.py). Each measurement: ``--threads`` threads, each
doing ``--ops`` commits as fast as it can, on a fresh database in a temporary
directory (on the same disk as ``--dir``), reported as commits/s and commits per
fsync (commits / batches).

* ``kv``: ``SqliteDatabase.run`` transactions that read a key and write it (each
  thread its own key: no conflicts), as meta's operations do;
* ``chunk``: ``ChunkMetaStore.commit`` of a staged update of a chunk (each
  thread its own chunks), as a storage target's write path does.

With ``--trees`` (comma-separated source trees, e.g. a checkout before and after
a change), each run executes every tree in its own process, interleaved
(A, B in even runs, B, A in odd ones, so neither always follows the other's
disk writes), and the report gives medians per tree and the
ratio to the first tree measured in the same runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _kv(d: Path, threads: int, ops: int) -> dict[str, float]:
    from fs3.kv.sqlite import SqliteDatabase

    db = SqliteDatabase(str(d / "kv.db"))
    try:

        def worker(w: int) -> None:
            key = b"k%d" % w
            for i in range(ops):
                db.run(lambda tr, i=i: (tr.get(key), tr.set(key, b"%d" % i)))

        secs = _timed(worker, threads)
        return {"ops_s": threads * ops / secs, "per_fsync": db.commits / max(1, db.batches)}
    finally:
        db.close()


def _chunk(d: Path, threads: int, ops: int) -> dict[str, float]:
    from fs3.storage.chunk_meta import ChunkKey, ChunkMetaStore, CommitReq, PendingUpdate

    store = ChunkMetaStore(d / "meta.db", fsync=True)
    batches = [0]
    inner = store._commit_rows if hasattr(store, "_commit_rows") else None
    if inner is not None and not hasattr(store, "_group"):  # the tree before the shared primitive

        def counted(batch: Any) -> None:
            batches[0] += 1
            inner(batch)

        store._commit_rows = counted  # type: ignore[method-assign]
    try:

        def worker(w: int) -> None:
            for i in range(ops):
                key = ChunkKey(w + 1, i)
                p = PendingUpdate(key, update_ver=1, chain_ver=1, remove=False, length=4096)
                store.set_pending(p)
                store.commit(CommitReq(p, 1))

        secs = _timed(worker, threads)
        n = store._group.batches if hasattr(store, "_group") else batches[0]
        return {"ops_s": threads * ops / secs, "per_fsync": threads * ops / max(1, n)}
    finally:
        store.close()


def _timed(worker: Any, threads: int) -> float:
    ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def measure(threads: int, ops: int, base: str) -> dict[str, dict[str, float]]:
    out = {}
    for name, fn in (("kv", _kv), ("chunk", _chunk)):
        with tempfile.TemporaryDirectory(dir=base or None, prefix="fs3-gc-") as d:
            out[name] = fn(Path(d), threads, ops)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--ops", type=int, default=200, help="commits per thread")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--trees", default="", help="source trees to compare (default: this one)")
    p.add_argument("--dir", default="", help="where the temporary databases go")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(measure(a.threads, a.ops, a.dir)))
        return 0
    trees = [t for t in a.trees.split(",") if t] or [str(Path(__file__).resolve().parents[1])]
    got: dict[str, list[dict[str, dict[str, float]]]] = {t: [] for t in trees}
    for run in range(a.runs):
        for t in trees if run % 2 == 0 else trees[::-1]:  # no tree always runs first
            env = dict(os.environ, PYTHONPATH=t)
            cmd = [sys.executable, __file__, "--one", "--threads", str(a.threads)]
            cmd += ["--ops", str(a.ops), "--dir", a.dir]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=t)
            got[t].append(json.loads(r.stdout))
    first = trees[0]
    print(f"threads={a.threads} ops/thread={a.ops} runs={a.runs} load={os.getloadavg()}")
    for store in ("kv", "chunk"):
        base = statistics.median(r[store]["ops_s"] for r in got[first])
        for t in trees:
            ops_s = statistics.median(r[store]["ops_s"] for r in got[t])
            per = statistics.median(r[store]["per_fsync"] for r in got[t])
            print(
                f"{store:5} {t}: {ops_s:8.0f} commits/s  {per:5.1f} commits/fsync  "
                f"x{ops_s / base:.2f} of {first}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
