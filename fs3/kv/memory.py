"""In-memory KV engine that detects conflicts like a real one.

Optimistic concurrency as FoundationDB does it: a transaction reads at the
database version current when it started, records its read-conflict ranges, and
at commit fails with ``KV_CONFLICT`` if any transaction that committed after its
read version wrote into one of those ranges. That makes retry paths run in unit
tests. Thread-safe (one lock); state lives only as long as the object.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

from fs3 import faults
from fs3.errors import Code, FsError
from fs3.kv.database import BufferedWritesTransaction, Database, KeyValue, key_after

Range = tuple[bytes, bytes]


def _overlaps(a: Range, b: Range) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class MemoryDatabase(Database):
    """A sorted dict of committed data plus a log of recent commits' write sets."""

    engine = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._keys: list[bytes] = []  # sorted
        self._data: dict[bytes, bytes] = {}
        # Multi-version: history[key] = [(version, value|None)], so a transaction
        # reads the snapshot at its read version even while others commit.
        self._history: dict[bytes, list[tuple[int, bytes | None]]] = {}
        self._version = 0
        self._commits: list[tuple[int, list[Range]]] = []  # (version, write ranges)
        self._active: dict[int, int] = {}  # id(txn) -> read version

    def create_transaction(self) -> MemoryTransaction:
        with self._lock:
            tr = MemoryTransaction(self, self._version)
            self._active[id(tr)] = self._version
            return tr

    def snapshot_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The newest committed values, under the lock (so one version for all)."""
        keys = self._check_keys(keys)
        with self._lock:
            ver = self._version
            return [self._value_at(k, ver) for k in keys]

    # -- snapshot reads at a version --------------------------------------------

    def _value_at(self, key: bytes, version: int) -> bytes | None:
        hist = self._history.get(key)
        if not hist:
            return None
        # newest entry with v <= version
        for v, val in reversed(hist):
            if v <= version:
                return val
        return None

    def _range_at(self, begin: bytes, end: bytes, version: int) -> list[KeyValue]:
        lo = bisect.bisect_left(self._keys, begin)
        hi = bisect.bisect_left(self._keys, end)
        out: list[KeyValue] = []
        for k in self._keys[lo:hi]:
            v = self._value_at(k, version)
            if v is not None:
                out.append((k, v))
        return out

    def _commit(self, tr: MemoryTransaction) -> None:
        with self._lock:
            self._active.pop(id(tr), None)
            if tr.writes or tr.cleared:
                for version, ranges in self._commits:
                    if version <= tr.read_version:
                        continue
                    for w in ranges:
                        for r in tr.read_ranges:
                            if _overlaps(w, r):
                                raise FsError(
                                    Code.KV_CONFLICT, "transaction conflict", retryable=True
                                )
            if not tr.writes and not tr.cleared:
                return
            self._version += 1
            ver = self._version
            write_ranges: list[Range] = list(tr.cleared)
            for b, e in tr.cleared:
                lo = bisect.bisect_left(self._keys, b)
                hi = bisect.bisect_left(self._keys, e)
                for k in self._keys[lo:hi]:
                    if self._value_at(k, ver) is not None:
                        self._history.setdefault(k, []).append((ver, None))
            for k, v in tr.writes.items():
                write_ranges.append((k, key_after(k)))
                if k not in self._history:
                    bisect.insort(self._keys, k)
                    self._history[k] = []
                self._history[k].append((ver, v))
            self._commits.append((ver, write_ranges))
            self._gc()

    def _forget(self, tr: MemoryTransaction) -> None:
        with self._lock:
            self._active.pop(id(tr), None)

    def _gc(self) -> None:
        """Drop commit records and old versions no active transaction can need."""
        oldest = min(self._active.values(), default=self._version)
        self._commits = [c for c in self._commits if c[0] > oldest]
        if len(self._history) > 0 and self._version % 64 == 0:
            dead: list[bytes] = []
            for k, hist in self._history.items():
                # keep the newest version <= oldest and everything after it
                keep_from = 0
                for i, (v, _) in enumerate(hist):
                    if v <= oldest:
                        keep_from = i
                del hist[:keep_from]
                if len(hist) == 1 and hist[0][1] is None and hist[0][0] <= oldest:
                    dead.append(k)
            for k in dead:
                del self._history[k]
                i = bisect.bisect_left(self._keys, k)
                del self._keys[i]


class MemoryTransaction(BufferedWritesTransaction):
    def __init__(self, db: MemoryDatabase, read_version: int) -> None:
        self.db = db
        self.read_version = read_version
        self.writes: dict[bytes, bytes | None] = {}
        self.cleared: list[Range] = []
        self.read_ranges: list[Range] = []
        self.done = False

    def _check_open(self) -> None:
        if self.done:
            raise FsError(Code.INTERNAL, "transaction already committed or cancelled")

    def _get(self, key: bytes, *, snapshot: bool) -> bytes | None:
        if not snapshot:
            self.read_ranges.append((key, key_after(key)))
        if key in self.writes:
            return self.writes[key]
        if self._cleared(key):
            return None
        with self.db._lock:
            return self.db._value_at(key, self.read_version)

    def _get_range(
        self, begin: bytes, end: bytes, *, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        with self.db._lock:
            base = self.db._range_at(begin, end, self.read_version)
        merged: dict[bytes, bytes] = {k: v for k, v in base if not self._cleared(k)}
        for k, v in self.writes.items():
            if begin <= k < end:
                if v is None:
                    merged.pop(k, None)
                else:
                    merged[k] = v
        keys = sorted(merged, reverse=reverse)
        if limit > 0 and len(keys) > limit:
            keys = keys[:limit]
            if not snapshot:
                last = keys[-1]
                self.read_ranges.append((begin, key_after(last)) if not reverse else (last, end))
        elif not snapshot:
            self.read_ranges.append((begin, end))
        return [(k, merged[k]) for k in keys]

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._check_open()
        self.check_key(begin)
        self.check_key(end)
        self.read_ranges.append((bytes(begin), bytes(end)))

    def commit(self) -> None:
        self._check_open()
        faults.maybe_fail("kv.commit")
        self.done = True
        if not self.writes and not self.cleared:
            self.db._forget(self)  # read-only: nothing to check or apply
            return
        # Writes of None (clear) are applied as single-key clears.
        clears = [k for k, v in self.writes.items() if v is None]
        for k in clears:
            del self.writes[k]
            self.cleared.append((k, key_after(k)))
        self.db._commit(self)  # type: ignore[arg-type]

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            self.db._forget(self)
