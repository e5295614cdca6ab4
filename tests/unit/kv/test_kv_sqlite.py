"""SQLite engine specifics the contract suite cannot see: pragmas, lock timeouts,
the commit-log horizon, connection handling, bad configuration and group commit."""

from __future__ import annotations

import gc
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from fs3.errors import Code, FsError
from fs3.kv import open_database
from fs3.kv.sqlite import SqliteDatabase
from fs3.testing.lossyfs import lossy_dir, skip_reason


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "kv.db")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("sync", "level"), [("FULL", 2), ("NORMAL", 1), ("full", 2)])
def test_wal_mode_and_synchronous_level(path: str, sync: str, level: int) -> None:
    with SqliteDatabase(path, synchronous=sync) as db:
        tr = db.create_transaction()
        tr.get(b"x")
        conn = tr._conn
        assert conn is not None
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == level
        tr.cancel()


@pytest.mark.timeout(10)
def test_open_database_url_forms(tmp_path, monkeypatch) -> None:
    db = open_database(f"sqlite://{tmp_path}/abs.db")
    assert isinstance(db, SqliteDatabase) and db.path == f"{tmp_path}/abs.db"
    db.close()
    monkeypatch.chdir(tmp_path)
    db = open_database("sqlite://rel/kv.db")  # relative, parent directory created
    db.run(lambda tr: tr.set(b"k", b"v"))
    db.close()
    assert os.path.exists(tmp_path / "rel" / "kv.db")


@pytest.mark.timeout(10)
def test_url_query_options(tmp_path) -> None:
    db = open_database(f"sqlite://{tmp_path}/q.db?synchronous=NORMAL&busy_timeout_ms=250")
    assert isinstance(db, SqliteDatabase)
    assert (db.path, db.synchronous, db.busy_timeout_ms) == (f"{tmp_path}/q.db", "NORMAL", 250)
    db.close()
    for bad in ("?fsync=1", "?busy_timeout_ms=soon", "?synchronous=OFF"):
        with pytest.raises(FsError) as ei:
            open_database(f"sqlite://{tmp_path}/q.db{bad}")
        assert ei.value.code == Code.INVALID_ARGUMENT


@pytest.mark.timeout(10)
def test_data_persists_across_reopen(path: str) -> None:
    with SqliteDatabase(path) as db:
        db.run(lambda tr: tr.set(b"k", b"v"))
    with SqliteDatabase(path) as db:
        assert db.run(lambda tr: tr.get(b"k")) == b"v"


@pytest.mark.timeout(10)
def test_foreign_write_lock_gives_retryable_error_not_a_crash(path: str) -> None:
    db = SqliteDatabase(path, busy_timeout_ms=50)
    db.run(lambda tr: tr.set(b"k", b"v0"))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        other.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (b"z", b"1"))
        # reads still work (WAL readers never wait for the writer) ...
        assert db.run(lambda tr: tr.get(b"k")) == b"v0"
        # ... a commit waits busy_timeout, then fails retryably
        tr = db.create_transaction()
        tr.set(b"k", b"v1")
        with pytest.raises(FsError) as ei:
            tr.commit()
        assert ei.value.code == Code.KV_UNAVAILABLE and ei.value.retryable
        with pytest.raises(FsError) as ei:
            db.run(lambda tr: tr.set(b"k", b"v2"), max_retries=2)
        assert ei.value.retryable
    finally:
        other.execute("ROLLBACK")
        other.close()
    db.run(lambda tr: tr.set(b"k", b"v3"))
    assert db.run(lambda tr: tr.get(b"k")) == b"v3"
    db.close()


@pytest.mark.timeout(10)
def test_read_modify_write_waits_for_lock_then_detects_conflict(path: str) -> None:
    with SqliteDatabase(path) as db:
        db.run(lambda tr: tr.set(b"k", b"0"))
        t1 = db.create_transaction()
        assert t1.get(b"k") == b"0"
        t2 = db.create_transaction()
        t2.set(b"k", b"2")
        t2.commit()
        t1.set(b"k", b"1")
        with pytest.raises(FsError) as ei:
            t1.commit()  # the in-place upgrade is refused; the commit log says why
        assert ei.value.code == Code.KV_CONFLICT
        assert db.run(lambda tr: tr.get(b"k")) == b"2"


