"""Aggregated data files: many tensors in one large file, described by index entries.

This is the data path every checkpoint format in :mod:`fs3.ckpt` (and the
PyTorch DCP storage in :mod:`fs3.ckpt.dcp`) writes through::

    entries = write_items(store, "step-1/rank-00000.data", [("w", arr), ("b", tensor)])
    read_items(store, "step-1/rank-00000.data", entries, [out_w, out_b])

``write_items`` lays the items end to end (each aligned to ``ALIGN`` bytes),
computes a CRC32C per item, writes the file with many I/Os in flight
(:meth:`fs3.ckpt.store.Store.write_segments`: USRBIO on an fs3 mount, the
client API otherwise), fsyncs it and returns one :class:`IndexEntry` per item.
Nothing is durable before it returns; the caller publishes the entries (an
index file) only afterwards. ``read_items`` fills caller-owned buffers and
checks every CRC (:class:`CorruptCheckpoint` on a mismatch).
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import crc32c as _crc

from fs3.ckpt import buffers
from fs3.ckpt.store import INFLIGHT, Segment, Store

ALIGN = 4096  # item start alignment in a data file (page/direct-I/O friendly)


class CorruptCheckpoint(OSError):
    """A CRC32C mismatch, a missing piece or an inconsistent index."""


def crc32c(buf: Any) -> int:
    return int(_crc.crc32c(buf))


@dataclass
class IndexEntry:
    """Where one item's bytes are: ``length`` bytes at ``offset`` of ``file``, with their CRC32C.

    ``dtype``/``shape`` describe the whole tensor; a piece of a tensor (a
    changed block, a rank's rows) starts ``toff`` bytes into it. ``enc`` is how
    the stored bytes encode it: ``raw``; ``zlib`` (lossless, ``rawlen`` bytes
    after decompression); ``q8`` (an int8-quantised delta: see
    :mod:`fs3.ckpt.codec`). The CRC is of the stored bytes.
    """

    name: str
    dtype: str
    shape: list[int]
    offset: int
    length: int
    crc32c: int
    file: str = ""
    toff: int = 0
    enc: str = "raw"
    rawlen: int = -1  # bytes of the tensor this piece covers once decoded (-1: == length)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def covered(self) -> int:
        return self.length if self.rawlen < 0 else self.rawlen

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["extra"]:
            del d["extra"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> IndexEntry:
        return cls(**d)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def write_items(
    store: Store,
    rel: str,
    items: Sequence[tuple[str, Any]],
    *,
    inflight: int = INFLIGHT,
    meta: Sequence[dict[str, Any]] | None = None,
) -> list[IndexEntry]:
    """Write ``items`` (name, array/tensor/bytes-like) into one data file; return their entries.

    ``meta[i]`` (optional) overrides entry fields of item ``i`` (``dtype``,
    ``shape``, ``toff``, ``enc``, ``rawlen``, ``extra``) for pieces and encoded data.
    The file is fsync'd before this returns.
    """
    entries: list[IndexEntry] = []
    segs: list[Segment] = []
    off = 0
    for i, (name, obj) in enumerate(items):
        mv = buffers.byte_view(obj)
        if buffers.is_tensor(obj):
            dtype, shape = buffers.dtype_name(obj), list(obj.shape)
        else:
            dtype, shape = "uint8", [len(mv)]
        e = IndexEntry(name, dtype, shape, off, len(mv), crc32c(mv), file=os.path.basename(rel))
        if meta is not None and meta[i]:
            for k, v in meta[i].items():
                setattr(e, k, v)
        entries.append(e)
        if len(mv):
            segs.append(Segment(off, mv))
        off = _align(off + len(mv))
    size = entries[-1].offset + entries[-1].length if entries else 0
    store.write_segments(rel, segs, size=size, inflight=inflight)
    return entries


class _Arrivals:
    """Tells which byte ranges of a file are complete as pieces of it arrive (from any thread).

    ``ranges`` must not overlap. ``ready(i)`` is called once range ``i`` has
    all its bytes (never for an empty range).
    """

    def __init__(self, ranges: Sequence[tuple[int, int]], ready: Callable[[int], None]) -> None:
        order = sorted((i for i, (a, b) in enumerate(ranges) if b > a), key=lambda i: ranges[i][0])
        self._ids = order
        self._starts = [ranges[i][0] for i in order]
        self._ends = [ranges[i][1] for i in order]  # sorted too: the ranges do not overlap
        self._left = [ranges[i][1] - ranges[i][0] for i in order]
        self._ready = ready
        self._lock = threading.Lock()

    def piece(self, offset: int, length: int) -> None:
        end = offset + length
        done = []
        with self._lock:
            j = bisect.bisect_right(self._ends, offset)  # the first range ending after offset
            while j < len(self._starts) and self._starts[j] < end:
                self._left[j] -= min(end, self._ends[j]) - max(offset, self._starts[j])
                if self._left[j] == 0:
                    done.append(self._ids[j])
                j += 1
        for i in done:
            self._ready(i)


def read_verified(
    store: Store,
    rel: str,
    segs: Sequence[Segment],
    entries: Sequence[IndexEntry],
    views: Sequence[memoryview],
    *,
    inflight: int = INFLIGHT,
) -> None:
    """Read ``segs`` from ``rel`` and check each entry's CRC32C as soon as its bytes have arrived.

    ``views[i]`` is the memory that the segments fill with ``entries[i]``'s
    stored bytes (file range ``[offset, offset + length)``). The checks run
    on a thread of their own while later pieces are still being read, so a
    load costs little more than the read. Raises :class:`CorruptCheckpoint`
    for the first entry whose bytes do not match.
    """
    bad: list[tuple[int, int]] = []  # (entry index, CRC32C read)

    def check(i: int) -> None:
        got = crc32c(views[i])
        if got != entries[i].crc32c:
            bad.append((i, got))

    with ThreadPoolExecutor(1, thread_name_prefix="fs3-ckpt-crc") as checker:

        def ready(i: int) -> None:
            checker.submit(check, i)

        arrivals = _Arrivals([(e.offset, e.offset + e.length) for e in entries], ready)
        store.read_segments(rel, segs, inflight=inflight, on_piece=arrivals.piece)
    for i, e in enumerate(entries):
        if e.length == 0:
            check(i)
    if bad:
        i, got = min(bad, key=lambda b: entries[b[0]].offset)
        e = entries[i]
        raise CorruptCheckpoint(
            5,
            f"CRC32C mismatch in {rel} for {e.name!r} at {e.toff}: stored {e.crc32c:#010x}, "
            f"read {got:#010x}",
        )


def read_items(
    store: Store,
    rel: str,
    entries: Sequence[IndexEntry],
    outs: Sequence[Any],
    *,
    inflight: int = INFLIGHT,
    verify: bool = True,
) -> None:
    """Read each entry's stored bytes into ``outs[i]`` (writable, exactly ``length`` bytes).

    ``outs`` may be numpy arrays, CPU torch tensors, bytearrays or memoryviews.
    Raises :class:`CorruptCheckpoint` if a CRC does not match.
    """
    if len(entries) != len(outs):
        raise ValueError(f"{len(entries)} entries but {len(outs)} output buffers")
    views: list[memoryview] = []
    segs: list[Segment] = []
    for e, o in zip(entries, outs, strict=True):
        mv = buffers.byte_view(o)
        if mv.readonly:
            raise ValueError(f"output buffer for {e.name!r} is read-only")
        if len(mv) != e.length:
            raise ValueError(f"output buffer for {e.name!r} has {len(mv)} bytes, entry {e.length}")
        views.append(mv)
        if e.length:
            segs.append(Segment(e.offset, mv))
    if verify:
        read_verified(store, rel, segs, entries, views, inflight=inflight)
    else:
        store.read_segments(rel, segs, inflight=inflight)
