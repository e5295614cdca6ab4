"""The USRBIO ring: submission and completion queues in one shared-memory file.

Layout (modelled on 3FS's ``IoRing``; all integers native little-endian x86)::

    0    magic "FS3IORNG" | u32 version | u32 entries | u32 for_read | i32 io_depth
         | i32 timeout_ms | u32 flags
    64   u32 sqe_head    written by the application (producer of SQEs)
    128  u32 sqe_tail    written by the agent       (consumer of SQEs)
    192  u32 cqe_head    written by the agent       (producer of CQEs)
    256  u32 cqe_tail    written by the application (consumer of CQEs)
    512  IoArgs[entries]   56 B: buf_id[16] buf_off inode file_off io_len userdata (u64s)
         IoCqe[entries+1]  24 B: i32 index, i32 reserved, i64 result, u64 userdata
         IoSqe[entries+1]  16 B: i32 index, i32 reserved, u64 userdata

``entries`` is the number of I/O slots (args); each queue has ``entries + 1``
positions so that one stays empty to tell full from empty. Positions are
indices in ``[0, entries]``; a queue is empty when head == tail.

A slot (its IoArgs) belongs to the application from ``prep_io`` until it pops
the slot's CQE, so at most ``entries`` I/Os are in flight and neither queue can
overflow. Index words are 4-byte aligned and written with single 32-bit stores
(ctypes), so a reader never sees a torn value; the producer writes the entry
before it advances the head. On x86 (TSO) that order is what the consumer
observes; a port to a weaker memory model would need explicit fences here.
"""

from __future__ import annotations

import ctypes
import struct
from typing import NamedTuple

MAGIC = b"FS3IORNG"
VERSION = 1
HEADER = struct.Struct("<8sIIIiiI")
HEADER_SIZE = 512
OFF_SQE_HEAD = 64
OFF_SQE_TAIL = 128
OFF_CQE_HEAD = 192
OFF_CQE_TAIL = 256
ARGS = struct.Struct("<16sQQQQQ")  # 56 bytes
CQE = struct.Struct("<iiqQ")  # 24 bytes
SQE = struct.Struct("<iiQ")  # 16 bytes
MAX_ENTRIES = 1 << 16

assert ARGS.size == 56 and CQE.size == 24 and SQE.size == 16


def ring_size(entries: int) -> int:
    """Bytes of the shared-memory file for a ring of ``entries`` slots (4 KiB aligned)."""
    n = HEADER_SIZE + entries * ARGS.size + (entries + 1) * (CQE.size + SQE.size)
    return (n + 4095) // 4096 * 4096


class IoArgs(NamedTuple):
    """One slot's I/O (a tuple: the agent unpacks one per I/O, and a frozen dataclass
    costs several times more to build)."""

    buf_id: bytes
    buf_off: int
    inode: int
    file_off: int
    io_len: int
    userdata: int


class Ring:
    """A view of a ring living in ``buf`` (a shared mapping); used by both sides."""

    def __init__(self, buf: memoryview) -> None:
        magic, version, entries, for_read, io_depth, timeout_ms, flags = HEADER.unpack_from(buf, 0)
        if magic != MAGIC or version != VERSION:
            raise ValueError("not an fs3 io ring (bad magic/version)")
        if not 1 <= entries <= MAX_ENTRIES:
            raise ValueError(f"ring entries {entries} out of range")
        if len(buf) < ring_size(entries):
            raise ValueError(
                f"ring of {entries} entries needs {ring_size(entries)} bytes, file has {len(buf)}"
            )
        self.buf = buf
        self.entries = entries
        self.n = entries + 1
        self.for_read = bool(for_read)
        self.io_depth = io_depth
        self.timeout_ms = timeout_ms
        self.flags = flags
        self._args_off = HEADER_SIZE
        self._cqe_off = self._args_off + entries * ARGS.size
        self._sqe_off = self._cqe_off + self.n * CQE.size
        self._sqe_head = ctypes.c_uint32.from_buffer(buf, OFF_SQE_HEAD)
        self._sqe_tail = ctypes.c_uint32.from_buffer(buf, OFF_SQE_TAIL)
        self._cqe_head = ctypes.c_uint32.from_buffer(buf, OFF_CQE_HEAD)
        self._cqe_tail = ctypes.c_uint32.from_buffer(buf, OFF_CQE_TAIL)

    @staticmethod
    def init(
        buf: memoryview,
        entries: int,
        for_read: bool,
        io_depth: int,
        timeout_ms: int,
        flags: int = 0,
    ) -> Ring:
        """Format a fresh (zeroed) ring file and return a view of it."""
        if not 1 <= entries <= MAX_ENTRIES:
            raise ValueError(f"entries must be 1..{MAX_ENTRIES}")
        HEADER.pack_into(
            buf, 0, MAGIC, VERSION, entries, int(for_read), io_depth, timeout_ms, flags
        )
        return Ring(buf)

    def release(self) -> None:
        """Drop the ctypes views so the mapping can be closed."""
        del self._sqe_head, self._sqe_tail, self._cqe_head, self._cqe_tail

    def _pos(self, v: int) -> int:
        """A position read from shared memory, clamped so a corrupt value cannot index out of range."""
        return v if v < self.n else 0

    # -- application side ----------------------------------------------------------

    def write_args(self, index: int, args: IoArgs) -> None:
        ARGS.pack_into(
            self.buf,
            self._args_off + index * ARGS.size,
            args.buf_id,
            args.buf_off,
            args.inode,
            args.file_off,
            args.io_len,
            args.userdata,
        )

    def push_sqe(self, index: int, userdata: int) -> bool:
        head = self._pos(self._sqe_head.value)
        nxt = (head + 1) % self.n
        if nxt == self._pos(self._sqe_tail.value):
            return False
        SQE.pack_into(self.buf, self._sqe_off + head * SQE.size, index, 0, userdata)
        self._sqe_head.value = nxt  # publish after the entry is written
        return True

    def pop_cqe(self) -> tuple[int, int, int] | None:
        """``(index, result, userdata)`` of the oldest completion, or None."""
        tail = self._pos(self._cqe_tail.value)
        if tail == self._pos(self._cqe_head.value):
            return None
        index, _r, result, userdata = CQE.unpack_from(self.buf, self._cqe_off + tail * CQE.size)
        self._cqe_tail.value = (tail + 1) % self.n
        return index, result, userdata

    # -- agent side ------------------------------------------------------------------

    def sqes_queued(self) -> int:
        return (self._pos(self._sqe_head.value) - self._pos(self._sqe_tail.value)) % self.n

    def pop_sqe(self) -> tuple[int, int] | None:
        tail = self._pos(self._sqe_tail.value)
        if tail == self._pos(self._sqe_head.value):
            return None
        index, _r, userdata = SQE.unpack_from(self.buf, self._sqe_off + tail * SQE.size)
        self._sqe_tail.value = (tail + 1) % self.n
        return index, userdata

    def read_args(self, index: int) -> IoArgs:
        if not 0 <= index < self.entries:
            raise ValueError(f"slot index {index} out of range")
        return IoArgs._make(ARGS.unpack_from(self.buf, self._args_off + index * ARGS.size))

    def push_cqe(self, index: int, result: int, userdata: int) -> bool:
        head = self._pos(self._cqe_head.value)
        nxt = (head + 1) % self.n
        if nxt == self._pos(self._cqe_tail.value):
            return False
        CQE.pack_into(self.buf, self._cqe_off + head * CQE.size, index, 0, result, userdata)
        self._cqe_head.value = nxt
        return True
