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
        self._lock = threading.Lock()
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
        with self._lock:
            if not self._free:
                self._free.extend(self._reserve())
            return self._free.popleft()

    def try_allocate(self) -> int | None:
        """A fresh inode number if one is reserved already, else None (no KV transaction)."""
        with self._lock:
            return self._free.popleft() if self._free else None

    def give_back(self, ino: int) -> None:
        """Return an id that was allocated but not used (it stays unique)."""
        with self._lock:
            self._free.appendleft(ino)
