"""Transactional ordered KV: the one storage seam of mgmtd and meta.

``open_database(url)`` picks an engine by URL:

* ``memory://`` — in-process, for tests (conflicts detected like a real engine);
* ``sqlite:///abs/path.db`` or ``sqlite://relative.db`` — embedded default,
  one WAL database file shared by every process on a host;
* ``fdb://`` or ``fdb:///path/to/fdb.cluster`` — FoundationDB (official binding).
"""

from __future__ import annotations

from fs3.errors import Code, FsError
from fs3.kv.database import Database, KeyValue, Transaction, key_after, strinc

__all__ = ["Database", "KeyValue", "Transaction", "key_after", "strinc", "open_database"]


def open_database(url: str) -> Database:
    """Open the KV engine named by ``url`` (see module docstring)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise FsError(Code.INVALID_ARGUMENT, f"bad KV url {url!r}: expected scheme://...")
    if scheme == "memory":
        from fs3.kv.memory import MemoryDatabase

        return MemoryDatabase()
    if scheme == "sqlite":
        from fs3.kv.sqlite import SqliteDatabase

        if not rest:
            raise FsError(Code.INVALID_ARGUMENT, f"bad KV url {url!r}: sqlite needs a path")
        return SqliteDatabase(rest)
    if scheme == "fdb":
        from fs3.kv.fdb import FdbDatabase

        return FdbDatabase(rest or None)
    raise FsError(Code.INVALID_ARGUMENT, f"unknown KV engine {scheme!r} (memory, sqlite, fdb)")
