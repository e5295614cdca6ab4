"""Placement at create time: which chains a new file's chunks go to.

A file's layout is fixed when it is created (docs/architecture.md#file-layout).
A directory holds a *default* layout (chunk size, stripe width, chain table id) that new files
inherit; the file gets a concrete list of ``stripe`` chain ids taken as a
window from the newest version of that chain table. Windows advance
round-robin with a per-meta-server counter that starts at a random offset, so
files spread evenly over all chains without any shared (conflicting) counter
in the KV. Storing the concrete ``chain_ids`` (not base + seed) makes the
layout unambiguous for every client: chunk ``i`` lives on
``chain_ids[i % stripe]`` (fs3/client/layout.py does that math).

Chain tables come from mgmtd's routing info through a
:class:`ChainTableSource`; meta never talks to mgmtd directly here, so tests
inject a fixed source.

A file is never created without chains: its layout is fixed at create, so a
file placed on an empty chain list could be stat'ed but never written. When
the table is not in the meta server's routing yet (a meta server that has just
started and whose routing watcher has not caught up), :meth:`ChainAllocator.place`
raises :class:`NoChainTable` and the create fails with a retryable
``UNKNOWN_CHAIN_TABLE``; the client retries until the routing arrives.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
from typing import Protocol

from fs3.errors import Code, FsError, posix
from fs3.limits import chunk_size_rule, valid_chunk_size
from fs3.logs import event
from fs3.proto import meta_pb2

log = logging.getLogger("fs3.meta.layout")

MAX_STRIPE = 4096


class ChainTableSource(Protocol):
    """Where meta gets chain tables and capacity figures (routing info)."""

    def latest_table(self, table_id: int) -> tuple[int, list[int]] | None:
        """(version, chain ids) of the newest version of a table, or None if unknown."""

    def space(self) -> tuple[int, int, int] | None:
        """(capacity, used, free) bytes of the storage cluster, or None if unknown."""


class NoChainTables:
    """A source without routing (a meta server started without a cluster file): directories
    and the namespace work, regular files cannot be created (there are no chains)."""

    def latest_table(self, table_id: int) -> tuple[int, list[int]] | None:
        return None

    def space(self) -> tuple[int, int, int] | None:
        return None


class StaticChainTables:
    """Fixed chain tables (tests, benchmarks, single-host tools)."""

    def __init__(
        self,
        tables: dict[int, list[int]],
        *,
        version: int = 1,
        space: tuple[int, int, int] | None = None,
    ) -> None:
        self.tables = {k: list(v) for k, v in tables.items()}
        self.version = version
        self._space = space

    def latest_table(self, table_id: int) -> tuple[int, list[int]] | None:
        chains = self.tables.get(table_id)
        return None if not chains else (self.version, list(chains))

    def space(self) -> tuple[int, int, int] | None:
        return self._space


class NoChainTable(Exception):
    """No chains to place a new file on: its chain table is not known to this meta server.

    Deliberately not an :class:`FsError`: it is raised inside the create's KV
    transaction, and ``Database.run`` retries a retryable FsError in place, which
    would park a meta worker thread until the routing watcher catches up. The
    meta operator lets the transaction end and answers :meth:`error` at once;
    the client retries with its own backoff and deadline.
    """

    def __init__(self, table_id: int, *, routed: bool) -> None:
        self.table_id = table_id
        self.routed = routed
        super().__init__(f"chain table {table_id} unknown")

    def error(self) -> FsError:
        """Retryable while routing may still bring the table; permanent without routing."""
        if self.routed:
            return FsError(
                Code.UNKNOWN_CHAIN_TABLE,
                f"chain table {self.table_id} is not in this meta server's routing yet "
                "(it has just started, or the table was not created): no chains to place "
                "a new file on; retry",
                retryable=True,
            )
        return FsError(
            Code.UNKNOWN_CHAIN_TABLE,
            "this meta server has no routing (started without a cluster file): "
            "it cannot place new files on chains",
            retryable=False,
        )


def validate_layout(layout: meta_pb2.Layout, *, partial: bool) -> None:
    """Refuse impossible layouts with EINVAL. ``partial``: zero fields mean "keep"."""
    cs = layout.chunk_size
    if cs or not partial:
        if not valid_chunk_size(cs):
            raise posix(errno.EINVAL, f"chunk_size must be {chunk_size_rule()}, got {cs}")
    if layout.stripe or not partial:
        if not 1 <= layout.stripe <= MAX_STRIPE:
            raise posix(errno.EINVAL, f"stripe must be in [1, {MAX_STRIPE}]")
    if not partial and layout.table_id == 0:
        raise posix(errno.EINVAL, "table_id must be >= 1")


def merge_layout(base: meta_pb2.Layout, override: meta_pb2.Layout) -> meta_pb2.Layout:
    """``base`` with the non-zero fields of ``override`` (chain list never copied)."""
    out = meta_pb2.Layout(
        chunk_size=override.chunk_size or base.chunk_size,
        stripe=override.stripe or base.stripe,
        table_id=override.table_id or base.table_id,
    )
    return out


class ChainAllocator:
    """Chooses chain windows for new files, round-robin per (table, stripe)."""

    def __init__(self, source: ChainTableSource, *, seed: int | None = None) -> None:
        self.source = source
        self._rng = random.Random(seed)
        self._counters: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._warned: set[int] = set()

    def place(self, default: meta_pb2.Layout) -> meta_pb2.Layout:
        """A concrete file layout from a directory's default layout.

        The stripe is capped at the table's size, so a file never lists one chain
        twice. Without the chain table (or with an empty one) it raises
        :class:`NoChainTable` rather than return a layout without chains, and
        logs that once per table.
        """
        out = meta_pb2.Layout(
            chunk_size=default.chunk_size, stripe=default.stripe, table_id=default.table_id
        )
        table = self.source.latest_table(default.table_id)
        if not table or not table[1]:
            if default.table_id not in self._warned:
                self._warned.add(default.table_id)
                event(
                    log,
                    "no chain table yet; file creates fail until routing has it",
                    level=logging.WARNING,
                    table_id=default.table_id,
                )
            raise NoChainTable(default.table_id, routed=not isinstance(self.source, NoChainTables))
        self._warned.discard(default.table_id)
        version, chains = table
        n = len(chains)
        stripe = min(default.stripe, n)
        key = (default.table_id, stripe)
        with self._lock:
            counter = self._counters.get(key)
            if counter is None:
                counter = self._rng.randrange(n) // stripe * stripe if n >= stripe else 0
            self._counters[key] = counter + stripe
        start = counter % n
        out.stripe = stripe
        out.table_version = version
        out.chain_ids.extend(chains[(start + i) % n] for i in range(stripe))
        return out
