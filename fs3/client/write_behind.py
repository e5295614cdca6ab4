"""Write-behind: the client's one engine for writes that return before storage has them.

Used by ``AsyncClient.write(..., behind=True)``, which both the FUSE daemon's
buffered writes (:mod:`fs3.fuse.ops`) and the Python file API use
(docs/architecture.md, data flow of a write, step 2). What it guarantees:

* **Coalescing into the staging buffer.** Sequential writes to an inode are
  copied once, into a per-inode buffer that never crosses a chunk boundary.
  The buffer comes from the transport (:meth:`ClientTransport.staging_buffer`):
  with the shm transport it lies in a registered shared-memory region, so the
  storage node reads the payload straight out of it — the buffer *is* what is
  sent, with no second copy. A full buffer, a write that does not continue it
  (another offset or another handle), :meth:`settle` (reads, truncates,
  flush, fsync, close) or age (``max_age_s``) sends it in the background.
* **Bounded, striped, in order.** At most ``depth`` buffers are in flight per
  client (a write waits for a slot: memory stays bounded); consecutive chunks
  go to consecutive chains of the file's stripe, so they are written to
  several chains at once. A buffer overlapping one still in flight waits for
  it, so overlapping writes land in the order they were made.
* **Deferred errors.** A failed background write is recorded on every
  writable handle of the inode (``FileHandle.error``, through ``on_error``) and
  raised by that handle's next write, flush, fsync or close, as the kernel does
  for its page cache's writeback errors.

Nothing here is durable: durability comes from ``fsync``/``close``, which
settle the inode (every buffer written, committed by every replica of its
chain) before reporting the length to meta.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fs3.errors import Code, FsError

if TYPE_CHECKING:
    from fs3.client.core import FileHandle
    from fs3.transport.base import ClientTransport

log = logging.getLogger("fs3.client.write_behind")

StorageWrite = Callable[["FileHandle", int, memoryview], Awaitable[int]]
OnError = Callable[["FileHandle", FsError], None]


@dataclass(eq=False)
class _Flight:
    """A buffer being written: its file range, the handle that wrote it, and its task."""

    start: int
    end: int
    owner: FileHandle
    task: asyncio.Task[None]


@dataclass(eq=False)
class _Inode:
    """Write-behind state of one inode: the open buffer and the writes in flight."""

    inode: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    buf: memoryview | None = None  # the staging buffer (from buf_off to the chunk's end)
    release: Callable[[], None] | None = None  # gives the buffer back
    used: int = 0  # bytes of buf filled
    off: int = 0  # file offset of buf[0]
    owner: FileHandle | None = None
    since: float = 0.0  # monotonic time of the buffer's first byte
    timer: asyncio.TimerHandle | None = None  # the age check of the open buffer
    flights: list[_Flight] = field(default_factory=list)
    # (start, handle) of buffers waiting for a slot
    sending: list[tuple[int, FileHandle]] = field(default_factory=list)
    users: int = 0  # write()/settle() calls holding this state (it must not be dropped meanwhile)

    @property
    def busy(self) -> bool:
        return self.used > 0 or bool(self.flights) or bool(self.sending)


class WriteBehind:
    """One per client. See the module docstring.

    Args:
        write: ``await write(fh, offset, data)`` writes to storage (committed on return).
        transport: supplies staging buffers (:meth:`ClientTransport.staging_buffer`).
        on_error: records a background write's failure on a handle.
        depth: buffers in flight per client before a write waits.
        max_age_s: a partly filled buffer is sent after this long.
    """

    def __init__(
        self,
        write: StorageWrite,
        transport: ClientTransport,
        on_error: OnError,
        *,
        depth: int = 8,
        max_age_s: float = 1.0,
    ) -> None:
        self._write = write
        self._transport = transport
        self._on_error = on_error
        self.depth = max(1, depth)
        self.max_age_s = max_age_s
        self._slots: asyncio.Semaphore | None = None
        self._inodes: dict[int, _Inode] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = {"storage_writes": 0, "staged_in_place": 0, "buffers_copied": 0}

    # ------------------------------------------------------------------ queries

    def busy(self, inode: int) -> bool:
        """True while ``inode`` has buffered bytes or writes in flight."""
        st = self._inodes.get(inode)
        return st is not None and st.busy

    def unsettled_from(self, inode: int) -> int | None:
        """The lowest file offset not yet on storage (buffered or in flight), if any."""
        st = self._inodes.get(inode)
        if st is None:
            return None
        starts = [f.start for f in st.flights] + [s for s, _ in st.sending]
        if st.used:
            starts.append(st.off)
        return min(starts) if starts else None

    def unsettled_by(self, fh: FileHandle) -> bool:
        """True while a write made through ``fh`` is buffered or in flight (not on storage).

        Why: the handle's mtime must not reach meta before its data reaches storage
        (``AsyncClient._hint``): a mount that keeps its page cache while the file's
        (size, mtime) is unchanged would cache the old bytes under the new mtime and
        keep serving them after the write is acknowledged.
        """
        st = self._inodes.get(fh.inode)
        if st is None:
            return False
        return (
            (st.used > 0 and st.owner is fh)
            or any(o is fh for _, o in st.sending)
            or any(f.owner is fh for f in st.flights)
        )

    # ------------------------------------------------------------------ writing

    async def write(self, fh: FileHandle, offset: int, data: memoryview) -> None:
        """Accept ``data`` at ``offset`` (copied; the caller may reuse its buffer)."""
        st = self._inodes.get(fh.inode)
        if st is None:
            st = self._inodes[fh.inode] = _Inode(fh.inode)
        cs = fh.chunk_size or (1 << 20)
        n = len(data)
        st.users += 1
        try:
            async with st.lock:
                pos = 0
                while pos < n:
                    o = offset + pos
                    if st.used and (st.owner is not fh or st.off + st.used != o):
                        await self._send(st)
                    if st.buf is None or not st.used:
                        self._open(st, fh, o, (o // cs + 1) * cs - o)
                    assert st.buf is not None
                    take = min(len(st.buf) - st.used, n - pos)
                    st.buf[st.used : st.used + take] = data[pos : pos + take]
                    st.used += take
                    pos += take
                    if st.used == len(st.buf):
                        await self._send(st)
        finally:
            st.users -= 1
            self._maybe_drop(st)

    def _maybe_drop(self, st: _Inode) -> None:
        """Forget an inode's state once nothing is buffered, in flight or about to be."""
        if not st.busy and not st.users and self._inodes.get(st.inode) is st:
            del self._inodes[st.inode]

    def _open(self, st: _Inode, fh: FileHandle, offset: int, size: int) -> None:
        """Start a buffer of ``size`` bytes (to the chunk's end) at ``offset``."""
        if st.release is not None:
            st.release()
        got = self._transport.staging_buffer(size)
        if got is None:
            st.buf, st.release = memoryview(bytearray(size)), None
            self.stats["buffers_copied"] += 1
        else:
            st.buf, st.release = got
            self.stats["staged_in_place"] += 1
        st.used, st.off, st.owner, st.since = 0, offset, fh, time.monotonic()
        if self.max_age_s > 0 and st.timer is None:
            st.timer = asyncio.get_running_loop().call_later(self.max_age_s, self._age, st)

    async def _send(self, st: _Inode) -> None:
        """Send the inode's buffer in the background (caller holds st.lock)."""
        if not st.used or st.buf is None or st.owner is None:
            return
        fh, start, data, release = st.owner, st.off, st.buf[: st.used], st.release
        end = start + st.used
        st.buf, st.release, st.used, st.owner = None, None, 0, None
        sending = (start, fh)
        st.sending.append(sending)  # still unsettled while it waits (busy, unsettled_from)
        try:
            while any(f.start < end and start < f.end for f in st.flights):
                await asyncio.wait([f.task for f in st.flights if f.start < end and start < f.end])
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.depth)
            await self._slots.acquire()
        except BaseException:
            if release is not None:
                release()
            self._on_error(
                fh, FsError(Code.CANCELLED, f"write of inode {st.inode} at {start} was cancelled")
            )
            raise
        finally:
            st.sending.remove(sending)
        task = asyncio.get_running_loop().create_task(self._run(st, fh, start, data, release))
        flight = _Flight(start, end, fh, task)
        st.flights.append(flight)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._landed(st, flight, t))

    async def _run(
        self,
        st: _Inode,
        fh: FileHandle,
        start: int,
        data: memoryview,
        release: Callable[[], None] | None,
    ) -> None:
        try:
            self.stats["storage_writes"] += 1
            await self._write(fh, start, data)
        except FsError as e:
            log.warning(
                "background write of inode %d [%d, %d) failed: %s",
                st.inode,
                start,
                start + len(data),
                e,
            )
            self._on_error(fh, e)
        except asyncio.CancelledError:
            self._on_error(
                fh, FsError(Code.CANCELLED, f"write of inode {st.inode} at {start} was cancelled")
            )
            raise
        except Exception as e:  # noqa: BLE001 - recorded on the handles, never lost
            log.exception("background write of inode %d failed", st.inode)
            self._on_error(
                fh, FsError(Code.INTERNAL, f"write of inode {st.inode} at {start} failed: {e!r}")
            )
        finally:
            if release is not None:
                release()
            assert self._slots is not None
            self._slots.release()

    def _landed(self, st: _Inode, flight: _Flight, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        with contextlib.suppress(ValueError):
            st.flights.remove(flight)
        self._maybe_drop(st)
        if not task.cancelled():
            task.exception()  # retrieved: failures were recorded by _run

    def _age(self, st: _Inode) -> None:
        """Timer: send a buffer that sat partly filled for ``max_age_s``; re-arm otherwise."""
        st.timer = None
        if not st.used:
            return
        left = st.since + self.max_age_s - time.monotonic()
        loop = asyncio.get_running_loop()
        if left > 0 or st.lock.locked():
            st.timer = loop.call_later(max(left, 0.05), self._age, st)
            return
        task = loop.create_task(self._send_locked(st))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_locked(self, st: _Inode) -> None:
        st.users += 1
        try:
            async with st.lock:
                await self._send(st)
        finally:
            st.users -= 1
            self._maybe_drop(st)

    # ------------------------------------------------------------------ settling

    async def settle(self, inode: int, start: int = 0, end: int | None = None) -> None:
        """Send the buffer and wait for the writes of ``inode`` overlapping [start, end)
        (the whole inode if ``end`` is None). Errors stay recorded on the handles."""
        st = self._inodes.get(inode)
        if st is None:
            return

        def overlaps(s: int, e: int) -> bool:
            return end is None or (s < end and start < e)

        st.users += 1
        try:
            # Under the lock: a buffer another task is sending (waiting for a slot) is in
            # flight once the lock is free, so it is waited for below.
            async with st.lock:
                if st.used and overlaps(st.off, st.off + st.used):
                    await self._send(st)
            while True:
                tasks = [f.task for f in st.flights if overlaps(f.start, f.end)]
                if not tasks:
                    return
                await asyncio.wait(tasks)
        finally:
            st.users -= 1
            self._maybe_drop(st)

    async def close(self) -> None:
        """Cancel timers; wait for every write in flight (call after the handles settled)."""
        for st in list(self._inodes.values()):
            if st.timer is not None:
                st.timer.cancel()
                st.timer = None
            with contextlib.suppress(FsError):
                await self.settle(st.inode)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
