"""FoundationDB KV engine: a thin adapter on the official ``fdb`` binding.

Production clusters keep mgmtd and meta state in FoundationDB. FDB already has
exactly the semantics of ``fs3.kv.database`` (it is the model), so this module
only translates: bytes in, bytes out, snapshot reads through ``tr.snapshot``,
and every ``fdb.FDBError`` into an :class:`FsError` that
:meth:`Database.run` knows how to retry. Keeping it thin lets the shared contract
suite (``tests/contract/test_kv.py``, run when ``FS3_FDB_CLUSTER_FILE`` is set)
cover the logic.

The binding is pure Python but loads ``libfdb_c`` when the API version is
selected; without that library :class:`FdbDatabase` raises
``FsError(KV_UNAVAILABLE)`` with a message saying so, never an ImportError.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from fs3 import faults
from fs3.errors import Code, FsError
from fs3.kv.database import Database, KeyValue, Transaction

API_VERSION = 710

# FDB error codes with an fs3 meaning of their own (see FDB's error_definitions.h).
FDB_TRANSACTION_TOO_OLD = 1007
FDB_NOT_COMMITTED = 1020
FDB_COMMIT_UNKNOWN_RESULT = 1021
FDB_TRANSACTION_TIMED_OUT = 1031
FDB_TRANSACTION_TOO_LARGE = 2101
FDB_KEY_TOO_LARGE = 2102
FDB_VALUE_TOO_LARGE = 2103

_CONFLICT_CODES = frozenset({FDB_NOT_COMMITTED, FDB_TRANSACTION_TOO_OLD})
_TOO_LARGE_CODES = frozenset({FDB_TRANSACTION_TOO_LARGE, FDB_KEY_TOO_LARGE, FDB_VALUE_TOO_LARGE})

_load_lock = threading.Lock()


def classify_fdb_error(
    code: int, description: str, *, retryable: bool, maybe_committed: bool, in_commit: bool
) -> FsError:
    """The :class:`FsError` for an FDB error.

    Args:
        code: ``FDBError.code``.
        description: ``FDBError.description`` (for the message).
        retryable: ``fdb.predicates.is_retryable(e)``.
        maybe_committed: ``fdb.predicates.is_maybe_committed(e)``.
        in_commit: the error came from ``commit()``; a timeout there may have committed.
    """
    msg = f"FoundationDB error {code}: {description}"
    if (
        maybe_committed
        or code == FDB_COMMIT_UNKNOWN_RESULT
        or (in_commit and code == FDB_TRANSACTION_TIMED_OUT)
    ):
        # The caller must make the retry idempotent (meta does, via request ids).
        return FsError(Code.KV_COMMIT_UNKNOWN, msg, retryable=True)
    if code in _CONFLICT_CODES:
        return FsError(Code.KV_CONFLICT, msg, retryable=True)
    if code in _TOO_LARGE_CODES:
        return FsError(Code.KV_TOO_LARGE, msg, retryable=False)
    if retryable:
        return FsError(Code.KV_UNAVAILABLE, msg, retryable=True)
    return FsError(Code.KV_UNAVAILABLE, msg, retryable=False)


def load_fdb() -> Any:
    """The ``fdb`` module with API version 710 selected, or ``FsError(KV_UNAVAILABLE)``."""
    with _load_lock:
        try:
            import fdb

            fdb.api_version(API_VERSION)
        except Exception as e:
            raise FsError(
                Code.KV_UNAVAILABLE,
                "FoundationDB engine unavailable: the fdb binding could not load the "
                f"FoundationDB client library libfdb_c (API {API_VERSION}): {e}. Install the "
                "foundationdb-clients package or use the sqlite engine.",
                retryable=False,
            ) from e
        return fdb


class FdbDatabase(Database):
    """fs3's KV interface over a FoundationDB cluster.

    Args:
        cluster_file: path of ``fdb.cluster``; None uses FDB's default lookup
            (``FDB_CLUSTER_FILE``, then ``/etc/foundationdb/fdb.cluster``).
        timeout_ms: FDB cancels a transaction that runs longer than this
            (so a dead cluster fails requests instead of hanging them).
    """

    engine = "fdb"

    def __init__(self, cluster_file: str | None = None, *, timeout_ms: int = 10_000) -> None:
        super().__init__()
        self._fdb = load_fdb()
        try:
            self._db = self._fdb.open(cluster_file or None)
            self._db.options.set_transaction_timeout(int(timeout_ms))
        except self._fdb.FDBError as e:
            raise self._error(e, in_commit=False) from e

    def _error(self, e: Any, *, in_commit: bool) -> FsError:
        preds = self._fdb.predicates
        return classify_fdb_error(
            int(e.code),
            str(e.description),
            retryable=bool(preds.is_retryable(e)),
            maybe_committed=bool(preds.is_maybe_committed(e)),
            in_commit=in_commit,
        )

    def snapshot_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Snapshot gets in one read-only FDB transaction (its read version is the
        consistent point), all issued before the first is waited for: one round trip."""
        keys = self._check_keys(keys)
        fdb = self._fdb
        try:
            tr = self._db.create_transaction()
            try:
                futures = [tr.snapshot.get(k) for k in keys]
                values = [f.value for f in futures]
            finally:
                tr.cancel()
        except fdb.FDBError as e:
            raise self._error(e, in_commit=False) from e
        return [None if v is None else bytes(v) for v in values]

    def create_transaction(self) -> FdbTransaction:
        try:
            return FdbTransaction(self, self._db.create_transaction())
        except self._fdb.FDBError as e:
            raise self._error(e, in_commit=False) from e


