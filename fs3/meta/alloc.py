"""Inode number allocation, unique across every meta server sharing the KV.

Like 3FS's ``InodeIdAllocator``: a server reserves a *batch* of ids by bumping
a counter key in its own small transaction (``counter c`` → ids
``[c*batch + 1, (c+1)*batch]``), then hands them out from memory. Only batch
reservations touch the shared key, so creates on different servers do not
conflict on it. Ids are never reused (an id reserved but not used is simply
skipped), so ``generation`` can stay 0. Counter 0 is never used: ids up to
``batch`` are reserved (the root is inode 1).
"""

from __future__ import annotations

import threading
from collections import deque

from fs3.kv import Database, Transaction
from fs3.meta import schema as S


class InodeAllocator:
    """Hands out unique inode numbers; thread-safe."""

    def __init__(self, db: Database, batch: int = 1024) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.db = db
        self.batch = batch
        self._free: deque[int] = deque()
        # Two locks: ``_lock`` only guards ``_free`` (held for a deque operation),
        # ``_reserving`` serialises reservations (held across a KV commit). The
        # event loop takes ``_lock`` alone (try_allocate, give_back), so a
        # reservation on a worker thread never blocks it.
        self._lock = threading.Lock()
        self._reserving = threading.Lock()
        self.reservations = 0

    def _reserve(self) -> list[int]:
        batch = self.batch

        def txn(tr: Transaction) -> int:
            key = S.alloc_key(0)
            c = max(S.decode_u64(tr.get(key)), 1)
            tr.set(key, S.encode_u64(c + 1))
            return c

        c = self.db.run(txn)
        self.reservations += 1
        # counter c >= 1 owns [c*batch + 1, (c+1)*batch]: never 1 (root), never shared
        return list(range(c * batch + 1, (c + 1) * batch + 1))

    def allocate(self) -> int:
        """A fresh inode number (may run a small KV transaction)."""
        while True:
            got = self.try_allocate()
            if got is not None:
                return got
            with self._reserving:
                with self._lock:
                    if self._free:  # another thread reserved meanwhile
                        continue
                ids = self._reserve()
                with self._lock:
                    self._free.extend(ids)

    def try_allocate(self) -> int | None:
        """A fresh inode number if one is reserved already, else None (no KV
        transaction, and never waits for a reservation in progress)."""
        with self._lock:
            return self._free.popleft() if self._free else None

    def give_back(self, ino: int) -> None:
        """Return an id that was allocated but not used (it stays unique)."""
        with self._lock:
            self._free.appendleft(ino)
