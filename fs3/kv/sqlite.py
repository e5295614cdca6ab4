"""SQLite KV engine: the embedded default, one WAL file shared by processes.

Every mgmtd and meta process on a host opens the same database file; SQLite's
WAL mode gives each reader a consistent snapshot while one writer at a time
appends to the log, and ``synchronous=FULL`` fsyncs the log on every commit, so
a committed transaction survives ``kill -9`` of its writer and power loss.

Concurrency is optimistic, as FoundationDB does it, so the engine honours the
whole contract of ``fs3.kv.database`` (snapshot reads that do not conflict,
explicit read-conflict ranges), not just "one writer at a time":

* A transaction reads through a deferred SQLite read transaction: the first read
  pins a WAL snapshot, whose *commit version* (the newest row of ``kv_commits``) is read
  with the first read that joins the conflict set, or at commit if it writes (a
  transaction of snapshot reads only never needs it). Writes are buffered in the
  transaction object and merged into its reads (read-your-writes).
* Every commit appends one row to ``kv_commits``: its version (the table's
  integer key, so the newest version is one B-tree seek and the row goes to the
  rightmost leaf) and its write ranges packed into one blob. A commit thus adds
  one row and no index entry, and rewrites no counter: a commit of a few keys
  writes the kv pages it changes plus one page of the log, which is what the
  WAL fsync of every commit pays for (``kv_meta`` keeps only the trim horizon,
  and the version of a database whose log is still empty).
* At commit the buffered writes are applied under SQLite's write lock. Fast
  path: the read transaction upgrades in place, which WAL mode allows only if
  nobody committed since our snapshot - then no conflict is possible. Otherwise
  (``SQLITE_BUSY_SNAPSHOT`` or the lock is held) we start a fresh ``BEGIN
  IMMEDIATE`` (waiting up to ``busy_timeout``, polling the lock at sub-millisecond
  intervals: :meth:`SqliteDatabase._begin_write`) and compare our read-conflict
  ranges with the write ranges of every commit after our read version; an
  overlap is ``KV_CONFLICT`` (retryable), exactly like FDB's resolver.
* ``kv_commits`` rows older than ``max_txn_age_s`` are trimmed (the newest row
  always stays: it holds the version); a transaction whose
  read version predates the trimmed horizon fails with a retryable conflict
  ("transaction too old"), like FDB's 5-second MVCC window.

Group commit: with ``synchronous=FULL`` every SQLite COMMIT is one WAL fsync,
and the fsync, not the SQL, bounds a busy meta server. So commits of one process
share SQLite write transactions, through :class:`fs3.group_commit.GroupCommit`
(the mechanism the storage targets' chunk rows use too). A transaction that
finds nobody committing and nobody queued takes the fast path above on its own
(:meth:`GroupCommit.try_exclusive`). Otherwise it queues; the
batch's leader opens one ``BEGIN IMMEDIATE``, validates and applies each
transaction in turn under its own savepoint and version (a conflicting one
aborts alone: its savepoint is never written), and COMMITs once. Every
transaction of the batch is acknowledged - its ``commit()`` returns - only after
that COMMIT (and so the fsync) returned. A batch that fails as a whole (the
COMMIT, or the write lock not granted in time) fails for all its members and is
not retried one by one: its members are already isolated by their savepoints,
and another wait for the lock per member would only multiply the delay.

Conflict checks read an in-memory tail of the commit log (:class:`_ConflictIndex`):
the write ranges of recent commits by version, extended from ``kv_commits`` whenever
another process committed in between. A check touches only the commits after the
transaction's read version and tests point reads by set membership, so it costs
nothing that grows with the database or the number of keys read earlier.

SQLite connections are not thread-safe and hold at most one transaction, so each
transaction borrows a connection from a small pool for its lifetime; threads
(``run_async`` worker threads) and interleaved transactions on one thread both
work. Every SQLite failure becomes an :class:`FsError`; lock timeouts are
retryable, corruption or a missing directory is not.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import threading
import time
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from fs3 import faults
from fs3.durable import makedirs_durably
from fs3.errors import Code, FsError
from fs3.group_commit import GroupCommit
from fs3.kv.database import BufferedWritesTransaction, Database, KeyValue, Transaction, key_after

Range = tuple[bytes, bytes]

# What a process of an earlier release gets for each commit on an upgraded file.
KV_LOG_RETIRED = (
    "this KV file was upgraded to the kv_commits log of a newer fs3: "
    "run every process that uses it on that release"
)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS kv_commits "
    "(version INTEGER PRIMARY KEY, ranges BLOB NOT NULL, ts REAL NOT NULL)",
    # The commit log of earlier releases (a row per key and an index). Its versions
    # continue from kv_meta's, and its rows only mattered to transactions then in
    # flight, so they go. The table itself stays, retired: a process of an earlier
    # release on the same file (a rolling restart) would log its commits there,
    # unseen by this release's conflict checks (and this release's commits unseen
    # by its own): lost updates. Its every commit is rolled back whole instead,
    # with a message that says why.
    "CREATE TABLE IF NOT EXISTS kv_log "
    "(version INTEGER NOT NULL, b BLOB NOT NULL, e BLOB NOT NULL, ts REAL NOT NULL)",
    "DELETE FROM kv_log",
    "CREATE TRIGGER IF NOT EXISTS kv_log_retired BEFORE INSERT ON kv_log BEGIN "
    f"SELECT RAISE(ROLLBACK, '{KV_LOG_RETIRED}'); END",
    "CREATE TABLE IF NOT EXISTS kv_meta (id INTEGER PRIMARY KEY CHECK (id = 0), "
    "version INTEGER NOT NULL, trimmed INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO kv_meta (id, version, trimmed) VALUES (0, 0, 0)",
)

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_BUSY_SNAPSHOT = 517
_TRIM_EVERY = 256  # commits between kv_commits trims
_POOL_MAX = 16  # idle connections kept
_FETCH = 256  # rows per fetch in range reads
_BATCH_MAX = 256  # transactions per group commit
_INDEX_MAX = 8192  # commits kept in the in-memory conflict index
_BUSY_PAUSE_MIN_S = 50e-6  # first pause between tries for another process's write lock
_BUSY_PAUSE_MAX_S = 1e-3  # the longest (see SqliteDatabase._begin_write)
# The commit version: the newest kv_commits row (a seek to the rowid B-tree's last
# entry), or kv_meta's while the log is empty (a new database or one that predates
# kv_commits); kv_meta also holds the trim horizon.
_VERSION_SQL = (
    "SELECT coalesce((SELECT version FROM kv_commits ORDER BY version DESC LIMIT 1), version), "
    "trimmed FROM kv_meta WHERE id = 0"
)
_LEN = struct.Struct(">I")


def _pack_ranges(points: Iterable[bytes], ranges: list[Range]) -> bytes:
    """One commit's write ranges as one blob: ``0 len key`` per point, ``1 len b len e`` per range."""
    out = bytearray()
    for k in points:
        out += b"\x00"
        out += _LEN.pack(len(k))
        out += k
    for b, e in ranges:
        out += b"\x01"
        out += _LEN.pack(len(b))
        out += b
        out += _LEN.pack(len(e))
        out += e
    return bytes(out)


