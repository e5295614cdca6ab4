"""Reusable private memory for bulk bytes: anonymous mappings lent as buffers.

A mapping is lent as a memoryview of it and lent again only once no view of it
is left anywhere: every memoryview of a mapping (and every slice of one) holds
a reference to it, so ``sys.getrefcount`` tells when nobody uses it, and there
is no release call for a caller to forget. Mappings come in power-of-two size
classes, are page aligned (an ``O_DIRECT`` write can use them as they are) and
are pooled up to ``cache_bytes``; beyond that a buffer gets a mapping of its
own, unmapped when its last view goes.

Why: receiving bulk bytes into fresh memory costs a zero-fill (``bytearray``'s
memset, or the kernel's page faults for a fresh mapping) and an allocation on
top of the copy out of the socket: about 30 µs of a 1 MiB payload's receive
path on this VM (``benchmarks/rpc.py --paths``), a sixth of it or more. The
native server receives request payloads into these
(:class:`fs3.rpc.native.server.ServerConnection`), the storage node copies
one-sided payloads into them (:class:`fs3.transport.region.PrivateCopies`).
"""

from __future__ import annotations

import mmap
import sys
import threading

MIN_CLASS = 64 << 10  # smallest pooled mapping (sizes are rounded up to a power of two)
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# sys.getrefcount of a pooled mapping nobody uses: its list, the loop name, the call's argument
_IDLE_REFS = 3


class MappingPool:
    """Lends ``take(n)`` buffers of private memory, reused once no view of them is left.

    Thread safe: a view may be dropped on any thread (a handler's worker
    thread), and ``take`` may run on several.
    """

    def __init__(self, cache_bytes: int = 64 << 20) -> None:
        self.cache_bytes = cache_bytes
        self._pool: dict[int, list[mmap.mmap]] = {}
        self._cached = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> memoryview:
        """``n`` (> 0) bytes of writable memory, the caller's alone while any view of it lives.

        The contents are whatever the previous user left: the caller overwrites them.
        """
        size = max(MIN_CLASS, 1 << (n - 1).bit_length())
        with self._lock:
            pooled = self._pool.setdefault(size, [])
            for mm in pooled:
                if sys.getrefcount(mm) <= _IDLE_REFS:  # no view of it is left
                    return memoryview(mm)[:n]
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_POPULATE
            fresh = mmap.mmap(-1, size, flags=flags)
            if self._cached + size <= self.cache_bytes:
                pooled.append(fresh)
                self._cached += size
            return memoryview(fresh)[:n]

    @property
    def cached_bytes(self) -> int:
        """Bytes of pooled mappings (tests, metrics)."""
        return self._cached


__all__ = ["MIN_CLASS", "MappingPool"]
