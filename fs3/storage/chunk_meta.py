"""Chunk metadata store: committed rows in SQLite, pending versions in memory, group commit.

The metadata half of the chunk engine (:mod:`fs3.storage.chunk_engine` composes
it with the data-file store of :mod:`fs3.storage.chunk_data`). Rows are in
docs/kv-schema.md#chunk-metadata-of-storage-targets; one row names the data file
of the chunk's committed version.

**Two locks, and which methods the event loop may call.**

* ``_mem`` guards the in-memory maps (committed metas, pending updates, usage).
  It is never held across disk I/O, so the event loop may call the methods that
  take only it: :meth:`get`, :meth:`pending`, :meth:`list`, :meth:`usage`,
  :meth:`live_files`, :meth:`is_published_cheaply` and
  :meth:`publish_prepared` (an update whose row is already durable).
* ``_db`` serialises the SQLite connection and is held across the WAL fsync of
  a transaction. Only the storage node's I/O threads take it: :meth:`commit`,
  :meth:`prepare`, :meth:`restore_row` (inside :meth:`pop_pending`) and
  :meth:`close` may block for a disk flush and must not run on the event loop.

A commit checks (under ``_mem``) that its update is still the staged one and
marks it ``committing``; a stage or abort of the same chunk meanwhile waits
(in its I/O thread) until the commit published or failed, so a durable row
never names a data file a newer stage already deleted. Commits of other chunks
and every event-loop read go on during the fsync.

**Errors** are classified by SQLite's result code (``sqlite3.Error.sqlite_errorcode``),
never by message text: ``SQLITE_FULL`` is NO_SPACE; ``SQLITE_IOERR``,
``SQLITE_CORRUPT`` and ``SQLITE_NOTADB`` are disk errors (INTERNAL with errno
EIO, which takes the target offline, see ``Replicator.note_disk_error``);
``SQLITE_READONLY`` is EROFS; anything else is INTERNAL.
"""

from __future__ import annotations

import builtins
import contextlib
import errno as _errno
import sqlite3
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from fs3.errors import Code, FsError
from fs3.group_commit import GroupCommit

ALL_INDEXES = 0xFFFFFFFF

# SQLite primary result codes (https://sqlite.org/rescode.html, also in sqlite3.h).
SQLITE_READONLY = 8
SQLITE_IOERR = 10
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_NOTADB = 26


@dataclass(frozen=True, order=True)
class ChunkKey:
    """A chunk: (inode, chunk index). Ordered like 3FS chunk ids within an inode."""

    inode: int
    index: int

    def __str__(self) -> str:
        return f"{self.inode:x}:{self.index}"


@dataclass(frozen=True)
class ChunkMeta:
    """Committed state of one chunk (plus the pending version, if any)."""

    key: ChunkKey
    commit_ver: int
    chain_ver: int
    length: int
    checksum: int
    block_crcs: bytes = b""  # packed little-endian u32 per block
    file: str = ""  # data file name relative to the target's data dir ("" for an empty chunk)
    update_ver: int = 0  # == commit_ver unless an update is pending

    @property
    def uncommitted(self) -> bool:
        return self.update_ver != self.commit_ver


@dataclass
class PendingUpdate:
    """A staged, not yet committed chunk version (in memory only)."""

    key: ChunkKey
    update_ver: int
    chain_ver: int
    remove: bool
    length: int = 0
    checksum: int = 0
    block_crcs: bytes = b""
    file: str = ""
    owns_file: bool = False  # the file was created for this update (delete it on abort)
    tag: tuple[str, int, int] | None = None  # (client, channel, seqnum) of the request, for retries
    extra: dict[str, object] = field(default_factory=dict)
    synced: bool = True  # the staged data is durable (see ChunkEngine.sync_pending)
    prepared: bool = False  # its metadata row is already durable (see ChunkEngine.prepare)
    prepared_chain_ver: int = 0  # the chain version that row carries
    committing: bool = False  # a transaction naming it is in progress (see chunk_meta)


def no_space(what: str) -> FsError:
    return FsError(Code.NO_SPACE, f"no space left on device: {what}", retryable=False)


