"""The one KV seam of fs3, shaped after FoundationDB.

mgmtd and meta see only :class:`Database` and :class:`Transaction`. A transaction
function is plain synchronous code (no awaits inside a transaction keeps them
short and lets every engine run it on a worker thread); :meth:`Database.run`
retries it on conflicts and other retryable errors, so the function must not have
side effects outside the transaction.

Semantics every engine provides (checked by ``tests/contract/test_kv.py``):

* serializable transactions: a committed transaction behaves as if it ran alone;
  a transaction whose (non-snapshot) reads were invalidated by a concurrent commit
  fails with ``KV_CONFLICT`` and is retried by :meth:`Database.run`;
* reads see the transaction's own writes;
* ``snapshot=True`` reads add nothing to the read-conflict set; explicit
  :meth:`Transaction.add_read_conflict_range` adds a range without reading it;
* a function that raises leaves nothing behind;
* keys and values are ``bytes``; keys are ordered bytewise (pack them with
  ``fs3.kv.keys``, i.e. the FoundationDB tuple layer, so every engine orders alike).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TypeVar

from fs3 import faults
from fs3.errors import Code, FsError

T = TypeVar("T")

log = logging.getLogger("fs3.kv")

KeyValue = tuple[bytes, bytes]

# FoundationDB's limits; every engine enforces them so code that works on the
# embedded engine also works in production.
MAX_KEY_SIZE = 10_000
MAX_VALUE_SIZE = 100_000
# Keys per Database.snapshot_get: it is for point lookups (SQLite binds each key
# as a statement variable, and older builds allow 999 of them).
MAX_SNAPSHOT_KEYS = 512


def key_after(key: bytes) -> bytes:
    """The first key strictly greater than ``key`` (for single-key ranges)."""
    return key + b"\x00"


def strinc(prefix: bytes) -> bytes:
    """The first key greater than every key that starts with ``prefix``."""
    p = prefix.rstrip(b"\xff")
    if not p:
        raise ValueError("prefix must contain a byte other than 0xff")
    return p[:-1] + bytes([p[-1] + 1])


class Transaction(ABC):
    """One serializable transaction. Not thread-safe; use from one thread."""

    def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        """The value of ``key`` or None. Non-snapshot reads join the conflict set.

        Checks the key and passes the ``kv.get`` fault point here, for every engine
        alike; engines implement :meth:`_get`.
        """
        self._check_open()
        if type(key) is not bytes or len(key) > MAX_KEY_SIZE:  # the usual case: nothing to do
            self.check_key(key)
            key = bytes(key)
        faults.maybe_fail("kv.get")
        return self._get(key, snapshot=snapshot)

    @abstractmethod
    def _get(self, key: bytes, *, snapshot: bool) -> bytes | None:
        """:meth:`get` after its checks; ``key`` is ``bytes``."""

    def get_range(
        self,
        begin: bytes,
        end: bytes,
        *,
        limit: int = 0,
        reverse: bool = False,
        snapshot: bool = False,
    ) -> list[KeyValue]:
        """Pairs with ``begin <= key < end`` in key order (descending if ``reverse``).

        ``limit`` > 0 caps the number of pairs. A non-snapshot read adds the range
        actually covered (up to the last key returned when limited) to the
        read-conflict set.

        The argument checks and the ``kv.get_range`` fault point live here so every
        engine rejects bad input alike; engines implement :meth:`_get_range`.
        """
        self._check_open()
        self.check_key(begin)
        self.check_key(end)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise FsError(
                Code.INVALID_ARGUMENT, f"get_range limit must be an int >= 0, not {limit!r}"
            )
        begin, end = bytes(begin), bytes(end)
        faults.maybe_fail("kv.get_range")
        if begin >= end:
            return []
        return self._get_range(begin, end, limit=limit, reverse=reverse, snapshot=snapshot)

    @abstractmethod
    def _get_range(
        self, begin: bytes, end: bytes, *, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        """:meth:`get_range` after its checks: ``begin < end``, both ``bytes``."""

    @abstractmethod
    def set(self, key: bytes, value: bytes) -> None:
        """Write ``key`` = ``value`` (visible to this transaction at once)."""

    @abstractmethod
    def clear(self, key: bytes) -> None:
        """Delete ``key`` if present."""

    @abstractmethod
    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Delete every key with ``begin <= key < end``."""

    @abstractmethod
    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        """Make the commit fail if another transaction wrote into [begin, end)."""

    def add_read_conflict_key(self, key: bytes) -> None:
        """Make the commit fail if another transaction wrote ``key``."""
        self.check_key(key)
        self.add_read_conflict_range(key, key_after(bytes(key)))

    @abstractmethod
    def commit(self) -> None:
        """Commit, or raise ``FsError(KV_CONFLICT)`` (retryable)."""

    def commit_now(self) -> bool:
        """Commit only if that needs no wait for other transactions; True if committed.

        For a caller that must not block on others' commits (an event loop
        serving a lone mutation): False means the commit would have had to
        queue behind other transactions (a group commit in progress, a newer
        commit to validate against), so nothing was written and the
        transaction is finished, as after :meth:`cancel`; the caller runs it
        again the ordinary way. Errors are raised as by :meth:`commit`. An
        engine whose commit never queues (this default) just commits.
        """
        self.commit()
        return True

    @abstractmethod
    def cancel(self) -> None:
        """Abandon the transaction; nothing it wrote becomes visible."""

    # Helpers shared by every engine -------------------------------------------

    @abstractmethod
    def _check_open(self) -> None:
        """Raise if the transaction was committed or cancelled."""

    @staticmethod
    def check_key(key: bytes) -> None:
        if not isinstance(key, bytes | bytearray):
            raise FsError(Code.INVALID_ARGUMENT, f"KV key must be bytes, not {type(key).__name__}")
        if len(key) > MAX_KEY_SIZE:
            raise FsError(Code.KV_TOO_LARGE, f"KV key of {len(key)} bytes exceeds {MAX_KEY_SIZE}")

    @staticmethod
    def check_value(value: bytes) -> None:
        if not isinstance(value, bytes | bytearray):
            raise FsError(
                Code.INVALID_ARGUMENT, f"KV value must be bytes, not {type(value).__name__}"
            )
        if len(value) > MAX_VALUE_SIZE:
            raise FsError(
                Code.KV_TOO_LARGE, f"KV value of {len(value)} bytes exceeds {MAX_VALUE_SIZE}"
            )