@pytest.mark.timeout(10)
def test_snapshot_point_read_runs_one_select(path: str) -> None:
    """A snapshot read leaves the commit version unread (it is not needed to commit nothing)."""
    with SqliteDatabase(path) as db:
        db.run(lambda tr: tr.set(b"k", b"v"))
        statements: list[str] = []
        for conn in db._pool:  # the transaction below borrows one of these
            conn.set_trace_callback(statements.append)
        tr = db.create_transaction()
        assert tr.get(b"k", snapshot=True) == b"v"
        tr.commit()
        assert tr.read_version is None
        assert statements == ["BEGIN", "SELECT v FROM kv WHERE k = x'6b'", "ROLLBACK"]
        for conn in db._pool:
            conn.set_trace_callback(None)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("later", ["get", "write"])
def test_version_read_after_a_snapshot_read_is_the_snapshots(path: str, later: str) -> None:
    """A transaction whose first reads were snapshot reads validates its conflict reads
    (and its commit) from the version of the snapshot those pinned, not a later one."""
    with SqliteDatabase(path) as db:
        db.run(lambda tr: (tr.set(b"a", b"0"), tr.set(b"k", b"0")))
        t1 = db.create_transaction()
        assert t1.get(b"a", snapshot=True) == b"0"  # pins the snapshot, not the version
        db.run(lambda tr: tr.set(b"k", b"2"))  # commits after t1's snapshot
        if later == "get":
            assert t1.get(b"k") == b"0"  # still the snapshot; joins the conflict set
        else:
            t1.add_read_conflict_range(b"k", b"l")
        t1.set(b"mine", b"1")
        with pytest.raises(FsError) as ei:
            t1.commit()
        assert ei.value.code == Code.KV_CONFLICT
        assert db.run(lambda tr: tr.get(b"mine")) is None


@pytest.mark.timeout(10)
def test_snapshot_reads_then_a_write_commit_at_the_snapshots_version(path: str) -> None:
    with SqliteDatabase(path) as db:
        db.run(lambda tr: tr.set(b"a", b"0"))
        t1 = db.create_transaction()
        assert t1.get(b"a", snapshot=True) == b"0"
        db.run(lambda tr: tr.set(b"b", b"1"))
        t1.set(b"c", b"1")
        t1.commit()  # snapshot reads conflict with nothing: the write lands
        assert t1.read_version == 1  # its snapshot's, read at commit; "b" came with version 2
        assert db.run(lambda tr: (tr.get(b"b"), tr.get(b"c"))) == (b"1", b"1")


@pytest.mark.timeout(30)
def test_transaction_older_than_the_commit_log_horizon_conflicts(path: str) -> None:
    with SqliteDatabase(path, max_txn_age_s=0.001) as db:
        old = db.create_transaction()
        old.get(b"unrelated")
        for i in range(300):  # passes a trim point; the log before it is dropped
            db.run(lambda tr, i=i: tr.set(b"n", b"%d" % i))
        old.set(b"mine", b"1")
        with pytest.raises(FsError) as ei:
            old.commit()
        assert ei.value.code == Code.KV_CONFLICT and ei.value.retryable
        assert "too old" in ei.value.message
        # the log really is bounded
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("SELECT count(*) FROM kv_commits").fetchone()[0] < 300
        finally:
            conn.close()
        # a fresh transaction is fine
        db.run(lambda tr: (tr.get(b"unrelated"), tr.set(b"mine", b"2")))


@pytest.mark.timeout(10)
def test_dropped_transaction_returns_its_connection(path: str) -> None:
    with SqliteDatabase(path) as db:
        db.run(lambda tr: tr.get(b"x"))
        idle = len(db._pool)
        tr = db.create_transaction()
        tr.get(b"x")
        assert len(db._pool) == idle - 1
        del tr
        gc.collect()
        assert len(db._pool) == idle


@pytest.mark.timeout(10)
def test_closed_database_refuses_new_transactions(path: str) -> None:
    db = SqliteDatabase(path)
    db.close()
    with pytest.raises(FsError) as ei:
        db.run(lambda tr: tr.get(b"x"))
    assert ei.value.code == Code.KV_UNAVAILABLE and not ei.value.retryable


