"""The client's write-behind engine (fs3.client.write_behind), against an in-memory store.

The storage write is an asyncio function that lands bytes in a bytearray after a
controllable delay; the transport is the real shm transport (its staging buffers
are what the engine fills and sends) or the base one (plain memory).
"""

from __future__ import annotations

import asyncio
import errno
import os
from typing import Any

import pytest

from fs3.client.core import Caller, FileHandle
from fs3.client.write_behind import WriteBehind
from fs3.errors import Code, FsError
from fs3.proto import meta_pb2
from fs3.transport.shm import ShmClientTransport

pytestmark = pytest.mark.timeout(20)

CS = 64 << 10  # chunk size of the test files


def _fh(fh: int, inode: int = 7, flags: int = os.O_RDWR) -> FileHandle:
    return FileHandle(fh, inode, flags, "s", meta_pb2.Attr(), (1, 2, 3), CS, Caller(0, 0))


class Store:
    """The storage write: records (offset, length, payload address) and lands bytes."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.calls: list[tuple[int, int]] = []
        self.inflight = 0
        self.max_inflight = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_at: int | None = None

    async def write(self, fh: FileHandle, offset: int, data: memoryview) -> int:
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            await self.gate.wait()
            await asyncio.sleep(0)
            if self.fail_at is not None and offset <= self.fail_at < offset + len(data):
                raise FsError(Code.NO_SPACE, "target full")
            end = offset + len(data)
            if len(self.data) < end:
                self.data.extend(bytes(end - len(self.data)))
            self.data[offset:end] = data
            self.calls.append((offset, len(data)))
            return len(data)
        finally:
            self.inflight -= 1


def _engine(store: Store, transport: Any, handles: list[FileHandle], **kw: Any) -> WriteBehind:
    def failed(fh: FileHandle, err: FsError) -> None:
        for h in {fh, *(h for h in handles if h.inode == fh.inode)}:
            if h.writable and h.error is None:
                h.error = err

    return WriteBehind(store.write, transport, failed, **kw)


def test_sequential_writes_coalesce_into_chunks_sent_from_staging_memory() -> None:
    async def main() -> None:
        tr = ShmClientTransport("c1")
        store = Store()
        h = _fh(1)
        wb = _engine(store, tr, [h], depth=4)
        payload = os.urandom(3 * CS + 100)
        for i in range(0, len(payload), 4096):  # the kernel's small writes
            await wb.write(h, i, memoryview(payload)[i : i + 4096])
        assert wb.busy(h.inode)
        await wb.settle(h.inode)
        assert not wb.busy(h.inode)
        assert bytes(store.data) == payload
        assert store.calls == [(0, CS), (CS, CS), (2 * CS, CS), (3 * CS, 100)]
        assert wb.stats["staged_in_place"] == 4 and wb.stats["buffers_copied"] == 0
        assert sum(a.used for a in tr._staging.arenas) == 0  # every buffer given back
        await wb.close()
        await tr.close()

    asyncio.run(main())


def test_depth_bounds_writes_in_flight_and_overlaps_stay_in_order() -> None:
    async def main() -> None:
        from fs3.transport.base import ClientTransport

        class Plain(ClientTransport):
            async def write_ref(self, *a: Any) -> Any:
                raise AssertionError

            async def read_ref(self, *a: Any) -> Any:
                raise AssertionError

            async def close(self) -> None:
                return None

        store = Store()
        store.gate.clear()
        h = _fh(1)
        wb = _engine(store, Plain("c"), [h], depth=2)
        first = asyncio.ensure_future(wb.write(h, 0, memoryview(b"a" * (4 * CS))))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not first.done()  # two chunks in flight, the third waits for a slot
        assert store.inflight == 2
        store.gate.set()
        await first
        # an overwrite of chunk 0 while it may still be in flight lands after it
        await wb.write(h, 0, memoryview(b"b" * 10))
        await wb.settle(h.inode)
        assert store.max_inflight <= 2
        assert bytes(store.data[:12]) == b"b" * 10 + b"aa"
        assert wb.stats["buffers_copied"] == 5
        await wb.close()

    asyncio.run(main())


def test_a_failed_background_write_is_deferred_to_every_writer_of_the_inode() -> None:
    async def main() -> None:
        tr = ShmClientTransport("c2")
        store = Store()
        store.fail_at = CS + 5
        w1, w2, ro, other = _fh(1), _fh(2), _fh(3, flags=os.O_RDONLY), _fh(4, inode=8)
        wb = _engine(store, tr, [w1, w2, ro, other], depth=4)
        await wb.write(w1, 0, memoryview(os.urandom(2 * CS)))
        await wb.settle(w1.inode)  # settling does not raise: the handles do
        assert w1.error is not None and w1.error.code == Code.NO_SPACE
        assert w1.error.errno == errno.ENOSPC
        assert w2.error is w1.error
        assert ro.error is None and other.error is None
        assert store.calls == [(0, CS)]
        await wb.close()
        await tr.close()

    asyncio.run(main())


def test_a_partly_filled_buffer_is_sent_after_its_age() -> None:
    async def main() -> None:
        tr = ShmClientTransport("c3")
        store = Store()
        h = _fh(1)
        wb = _engine(store, tr, [h], max_age_s=0.05)
        await wb.write(h, 100, memoryview(b"x" * 10))
        assert wb.unsettled_from(h.inode) == 100
        for _ in range(200):
            if store.calls:
                break
            await asyncio.sleep(0.01)
        assert store.calls == [(100, 10)]
        for _ in range(100):
            if not wb.busy(h.inode):
                break
            await asyncio.sleep(0.01)
        assert wb.unsettled_from(h.inode) is None
        await wb.close()
        await tr.close()

    asyncio.run(main())


def test_another_handle_or_offset_sends_the_buffer_first() -> None:
    async def main() -> None:
        tr = ShmClientTransport("c4")
        store = Store()
        a, b = _fh(1), _fh(2)
        wb = _engine(store, tr, [a, b])
        await wb.write(a, 0, memoryview(b"1" * 10))
        await wb.write(b, 10, memoryview(b"2" * 10))  # contiguous, but another handle
        await wb.write(b, 100, memoryview(b"3" * 10))  # same handle, not contiguous
        await wb.settle(a.inode, 0, 5)  # a range: only what overlaps it must be settled
        assert (0, 10) in store.calls
        await wb.settle(a.inode)
        assert sorted(store.calls) == [(0, 10), (10, 10), (100, 10)]
        await wb.close()
        await tr.close()

    asyncio.run(main())


def test_settle_waits_for_a_buffer_that_waits_for_a_slot() -> None:
    """fsync must cover a write that returned but whose buffer is still queued for a slot."""

    async def main() -> None:
        tr = ShmClientTransport("c5")
        store = Store()
        store.gate.clear()
        other, h = _fh(1, inode=8), _fh(2, inode=7)
        wb = _engine(store, tr, [other, h], depth=1)
        await wb.write(other, 0, memoryview(b"o" * CS))  # in flight: takes the only slot
        queued = asyncio.ensure_future(wb.write(h, 0, memoryview(b"h" * CS)))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not queued.done()  # its full buffer waits for the slot
        assert wb.busy(h.inode) and wb.unsettled_from(h.inode) == 0
        settled = asyncio.ensure_future(wb.settle(h.inode))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not settled.done()
        store.gate.set()
        await asyncio.wait_for(settled, 5)
        assert len(store.calls) == 2 and bytes(store.data[:CS]) == b"h" * CS
        await queued
        await wb.close()
        await tr.close()

    asyncio.run(main())


def test_state_is_kept_while_a_writer_waits_for_the_inode_lock() -> None:
    """A landing write must not drop the inode's state between a lock release and the
    next writer's wake-up: that writer's bytes would go to a state settle() cannot see."""

    async def main() -> None:
        tr = ShmClientTransport("c6")
        store = Store()
        h = _fh(1)
        wb = _engine(store, tr, [h])
        await wb.write(h, 0, memoryview(b"x" * 10))
        await wb.settle(h.inode)
        await wb.write(h, 10, memoryview(b"y" * 10))
        st = wb._inodes[h.inode]
        await st.lock.acquire()  # as a writer in the middle of sending would hold it
        waiter = asyncio.ensure_future(wb.write(h, 20, memoryview(b"z" * 10)))
        await asyncio.sleep(0)
        st.used = 0  # pretend the buffer went out (not busy) ...
        st.lock.release()
        wb._maybe_drop(st)  # ... and a write landed right now, before the waiter runs
        assert wb._inodes.get(h.inode) is st
        await waiter
        await wb.close()
        await tr.close()

    asyncio.run(main())


def test_unsettled_by_holds_while_a_handles_write_is_not_on_storage() -> None:
    """The mtime of a handle's writes goes to meta only once they are on storage
    (AsyncClient._hint): a buffered write, one waiting for a slot and one in flight are
    unsettled for their handle; another handle's writes, or another inode's, are not."""

    async def main() -> None:
        tr = ShmClientTransport("c7")
        store = Store()
        store.gate.clear()
        a, b, other = _fh(1), _fh(2), _fh(3, inode=8)
        wb = _engine(store, tr, [a, b, other], depth=1, max_age_s=0)
        assert not wb.unsettled_by(a)
        await wb.write(a, 0, memoryview(b"a" * 10))  # buffered (no age: only settle sends it)
        assert wb.unsettled_by(a) and not wb.unsettled_by(b) and not wb.unsettled_by(other)
        await wb.write(b, 100, memoryview(b"b" * 10))  # sends a's buffer: in flight, gated
        for _ in range(10):
            await asyncio.sleep(0)
        assert store.inflight == 1
        assert wb.unsettled_by(a) and wb.unsettled_by(b)
        queued = asyncio.ensure_future(wb.settle(b.inode))  # b's buffer waits for the slot
        for _ in range(10):
            await asyncio.sleep(0)
        assert not queued.done() and wb.unsettled_by(b)
        store.gate.set()
        await asyncio.wait_for(queued, 5)
        assert not wb.unsettled_by(a) and not wb.unsettled_by(b)
        assert sorted(store.calls) == [(0, 10), (100, 10)]
        await wb.close()
        await tr.close()

    asyncio.run(main())