class BufferedWritesTransaction(Transaction):
    """A transaction that buffers writes in ``self.writes`` (key -> value, None = clear)
    until commit: the memory and sqlite engines share this; FDB buffers itself."""

    writes: dict[bytes, bytes | None]
    cleared: list[tuple[bytes, bytes]]  # ranges cleared by this transaction

    def _cleared(self, key: bytes) -> bool:
        cleared = self.cleared
        if not cleared:  # the usual case: no generator for nothing to search
            return False
        return any(b <= key < e for b, e in cleared)

    def set(self, key: bytes, value: bytes) -> None:
        self._check_open()
        self.check_key(key)
        self.check_value(value)
        self.writes[bytes(key)] = bytes(value)

    def clear(self, key: bytes) -> None:
        self._check_open()
        self.check_key(key)
        self.writes[bytes(key)] = None

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._check_open()
        self.check_key(begin)
        self.check_key(end)
        begin, end = bytes(begin), bytes(end)
        if begin >= end:
            return
        for k in [k for k in self.writes if begin <= k < end]:
            del self.writes[k]
        self.cleared.append((begin, end))


class Database(ABC):
    """A transactional ordered KV store.

    Args (of :meth:`run`):
        max_retries: give up after this many retryable failures.
        timeout_s: give up when retrying takes longer than this.
    """

    #: short name of the engine ("memory", "sqlite", "fdb")
    engine: str = "abstract"

    def __init__(self) -> None:
        self.retries = 0  # retryable failures seen by run(), for metrics and tests
        self._rng = random.Random()

    @abstractmethod
    def create_transaction(self) -> Transaction:
        """A new transaction; most callers want :meth:`run` instead."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources."""

    def snapshot_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The values of ``keys`` (None: absent), all read at one consistent point.

        A read-only point lookup outside any transaction: no conflict set, no
        commit, one attempt (a retryable failure is raised; wrap the call in
        :meth:`run` to retry). Engines answer it with the least work they can
        (SQLite: one SELECT, which is its own snapshot; no BEGIN/ROLLBACK). This
        default reads them with snapshot gets in one throwaway transaction.

        Checks each key and passes the ``kv.get`` fault point once, like :meth:`Transaction.get`.
        """
        keys = self._check_keys(keys)
        tr = self.create_transaction()
        try:
            return [tr._get(k, snapshot=True) for k in keys]  # checked above
        finally:
            tr.cancel()

    @staticmethod
    def _check_keys(keys: Sequence[bytes]) -> list[bytes]:
        """:meth:`snapshot_get`'s argument checks and fault point, for every engine alike."""
        if len(keys) > MAX_SNAPSHOT_KEYS:
            raise FsError(
                Code.INVALID_ARGUMENT,
                f"snapshot_get of {len(keys)} keys exceeds {MAX_SNAPSHOT_KEYS}: use a transaction",
            )
        out = []
        for k in keys:
            if type(k) is not bytes or len(k) > MAX_KEY_SIZE:
                Transaction.check_key(k)
                k = bytes(k)
            out.append(k)
        faults.maybe_fail("kv.get")
        return out

    def run(
        self, fn: Callable[[Transaction], T], *, max_retries: int = 100, timeout_s: float = 30.0
    ) -> T:
        """Run ``fn`` in a transaction, committing it; retry on retryable errors.

        Raises the last error if ``fn`` keeps failing past ``max_retries`` or
        ``timeout_s``; a non-retryable exception from ``fn`` is raised at once and
        nothing ``fn`` wrote is kept.
        """
        deadline = time.monotonic() + timeout_s
        backoff = 0.001
        attempt = 0
        while True:
            tr = self.create_transaction()
            try:
                result = fn(tr)
                tr.commit()
                return result
            except FsError as e:
                tr.cancel()
                if not e.retryable:
                    raise
                attempt += 1
                self.retries += 1
                if attempt > max_retries or time.monotonic() + backoff > deadline:
                    log.warning("kv transaction gave up after %d attempts: %s", attempt, e)
                    raise
                time.sleep(backoff * (0.5 + self._rng.random()))
                backoff = min(backoff * 2, 0.1)
            except BaseException:
                tr.cancel()
                raise

    async def run_async(
        self, fn: Callable[[Transaction], T], *, max_retries: int = 100, timeout_s: float = 30.0
    ) -> T:
        """:meth:`run` on a worker thread, for asyncio servers (engines block)."""
        return await asyncio.to_thread(self.run, fn, max_retries=max_retries, timeout_s=timeout_s)

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