@pytest.mark.timeout(10)
def test_bad_configuration_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(FsError) as ei:
        SqliteDatabase(str(tmp_path / "kv.db"), synchronous="OFF")
    assert ei.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(FsError) as ei:
        SqliteDatabase(str(tmp_path / "kv.db"), busy_timeout_ms=-1)
    assert ei.value.code == Code.INVALID_ARGUMENT
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FsError) as ei:
        SqliteDatabase(str(tmp_path / "afile" / "kv.db"))  # parent is a file
    assert ei.value.code == Code.KV_UNAVAILABLE and not ei.value.retryable
    (tmp_path / "garbage.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(FsError) as ei:
        SqliteDatabase(str(tmp_path / "garbage.db"))
    assert ei.value.code == Code.KV_UNAVAILABLE and not ei.value.retryable


@pytest.mark.timeout(60)
@pytest.mark.fuse
@pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
def test_committed_data_survives_a_power_cut_in_a_new_directory() -> None:
    """Regression: the KV's parent directory was created with os.makedirs and never fsync'd
    into its own parent, so a power cut dropped the whole database with every commit."""
    with lossy_dir("fs3-kv-lossy-") as m:
        path = str(m.mountpoint / "var" / "fs3" / "kv.db")
        db = SqliteDatabase(path)
        db.run(lambda tr: tr.set(b"k", b"acknowledged"))
        m.crash()
        db.close()
        with SqliteDatabase(path) as again:
            assert again.run(lambda tr: tr.get(b"k")) == b"acknowledged"


# -- group commit ---------------------------------------------------------------------


class _HeldCommits:
    """Make the engine look busy committing, so committers queue up as one batch.

    While held, every ``commit()`` waits in the group-commit queue exactly as it
    would behind a leader in the middle of an fsync; :meth:`release` lets them go.
    """

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        assert db._group.try_exclusive(), "the engine was busy committing"

    def wait_queued(self, n: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (q := self.db._group.queued) < n:
            assert time.monotonic() < deadline, f"only {q} of {n} queued"
            time.sleep(0.01)

    def release(self) -> None:
        self.db._group.end_exclusive()


def _commit_in_thread(tr, results: dict, name: str) -> threading.Thread:
    def go() -> None:
        try:
            tr.commit()
            results[name] = "ok"
        except FsError as e:
            results[name] = e

    t = threading.Thread(target=go)
    t.start()
    return t


@pytest.mark.timeout(30)
def test_queued_transactions_share_one_durable_commit(path: str) -> None:
    with SqliteDatabase(path) as db:
        held = _HeldCommits(db)
        results: dict = {}
        threads = []
        for i in range(6):
            tr = db.create_transaction()
            tr.get(b"k%d" % i)  # a read: each is validated, not just blindly applied
            tr.set(b"k%d" % i, b"v%d" % i)
            threads.append(_commit_in_thread(tr, results, str(i)))
        held.wait_queued(6)
        assert not results  # nobody is acknowledged before its batch committed
        held.release()
        for t in threads:
            t.join(10)
        assert results == {str(i): "ok" for i in range(6)}
        assert (db.commits, db.batches) == (6, 1)
        for i in range(6):
            assert db.run(lambda tr, i=i: tr.get(b"k%d" % i)) == b"v%d" % i
        # each got its own version: the commit log has a row for each of the six
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("SELECT count(DISTINCT version) FROM kv_commits").fetchone()[0] == 6
        finally:
            conn.close()


@pytest.mark.timeout(30)
def test_a_conflicting_transaction_aborts_alone_inside_its_batch(path: str) -> None:
    with SqliteDatabase(path) as db:
        db.run(lambda tr: tr.set(b"n", b"0"))
        held = _HeldCommits(db)
        results: dict = {}
        threads = []
        for name in ("a", "b"):  # both read n at the same version, both write it
            tr = db.create_transaction()
            n = int(tr.get(b"n") or b"0")
            tr.set(b"n", b"%d" % (n + 1))
            threads.append(_commit_in_thread(tr, results, name))
        other = db.create_transaction()
        other.get(b"other")
        other.set(b"other", b"x")
        threads.append(_commit_in_thread(other, results, "other"))
        held.wait_queued(3)
        held.release()
        for t in threads:
            t.join(10)
        assert results["other"] == "ok"
        outcomes = sorted(str(results[n]) if results[n] != "ok" else "ok" for n in ("a", "b"))
        assert outcomes[1] == "ok" and "KV_CONFLICT" in outcomes[0], results
        conflict = next(results[n] for n in ("a", "b") if results[n] != "ok")
        assert conflict.retryable
        assert (db.commits, db.batches) == (1 + 2, 1 + 1)  # the setup commit, then one batch
        assert db.run(lambda tr: tr.get(b"n")) == b"1"  # one increment, not two, not zero
        assert db.run(lambda tr: tr.get(b"other")) == b"x"


@pytest.mark.timeout(60)
def test_many_threads_committing_take_fewer_fsyncs_than_commits(path: str) -> None:
    with SqliteDatabase(path) as db:
        key = b"counter"

        def inc(tr) -> None:
            tr.set(key, b"%d" % (int(tr.get(key) or b"0") + 1))

        def put(i: int) -> None:
            for j in range(40):
                db.run(lambda tr, j=j: tr.set(b"p%d-%d" % (i, j), b"x"))
                db.run(inc)

        threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(50)
        assert db.run(lambda tr: tr.get(key)) == b"320"  # conflicts retried, none lost
        assert len(db.run(lambda tr: tr.get_range(b"p", b"q"))) == 320
        assert db.commits == 640
        assert db.batches < db.commits


@pytest.mark.timeout(90)
@pytest.mark.fuse
@pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
def test_group_committed_data_survives_kill_9_and_a_power_cut() -> None:
    """Six threads of a child commit at once (group commit); SIGKILL, then the power goes:
    every transaction the child acknowledged is on disk."""
    with lossy_dir("fs3-kv-lossy-") as m:
        path = str(m.mountpoint / "kv.db")
        SqliteDatabase(path).close()  # the schema exists before the child starts
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fs3.testing.kv",
                "commit-concurrent",
                f"sqlite://{path}",
                b"w".hex(),
                "6",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            acked, stats = _read_acks(child, 300, 60)
            assert len(acked) >= 300, (child.poll(), child.stderr.read() if child.stderr else "")
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
            acked.extend(x for x in child.stdout.read().split("\n") if x and x[0] != "#")
            m.crash()  # everything the child did not fsync is gone
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=10)
            for f in (child.stdout, child.stderr):
                if f:
                    f.close()
        commits, batches = stats[-1]
        assert batches < commits, stats  # the commits really were grouped
        with SqliteDatabase(path) as again:
            stored = dict(again.run(lambda tr: tr.get_range(b"w", b"x")))
        missing = [k for k in acked if stored.get(b"w" + k.encode()) != k.encode()]
        assert not missing, missing[:10]


def _read_acks(
    child: subprocess.Popen[str], n: int, timeout_s: float
) -> tuple[list[str], list[tuple[int, int]]]:
    """Acknowledged names and (commits, batches) reports from a commit-concurrent child."""
    assert child.stdout is not None
    acked: list[str] = []
    stats: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout_s
    while (len(acked) < n or not stats) and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        line = line.strip()
        if line.startswith("#"):
            f = dict(part.split("=") for part in line[1:].split())
            stats.append((int(f["commits"]), int(f["batches"])))
        elif line:
            acked.append(line)
    return acked, stats


def test_commit_ranges_pack_and_unpack() -> None:
    from fs3.kv.sqlite import _Commit, _pack_ranges

    points = {b"a", b"", b"\x00\xff" * 300}
    ranges = [(b"b", b"c"), (b"", b"\xff")]
    c = _Commit.unpack(7, _pack_ranges(points, ranges))
    assert (c.version, c.points, c.ranges) == (7, points, ranges)
    assert _Commit.unpack(1, b"").points == set()


@pytest.mark.timeout(10)
def test_a_commit_writes_one_log_row_and_no_counter(path: str) -> None:
    """One kv_commits row per commit (its version as the table's key, its ranges in
    one blob); kv_meta is not rewritten: the version is the log's newest row."""
    from fs3.kv.sqlite import _Commit

    with SqliteDatabase(path) as db:
        db.run(lambda tr: (tr.set(b"x", b"1"), tr.set(b"y", b"2"), tr.clear_range(b"p", b"q")))
        db.run(lambda tr: tr.set(b"x", b"3"))
        conn = sqlite3.connect(path)
        try:
            rows = conn.execute(
                "SELECT version, ranges FROM kv_commits ORDER BY version"
            ).fetchall()
            assert [v for v, _ in rows] == [1, 2]
            c = _Commit.unpack(1, bytes(rows[0][1]))
            assert c.points == {b"x", b"y"} and c.ranges == [(b"p", b"q")]
            assert conn.execute("SELECT version FROM kv_meta").fetchone()[0] == 0
            assert conn.execute("SELECT count(*) FROM kv_log").fetchone()[0] == 0
        finally:
            conn.close()
        tr = db.create_transaction()
        tr.get(b"x")
        assert tr.read_version == 2
        tr.cancel()


@pytest.mark.timeout(10)
def test_versions_continue_from_a_database_with_the_old_log(path: str) -> None:
    """A file written by the per-key kv_log of earlier releases: its version (kv_meta)
    carries on, and the old log table goes."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
    conn.execute("CREATE TABLE kv_log (version INTEGER, b BLOB, e BLOB, ts REAL)")
    conn.execute("CREATE INDEX kv_log_version ON kv_log(version)")
    conn.execute(
        "CREATE TABLE kv_meta (id INTEGER PRIMARY KEY CHECK (id = 0), "
        "version INTEGER NOT NULL, trimmed INTEGER NOT NULL)"
    )
    conn.execute("INSERT INTO kv_meta VALUES (0, 41, 30)")
    conn.execute("INSERT INTO kv VALUES (x'6b', x'76')")
    conn.close()
    with SqliteDatabase(path) as db:
        _write_at_version(db, b"k", b"v", 41)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT count(*) FROM kv_log").fetchone()[0] == 0
    finally:
        conn.close()


@pytest.mark.timeout(10)
def test_a_process_of_an_earlier_release_cannot_commit_on_an_upgraded_file(path: str) -> None:
    """A commit in the old format (kv rows, then its kv_log rows, then kv_meta's
    version, in one transaction) on a file this release opened is rolled back whole,
    with a message that says why: an old and a new process on one file would not
    see each other's commits in their conflict checks (lost updates)."""
    from fs3.kv.sqlite import KV_LOG_RETIRED

    with SqliteDatabase(path) as db:
        db.run(lambda tr: tr.set(b"k", b"new"))
        old = sqlite3.connect(path, isolation_level=None)
        try:
            # what an earlier release ran at open: a no-op now
            old.execute(
                "CREATE TABLE IF NOT EXISTS kv_log "
                "(version INTEGER NOT NULL, b BLOB NOT NULL, e BLOB NOT NULL, ts REAL NOT NULL)"
            )
            old.execute("CREATE INDEX IF NOT EXISTS kv_log_version ON kv_log(version)")
            old.execute("BEGIN IMMEDIATE")
            old.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (x'6b', x'6f6c64')")
            with pytest.raises(sqlite3.IntegrityError, match="upgraded"):
                old.execute("INSERT INTO kv_log VALUES (1, x'6b', x'6b00', 0)")
            assert not old.in_transaction  # rolled back whole, kv row included
        finally:
            old.close()
        assert db.run(lambda tr: tr.get(b"k")) == b"new"
        assert "run every process" in KV_LOG_RETIRED


@pytest.mark.timeout(30)
def test_trimming_keeps_the_newest_commit_and_so_the_version(path: str) -> None:
    """Every row old enough goes except the newest: it carries the version, which
    another process (a fresh database object) must read as the latest."""
    with SqliteDatabase(path, max_txn_age_s=0.001) as db:
        for i in range(256):
            db.run(lambda tr, i=i: tr.set(b"n", b"%d" % i))
            if i == 254:
                time.sleep(0.01)  # all but the last are older than the horizon at 256
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("SELECT version FROM kv_commits").fetchall() == [(256,)]
            assert conn.execute("SELECT trimmed FROM kv_meta").fetchone()[0] == 255
        finally:
            conn.close()
    with SqliteDatabase(path) as other:
        _write_at_version(other, b"n", b"255", 256)


def _write_at_version(db: SqliteDatabase, key: bytes, value: bytes, version: int) -> None:
    """``key`` reads ``value`` at commit ``version``; a write of it commits as the next one."""
    tr = db.create_transaction()
    assert tr.get(key) == value and tr.read_version == version
    tr.set(key, b"x")
    tr.commit()
    tr = db.create_transaction()
    assert tr.get(key) == b"x" and tr.read_version == version + 1
    tr.cancel()


@pytest.mark.timeout(30)
def test_a_commit_polls_a_foreign_write_lock_and_takes_it_once_free(path: str) -> None:
    """The batch writer does not sleep in SQLite's busy handler (1, 2, 5, 10 ... ms
    between tries): it tries BEGIN IMMEDIATE again at sub-millisecond pauses, and
    commits as soon as the other process lets the lock go."""
    with SqliteDatabase(path) as db:
        writer = db._writer_conn()
        assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == 0
        tries: list[str] = []
        writer.set_trace_callback(lambda sql: tries.append(sql) if "IMMEDIATE" in sql else None)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        results: dict[str, str] = {}

        def commit() -> None:
            tr = db.create_transaction()
            tr.set(b"k", b"v")  # a blind write: straight to a batch
            tr.commit()
            results["k"] = "ok"

        t = threading.Thread(target=commit)
        t.start()
        deadline = time.monotonic() + 20
        while len(tries) < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(tries) >= 5 and not results  # tried again and again, still waiting
        other.execute("ROLLBACK")
        other.close()
        t.join(10)
        assert results == {"k": "ok"}
        writer.set_trace_callback(None)
        assert db.run(lambda tr: tr.get(b"k")) == b"v"


@pytest.mark.timeout(10)
def test_snapshot_get_is_one_statement_without_begin(path: str) -> None:
    """A point read outside a transaction costs one SELECT: no BEGIN, no version read, no ROLLBACK."""
    with SqliteDatabase(path) as db:
        db.run(lambda tr: (tr.set(b"a", b"1"), tr.set(b"b", b"2")))
        conn = db._acquire()
        traced: list[str] = []
        conn.set_trace_callback(traced.append)
        db._release(conn)
        assert db.snapshot_get([b"a", b"missing", b"b"]) == [b"1", None, b"2"]
        assert len(traced) == 1 and traced[0].startswith("SELECT"), traced
        assert not conn.in_transaction  # nothing pinned: the pool holds no snapshot
        traced.clear()
        assert db.snapshot_get([b"a"]) == [b"1"]
        assert len(traced) == 1, traced


@pytest.mark.timeout(20)
def test_commit_now_commits_alone_and_durably_when_nothing_is_in_the_way(path: str) -> None:
    with SqliteDatabase(path) as db:
        tr = db.create_transaction()
        assert tr.get(b"k") is None
        tr.set(b"k", b"v")
        assert tr.commit_now()
        assert (db.commits, db.batches) == (1, 1)
        ro = db.create_transaction()
        assert ro.get(b"k") == b"v"
        assert ro.commit_now()  # read-only: nothing to write, nothing to wait for
    # another connection (as after a restart) sees it
    with SqliteDatabase(path) as db2:
        assert db2.run(lambda tr: tr.get(b"k")) == b"v"


@pytest.mark.timeout(20)
def test_commit_now_refuses_to_wait_and_writes_nothing(path: str) -> None:
    """Each case where a commit would have to queue: False at once, nothing written,
    the transaction finished; the same writes then commit the ordinary way."""
    with SqliteDatabase(path) as db:
        # 1. a batch (another thread's commit) in progress
        held = _HeldCommits(db)
        tr = db.create_transaction()
        tr.get(b"a")
        tr.set(b"a", b"1")
        t0 = time.monotonic()
        assert not tr.commit_now()
        assert time.monotonic() - t0 < 1.0
        held.release()
        with pytest.raises(FsError):
            tr.commit()  # finished: it cannot be committed again
        # 2. somebody committed after its snapshot (it must be validated in a batch)
        stale = db.create_transaction()
        stale.get(b"b")
        stale.set(b"b", b"stale")
        db.run(lambda t: t.set(b"other", b"x"))
        assert not stale.commit_now()
        # 3. blind writes: no snapshot to upgrade in place
        blind = db.create_transaction()
        blind.set(b"c", b"1")
        assert not blind.commit_now()
        # 4. another process holds SQLite's write lock: refused at once, no busy wait
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            locked = db.create_transaction()
            locked.get(b"d")
            locked.set(b"d", b"1")
            t0 = time.monotonic()
            assert not locked.commit_now()
            assert time.monotonic() - t0 < 1.0  # busy_timeout is 10 s
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert db.commits == 1  # only the "other" write
        for k in (b"a", b"b", b"c", b"d"):
            assert db.run(lambda t, k=k: t.get(k)) is None
        again = db.create_transaction()
        again.get(b"a")
        again.set(b"a", b"1")
        assert again.commit_now()
        assert db.run(lambda t: t.get(b"a")) == b"1"
