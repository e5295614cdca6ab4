"""Reusable private memory for bulk bytes, lent as buffers.

A buffer is lent as a memoryview of it and lent again only once no view of it
is left anywhere: every memoryview of a buffer (and every slice of one) holds
a reference to it, so ``sys.getrefcount`` tells when nobody uses it, and there
is no release call for a caller to forget. Buffers come in power-of-two size
classes and are pooled up to ``cache_bytes``; beyond that a buffer is made for
the one use and freed when its last view goes.

Why: receiving bulk bytes into fresh memory costs a zero-fill (``bytearray``'s
memset, or the kernel's page faults for a fresh mapping) and an allocation on
top of the copy out of the socket: 30-60 µs of a 1 MiB payload's receive path
on this VM, a sixth to a third of it (``benchmarks/rpc.py --paths``,
benchmarks/results/rpc-20261202-1.md).

What a buffer is, the caller says (``make``): the native server receives
request payloads into ``bytearray`` buffers
(:class:`fs3.rpc.native.server.ServerConnection`), the storage node copies
one-sided payloads into page-aligned anonymous mappings
(:func:`anonymous_mapping`, :class:`fs3.transport.region.PrivateCopies`).
"""

from __future__ import annotations

import mmap
import sys
import threading
from collections.abc import Callable
from typing import Any

MIN_CLASS = 64 << 10  # smallest pooled buffer (sizes are rounded up to a power of two)
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# sys.getrefcount of a pooled buffer nobody uses: its list, the loop name, the call's argument
_IDLE_REFS = 3


def anonymous_mapping(size: int) -> mmap.mmap:
    """``size`` bytes of private, page-aligned memory, faulted in up front."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_POPULATE)


class BufferPool:
    """Lends ``take(n)`` buffers made by ``make(size)``, reused once no view of them is left.

    Thread safe: a view may be dropped on any thread (a handler's worker
    thread), and ``take`` may run on several.
    """

    def __init__(
        self, cache_bytes: int = 64 << 20, make: Callable[[int], Any] = anonymous_mapping
    ) -> None:
        self.cache_bytes = cache_bytes
        self._make = make
        self._pool: dict[int, list[Any]] = {}
        self._cached = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> memoryview:
        """``n`` (> 0) bytes of writable memory, the caller's alone while any view of it lives.

        The contents are whatever the previous user left: the caller overwrites them.
        """
        size = max(MIN_CLASS, 1 << (n - 1).bit_length())
        with self._lock:
            pooled = self._pool.setdefault(size, [])
            for buf in pooled:
                if sys.getrefcount(buf) <= _IDLE_REFS:  # no view of it is left
                    return memoryview(buf)[:n]
            fresh = self._make(size)
            if self._cached + size <= self.cache_bytes:
                pooled.append(fresh)
                self._cached += size
            return memoryview(fresh)[:n]

    @property
    def cached_bytes(self) -> int:
        """Bytes of pooled buffers (tests, metrics)."""
        return self._cached


__all__ = ["MIN_CLASS", "BufferPool", "anonymous_mapping"]
