"""Where checkpoint files live: a directory on a local path, or an fs3 path through the client API.

Two stores implement one small interface (:class:`Store`): metadata calls
(``makedirs``, ``listdir``, ``write_atomic`` ...) and the two bulk calls the data
path needs, :meth:`Store.write_segments` and :meth:`Store.read_segments`, which
move many ``(file_offset, buffer)`` pieces with many I/Os in flight.

* :class:`PosixStore` — any local directory. When the directory is on an fs3
  FUSE mount whose USRBIO agent answers, bulk I/O goes through USRBIO rings
  (docs: ``fs3/usrbio/api.py``): a buffer obtained from :meth:`Store.alloc` is
  shared memory registered with the agent, so data moves with no copy (it
  comes from the process's :class:`LoadPool` for the mount and is reused by a
  later load, through any store, once nothing views it); other buffers are staged through a registered buffer. Otherwise it uses
  ``os.pwrite``/``os.preadv`` from a thread pool (they release the GIL), and
  :meth:`Store.alloc` lends memory of the process's :class:`HostArena`.
* :class:`ClientStore` — an fs3 path through :class:`fs3.client.file_api.Client`
  (no mount needed): the asyncio core's ``write``/``readinto`` run concurrently
  on the client's bridge loop.

Durability: ``write_segments`` returns only after the file is fsync'd;
``write_atomic`` writes a temporary file, fsyncs it, renames it over the name
and (POSIX) fsyncs the directory, so a reader sees the old content or the new,
never a torn one. That is what the success marker relies on.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import mmap
import os
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from fs3.durable import write_durably
from fs3.transport.region import populate_range

IO_BYTES = 1 << 20  # one I/O = the default chunk size: each I/O touches one chain
INFLIGHT = 64  # I/Os in flight per bulk call (over all its rings)
RINGS = 2  # USRBIO rings (one thread each) per bulk call: one ring's Python work overlaps the other's waits
# USRBIO reads (loads) take larger I/Os on more rings: an I/O of several chunks is one ring
# entry, one completion and one agent batch slot (the agent's client fans it out to the
# chunks' chains), and four rings keep the agent fed while this process's threads wait
# for the CPU. Measured on 1 GiB (benchmarks/results/ckpt-*): 4 MiB x 32 on 4 rings read
# ~15 % faster than 1 MiB x 64 on 2 under the same load. Writes keep IO_BYTES (one chain
# per I/O, so a failed chunk write is retried alone).
READ_IO_BYTES = 4 << 20
READ_INFLIGHT = 32  # at the default depth (INFLIGHT); a caller's depth scales with it
READ_RINGS = 4

OnPiece = Callable[[int, int], None]  # (file offset, length) of a finished I/O; any thread


@dataclass
class Segment:
    """One piece of a bulk transfer: ``len(buf)`` bytes at ``offset`` of the file."""

    offset: int
    buf: memoryview  # a 1-D unsigned-byte view; written from, or read into


def split_segments(segs: Sequence[Segment], io_bytes: int = IO_BYTES) -> list[Segment]:
    """Cut segments into I/Os of at most ``io_bytes`` (so many can be in flight)."""
    out: list[Segment] = []
    for s in segs:
        n = len(s.buf)
        for a in range(0, n, io_bytes):
            out.append(Segment(s.offset + a, s.buf[a : min(n, a + io_bytes)]))
    return out


def _addr(mv: memoryview) -> int:
    return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data) if len(mv) else 0


def anon_mmap(nbytes: int) -> mmap.mmap:
    """A private anonymous mapping of ``nbytes``, in transparent huge pages where the kernel allows.

    Huge pages make a GiB 512 page faults instead of 262144 (each costs
    microseconds on a virtual machine) and spare the TLB during copies. Where
    THP is off or unsupported the advice fails and the mapping keeps 4 KiB
    pages (:func:`huge_bytes` says which it got).
    """
    mm = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass  # no THP here: 4 KiB pages
    return mm


def populate_memory(buf: memoryview, step: int = 0) -> bool:
    """Fault in every page of ``buf`` writable, without changing its bytes (``step``: per call).

    One ``madvise(MADV_POPULATE_WRITE)`` maps the pages without a trap per
    page; on a page already there it does nothing (a reused buffer costs a
    page-table walk). False where the kernel lacks it: then pages are faulted
    in on first write, as without this call.
    """
    return populate_range(_addr(buf), len(buf), step) if len(buf) else True


def huge_bytes(buf: memoryview) -> int:
    """Bytes of the mapping holding ``buf`` that are in transparent huge pages (``AnonHugePages``)."""
    addr = _addr(buf)
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1]) * 1024
    return 0


def memmove(dst: memoryview, src: memoryview) -> None:
    """Copy ``src`` into ``dst`` (same length) with the GIL released.

    A memoryview slice assignment holds the GIL for the whole copy; a ctypes
    call drops it, so I/O threads and CRC checks keep running during copies.
    """
    n = len(src)
    if n:
        if len(dst) != n:
            raise ValueError(f"copy of {n} bytes into {len(dst)}")
        ctypes.memmove(_addr(dst), _addr(src), n)


class Store:
    """The file operations a checkpoint needs, on paths relative to ``root``."""

    root: str
    kind: str  # "usrbio", "posix" or "client": which data path bulk I/O takes

    # -- bulk data
    def alloc(self, nbytes: int, *, populate: bool = False) -> memoryview:
        """A host buffer of ``nbytes`` that this store's bulk I/O fills or drains with no copy if it can.

        Loads read into it and snapshots are copied into it. Views of it
        (``buf[a:b]``, tensors over them) keep the memory; pooled memory (here
        the process's :class:`HostArena`) is reused only after the buffer and
        every view of it are gone. ``populate``: every page is faulted in
        before this returns.
        """
        return host_arena().take(nbytes, populate=populate) if nbytes else memoryview(b"")

    def write_segments(
        self, rel: str, segs: Sequence[Segment], *, size: int, inflight: int = INFLIGHT
    ) -> None:
        """Create ``rel`` (replacing it) of ``size`` bytes from ``segs``, then fsync it."""
        raise NotImplementedError

    def read_segments(
        self,
        rel: str,
        segs: Sequence[Segment],
        *,
        inflight: int = INFLIGHT,
        on_piece: OnPiece | None = None,
    ) -> None:
        """Fill every segment's buffer from ``rel``; a short read raises EIO.

        ``on_piece(offset, length)`` is called (from an I/O thread) as each
        piece of the file lands in its buffer, so a caller can check and use
        what has arrived while the rest is still being read.
        """
        raise NotImplementedError

    # -- metadata
    def makedirs(self, rel: str) -> None:
        raise NotImplementedError

    def listdir(self, rel: str) -> list[str]:
        raise NotImplementedError

    def exists(self, rel: str) -> bool:
        raise NotImplementedError

    def size(self, rel: str) -> int:
        raise NotImplementedError

    def read_bytes(self, rel: str) -> bytes:
        raise NotImplementedError

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Replace ``rel`` with ``data`` durably and atomically (tmp + fsync + rename)."""
        raise NotImplementedError

    def remove_tree(self, rel: str) -> None:
        raise NotImplementedError

    def unlink(self, rel: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _short(rel: str, want: int, got: int) -> OSError:
    return OSError(errno.EIO, f"short read of {rel}: {got} of {want} bytes")


def _io_error(rel: str, write: bool, want: int, result: int) -> OSError:
    """The error of a USRBIO I/O that returned ``result`` (-errno or a short count) for ``want`` bytes."""
    op = "write" if write else "read"
    if result < 0:
        return OSError(-result, f"usrbio {op} of {rel}: {os.strerror(-result)}")
    if write:
        return OSError(errno.EIO, f"short usrbio write of {rel}: {result} of {want} bytes")
    return _short(rel, want, result)


# --------------------------------------------------------------------------- pooled buffers

POOL_IDLE_S = 30.0  # an idle pooled buffer is unmapped after this long without a load
POOL_IDLE_MAX = 2  # idle pooled buffers kept at most (the most recently returned)
# pooled sizes are multiples of this (a huge page), so similar sizes share one mapping
_POOL_GRAIN = 2 << 20


class _Pooled:
    """One mapping of a :class:`BufferPool`: lent out (its memory is some caller's tensors) or idle.

    ``mem`` is the mapping: an object with ``buf`` (a writable memoryview of
    all of it), ``size``, ``closed`` and ``close()`` (a USRBIO Iov, or
    :class:`_AnonBlock`).
    """

    __slots__ = ("base", "idle_since", "lent", "mem")

    def __init__(self, mem: Any) -> None:
        self.mem = mem
        self.base = _addr(mem.buf)
        self.lent = False
        self.idle_since = 0.0


class BufferPool:
    """Mappings lent as buffers and reused once the buffer and every view of it are gone.

    :meth:`take` lends ``nbytes`` of a mapping; the caller's tensors are views
    of it. When the buffer and every view of it are gone (tracked with
    :func:`weakref.finalize` on the buffer's owner, so any thread may drop the
    last view) the mapping becomes idle and the next :meth:`take` of a similar
    size reuses it: no new mapping, registration or page faults (fresh pages
    cost this VM about as much CPU as reading the data into them,
    benchmarks/results). A mapping is never lent twice at once, so a caller's
    tensors are never overwritten by a later user. Idle mappings are bounded
    (``idle_max`` of them, ``idle_bytes`` in all) and unmapped after
    ``idle_s`` seconds, so a process that used one once does not keep the
    memory. :meth:`close` unmaps the idle ones and closes lent ones, whose
    memory stays while their views do. Subclasses say how a mapping is made.
    """

    def __init__(
        self,
        *,
        idle_s: float = POOL_IDLE_S,
        idle_max: int = POOL_IDLE_MAX,
        idle_bytes: int,
    ) -> None:
        self.idle_s = idle_s
        self.idle_max = idle_max
        self.idle_bytes = idle_bytes
        self._all: list[_Pooled] = []
        self.made = 0  # mappings made so far (a take that reused one does not count)
        self._lock = threading.RLock()  # the return callback may run inside a locked section (gc)
        self._closed = False
        self._timer: threading.Timer | None = None

    def _make(self, size: int) -> Any:
        raise NotImplementedError

    def take(self, nbytes: int, *, populate: bool = False) -> memoryview:
        """``nbytes`` (> 0) of writable memory, exclusively the caller's while it is used.

        ``populate``: every page is faulted in before this returns (a reused
        mapping already is, so it costs a page-table walk).
        """
        want = -(-nbytes // _POOL_GRAIN) * _POOL_GRAIN
        with self._lock:
            while True:
                if self._closed:
                    raise ValueError("buffer pool is closed")
                fits = [q for q in self._all if not q.lent and want <= q.mem.size <= want * 9 // 8]
                p = min(fits, key=lambda q: q.mem.size) if fits else None
                if p is None:
                    p = _Pooled(self._make(want))
                    self.made += 1
                    self._all.append(p)
                p.lent = True
                # a buffer given back meanwhile (a gc pass inside this section runs its
                # finalizer here) may have trimmed the idle mapping picked: pick again
                if p in self._all and not p.mem.closed:
                    break
            try:
                # the owner object: its life is the life of every view handed out from it
                owner = (ctypes.c_ubyte * nbytes).from_buffer(p.mem.buf[:nbytes])
            except BaseException:
                p.lent = False
                raise
        weakref.finalize(owner, self._give_back, p)
        if populate:
            populate_memory(p.mem.buf)
        return memoryview(owner).cast("B")

    def find(self, addr: int, length: int) -> tuple[Any, int] | None:
        """The mapping holding ``[addr, addr + length)`` and the offset there, or None."""
        for p in tuple(self._all):
            if p.base <= addr and addr + length <= p.base + p.mem.size:
                return p.mem, addr - p.base
        return None

    def sizes(self) -> tuple[list[int], list[int]]:
        """Sizes of the (lent, idle) mappings."""
        with self._lock:
            return ([p.mem.size for p in self._all if p.lent],
                    [p.mem.size for p in self._all if not p.lent])  # fmt: skip

    def _give_back(self, p: _Pooled) -> None:
        with self._lock:
            p.lent = False
            if self._closed or p.mem.closed:
                self._drop(p)
                return
            p.idle_since = time.monotonic()
            # the newest first; older ones past idle_max or idle_bytes are unmapped now
            idle = sorted((q for q in self._all if not q.lent), key=lambda q: -q.idle_since)
            kept = held = 0
            for q in idle:
                if kept >= self.idle_max or held + q.mem.size > self.idle_bytes:
                    self._drop(q)
                else:
                    kept, held = kept + 1, held + q.mem.size
            self._schedule(self.idle_s)

    def _schedule(self, delay: float) -> None:
        """One timer at a time runs :meth:`expire` (caller holds the lock)."""
        if self._timer is None and not self._closed:
            self._timer = threading.Timer(delay, self._tick)
            self._timer.daemon = True
            self._timer.start()

    def _tick(self) -> None:
        with self._lock:
            self._timer = None
            self.expire()
            idle = [p.idle_since for p in self._all if not p.lent]
            if idle:  # the next one due
                self._schedule(max(0.0, min(idle) + self.idle_s - time.monotonic()))

    def expire(self) -> int:
        """Unmap the mappings idle for ``idle_s`` or longer; returns how many."""
        now = time.monotonic()
        with self._lock:
            old = [p for p in self._all if not p.lent and now - p.idle_since >= self.idle_s]
            for p in old:
                self._drop(p)
        return len(old)

    def _drop(self, p: _Pooled) -> None:
        if p in self._all:
            self._all.remove(p)
        p.mem.close()  # a lent mapping's pages live on in its views

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            for p in list(self._all):
                self._drop(p)


class LoadPool(BufferPool):
    """Registered USRBIO Iovs that loads read into (handed out as tensors) and snapshots fill.

    See :class:`BufferPool`.
    Closing an Iov deregisters and unlinks it; a lent one's pages stay while
    its views do.
    """

    def __init__(
        self,
        mount: str,
        *,
        idle_s: float = POOL_IDLE_S,
        idle_max: int = POOL_IDLE_MAX,
        idle_bytes: int | None = None,
    ) -> None:
        self.mount = mount
        # idle memory is RAM (tmpfs) that nobody uses: at most a quarter of /dev/shm
        super().__init__(
            idle_s=idle_s,
            idle_max=idle_max,
            idle_bytes=_shm_bytes(free=False) // 4 if idle_bytes is None else idle_bytes,
        )

    def _make(self, size: int) -> Any:
        from fs3.usrbio import Iov

        iov = Iov(self.mount, size)
        try:
            # Allocate the file's pages now (one call; zeroed later, where first
            # touched): a storage server maps a region's allocated pages in one
            # go when it is registered there (ShmRegion.populate_allocated), at
            # the Iov's first I/O, instead of faulting them in one by one.
            os.posix_fallocate(iov.fileno(), 0, size)
        except OSError:
            pass  # no room in /dev/shm for all of it now: pages are allocated as written
        return iov


_load_pools: dict[tuple[int, str, int, int], LoadPool] = {}
_load_pools_lock = threading.Lock()


def load_pool(mount: str) -> LoadPool:
    """The process's :class:`LoadPool` for the USRBIO agent of ``mount``, made on first use.

    One per process and agent, not per store: a load through a store opened
    for one call (:func:`fs3.ckpt.load`) reads into the Iov an earlier one
    gave back instead of registering and faulting in fresh memory. A
    restarted agent (a new socket) gets a new pool; the old one is closed.
    A forked child gets its own (the parent's Iovs are the parent's).
    """
    from fs3.usrbio.shm import agent_socket_path

    st = os.stat(agent_socket_path(mount))
    key = (os.getpid(), mount, st.st_dev, st.st_ino)
    with _load_pools_lock:
        pool = _load_pools.get(key)
        if pool is None or pool.closed:
            for k in [k for k in _load_pools if k[0] != key[0] or k[1] == mount]:
                old = _load_pools.pop(k)
                if k[0] == key[0]:
                    old.close()
            pool = _load_pools[key] = LoadPool(mount)
        return pool


class _AnonBlock:
    """Anonymous process memory (huge pages where allowed) with the interface a pool needs."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._mm = anon_mmap(size)
        self.buf: memoryview = memoryview(self._mm)
        self.closed = False

    def close(self) -> None:
        """Unmap now if nothing views the memory, else when the last view goes."""
        self.closed = True
        try:
            self.buf.release()
        except BufferError:
            pass
        try:
            self._mm.close()
        except BufferError:
            pass  # views remain: the mapping is freed with the last of them


class HostArena(BufferPool):
    """Process memory in transparent huge pages, lent and reused (see :class:`BufferPool`).

    Snapshot buffers of every :class:`fs3.ckpt.Checkpointer` and the loads
    of stores without registered memory take their memory here, so a process
    that loads a checkpoint, drops it and then saves (a resumed job) snapshots
    into pages it already has. Idle memory is bounded by a quarter of RAM.
    """

    def __init__(
        self,
        *,
        idle_s: float = POOL_IDLE_S,
        idle_max: int = POOL_IDLE_MAX,
        idle_bytes: int | None = None,
    ) -> None:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        super().__init__(
            idle_s=idle_s,
            idle_max=idle_max,
            idle_bytes=ram // 4 if idle_bytes is None else idle_bytes,
        )

    def _make(self, size: int) -> Any:
        return _AnonBlock(size)


_arena: tuple[int, HostArena] | None = None
_arena_lock = threading.Lock()


def host_arena() -> HostArena:
    """The process's :class:`HostArena` (a forked child gets its own)."""
    global _arena
    with _arena_lock:
        if _arena is None or _arena[0] != os.getpid():
            _arena = (os.getpid(), HostArena())
        return _arena[1]


# --------------------------------------------------------------------------- POSIX (+ USRBIO)


def _mountpoint(path: str) -> str:
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


def _fs3_mount_of(path: str) -> str | None:
    """The fs3 mount point holding ``path`` if its USRBIO agent socket exists, else None."""
    from fs3.usrbio.shm import agent_socket_path

    mp = _mountpoint(path)
    try:
        return mp if os.path.exists(agent_socket_path(mp)) else None
    except OSError:
        return None


class PosixStore(Store):
    """A local directory; USRBIO for bulk I/O when it is on an fs3 mount (``usrbio=None``: auto)."""

    def __init__(
        self,
        root: str,
        *,
        usrbio: bool | None = None,
        staging_bytes: int = 64 << 20,
        create: bool = True,
    ):
        self.root = os.path.abspath(root)
        if create:
            os.makedirs(self.root, exist_ok=True)
        elif not os.path.isdir(self.root):
            raise FileNotFoundError(errno.ENOENT, "no such checkpoint directory", root)
        mount = _fs3_mount_of(self.root) if usrbio is not False else None
        if usrbio and mount is None:
            raise OSError(errno.ENODEV, f"{root} is not on an fs3 mount with a USRBIO agent")
        self.mount = mount
        self.kind = "usrbio" if mount else "posix"
        self._pool: ThreadPoolExecutor | None = None
        self._loads: LoadPool | None = None  # the process's Iovs for this mount (zero-copy)
        self._staging: Any = None
        self._staging_bytes = staging_bytes
        self._lock = threading.Lock()

    def _p(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(INFLIGHT, thread_name_prefix="fs3-ckpt-io")
        return self._pool

    def alloc(self, nbytes: int, *, populate: bool = False) -> memoryview:
        """On an fs3 mount: memory of a registered USRBIO Iov, so the agent moves data in place.

        The Iov comes from the process's :class:`LoadPool` for this mount
        (:func:`load_pool`), which loads and snapshots share: a load reads
        straight into it, a save writes straight from it (no staging copy).
        The first buffer of a size maps a fresh Iov; once every view of a
        buffer is gone the Iov goes back to the pool, and the next load or
        snapshot of that size uses memory that is already mapped, registered
        and faulted in, here and in the storage servers (measured: fresh
        pages cost this VM about as much CPU as the read itself,
        benchmarks/ckpt.py). So a job that saved and dropped a snapshot
        buffer, or loaded and dropped the tensors, reuses those pages. The Iov
        is shared memory (/dev/shm): a buffer that would take more than half
        of what is free there is process memory instead (staged).
        """
        if self.mount is None or nbytes == 0 or nbytes > _shm_bytes(free=True) // 2:
            return super().alloc(nbytes, populate=populate)
        with self._lock:
            if self._loads is None or self._loads.closed:
                self._loads = load_pool(self.mount)
            pool = self._loads
        return pool.take(nbytes, populate=populate)

    def _iov_of(self, mv: memoryview) -> tuple[Any, int] | None:
        """The registered Iov that ``mv`` lies in (and its offset there), if any."""
        pool = self._loads
        return pool.find(_addr(mv), len(mv)) if pool is not None else None

    # -- bulk
    def write_segments(
        self, rel: str, segs: Sequence[Segment], *, size: int, inflight: int = INFLIGHT
    ) -> None:
        path = self._p(rel)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            ios = split_segments(segs)
            if self.mount is not None:
                self._usrbio(fd, ios, inflight, write=True, rel=rel)
            else:
                list(self._threads().map(lambda s: _pwrite_all(fd, s), ios))
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_segments(
        self,
        rel: str,
        segs: Sequence[Segment],
        *,
        inflight: int = INFLIGHT,
        on_piece: OnPiece | None = None,
    ) -> None:
        fd = os.open(self._p(rel), os.O_RDONLY)
        try:
            if self.mount is not None:
                self._usrbio(
                    fd,
                    split_segments(segs, READ_IO_BYTES),
                    max(1, inflight * READ_INFLIGHT // INFLIGHT),
                    write=False,
                    rel=rel,
                    on_piece=on_piece,
                    rings=READ_RINGS,
                )
            else:
                ios = split_segments(segs)

                def one(s: Segment) -> None:
                    _pread_all(fd, s, rel)
                    if on_piece is not None:
                        on_piece(s.offset, len(s.buf))

                list(self._threads().map(one, ios))
        finally:
            os.close(fd)

    def _usrbio(
        self,
        fd: int,
        ios: list[Segment],
        inflight: int,
        *,
        write: bool,
        rel: str,
        on_piece: OnPiece | None = None,
        rings: int = RINGS,
    ) -> None:
        """Run ``ios`` through ``rings`` USRBIO rings, ``inflight`` in all.

        Each ring has its own thread and its own slots of the staging Iov; the
        rings take I/Os from one queue in file order, so pieces land roughly
        front to back. A segment inside an Iov from :meth:`alloc` moves
        straight from/to it; any other is staged through the ring's slot (one
        copy, with the GIL released). On an error every ring stops taking
        work, reaps what it has in flight (the agent must be done with the
        staging slots before the next call reuses them) and the first error
        is raised.
        """
        from fs3.usrbio import Ior, Iov, dereg_fd, prep_io, reg_fd, submit_ios, wait_for_ios

        assert self.mount is not None
        mount = self.mount
        with self._lock:  # the staging Iov is shared; stores are shared by writer threads
            if self._staging is None:
                self._staging = Iov(mount, self._staging_bytes)
            staging = self._staging
            nrings = max(1, min(rings, len(ios), inflight))
            depth = max(1, inflight // nrings)
            slot = max(1, min(IO_BYTES, self._staging_bytes // (depth * nrings)))
            # a staged I/O must fit its slot; one in a registered Iov keeps its size
            queue: list[Segment] = []
            for s in ios:
                queue += [s] if self._iov_of(s.buf) is not None else split_segments([s], slot)
            queue.reverse()  # pop() takes the front
            qlock = threading.Lock()
            errors: list[BaseException] = []

            def take() -> Segment | None:
                with qlock:
                    return queue.pop() if queue and not errors else None

            def fail(e: BaseException) -> None:
                with qlock:
                    errors.append(e)

            def ring(r: int) -> None:
                free = [(r * depth + i) * slot for i in range(depth)]
                try:
                    ior = Ior(mount, entries=depth, for_read=not write)
                except BaseException as e:  # noqa: BLE001 - re-raised by the caller below
                    fail(e)
                    return
                pending = 0
                try:
                    while True:
                        # a staged I/O holds a slot, a direct one does not: below depth, one is free
                        while pending < depth:
                            s = take()
                            if s is None:
                                break
                            hit = self._iov_of(s.buf)
                            if hit is not None:
                                prep_io(
                                    ior,
                                    hit[0],
                                    hit[1],
                                    fd,
                                    s.offset,
                                    len(s.buf),
                                    userdata=(s, None),
                                )
                            else:
                                k = free.pop()
                                if write:
                                    memmove(staging.buf[k : k + len(s.buf)], s.buf)
                                prep_io(ior, staging, k, fd, s.offset, len(s.buf), userdata=(s, k))
                            pending += 1
                        if not pending:
                            return
                        submit_ios(ior)
                        for c in wait_for_ios(ior, max_results=depth, min_results=1):
                            pending -= 1
                            seg, k = c.userdata
                            if k is not None:
                                free.append(k)
                            if errors:
                                continue  # draining after a failure elsewhere
                            if c.result != len(seg.buf):
                                raise _io_error(rel, write, len(seg.buf), c.result)
                            if k is not None and not write:
                                memmove(seg.buf, staging.buf[k : k + len(seg.buf)])
                            if on_piece is not None:
                                on_piece(seg.offset, len(seg.buf))
                except BaseException as e:  # noqa: BLE001 - re-raised by the caller below
                    fail(e)
                    try:
                        while ior.in_flight:
                            wait_for_ios(ior, max_results=depth, min_results=1)
                    except Exception:  # noqa: BLE001 - the agent is gone: nothing left in flight
                        pass
                finally:
                    ior.close()

            reg_fd(fd)
            try:
                threads = [
                    threading.Thread(target=ring, args=(r,), name=f"fs3-ckpt-ring-{r}")
                    for r in range(1, nrings)
                ]
                for t in threads:
                    t.start()
                ring(0)
                for t in threads:
                    t.join()
            finally:
                dereg_fd(fd)
            if errors:
                raise errors[0]

    # -- metadata
    def makedirs(self, rel: str) -> None:
        os.makedirs(self._p(rel), exist_ok=True)

    def listdir(self, rel: str) -> list[str]:
        return sorted(os.listdir(self._p(rel)))

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._p(rel))

    def size(self, rel: str) -> int:
        return os.stat(self._p(rel)).st_size

    def read_bytes(self, rel: str) -> bytes:
        with open(self._p(rel), "rb") as f:
            return f.read()

    def write_atomic(self, rel: str, data: bytes) -> None:
        path = self._p(rel)
        # a unique staging name: ranks may race, and dcp sweeps ``NAME.tmp-*`` leftovers
        write_durably(path, data, tmp=f"{path}.tmp-{uuid.uuid4().hex[:8]}")

    def remove_tree(self, rel: str) -> None:
        shutil.rmtree(self._p(rel), ignore_errors=False)

    def unlink(self, rel: str) -> None:
        os.unlink(self._p(rel))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._staging is not None:
            self._staging.close()
            self._staging = None
        self._loads = None  # the process's pool outlives the store: later loads reuse its Iovs


def _shm_bytes(*, free: bool) -> int:
    """Bytes free in /dev/shm (``free``) or its whole size; USRBIO Iovs live there (0: unknown)."""
    from fs3.transport.region import SHM_DIR

    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return (st.f_bavail if free else st.f_blocks) * st.f_frsize


def _pwrite_all(fd: int, s: Segment) -> None:
    mv, off = s.buf, s.offset
    while len(mv):
        n = os.pwrite(fd, mv, off)
        mv, off = mv[n:], off + n


def _pread_all(fd: int, s: Segment, rel: str) -> None:
    mv, off, want = s.buf, s.offset, len(s.buf)
    got = 0
    while got < want:
        n = os.preadv(fd, [mv[got:]], off + got)
        if n == 0:
            raise _short(rel, want, got)
        got += n


# --------------------------------------------------------------------------- fs3 client API


class ClientStore(Store):
    """A directory of fs3 reached through a connected :class:`fs3.client.file_api.Client`."""

    kind = "client"

    def __init__(self, client: Any, root: str, *, create: bool = True) -> None:
        self.client = client
        self.root = "/" + root.strip("/")
        if create:
            client.makedirs(self.root, exist_ok=True)
        elif not client.isdir(self.root):
            raise FileNotFoundError(errno.ENOENT, "no such checkpoint directory", root)

    def _p(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}" if rel else self.root

    def _gather(self, fn: Any, ios: list[Segment], inflight: int) -> Any:
        async def run() -> None:
            sem = asyncio.Semaphore(inflight)

            async def one(s: Segment) -> None:
                async with sem:
                    await fn(s)

            await asyncio.gather(*(one(s) for s in ios))

        return run()

    def write_segments(
        self, rel: str, segs: Sequence[Segment], *, size: int, inflight: int = INFLIGHT
    ) -> None:
        core = self.client.core
        with self.client.open(self._p(rel), "wb", buffering=0) as f:
            h = f.handle

            async def one(s: Segment) -> None:
                await core.write(h, s.offset, s.buf)

            self.client._run(self._gather(one, split_segments(segs), inflight), rel)
            if size > 0 and (not segs or max(s.offset + len(s.buf) for s in segs) < size):
                f.truncate(size)
            f.fsync()

    def read_segments(
        self,
        rel: str,
        segs: Sequence[Segment],
        *,
        inflight: int = INFLIGHT,
        on_piece: OnPiece | None = None,
    ) -> None:
        core = self.client.core
        with self.client.open(self._p(rel), "rb", buffering=0) as f:
            h = f.handle

            async def one(s: Segment) -> None:
                n = await core.readinto(h, s.offset, s.buf)
                if n != len(s.buf):
                    raise _short(rel, len(s.buf), n)
                if on_piece is not None:
                    on_piece(s.offset, n)

            self.client._run(self._gather(one, split_segments(segs), inflight), rel)

    def makedirs(self, rel: str) -> None:
        self.client.makedirs(self._p(rel), exist_ok=True)

    def listdir(self, rel: str) -> list[str]:
        return sorted(self.client.listdir(self._p(rel)))

    def exists(self, rel: str) -> bool:
        return bool(self.client.exists(self._p(rel)))

    def size(self, rel: str) -> int:
        return int(self.client.getsize(self._p(rel)))

    def read_bytes(self, rel: str) -> bytes:
        with self.client.open(self._p(rel), "rb") as f:
            return bytes(f.read())

    def write_atomic(self, rel: str, data: bytes) -> None:
        path = self._p(rel)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with self.client.open(tmp, "wb") as f:
            f.write(data)
            f.fsync()
        # meta commits a rename as one transaction: durable once it returns
        self.client.rename(tmp, path)

    def unlink(self, rel: str) -> None:
        self.client.unlink(self._p(rel))

    def remove_tree(self, rel: str) -> None:
        path = self._p(rel)
        for dirpath, dirnames, filenames in list(self.client.walk(path, topdown=False)):
            for n in filenames:
                self.client.unlink(f"{dirpath.rstrip('/')}/{n}")
            for n in dirnames:
                self.client.rmdir(f"{dirpath.rstrip('/')}/{n}")
        self.client.rmdir(path)


def open_store(
    path: str | Store, *, client: Any = None, usrbio: bool | None = None, create: bool = True
) -> Store:
    """A store for ``path``: itself if already a Store, the client API if ``client``, else POSIX.

    ``create=False``: the directory must exist (FileNotFoundError otherwise).
    """
    if isinstance(path, Store):
        return path
    if client is not None:
        return ClientStore(client, path, create=create)
    return PosixStore(path, usrbio=usrbio, create=create)