def sqlite_error(e: sqlite3.Error, what: str) -> FsError:
    """The FsError for a failed SQLite call, from its result code (not its message)."""
    code = getattr(e, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    name = getattr(e, "sqlite_errorname", None) or "no result code"
    msg = f"{what}: {e} ({name})"
    if primary == SQLITE_FULL:
        return no_space(msg)
    if primary in (SQLITE_IOERR, SQLITE_CORRUPT, SQLITE_NOTADB):
        return FsError(Code.INTERNAL, msg, errno=_errno.EIO)
    if primary == SQLITE_READONLY:
        return FsError(Code.INTERNAL, msg, errno=_errno.EROFS)
    return FsError(Code.INTERNAL, msg)


def superseded(key: ChunkKey) -> FsError:
    """A commit whose staged update another stage replaced meanwhile (a resync's full-chunk
    write racing a forwarded update on a syncing target): retryable, and not a disk error,
    which would take the whole target offline until restart."""
    return FsError(
        Code.CHUNK_BUSY,
        f"chunk {key}: commit of an update that is no longer staged (replaced by a newer stage)",
    )


@dataclass(eq=False)
class CommitReq:
    pending: PendingUpdate
    chain_ver: int
    publish: bool = True  # False: only make the row durable (prepare)
    meta: ChunkMeta | None = None  # the published version (set by a successful commit)
    unlink: list[str] = field(default_factory=list)  # data files the published version superseded

    def row(self) -> tuple[int, int, int, int, bytes, str]:
        """The row this commit writes: (commit_ver, chain_ver, length, checksum, block_crcs, file)."""
        p = self.pending
        return (p.update_ver, self.chain_ver, p.length, p.checksum, p.block_crcs, p.file)


def _i64(v: int) -> int:
    """SQLite integers are signed 64-bit; store u64 inode ids two's-complement."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _u64(v: int) -> int:
    return v + (1 << 64) if v < 0 else v


class ChunkMetaStore:
    """The metadata of one target's chunks. See the module docstring for the locking rules.

    Args:
        path: the SQLite database file.
        fsync: ``synchronous=FULL`` (a commit is durable when it returns) or OFF (tests).
    """

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self._mem = threading.Lock()
        self._changed = threading.Condition(self._mem)  # a commit finished (committing cleared)
        self._db_lock = threading.Lock()
        self._metas: dict[ChunkKey, ChunkMeta] = {}
        self._pending: dict[ChunkKey, PendingUpdate] = {}
        self._used = 0
        # group commit (fs3.group_commit, shared with the KV engine): a failing batch is
        # retried one request at a time, so one bad commit (NO_SPACE, superseded) fails alone
        self._group: GroupCommit[CommitReq] = GroupCommit(
            self._commit_rows, retry_alone=lambda e: isinstance(e, FsError)
        )
        try:
            self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS chunks (inode INTEGER, idx INTEGER, commit_ver INTEGER,"
                " chain_ver INTEGER, length INTEGER, checksum INTEGER, block_crcs BLOB, file TEXT,"
                " PRIMARY KEY (inode, idx)) WITHOUT ROWID"
            )
            for row in self.db.execute(
                "SELECT inode, idx, commit_ver, chain_ver, length, checksum, block_crcs, file"
                " FROM chunks"
            ):
                key = ChunkKey(_u64(row[0]), row[1])
                self._metas[key] = ChunkMeta(
                    key, row[2], row[3], row[4], row[5], bytes(row[6]), row[7], row[2]
                )
                self._used += row[4]
        except sqlite3.Error as e:
            raise sqlite_error(e, f"open chunk metadata {path}") from None

    # -- reads (event loop allowed: _mem only)

    def get(self, key: ChunkKey) -> ChunkMeta | None:
        """Committed meta of ``key``; ``update_ver`` shows a pending version."""
        with self._mem:
            m = self._metas.get(key)
            p = self._pending.get(key)
        if m is None:
            return None
        return replace(m, update_ver=p.update_ver) if p is not None else m

    def pending(self, key: ChunkKey) -> PendingUpdate | None:
        with self._mem:
            return self._pending.get(key)

    def list(
        self, inode: int | None = None, begin: int = 0, end: int = ALL_INDEXES
    ) -> builtins.list[ChunkMeta]:
        with self._mem:
            items = [
                m if (p := self._pending.get(k)) is None else replace(m, update_ver=p.update_ver)
                for k, m in self._metas.items()
                if inode is None or (k.inode == inode and begin <= k.index < end)
            ]
        items.sort(key=lambda m: m.key)
        return items

    def usage(self) -> tuple[int, int]:
        """(bytes held by committed chunks, committed chunk count)."""
        with self._mem:
            return self._used, len(self._metas)

    def live_files(self) -> set[str]:
        """Data files named by committed rows."""
        with self._mem:
            return {m.file for m in self._metas.values() if m.file}

    def pending_keys(self) -> builtins.list[ChunkKey]:
        with self._mem:
            return builtins.list(self._pending)

    # -- pending updates (I/O threads: may wait for a commit of the same chunk)

    def _wait_not_committing(self, key: ChunkKey) -> None:
        """Wait (holding _mem's condition) while a commit of ``key``'s staged update runs."""
        while (p := self._pending.get(key)) is not None and p.committing:
            self._changed.wait()

    def set_pending(self, p: PendingUpdate) -> PendingUpdate | None:
        """Make ``p`` the staged update of its chunk; returns the one it replaced."""
        with self._mem:
            self._wait_not_committing(p.key)
            old = self._pending.pop(p.key, None)
            self._pending[p.key] = p
        return old

    def pop_pending(self, key: ChunkKey) -> PendingUpdate | None:
        """Drop the staged update of ``key``; a prepared one gets its old row back durably."""
        with self._mem:
            self._wait_not_committing(key)
            p = self._pending.pop(key, None)
            old = self._metas.get(key)
        if p is not None and p.prepared:
            self.restore_row(key, old)  # before its file goes: the row must never name a lost file
        return p

    def restore_row(self, key: ChunkKey, old: ChunkMeta | None) -> None:
        """Durably put back the committed row ``old`` of ``key`` (undo a prepare)."""
        with self._db_lock:
            try:
                if old is None:
                    self._write_row(key, None)
                else:
                    self._write_row(
                        key,
                        (
                            old.commit_ver,
                            old.chain_ver,
                            old.length,
                            old.checksum,
                            old.block_crcs,
                            old.file,
                        ),
                    )
            except sqlite3.Error as e:
                raise sqlite_error(e, f"abort of chunk {key}") from None

    def _write_row(self, key: ChunkKey, row: tuple[int, int, int, int, bytes, str] | None) -> None:
        """Put (or, for None, delete) the row of ``key``: (commit_ver, chain_ver, length,
        checksum, block_crcs, file). Holds _db_lock."""
        if row is None:
            self.db.execute(
                "DELETE FROM chunks WHERE inode=? AND idx=?", (_i64(key.inode), key.index)
            )
        else:
            self.db.execute(
                "INSERT OR REPLACE INTO chunks VALUES (?,?,?,?,?,?,?,?)",
                (_i64(key.inode), key.index, *row),
            )

    # -- publish (event loop allowed when prepared)

    @staticmethod
    def is_published_cheaply(pending: PendingUpdate, chain_ver: int) -> bool:
        """True if committing ``pending`` needs no disk I/O (its row is durable already)."""
        return pending.prepared and pending.prepared_chain_ver == chain_ver

    def publish_prepared(
        self, pending: PendingUpdate, chain_ver: int
    ) -> tuple[ChunkMeta | None, builtins.list[str]]:
        """Publish a prepared ``pending`` in memory; returns (new meta, superseded files)."""
        if not self.is_published_cheaply(pending, chain_ver):
            raise FsError(Code.INTERNAL, f"chunk {pending.key}: publish of an unprepared update")
        req = CommitReq(pending, chain_ver)
        unlink: builtins.list[str] = []
        with self._mem:
            if self._pending.get(pending.key) is not pending or pending.committing:
                raise superseded(pending.key)
            self._publish(req, unlink)
        return req.meta, unlink

    # -- group commit (I/O threads only: holds _db_lock across the WAL fsync)

    def commit(self, req: CommitReq) -> builtins.list[str]:
        """Write ``req``'s row (group commit); returns data files the commit superseded.

        Concurrent commits share one transaction (one WAL fsync) through
        :class:`fs3.group_commit.GroupCommit`: the first caller that finds no
        batch in progress writes every queued request's row, the others wait for
        their result. A batch that fails with an FsError is retried one request
        at a time so one bad commit (e.g. NO_SPACE) fails alone; any other
        failure fails the whole batch as INTERNAL.
        """
        try:
            self._group.submit(req)
        except FsError:
            raise
        except Exception as e:
            raise FsError(Code.INTERNAL, f"commit: {e}") from e
        return req.unlink

    def _commit_rows(self, batch: builtins.list[CommitReq]) -> None:
        """Write the rows of ``batch`` in one transaction, then publish them in memory.

        Requests with ``publish=False`` (prepare) only get their row made durable.
        ``_mem`` is not held during the transaction (the event loop reads on);
        the updates are marked ``committing`` instead, so a stage or abort of
        the same chunk waits until they are published (or failed).
        """
        with self._db_lock:
            with self._mem:
                for r in batch:
                    if self._pending.get(r.pending.key) is not r.pending or r.pending.committing:
                        raise superseded(r.pending.key)
                for r in batch:
                    r.pending.committing = True
            durable = False
            try:
                self.db.execute("BEGIN")
                for r in batch:
                    self._write_row(r.pending.key, None if r.pending.remove else r.row())
                self.db.execute("COMMIT")
                durable = True
            except sqlite3.Error as e:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
                raise sqlite_error(e, "commit") from None
            finally:
                with self._mem:
                    for r in batch:
                        r.pending.committing = False
                        if not durable:
                            continue
                        if r.publish:
                            self._publish(r, r.unlink)
                        else:
                            r.pending.prepared, r.pending.prepared_chain_ver = True, r.chain_ver
                    self._changed.notify_all()

    def _publish(self, r: CommitReq, unlink: builtins.list[str]) -> None:
        """Make ``r``'s update the committed version in memory (its row is durable). Holds _mem."""
        p, key = r.pending, r.pending.key
        del self._pending[key]
        old = self._metas.get(key)
        new: ChunkMeta | None = None
        if p.remove:
            self._metas.pop(key, None)
        else:
            new = ChunkMeta(key, *r.row(), p.update_ver)
            self._metas[key] = new
        self._used += (new.length if new else 0) - (old.length if old else 0)
        r.meta = new
        if old is not None and old.file and (new is None or new.file != old.file):
            unlink.append(old.file)

    def close(self) -> None:
        with self._db_lock:
            self.db.close()


__all__ = [
    "ALL_INDEXES",
    "ChunkKey",
    "ChunkMeta",
    "ChunkMetaStore",
    "CommitReq",
    "PendingUpdate",
    "no_space",
    "sqlite_error",
    "superseded",
]
