"""The chunk engine's two stores: error classification by code, and no event-loop lock across fsync.

fs3.storage.chunk_meta classifies SQLite failures by result code (a "disk I/O
error" is a disk error, not NO_SPACE), fs3.storage.chunk_data classifies OSErrors
by errno, and the lock the event loop takes (get/list/space/publish_prepared) is
never held while a commit's transaction waits for the disk.
"""

from __future__ import annotations

import errno
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fs3.errors import Code, FsError
from fs3.storage.chunk_data import os_error
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine
from fs3.storage.chunk_meta import SQLITE_FULL, SQLITE_IOERR, sqlite_error

pytestmark = pytest.mark.timeout(60)

CS = 1 << 20
K1, K2 = ChunkKey(1, 0), ChunkKey(2, 0)


def _err(msg: str, code: int | None, name: str = "") -> sqlite3.Error:
    e = sqlite3.OperationalError(msg)
    if code is not None:
        e.sqlite_errorcode = code  # type: ignore[attr-defined]
        e.sqlite_errorname = name  # type: ignore[attr-defined]
    return e


def test_sqlite_disk_io_error_is_a_disk_error_not_no_space() -> None:
    # SQLITE_IOERR_FSYNC = SQLITE_IOERR | (4 << 8): an extended code of the I/O class
    fe = sqlite_error(
        _err("disk I/O error", SQLITE_IOERR | (4 << 8), "SQLITE_IOERR_FSYNC"), "commit"
    )
    assert fe.code == Code.INTERNAL and fe.errno == errno.EIO
    fe = sqlite_error(_err("database or disk is full", SQLITE_FULL, "SQLITE_FULL"), "commit")
    assert fe.code == Code.NO_SPACE
    # words in the message decide nothing: without SQLITE_FULL's code it is no NO_SPACE
    fe = sqlite_error(_err("database or disk is full", None), "commit")
    assert fe.code == Code.INTERNAL
    fe = sqlite_error(_err("disk is busy: database is locked", 5, "SQLITE_BUSY"), "commit")
    assert fe.code == Code.INTERNAL
    fe = sqlite_error(_err("attempt to write a readonly database", 8, "SQLITE_READONLY"), "x")
    assert fe.errno == errno.EROFS


def test_os_errors_by_errno() -> None:
    assert os_error(OSError(errno.ENOSPC, "No space left on device"), "w").code == Code.NO_SPACE
    assert os_error(OSError(errno.EDQUOT, "Disk quota exceeded"), "w").code == Code.NO_SPACE
    fe = os_error(OSError(errno.EIO, "Input/output error (disk full?)"), "w")
    assert fe.code == Code.INTERNAL and fe.errno == errno.EIO


def test_real_sqlite_full_becomes_no_space_and_changes_nothing(tmp_path: Path) -> None:
    e = FileChunkEngine(tmp_path / "t", fsync=False)
    try:
        p = e.stage_write(K1, 0, b"a" * 100, update_ver=1, chain_ver=1, chunk_size=CS)
        e.commit(p)
        pages = e.meta.db.execute("PRAGMA page_count").fetchone()[0]
        e.meta.db.execute(f"PRAGMA max_page_count={pages}")  # the database cannot grow
        # 1 MiB of data: 16 block CRCs; many chunks so the rows need new pages
        staged = [
            e.stage_write(
                ChunkKey(10 + i, 0), 0, b"b" * CS, update_ver=1, chain_ver=1, chunk_size=CS
            )
            for i in range(64)
        ]
        with pytest.raises(FsError) as ei:
            for s in staged:
                e.commit(s)
        assert ei.value.code == Code.NO_SPACE
        assert e.get(K1) is not None and e.get(K1).length == 100  # type: ignore[union-attr]
    finally:
        e.close()


class _DbProxy:
    """Wraps the store's connection: COMMIT blocks on ``gate`` and may fail with ``fail``."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.gate = threading.Event()
        self.gate.set()
        self.in_commit = threading.Event()
        self.fail: sqlite3.Error | None = None

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            self.in_commit.set()
            assert self.gate.wait(30)
            if self.fail is not None:
                raise self.fail
        return self.db.execute(sql, *args)

    def close(self) -> None:
        self.db.close()


def test_disk_io_error_at_commit_is_eio_and_keeps_old_version(tmp_path: Path) -> None:
    e = FileChunkEngine(tmp_path / "t", fsync=False)
    proxy = _DbProxy(e.meta.db)
    e.meta.db = proxy  # type: ignore[assignment]
    try:
        e.commit(e.stage_write(K1, 0, b"old", update_ver=1, chain_ver=1, chunk_size=CS))
        proxy.fail = _err("disk I/O error", SQLITE_IOERR | (4 << 8), "SQLITE_IOERR_FSYNC")
        p = e.stage_write(K1, 0, b"new!", update_ver=2, chain_ver=1, chunk_size=CS)
        with pytest.raises(FsError) as ei:
            e.commit(p)
        assert ei.value.code == Code.INTERNAL and ei.value.errno == errno.EIO
        assert e.read(K1, 0, 10)[1] == b"old"
        assert e.pending(K1) is p and not p.committing  # still staged: abort/retry possible
    finally:
        proxy.fail = None
        e.close()


def test_event_loop_reads_do_not_wait_for_a_commit_flush(tmp_path: Path) -> None:
    """While one commit's transaction is stuck in its flush, get/list/space/publish answer."""
    e = FileChunkEngine(tmp_path / "t", fsync=False)
    proxy = _DbProxy(e.meta.db)
    e.meta.db = proxy  # type: ignore[assignment]
    try:
        e.commit(e.stage_write(K2, 0, b"k2", update_ver=1, chain_ver=1, chunk_size=CS))
        p2 = e.stage_write(K2, 0, b"k2v2", update_ver=2, chain_ver=1, chunk_size=CS)
        e.prepare(p2)  # its row is durable: publishing it needs no disk
        proxy.gate.clear()
        proxy.in_commit.clear()
        p1 = e.stage_write(K1, 0, b"k1", update_ver=1, chain_ver=1, chunk_size=CS)
        done: list[object] = []
        t = threading.Thread(target=lambda: done.append(e.commit(p1)))
        t.start()
        assert proxy.in_commit.wait(10)
        t0 = time.monotonic()
        assert e.get(K1) is None  # not yet published
        assert [m.key for m in e.list()] == [K2]
        assert e.space().chunk_count == 1
        meta, _old = e.publish_prepared(p2, 1)  # another chunk publishes meanwhile
        assert meta is not None and meta.length == 4
        assert time.monotonic() - t0 < 2.0
        # a stage of the chunk being committed waits until the commit finished
        staged: list[object] = []
        t2 = threading.Thread(
            target=lambda: staged.append(
                e.stage_write(K1, 0, b"k1v2", update_ver=2, chain_ver=1, chunk_size=CS)
            )
        )
        t2.start()
        t2.join(0.3)
        assert t2.is_alive() and not staged
        proxy.gate.set()
        t.join(10)
        t2.join(10)
        assert done and staged
        assert e.read(K1, 0, 10)[1] == b"k1"  # committed; the new stage is pending
        assert e.pending(K1) is staged[0]
    finally:
        proxy.gate.set()
        e.close()