class FdbTransaction(Transaction):
    """One FDB transaction; every binding call goes through :meth:`_call`."""

    def __init__(self, db: FdbDatabase, tr: Any) -> None:
        self.db = db
        self.tr = tr
        self.done = False

    def _check_open(self) -> None:
        if self.done:
            raise FsError(Code.INTERNAL, "transaction already committed or cancelled")

    def _reader(self, snapshot: bool) -> Any:
        return self.tr.snapshot if snapshot else self.tr

    def _get(self, key: bytes, *, snapshot: bool) -> bytes | None:
        try:
            value = self._reader(snapshot).get(key).value
        except self.db._fdb.FDBError as e:
            raise self.db._error(e, in_commit=False) from e
        return None if value is None else bytes(value)

    def _get_range(
        self, begin: bytes, end: bytes, *, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        try:
            rng = self._reader(snapshot).get_range(begin, end, limit=limit, reverse=reverse)
            return [(bytes(kv.key), bytes(kv.value)) for kv in rng]
        except self.db._fdb.FDBError as e:
            raise self.db._error(e, in_commit=False) from e

    def set(self, key: bytes, value: bytes) -> None:
        self._check_open()
        self.check_key(key)
        self.check_value(value)
        self.tr.set(bytes(key), bytes(value))

    def clear(self, key: bytes) -> None:
        self._check_open()
        self.check_key(key)
        self.tr.clear(bytes(key))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._check_open()
        self.check_key(begin)
        self.check_key(end)
        if bytes(begin) < bytes(end):
            self.tr.clear_range(bytes(begin), bytes(end))

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._check_open()
        self.check_key(begin)
        self.check_key(end)
        if bytes(begin) < bytes(end):
            self.tr.add_read_conflict_range(bytes(begin), bytes(end))

    def commit(self) -> None:
        self._check_open()
        faults.maybe_fail("kv.commit")
        self.done = True
        try:
            self.tr.commit().wait()
        except self.db._fdb.FDBError as e:
            raise self.db._error(e, in_commit=True) from e

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            try:
                self.tr.cancel()
            except self.db._fdb.FDBError:
                pass  # cancelling an already failed transaction is harmless