# This process's pid, kept by a fork hook: connections of a parent are never used
# in a forked child, and asking the kernel (os.getpid) on every pool access cost
# more than half a point read's Python time.
_pid = os.getpid()


def _after_fork() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)

_IN_SQL: dict[int, str] = {}  # snapshot_get's statement by number of keys


def _in_sql(n: int) -> str:
    """snapshot_get's one statement for ``n`` keys (kept for small ``n``).

    Up to 16 keys: a compound ``SELECT ... WHERE k = ? UNION ALL ...``, one
    primary-key search per key; SQLite plans ``k IN (?, ?)`` with an ephemeral
    table of the list, which costs more than the lookups (for two keys measured
    at 11 µs against 7 µs). A compound select is still one statement: one snapshot.
    """
    if n <= 16:
        sql = " UNION ALL ".join(["SELECT k, v FROM kv WHERE k = ?"] * n)
        _IN_SQL[n] = sql
        return sql
    return "SELECT k, v FROM kv WHERE k IN (" + ",".join("?" * n) + ")"


def _overlaps(a: Range, b: Range) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _is_busy(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - Python < 3.11
        return "locked" in str(e) or "busy" in str(e)
    return (code & 0xFF) in (_SQLITE_BUSY, _SQLITE_LOCKED)


def _to_fserror(e: sqlite3.Error, what: str) -> FsError:
    """Map a SQLite failure: lock contention is retryable, the rest is not."""
    name = getattr(e, "sqlite_errorname", type(e).__name__)
    if getattr(e, "sqlite_errorcode", None) == _SQLITE_BUSY_SNAPSHOT:
        return FsError(
            Code.KV_CONFLICT, f"sqlite {what}: snapshot is stale ({name})", retryable=True
        )
    if _is_busy(e):
        return FsError(
            Code.KV_UNAVAILABLE, f"sqlite {what}: database is busy ({name}: {e})", retryable=True
        )
    return FsError(Code.KV_UNAVAILABLE, f"sqlite {what} failed ({name}: {e})", retryable=False)


@dataclass
class _Commit:
    """The write ranges of one committed version: point keys apart, for set lookups."""

    version: int
    points: set[bytes] = field(default_factory=set)
    ranges: list[Range] = field(default_factory=list)

    def add(self, b: bytes, e: bytes) -> None:
        if e == key_after(b):
            self.points.add(b)
        else:
            self.ranges.append((b, e))

    @classmethod
    def unpack(cls, version: int, blob: bytes) -> _Commit:
        """The commit whose ranges :func:`_pack_ranges` packed into ``blob``."""
        c = cls(version)
        view = memoryview(blob)
        i, n = 0, len(view)
        while i < n:
            kind = view[i]
            (ln,) = _LEN.unpack_from(view, i + 1)
            i += 5
            b = bytes(view[i : i + ln])
            i += ln
            if kind == 0:
                c.points.add(b)
                continue
            (ln,) = _LEN.unpack_from(view, i)
            i += 4
            c.ranges.append((b, bytes(view[i : i + ln])))
            i += ln
        return c

    def hits(self, reads: list[Range]) -> bool:
        for rb, re_ in reads:
            if re_ == key_after(rb):
                if rb in self.points or any(b <= rb < e for b, e in self.ranges):
                    return True
                continue
            if any(_overlaps((b, e), (rb, re_)) for b, e in self.ranges):
                return True
            if any(rb <= k < re_ for k in self.points):
                return True
        return False


class _ConflictIndex:
    """The tail of ``kv_commits`` in memory: commits with ``floor < version <= known``.

    Only the thread committing (one at a time) touches it. ``known`` is the
    newest version this process has seen the write ranges of; when the database's
    version is ahead (another process committed), :meth:`catch_up` loads the
    missing rows from ``kv_commits`` - or, if they were trimmed, starts afresh.
    """

    def __init__(self) -> None:
        self.commits: deque[_Commit] = deque()
        self.floor: int | None = None  # versions <= floor are not in the index
        self.known: int | None = None

    def reset(self) -> None:
        self.commits.clear()
        self.floor = self.known = None

    def catch_up(self, conn: sqlite3.Connection, version: int, trimmed: int) -> None:
        if self.known is None or self.known < trimmed or self.known > version:
            self.commits.clear()
            self.floor = self.known = version
            return
        if self.known == version:
            return
        for v, blob in conn.execute(
            "SELECT version, ranges FROM kv_commits WHERE version > ? ORDER BY version",
            (self.known,),
        ):
            self.commits.append(_Commit.unpack(int(v), bytes(blob)))
        self.known = version
        self._bound()

    def append(self, c: _Commit) -> None:
        self.commits.append(c)
        self.known = c.version
        self._bound()

    def _bound(self) -> None:
        while len(self.commits) > _INDEX_MAX:
            self.floor = self.commits.popleft().version

    def covers(self, read_version: int) -> bool:
        return self.floor is not None and read_version >= self.floor

    def conflicts(self, read_version: int, reads: list[Range]) -> bool:
        """True if a commit after ``read_version`` wrote into ``reads`` (needs :meth:`covers`)."""
        for c in reversed(self.commits):
            if c.version <= read_version:
                return False
            if c.hits(reads):
                return True
        return False


class SqliteDatabase(Database):
    """A transactional ordered KV store in one SQLite WAL file.

    Args:
        path: database file; created (with its parent directory) if missing. It may
            carry the options below as a URL query, e.g. ``kv.db?synchronous=NORMAL``,
            so a service's ``kv_url`` config can choose them.
        synchronous: ``"FULL"`` (default; fsync per commit, survives power loss)
            or ``"NORMAL"`` (WAL fsynced only at checkpoints: survives a crash of
            the process but may lose the last commits on power loss).
        busy_timeout_ms: how long a commit waits for another process's write lock
            before failing with a retryable ``KV_UNAVAILABLE``.
        max_txn_age_s: commit records are kept this long; older transactions
            fail with a retryable conflict.
    """

    engine = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        busy_timeout_ms: int = 10_000,
        max_txn_age_s: float = 30.0,
    ) -> None:
        super().__init__()
        if isinstance(path, str) and "?" in path:
            # URL options: sqlite:///path/kv.db?synchronous=NORMAL&busy_timeout_ms=2000
            path, query = path.split("?", 1)
            for name, value in parse_qsl(query, keep_blank_values=True):
                try:
                    if name == "synchronous":
                        synchronous = value
                    elif name == "busy_timeout_ms":
                        busy_timeout_ms = int(value)
                    elif name == "max_txn_age_s":
                        max_txn_age_s = float(value)
                    else:
                        raise ValueError("unknown option")
                except ValueError as e:
                    raise FsError(
                        Code.INVALID_ARGUMENT,
                        f"bad sqlite KV option {name}={value!r} ({e}); options: "
                        "synchronous, busy_timeout_ms, max_txn_age_s",
                    ) from e
        if not isinstance(path, str) or not path:
            raise FsError(
                Code.INVALID_ARGUMENT, f"sqlite KV path must be a non-empty str, not {path!r}"
            )
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise FsError(
                Code.INVALID_ARGUMENT,
                f"sqlite synchronous must be FULL or NORMAL, not {synchronous!r}",
            )
        if busy_timeout_ms < 0 or max_txn_age_s <= 0:
            raise FsError(
                Code.INVALID_ARGUMENT, "sqlite busy_timeout_ms must be >= 0 and max_txn_age_s > 0"
            )
        self.path = path
        self.synchronous = synchronous.upper()
        self.busy_timeout_ms = busy_timeout_ms
        self.max_txn_age_s = max_txn_age_s
        self._lock = threading.Lock()
        self._pool: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._closed = False
        # group commit (see the module docstring): the batches, the leader's own
        # connection and the conflict index it keeps
        self._group: GroupCommit[SqliteTransaction] = GroupCommit(
            self._commit_batch, max_batch=_BATCH_MAX, retry_alone=lambda _e: False
        )
        self._writer: sqlite3.Connection | None = None
        self._index = _ConflictIndex()
        self.commits = 0  # transactions committed with writes (metrics, tests)
        self.batches = 0  # SQLite COMMITs (WAL fsyncs) they took
        parent = os.path.dirname(os.path.abspath(path))
        try:
            # durably: SQLite fsyncs the directory when the WAL first appears (which makes
            # the database file's own entry durable too), but not the levels above it
            makedirs_durably(parent)
        except OSError as e:
            raise FsError(
                Code.KV_UNAVAILABLE,
                f"sqlite KV: cannot create directory {parent}: {e}",
                retryable=False,
            ) from e
        self._init_schema()

    # -- connections ----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_ms / 1000.0,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # pooled; used by one thread at a time
                cached_statements=64,
            )
        except sqlite3.Error as e:
            raise FsError(
                Code.KV_UNAVAILABLE, f"sqlite KV: cannot open {self.path}: {e}", retryable=False
            ) from e
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
        except sqlite3.Error as e:
            conn.close()
            raise _to_fserror(e, "configure connection") from e
        return conn

    def _init_schema(self) -> None:
        """Switch the file to WAL and create the tables; safe to race with peers."""
        conn = self._connect()
        deadline = time.monotonic() + max(self.busy_timeout_ms / 1000.0, 1.0)
        try:
            while True:
                try:
                    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                    if str(mode).lower() != "wal":
                        raise FsError(
                            Code.KV_UNAVAILABLE,
                            f"sqlite KV: {self.path} cannot use WAL mode (got {mode!r})",
                            retryable=False,
                        )
                    conn.execute("BEGIN IMMEDIATE")
                    for stmt in _SCHEMA:
                        conn.execute(stmt)
                    conn.execute("COMMIT")
                    break
                except sqlite3.Error as e:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    if _is_busy(e) and time.monotonic() < deadline:
                        time.sleep(0.01)
                        continue
                    raise _to_fserror(e, f"open {self.path}") from e
        except BaseException:
            conn.close()
            raise
        self._release(conn)

    def _acquire(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise FsError(Code.KV_UNAVAILABLE, "sqlite KV database is closed", retryable=False)
            if self._pid != _pid:
                # Forked child: the parent's connections must not be used here.
                self._pool = []
                self._pid = _pid
            if self._pool:
                return self._pool.pop()
        return self._connect()

    def _release(self, conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            conn.close()
            return
        with self._lock:
            if not self._closed and len(self._pool) < _POOL_MAX and self._pid == _pid:
                self._pool.append(conn)
                return
        conn.close()

    def snapshot_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """One SELECT on a pooled connection in autocommit mode.

        A single statement outside BEGIN is its own read transaction in SQLite,
        so every row it returns comes from one WAL snapshot: a consistent read
        of all ``keys`` for the price of one statement (no BEGIN, no ROLLBACK,
        no commit-version read). The statement runs to completion
        (``fetchall``), so the connection goes back to the pool holding nothing.
        """
        keys = self._check_keys(keys)
        n = len(keys)
        if n == 0:
            return []
        sql = _IN_SQL.get(n) or _in_sql(n)
        conn = self._acquire()
        try:
            rows = conn.execute(sql, keys).fetchall()
        except sqlite3.Error as e:
            raise _to_fserror(e, "get") from e
        finally:
            self._release(conn)
        if n == 1:
            return [rows[0][1] if rows else None]
        found = dict(rows)
        return [found.get(k) for k in keys]

    def create_transaction(self) -> SqliteTransaction:
        if self._closed:
            raise FsError(Code.KV_UNAVAILABLE, "sqlite KV database is closed", retryable=False)
        return SqliteTransaction(self)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, []
        for conn in pool:
            conn.close()
        with self._group.exclusive():  # after the batch in progress
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    # -- group commit ------------------------------------------------------------

    def _group_commit(self, tr: SqliteTransaction, conn: sqlite3.Connection | None) -> None:
        """Commit ``tr`` alone or in a batch; return once durable, or raise its error.

        ``conn``: the connection holding ``tr``'s read snapshot (None for blind
        writes); this method releases it. With nobody committing or queued, the
        transaction commits alone on it (:meth:`_commit_alone`). Otherwise it
        queues for the next batch (:meth:`_commit_batch`).
        """
        if conn is not None:
            if self._group.try_exclusive():
                try:
                    if self._commit_alone(tr, conn):
                        return
                finally:
                    self._group.end_exclusive()
            else:
                self._release(conn)  # no snapshot pinned while waiting
        self._group.submit(tr)

    def _commit_alone(self, tr: SqliteTransaction, conn: sqlite3.Connection) -> bool:
        """The uncontended case: upgrade ``tr``'s read transaction in place and commit it.

        WAL refuses the upgrade (``SQLITE_BUSY_SNAPSHOT``) if anyone committed
        since the snapshot, so success means there is nothing to validate and
        the version read is still the newest. Returns False (nothing written,
        ``conn`` released) when refused: the caller takes the batch path, which
        validates against the commit log. Always releases ``conn``.
        """
        assert tr.read_version is not None
        try:
            version = tr.read_version + 1
            try:
                c = tr._log(conn, version)  # the first write: the upgrade, or BUSY_SNAPSHOT
            except sqlite3.OperationalError as e:
                if not _is_busy(e):
                    raise
                return False
            tr._apply(conn, version)
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._index.reset()
            raise _to_fserror(e, "commit") from e
        finally:
            self._release(conn)  # rolls back whatever did not commit
        if self._index.known == tr.read_version:
            self._index.append(c)
        else:
            self._index.reset()  # it missed commits before ours: reload from kv_commits
        self.commits += 1
        self.batches += 1
        return True

    def _writer_conn(self) -> sqlite3.Connection:
        """The batch leaders' connection (one at a time uses it), opened on first use."""
        if self._writer is None:
            conn = self._connect()
            try:
                # its waits for the write lock are _begin_write's, not SQLite's busy handler
                conn.execute("PRAGMA busy_timeout=0")
            except sqlite3.Error as e:
                conn.close()
                raise _to_fserror(e, "configure connection") from e
            self._writer = conn
        return self._writer

    def _begin_write(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE`` on the writer, waiting up to ``busy_timeout_ms`` for the lock.

        Another process (the other meta servers and mgmtd on this file) holds
        SQLite's write lock for one commit, a WAL fsync: a millisecond or a few.
        SQLite's own busy handler sleeps 1, 2, 5, 10, 15 ... ms between tries,
        so a writer that finds the lock taken sleeps past its release and the
        file then sits idle while both servers have commits queued. Here the
        tries are 50 us apart at first, doubling to at most 1 ms: the lock is
        taken within a fraction of a commit after it is free, at a few
        microseconds of CPU per try.
        """
        deadline = time.monotonic() + self.busy_timeout_ms / 1000.0
        pause = _BUSY_PAUSE_MIN_S
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as e:
                if not _is_busy(e) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, _BUSY_PAUSE_MAX_S)

    def _commit_batch(self, batch: list[SqliteTransaction]) -> list[FsError | None]:
        """One SQLite write transaction for ``batch`` (the group commit's ``write_batch``).

        Returns each member's outcome: a member whose reads conflict (or whose
        writes SQLite refuses) gets its own error and leaves nothing; the rest
        commit together. If the transaction itself fails (the COMMIT, the write
        lock), nobody was acknowledged and it raises for every member.
        """
        if self._closed:
            raise FsError(Code.KV_UNAVAILABLE, "sqlite KV database is closed", retryable=False)
        if self._pid != os.getpid():
            self._writer = None  # forked: the parent's connection is not ours
            self._index.reset()
        conn = self._writer_conn()
        errors: list[FsError | None] = [None] * len(batch)
        try:
            self._begin_write(conn)
            version, trimmed = conn.execute(_VERSION_SQL).fetchone()
            version, trimmed = int(version), int(trimmed)
            self._index.catch_up(conn, version, trimmed)
            added: list[_Commit] = []
            alone = len(batch) == 1  # nobody to protect: the whole transaction is its own
            for i, tr in enumerate(batch):
                try:
                    tr._validate(conn, self._index, added, trimmed)
                except FsError as e:
                    errors[i] = e
                    continue
                if alone:
                    c = tr._log(conn, version + 1)
                    tr._apply(conn, version + 1)
                else:
                    conn.execute("SAVEPOINT txn")
                    try:
                        c = tr._log(conn, version + 1)
                        tr._apply(conn, version + 1)
                        conn.execute("RELEASE txn")
                    except sqlite3.Error as e:
                        conn.execute("ROLLBACK TO txn")
                        conn.execute("RELEASE txn")
                        errors[i] = _to_fserror(e, "commit")
                        continue
                version += 1
                added.append(c)
            if added:
                conn.execute("COMMIT")
                for c in added:
                    self._index.append(c)
                self.commits += len(added)
                self.batches += 1
            else:
                conn.execute("ROLLBACK")
        except sqlite3.Error as e:
            self._index.reset()
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    self._writer = None
                    conn.close()
            raise _to_fserror(e, "commit") from e
        return errors


class SqliteTransaction(BufferedWritesTransaction):
    """Buffered writes over a pinned WAL snapshot; validated at commit."""

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self._conn: sqlite3.Connection | None = None
        self.read_version: int | None = None
        self.writes: dict[bytes, bytes | None] = {}
        self.cleared: list[Range] = []
        self.read_ranges: list[Range] = []
        self.done = False

    def __del__(self) -> None:
        # A transaction dropped without commit/cancel must not pin a WAL snapshot.
        try:
            self.cancel()
        except Exception:  # noqa: S110 - best effort in a finalizer
            pass

    # -- helpers ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.done:
            raise FsError(Code.INTERNAL, "transaction already committed or cancelled")

    @staticmethod
    def _check_range(begin: bytes, end: bytes) -> tuple[bytes, bytes]:
        Transaction.check_key(begin)
        Transaction.check_key(end)
        return bytes(begin), bytes(end)

    def _snapshot(self, *, version: bool = True) -> sqlite3.Connection:
        """The connection with our read transaction, opened on first use.

        The WAL snapshot is pinned by the transaction's first SELECT. The commit
        version it holds is read with it when ``version`` (reads that join the
        conflict set: commit checks them from that version on), else only when
        needed (:meth:`_pin_version`): a read-only transaction of snapshot reads
        never needs it, and a point read then costs its one SELECT. Read later in
        the same SQLite read transaction, the version is the snapshot's all the same.
        """
        conn = self._conn
        if conn is None:
            conn = self.db._acquire()
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as e:
                self.db._release(conn)
                raise _to_fserror(e, "begin read") from e
            self._conn = conn
        if version and self.read_version is None:
            self._pin_version(conn)
        return conn

    def _pin_version(self, conn: sqlite3.Connection) -> None:
        """Read the commit version of our snapshot (pinning the snapshot if no read did yet)."""
        try:
            row = conn.execute(_VERSION_SQL).fetchone()
        except sqlite3.Error as e:
            raise _to_fserror(e, "begin read") from e
        self.read_version = int(row[0])

    # -- reads --------------------------------------------------------------------

    def _get(self, key: bytes, *, snapshot: bool) -> bytes | None:
        conn = self._snapshot(version=not snapshot)
        if not snapshot:
            self.read_ranges.append((key, key_after(key)))
        if key in self.writes:
            return self.writes[key]
        if self._cleared(key):
            return None
        try:
            row = conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        except sqlite3.Error as e:
            raise _to_fserror(e, "get") from e
        return None if row is None else bytes(row[0])

    def _stored(
        self, conn: sqlite3.Connection, begin: bytes, end: bytes, reverse: bool
    ) -> Generator[KeyValue, None, None]:
        order = "DESC" if reverse else "ASC"
        try:
            cur = conn.execute(
                f"SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k {order}", (begin, end)
            )
            try:
                while True:
                    rows = cur.fetchmany(_FETCH)
                    if not rows:
                        return
                    for k, v in rows:
                        yield bytes(k), bytes(v)
            finally:
                cur.close()
        except sqlite3.Error as e:
            raise _to_fserror(e, "get_range") from e

    def _get_range(
        self, begin: bytes, end: bytes, *, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        conn = self._snapshot(version=not snapshot)
        # Own writes in the range, in output order, merged with the stored rows.
        local = sorted(
            ((k, v) for k, v in self.writes.items() if begin <= k < end),
            key=lambda kv: kv[0],
            reverse=reverse,
        )
        out: list[KeyValue] = []
        stored = self._stored(conn, begin, end, reverse)
        try:
            self._merge(stored, local, out, limit, reverse)
        finally:
            stored.close()  # finish the SQLite cursor even when the limit stopped us early
        if not snapshot:
            if limit and len(out) >= limit:
                last = out[-1][0]
                self.read_ranges.append((last, end) if reverse else (begin, key_after(last)))
            else:
                self.read_ranges.append((begin, end))
        return out

    def _merge(
        self,
        stored: Iterator[KeyValue],
        local: list[tuple[bytes, bytes | None]],
        out: list[KeyValue],
        limit: int,
        reverse: bool,
    ) -> None:
        """Merge stored rows (minus our clears/overrides) with our own writes, in order."""
        li = 0

        def before(a: bytes, b: bytes) -> bool:
            return a > b if reverse else a < b

        for k, v in stored:
            while li < len(local) and before(local[li][0], k):
                lk, lv = local[li]
                li += 1
                if lv is not None:
                    out.append((lk, lv))
                    if limit and len(out) >= limit:
                        break
            if limit and len(out) >= limit:
                break
            if k in self.writes or self._cleared(k):
                continue
            out.append((k, v))
            if limit and len(out) >= limit:
                break
        else:
            for lk, lv in local[li:]:
                if lv is not None:
                    out.append((lk, lv))
                    if limit and len(out) >= limit:
                        break

    # -- writes -------------------------------------------------------------------

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._check_open()
        begin, end = self._check_range(begin, end)
        if begin >= end:
            return
        self._snapshot()  # the range is checked from our read version on
        self.read_ranges.append((begin, end))

    # -- commit -------------------------------------------------------------------

    def _validate(
        self, conn: sqlite3.Connection, index: _ConflictIndex, added: list[_Commit], trimmed: int
    ) -> None:
        """Under the write lock: fail if a commit after our read version hit our reads.

        ``added``: commits applied earlier in the same batch (not yet in ``index``).
        """
        rv = self.read_version
        if rv is None or not self.read_ranges:
            return  # blind writes: nothing to validate
        if rv < trimmed:
            raise FsError(
                Code.KV_CONFLICT, "transaction too old (commit log trimmed)", retryable=True
            )
        reads = self.read_ranges
        conflict = any(c.hits(reads) for c in added if c.version > rv)
        if not conflict:
            if index.covers(rv):
                conflict = index.conflicts(rv, reads)
            else:  # older than the in-memory tail: ask the commit log itself
                rows = conn.execute(
                    "SELECT version, ranges FROM kv_commits WHERE version > ?", (rv,)
                ).fetchall()
                conflict = any(_Commit.unpack(int(v), bytes(r)).hits(reads) for v, r in rows)
        if conflict:
            raise FsError(Code.KV_CONFLICT, "transaction conflict", retryable=True)

    def _log(self, conn: sqlite3.Connection, version: int) -> _Commit:
        """Under the write lock: record ``version``'s write ranges (one ``kv_commits`` row).

        The first write of a commit (:meth:`SqliteDatabase._commit_alone` relies on
        it: this is the statement that upgrades the read transaction). Returns them.
        """
        c = _Commit(version, set(self.writes), list(self.cleared))
        conn.execute(
            "INSERT INTO kv_commits (version, ranges, ts) VALUES (?, ?, ?)",
            (version, _pack_ranges(c.points, c.ranges), time.time()),
        )
        return c

    def _apply(self, conn: sqlite3.Connection, version: int) -> None:
        """Under the write lock, after :meth:`_log`: apply the writes; trim the log now and then."""
        for b, e in self.cleared:
            conn.execute("DELETE FROM kv WHERE k >= ? AND k < ?", (b, e))
        sets = [(k, v) for k, v in self.writes.items() if v is not None]
        dels = [(k,) for k, v in self.writes.items() if v is None]
        if dels:
            conn.executemany("DELETE FROM kv WHERE k = ?", dels)
        if sets:
            conn.executemany("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", sets)
        if version % _TRIM_EVERY == 0:
            # the newest row stays (it holds the version), so trim below ``version``
            row = conn.execute(
                "SELECT max(version) FROM kv_commits WHERE ts < ? AND version < ?",
                (time.time() - self.db.max_txn_age_s, version),
            ).fetchone()
            if row[0] is not None:
                conn.execute("DELETE FROM kv_commits WHERE version <= ?", (row[0],))
                conn.execute("UPDATE kv_meta SET trimmed = ? WHERE id = 0", (row[0],))

    def _finish(self) -> tuple[bool, sqlite3.Connection | None]:
        """Start committing: (whether there is anything to write, the snapshot's connection).

        A read-only transaction is done here (its snapshot was consistent;
        nothing to validate). Otherwise the version read is pinned if only
        snapshot reads ran so far: it is needed before the commit moves it
        (:meth:`SqliteDatabase._commit_alone`) or the connection goes back to
        the pool (a batch).
        """
        self._check_open()
        faults.maybe_fail("kv.commit")
        self.done = True
        conn, self._conn = self._conn, None
        if not self.writes and not self.cleared:
            if conn is not None:
                self.db._release(conn)
            return False, None
        if conn is not None and self.read_version is None:
            try:
                self._pin_version(conn)
            except BaseException:
                self.db._release(conn)
                raise
        return True, conn

    def commit(self) -> None:
        """Validate and apply in the next group commit; returns once durable."""
        writes, conn = self._finish()
        if writes:
            self.db._group_commit(self, conn)

    def commit_now(self) -> bool:
        """Commit alone, on this thread, if nobody else is committing and nothing
        committed since this transaction's snapshot: the upgrade of its read
        transaction in place (:meth:`SqliteDatabase._commit_alone`), one COMMIT,
        durable when it returns. Otherwise False: it would have to queue for a
        batch and be validated there; nothing was written.

        It never waits: not for a batch in progress (``try_exclusive``), and not
        for another process's write lock either, as SQLite refuses the upgrade
        of an open read transaction at once (no busy handler) when the lock is
        taken.
        """
        writes, conn = self._finish()
        if not writes:
            return True
        db = self.db
        if conn is None:  # blind writes: no snapshot to upgrade, a batch validates them
            return False
        if not db._group.try_exclusive():
            db._release(conn)
            return False
        try:
            return db._commit_alone(self, conn)
        finally:
            db._group.end_exclusive()

    def cancel(self) -> None:
        if not self.done:
            self.done = True
        conn, self._conn = self._conn, None
        if conn is not None:
            self.db._release(conn)
