"""KV engines for tests: one factory for every engine, plus child-process workers.

The KV contract suite (and the meta contract suite) parametrize over
:data:`ENGINES`; :func:`unavailable_reason` says why an engine cannot run here
(FoundationDB needs ``FS3_FDB_CLUSTER_FILE``), and :func:`open_test_database`
opens a fresh, empty database of that engine. FDB is shared by every test run,
so each :class:`TestKV` owns a random key prefix and clears it when closed.

Run as ``python -m fs3.testing.kv increment URL KEY_HEX N`` or
``python -m fs3.testing.kv commit-forever URL PREFIX_HEX`` (or
``commit-concurrent URL PREFIX_HEX THREADS``, several threads committing at once,
so the engine groups their commits) to get a separate OS process that uses the
engine, for the multi-process, kill -9 and power-loss tests;
``python -m fs3.testing.kv bench URL N [THREADS]`` measures txn/s.
"""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

from fs3.kv import Database, Transaction, open_database
from fs3.kv.keys import TEST, pack, prefix_range

ENGINES = ("memory", "sqlite", "fdb")
#: engines whose data is shared between OS processes
SHARED_ENGINES = ("sqlite", "fdb")
FDB_ENV = "FS3_FDB_CLUSTER_FILE"


def unavailable_reason(engine: str) -> str | None:
    """Why ``engine`` cannot be tested on this machine, or None if it can."""
    if engine == "fdb" and not os.environ.get(FDB_ENV):
        return f"{FDB_ENV} is not set: no FoundationDB cluster to run the fdb engine against"
    if engine not in ENGINES:
        return f"unknown KV engine {engine!r}"
    return None


def engine_url(engine: str, tmp_dir: str) -> str:
    """The ``open_database`` URL of a fresh database of ``engine`` under ``tmp_dir``."""
    if engine == "memory":
        return "memory://"
    if engine == "sqlite":
        return "sqlite://" + os.path.join(os.path.abspath(tmp_dir), "kv.db")
    if engine == "fdb":
        return "fdb://" + os.environ.get(FDB_ENV, "")
    raise ValueError(f"unknown KV engine {engine!r}")


@dataclass
class TestKV:
    """A database plus a private key prefix (tests must put every key under it)."""

    __test__ = False  # not a pytest test class

    engine: str
    url: str
    db: Database
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def k(self, *parts: Any) -> bytes:
        """A key under this test's prefix: ``("t", run_id, *parts)``."""
        return pack(TEST, self.run_id, *parts)

    def range(self, *parts: Any) -> tuple[bytes, bytes]:
        """[begin, end) of every key that extends ``k(*parts)``."""
        return prefix_range(TEST, self.run_id, *parts)

    def close(self) -> None:
        """Remove this test's keys (matters on shared FDB) and close the engine."""
        try:
            b, e = self.range()
            self.db.run(lambda tr: tr.clear_range(b, e))
        finally:
            self.db.close()


def open_test_database(engine: str, tmp_dir: str) -> TestKV:
    """A fresh database of ``engine``; caller closes it."""
    url = engine_url(engine, tmp_dir)
    return TestKV(engine, url, open_database(url))


# -- child-process workers -----------------------------------------------------


def _increment(url: str, key: bytes, n: int) -> None:
    """Increment the decimal counter at ``key`` ``n`` times, one transaction each.

    Prints ``ready``, waits for a ``go`` line on stdin, then ``done retries=R``.
    """
    db = open_database(url)

    def inc(tr: Any) -> None:
        v = tr.get(key)
        tr.set(key, str(int(v or b"0") + 1).encode())

    try:
        # Start together so the processes really contend: wait for "go" on stdin.
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("no go")
        for _ in range(n):
            db.run(inc)
    finally:
        db.close()
    print(f"done retries={db.retries}", flush=True)


def _commit_forever(url: str, prefix: bytes) -> None:
    """Commit transaction i (key prefix+i = value i) and print i after each commit returns."""
    db = open_database(url)
    i = 0
    while True:
        key = prefix + str(i).encode()
        val = b"v%d" % i

        def put(tr: Transaction, key: bytes = key, val: bytes = val) -> None:
            tr.set(key, val)

        db.run(put)
        sys.stdout.write(f"{i}\n")
        sys.stdout.flush()
        i += 1


def _commit_concurrent(url: str, prefix: bytes, threads: int) -> None:
    """``threads`` threads commit keys prefix+"t-i" (value the same) and print "t-i" after each.

    Every 50 acknowledgments a ``# commits=C batches=B`` line reports how many
    commits the engine made and in how many durable batches (SQLite's group
    commit; other engines print 0 batches).
    """
    import threading

    db = open_database(url)
    out = threading.Lock()
    acked = 0

    def writer(t: int) -> None:
        nonlocal acked
        i = 0
        while True:
            name = f"{t}-{i}".encode()

            def put(tr: Transaction, key: bytes = prefix + name, val: bytes = name) -> None:
                tr.set(key, val)

            db.run(put)
            with out:
                acked += 1
                line = name.decode() + "\n"
                if acked % 50 == 0:
                    line += (
                        f"# commits={getattr(db, 'commits', 0)} "
                        f"batches={getattr(db, 'batches', 0)}\n"
                    )
                sys.stdout.write(line)
                sys.stdout.flush()
            i += 1

    workers = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def _bench(url: str, n: int, threads: int = 1) -> None:
    """Time ``n`` small read-modify-write transactions (one get + one set) per thread.

    Each thread works on its own key, so ``threads`` > 1 measures how commits of
    concurrent transactions share durable writes, not how they conflict.
    """
    import threading
    import time

    db = open_database(url)
    run = uuid.uuid4().hex
    keys = [pack(TEST, "bench", run, t) for t in range(threads)]

    def worker(key: bytes) -> None:
        def rmw(tr: Transaction) -> None:
            tr.set(key, str(int(tr.get(key) or b"0") + 1).encode())

        for _ in range(n):
            db.run(rmw)

    try:
        workers = [threading.Thread(target=worker, args=(k,)) for k in keys]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        dt = time.perf_counter() - t0
        b, e = prefix_range(TEST, "bench", run)
        db.run(lambda tr: tr.clear_range(b, e))
    finally:
        db.close()
    total = n * threads
    print(
        f"{db.engine}: {threads} thread(s) x {n} read-modify-write txns in {dt:.2f}s = "
        f"{total / dt:.0f} txn/s (commits={getattr(db, 'commits', '-')}, "
        f"batches={getattr(db, 'batches', '-')})",
        flush=True,
    )


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "increment":
        _increment(argv[1], bytes.fromhex(argv[2]), int(argv[3]))
        return 0
    if len(argv) == 3 and argv[0] == "commit-forever":
        _commit_forever(argv[1], bytes.fromhex(argv[2]))
        return 0
    if len(argv) == 4 and argv[0] == "commit-concurrent":
        _commit_concurrent(argv[1], bytes.fromhex(argv[2]), int(argv[3]))
        return 0
    if len(argv) in (3, 4) and argv[0] == "bench":
        _bench(argv[1], int(argv[2]), int(argv[3]) if len(argv) == 4 else 1)
        return 0
    print(
        "usage: python -m fs3.testing.kv increment URL KEY_HEX N"
        " | commit-forever URL PREFIX_HEX | commit-concurrent URL PREFIX_HEX THREADS"
        " | bench URL N [THREADS]"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
