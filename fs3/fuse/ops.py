"""The pyfuse3 file system: every FUSE low-level operation mapped onto :class:`AsyncClient`.

Design decisions (the reasons are in the docstrings below):

* **Permissions are checked twice, by the same POSIX rules**: meta checks
  every operation inside its transaction (the authority: it sees fresh
  attributes, and it is what the Python API and USRBIO get too), and the mount
  uses ``default_permissions`` so the kernel checks as well, with its cached
  attributes and the caller's real credentials. The kernel check is needed
  because the kernel resolves cached path components (dentries) without
  asking the daemon: without it a user could reach a file below a directory
  it may not search once another user had looked the path up. The kernel also
  knows what pyfuse3 hides from us (UTIME_NOW vs explicit times, a caller's
  supplementary groups) and it sends the clearing of S_ISUID/S_ISGID after a
  write or truncate by a non-owner as a ``setattr(mode)`` under the writer's
  identity, which the daemon applies as root when it only clears those bits.
  Every handler passes the caller's uid, gid and supplementary groups (read
  from ``/proc/<pid>/status``, cached for a second) to meta. An operation
  succeeds only if both allow it; they differ only while another mount's
  chmod/chown is still hidden by this mount's attribute cache
  (``attr_timeout_s``).
* **One asyncio loop**: pyfuse3 runs in its asyncio mode
  (``pyfuse3.asyncio.enable()``, see fs3.fuse.main) on the loop that also runs
  the client core, so a handler awaits the client's coroutines directly
  (:meth:`Fs3Operations._call` is a plain await). It used to run on trio and
  cross to the client's loop in another thread for every request (bridge
  wake-ups both ways + GIL hand-offs, 15-20 % of the daemon's CPU).
* **No exception escapes a handler**: FsError becomes its errno, anything
  else is logged and becomes EIO (:func:`_guard`). In pyfuse3's asyncio mode
  an escaped exception silently ends that worker task and the kernel's request
  is never answered (the caller hangs), so this matters even more than on trio
  (where it ended ``pyfuse3.main`` and left the mount returning ENOTCONN).
* **Write buffering** (docs/architecture.md, data flow of a write, step 2):
  buffered writes go to the client's write-behind engine
  (:mod:`fs3.client.write_behind`, through ``AsyncClient.write(behind=True)``),
  the same one the Python API uses: sequential writes to an inode accumulate in
  one staging buffer per inode that never crosses a chunk boundary and is sent
  to storage as it is (no second copy); a full buffer (or a non-contiguous
  write, flush, fsync, release, a read or setattr of the inode, or age) is
  written in the background, at most ``write_behind_chunks`` at a time per
  mount. A write error of a background flush is reported by the next write,
  flush (close) or fsync of the handle, as the kernel does for its own page
  cache. ``flush``/``fsync``/``release`` wait for every write of the inode and
  then report the length (and the last write's mtime) to meta, so close(2) and
  fsync(2) return only after the data is committed on all serving replicas and
  the length is recorded.
* **Close-to-open consistency**: ``open`` always asks meta (fresh attributes);
  if they differ from what this mount last told the kernel, the kernel's
  cached attributes and pages for the inode are invalidated and the page
  cache is not kept; otherwise ``keep_cache`` lets re-reads hit the page cache.
* **readdir offsets** survive concurrent changes: meta pages by name, and each
  open directory handle maps the offsets it hands out to the name of the entry
  they follow, so a resumed listing continues strictly after that name. A
  listing streams: the handle holds one page and the next one (fetched while
  the kernel takes the current page) and the newest ``DIR_OFFSETS_MAX`` offsets,
  whatever the directory's size (:class:`DirHandle`).
* **Kernel caches** (``[fuse]`` ``attr_timeout_s``, ``entry_timeout_s``,
  ``dir_entry_timeout_s``, ``negative_timeout_s``; README "Mount options"):
  every reply with attributes carries them (:meth:`Fs3Operations._entry`);
  listings are READDIRPLUS (pyfuse3 always asks for it). The kernel itself
  updates or drops what it cached for a name or inode changed through this
  mount (create, unlink, rename, link, setattr, write); what changes behind
  its back on this mount (USRBIO writes, a file changed elsewhere found at
  open) is invalidated with ``pyfuse3.invalidate_inode``.
* **O_DIRECT** opens are not served in FUSE direct-I/O mode (see
  :class:`OpenFile`): mmap works, set-id bits are cleared, caches stay coherent.
* **Exec** opens carry ``__FMODE_EXEC`` in their flags; meta then checks
  execute permission instead of read (``fs3.meta.ops.files``), so a mode
  ``--x`` program runs.
* **fallocate** is bound into libfuse by :mod:`fs3.fuse.lowlevel` (pyfuse3
  has no handler for it) and served by :meth:`Fs3Operations.fallocate`.
* **O_TMPFILE** cannot be served: the kernel sends FUSE_TMPFILE (opcode 51,
  Linux >= 6.1), but libfuse 3.14 (the version this system ships, protocol
  7.31) has no handler for it and answers ENOSYS, which the kernel turns into
  EOPNOTSUPP for the mount (what applications fall back on); pyfuse3 3.5.0 has
  no tmpfile handler either, and libfuse's dispatch table for unknown opcodes
  cannot be extended from outside the library.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from fs3 import config as _config
from fs3.client.core import (
    FALLOC_FL_PUNCH_HOLE,
    FALLOC_FL_ZERO_RANGE,
    ROOT,
    AsyncClient,
    Caller,
    FileHandle,
)
from fs3.errors import Code, FsError
from fs3.fuse.lowlevel import LowLevelHooks
from fs3.proto import common_pb2, meta_pb2

log = logging.getLogger("fs3.fuse")

NAME_MAX = 255
_CALLER_TTL_S = 1.0
_SUID_BITS = stat.S_ISUID | stat.S_ISGID
_CAPABILITY = b"security.capability"
READDIR_PAGE = 1024  # entries per meta ReadDir while listing (a kernel readdir call takes ~25)
#: offsets an open directory handle can resolve at most (see DirHandle): bounds the daemon's
#: memory per listing whatever the directory's size
DIR_OFFSETS_MAX = 16384
_DIR_ATTRS_MAX = 4096  # directories whose fresh attributes FuseClient keeps at most

T = TypeVar("T")
P = ParamSpec("P")


def _ts_ns(ts: common_pb2.Timespec) -> int:
    return int(ts.sec) * 1_000_000_000 + int(ts.nsec)


def _ts(ns: int) -> common_pb2.Timespec:
    return common_pb2.Timespec(sec=ns // 1_000_000_000, nsec=ns % 1_000_000_000)


def _check_name(name: bytes) -> None:
    """The kernel does not enforce NAME_MAX for FUSE file systems; we do."""
    if len(name) > NAME_MAX:
        raise pyfuse3.FUSEError(errno.ENAMETOOLONG)


def _guard(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Turn every failure of a handler into a FUSEError (never let one escape)."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        self = args[0]
        assert isinstance(self, Fs3Operations)
        ops = self.stats.ops
        ops[name] = ops.get(name, 0) + 1
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except FsError as e:
            if e.code != Code.POSIX:
                log.warning("%s%r failed: %s", name, _short(args[1:]), e)
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except asyncio.CancelledError:
            # The kernel must get an answer even when the handler's task is cancelled
            # (shutdown): answering EINTR ends the request; the worker loop then stops.
            log.warning("%s%r: client operation cancelled (shutting down?)", name, _short(args[1:]))
            raise pyfuse3.FUSEError(errno.EINTR) from None
        except OSError as e:
            log.exception("%s%r: unexpected OSError", name, _short(args[1:]))
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception:
            log.exception("%s%r: unexpected error (answered EIO)", name, _short(args[1:]))
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


def _short(args: tuple[Any, ...]) -> tuple[Any, ...]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, bytes | bytearray | memoryview) and len(a) > 64:
            out.append(f"<{len(a)} bytes>")
        elif isinstance(a, pyfuse3.RequestContext):
            out.append(f"ctx(uid={a.uid},gid={a.gid},pid={a.pid})")
        elif isinstance(a, pyfuse3.EntryAttributes | pyfuse3.SetattrFields | pyfuse3.ReaddirToken):
            out.append(type(a).__name__)
        else:
            out.append(a)
    return tuple(out)


class FuseClient(AsyncClient):
    """AsyncClient that also reports the last write's mtime with each length report.

    Writes go to storage, so meta learns of them only through the length
    reports (Sync/Close). Sending the write time there gives overwrites (which
    do not change the length) a correct mtime, and keeps an explicit utimensat
    done between the last write and close(2) (``cp -a``, ``tar``) from being
    overwritten by the report at close.
    """

    credential_kind = "mount"  # acts for the local users the kernel names, not an admin

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: fh number -> wall-clock ns of the last write not yet reported to meta.
        self.write_mtimes: dict[int, int] = {}
        #: directory inode -> (monotonic time received, its attributes as meta returned
        #: them with a create/unlink/mkdir/... in it); see Fs3Operations.getattr.
        self.dir_attrs: dict[int, tuple[float, meta_pb2.Attr]] = {}

    def _parent_changed(self, r: Any) -> None:
        if not r.HasField("parent_attr"):
            return
        a = r.parent_attr
        if len(self.dir_attrs) >= _DIR_ATTRS_MAX:
            self.dir_attrs.clear()
        self.dir_attrs[int(a.inode)] = (time.monotonic(), a)

    def _hint(self, fh: FileHandle, req: Any) -> None:
        super()._hint(fh, req)
        m = self.write_mtimes.get(fh.fh)
        if m:
            req.mtime.CopyFrom(_ts(m))


@dataclass(eq=False)
class OpenFile:
    """Daemon-side state of one FUSE file handle.

    ``direct``: opened with O_DIRECT. Its writes skip the daemon's write buffer
    (they are on storage when write(2) returns). The kernel is *not* told to
    serve the handle in FUSE direct-I/O mode (``FOPEN_DIRECT_IO``): in that
    mode mmap fails with ENODEV, the kernel does not drop S_ISUID/S_ISGID
    before a write (it only flags the write, which pyfuse3 does not pass on),
    and its cached pages of the inode are left as they were. Without it the
    kernel still sends every O_DIRECT read and write to the daemon, uncached,
    but first writes back and afterwards invalidates the cached pages of the
    range (``generic_file_direct_write``), clears the set-id bits with a
    ``setattr`` like for any write, and maps the file through the page cache.
    """

    h: FileHandle
    ist: InodeState
    direct: bool


@dataclass(eq=False)
class InodeState:
    """What the kernel must see of this mount's unreported writes to an inode (while open).

    The written bytes themselves are in the client's write-behind engine.
    """

    inode: int
    files: set[OpenFile] = field(default_factory=set)
    pending_end: int = 0  # end of data accepted (buffered or in flight) under pending_tv
    pending_tv: int = 0
    mtime_ns: int = 0  # last write on this mount not yet reported to meta


@dataclass(eq=False)
class DirHandle:
    """An open directory: offsets handed to the kernel map to the entry names they follow.

    Each name gets one offset (``ids``), whatever was added or removed
    meanwhile and however often it is listed again, so a telldir() value stays
    valid and the maps grow only with the distinct names seen, not with every
    pass (rewinddir loops). The maps keep the newest ``DIR_OFFSETS_MAX`` names:
    a listing of any size streams in bounded memory (the kernel resumes from
    the last offset it got, which is always kept); only a seekdir(3) back to a
    position more than that many names before the newest fails (EINVAL).
    """

    inode: int
    caller: Caller
    #: the directory's attributes when last fetched (``attr_at``, monotonic); they fill
    #: "." and ".." and answer fstat(2) on the open directory after it was removed (meta
    #: deletes an empty directory at once)
    attr: meta_pb2.Attr
    attr_at: float = 0.0
    names: dict[int, bytes] = field(default_factory=dict)
    ids: dict[bytes, int] = field(default_factory=dict)
    next_id: int = 3  # 1 and 2 follow "." and ".."
    # Entries fetched from meta but not yet taken by the kernel (its buffer
    # holds ~25 entries with attributes per readdir call), valid for a resume
    # strictly after ``buffer_after``.
    buffer: list[meta_pb2.DirEntry] = field(default_factory=list)
    buffer_after: bytes | None = None
    buffer_more: bool = True
    #: the listing was delivered to its end after this name: the kernel's closing
    #: readdir call (it asks until a reply is empty) is answered without a ReadDir
    end_after: bytes | None = None
    #: the next page (the cursor it follows, its ReadDir), fetched while the kernel
    #: takes the current one: meta lists it while this daemon and the kernel work
    ahead: tuple[bytes, asyncio.Task[tuple[list[meta_pb2.DirEntry], bool]]] | None = None

    def drop_ahead(self) -> None:
        """Cancel the page fetched ahead (a seek elsewhere, closedir, unmount)."""
        if self.ahead is not None:
            task, self.ahead = self.ahead[1], None
            task.cancel()
            task.add_done_callback(_consume)

    def offset_of(self, name: bytes) -> int:
        """The offset of ``name`` in this handle (a new one the first time, or once forgotten).

        ``names`` is kept in the order names were last handed out (dicts keep
        insertion order): the one forgotten is the least recently handed out,
        never one of the last reply's, which the kernel resumes from.
        """
        nid = self.ids.get(name)
        if nid is None:
            nid = self.ids[name] = self.next_id
            self.next_id += 1
            if len(self.names) >= DIR_OFFSETS_MAX:
                old = next(iter(self.names))
                self.ids.pop(self.names.pop(old), None)
        else:
            del self.names[nid]
        self.names[nid] = name
        return nid


def _nothing() -> None:
    """Give back a buffer the garbage collector frees (see Fs3Operations._read_buffer)."""


def _consume(task: asyncio.Task[Any]) -> None:
    """Retrieve a dropped task's outcome (nobody awaits it; asyncio would log it)."""
    if not task.cancelled():
        task.exception()


@dataclass
class Stats:
    """Request size maxima (to verify max_write / max_read / readahead settings) and counters."""

    max_write: int = 0
    max_read: int = 0
    writes: int = 0
    reads: int = 0
    storage_writes: int = 0
    staged_reads: int = 0  # reads into a transport staging slot (see Fs3Operations._read_buffer)
    #: reads being served now, the most at once, and the sum over reads of how many were
    #: in flight when each began (/ reads: the parallelism the kernel's requests get)
    reads_in_flight: int = 0
    max_reads_in_flight: int = 0
    read_concurrency: int = 0
    ops: dict[str, int] = field(default_factory=dict)  # handler calls by name


class Fs3Operations(pyfuse3.Operations):
    """The fs3 FUSE file system (one per mount)."""

    supports_dot_lookup = True
    enable_acl = False

    def __init__(self, client: FuseClient, cfg: _config.FuseSection) -> None:
        super().__init__()
        self.client = client
        self.cfg = cfg
        self.enable_writeback_cache = bool(cfg.writeback_cache)
        self.attr_timeout = float(cfg.attr_timeout_s)
        self.entry_timeout = float(cfg.entry_timeout_s)
        self.dir_entry_timeout = float(cfg.dir_entry_timeout_s)
        self.files: dict[int, OpenFile] = {}
        self.inodes: dict[int, InodeState] = {}
        self.dirs: dict[int, DirHandle] = {}
        self._dir_ids = 1
        self._callers: dict[tuple[int, int, int], tuple[float, Caller]] = {}
        self._seen: dict[
            int, tuple[int, int, int]
        ] = {}  # inode -> (size, mtime, ctime) last told to the kernel
        # the client's write-behind engine serves this mount's buffered writes
        client.write_behind.depth = max(1, cfg.write_behind_chunks)
        client.write_behind.max_age_s = float(cfg.write_buffer_age_s)
        #: background writes, invalidations and the age flusher (between start() and stop());
        #: kept here because the loop holds only weak references to tasks.
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = False
        self.stats = Stats()
        #: libfuse operations pyfuse3 does not bind (fallocate), installed after pyfuse3.init
        self.lowlevel = LowLevelHooks()
        #: how long a read buffer whose read saw a failed attempt waits before reuse
        #: (see read): a whole retry deadline plus one more attempt's timeout
        ccfg = getattr(client, "config", None)
        csec = ccfg.client if ccfg is not None else _config.ClientSection()
        self._quarantine_s = float(csec.retry_deadline_s + csec.rpc_timeout_s)
        self._caps: dict[
            int, tuple[float, bytes | None]
        ] = {}  # inode -> (expiry, security.capability)

    # ================================================================== helpers

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await one client-core coroutine: the client runs on this loop (no crossing)."""
        return await coro

    # ------------------------------------------------------------------ background tasks

    def start(self) -> None:
        """Start background work (kernel cache invalidations run as tasks from now on)."""
        self._running = True

    async def stop(self) -> None:
        """Cancel and wait for every background task (after :meth:`drain`, before unmount)."""
        self._running = False
        await self.lowlevel.stop()
        for d in self.dirs.values():
            d.drop_ahead()
        while self._tasks:
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    def _caller(self, ctx: pyfuse3.RequestContext) -> Caller:
        key = (int(ctx.uid), int(ctx.gid), int(ctx.pid))
        now = time.monotonic()
        hit = self._callers.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        c = Caller.from_pid(key[0], key[1], key[2])
        if len(self._callers) > 4096:
            self._callers.clear()
        self._callers[key] = (now + _CALLER_TTL_S, c)
        return c

    def _entry(self, attr: meta_pb2.Attr, *, seen: bool = True) -> pyfuse3.EntryAttributes:
        """EntryAttributes for the kernel, raised by this mount's buffered writes.

        On every reply that carries attributes (a listing: once per entry), so
        each protobuf field is read once (every read is a call into the
        protobuf runtime) and nothing here depends on the number of open files.
        ``seen=False`` (listings) does not record what the kernel was told in
        ``_seen``: a listing of any size adds nothing to the daemon's memory,
        and the first open of a file known only from a listing invalidates the
        kernel's attributes and pages (see :meth:`_open_info`).
        """
        e = pyfuse3.EntryAttributes()
        ino = attr.inode
        mode = attr.mode
        size = attr.size
        t = attr.mtime
        mtime = t.sec * 1_000_000_000 + t.nsec
        t = attr.ctime
        ctime = t.sec * 1_000_000_000 + t.nsec
        blocks = attr.blocks
        is_reg = mode & 0o170000 == stat.S_IFREG
        if is_reg:
            ist = self.inodes.get(ino)
            if ist is not None:
                if ist.pending_end > size and ist.pending_tv == attr.truncate_version:
                    size = ist.pending_end
                if ist.mtime_ns > mtime:
                    mtime = ist.mtime_ns
                    ctime = max(ctime, mtime)
            if blocks * 512 < size:
                blocks = (size + 511) // 512
            if seen:
                self._seen[ino] = (size, mtime, ctime)
            e.entry_timeout = self.entry_timeout
        elif mode & 0o170000 == stat.S_IFDIR:
            e.entry_timeout = self.dir_entry_timeout
        else:
            e.entry_timeout = self.entry_timeout
        e.st_ino = ino
        e.generation = attr.generation
        e.st_mode = mode
        e.st_nlink = attr.nlink
        e.st_uid = attr.uid
        e.st_gid = attr.gid
        e.st_rdev = attr.rdev
        e.st_size = size
        e.st_blksize = attr.blksize or 4096
        e.st_blocks = blocks
        t = attr.atime
        e.st_atime_ns = t.sec * 1_000_000_000 + t.nsec
        e.st_mtime_ns = mtime
        e.st_ctime_ns = ctime
        e.attr_timeout = self.attr_timeout
        return e

    def _file(self, fh: int) -> OpenFile:
        of = self.files.get(fh)
        if of is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return of

    def _register(self, h: FileHandle, direct: bool) -> OpenFile:
        ist = self.inodes.get(h.inode)
        if ist is None:
            ist = self.inodes[h.inode] = InodeState(h.inode, pending_tv=h.truncate_version)
        of = OpenFile(h, ist, direct)
        ist.files.add(of)
        self.files[h.fh] = of
        return of

    # ------------------------------------------------------------------ write buffer

    def _busy(self, ist: InodeState) -> bool:
        return self.client.write_behind.busy(ist.inode)

    async def _settle(self, ist: InodeState) -> None:
        """Send the inode's buffered writes and wait until none of them is in flight."""
        await self._call(self.client.write_behind.settle(ist.inode))

    def _raise_deferred(self, of: OpenFile) -> None:
        e = of.h.error
        if e is not None:
            of.h.error = None
            raise pyfuse3.FUSEError(e.errno or errno.EIO)

    async def _report(self, of: OpenFile, *, fsync: bool) -> None:
        """Tell meta the handle's length (+ last write mtime); clears the pending mtime."""
        h = of.h
        ist = of.ist
        mt = ist.mtime_ns
        if mt and h.writable:
            self.client.write_mtimes[h.fh] = mt
        try:
            if fsync:
                await self._call(self.client.fsync(h))
            else:
                await self._call(self.client.flush(h))
        finally:
            self.client.write_mtimes.pop(h.fh, None)
        if mt and ist.mtime_ns == mt and not h.dirty:
            ist.mtime_ns = 0

    async def _sync_inode(self, ino: int, *, report: bool) -> None:
        """Before a setattr/open(O_TRUNC): no buffered data, and (report) lengths known to meta."""
        ist = self.inodes.get(ino)
        if ist is None:
            return
        await self._settle(ist)
        if report:
            for of in list(ist.files):
                if of.h.writable and (of.h.dirty or ist.mtime_ns):
                    await self._report(of, fsync=False)

    async def drain(self) -> None:
        """Write every buffer and report every length (before unmount)."""
        for ist in list(self.inodes.values()):
            try:
                await self._sync_inode(ist.inode, report=True)
            except Exception as e:  # noqa: BLE001 - shutting down: log and continue with the rest
                log.warning("drain of inode %d failed: %s", ist.inode, e)

    # ================================================================== namespace

    @_guard
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        _check_name(name)
        try:
            attr = await self._call(self.client.lookup(self._caller(ctx), parent_inode, name))
        except FsError as e:
            if e.errno == errno.ENOENT and self.cfg.negative_timeout_s > 0:
                neg = pyfuse3.EntryAttributes()
                neg.st_ino = 0
                neg.entry_timeout = float(self.cfg.negative_timeout_s)
                return neg
            raise
        return self._entry(attr)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        """Nothing to drop: the daemon keeps no per-inode state beyond open handles."""
        for ino, _n in inode_list:
            if ino not in self.inodes:
                self._seen.pop(ino, None)

    @_guard
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        """Attributes from meta, or the ones the last entry change in the directory returned.

        The kernel forgets a directory's attributes after every create, unlink,
        mkdir ... in it and asks again at the next path walk (its permission
        check), one GetAttr RPC per created or removed file. Meta already
        returned those attributes with the op (``parent_attr``), so the first
        GetAttr after it is answered from them, once, if they are younger than
        ``attr_timeout_s``, and the kernel may keep them only for the rest of
        that time: this mount never shows attributes older than the kernel's
        own cache would, and every other handler that changes a directory
        through this mount drops its entry (:meth:`_drop_dir_attrs`); the
        kernel holds the directory's lock across such ops, so a reply cannot
        overtake a later chmod/rename of the same directory.
        """
        fresh = self.client.dir_attrs.pop(inode, None)
        if fresh is not None:
            left = fresh[0] + self.attr_timeout - time.monotonic()
            if left > 0:
                e = self._entry(fresh[1])
                e.attr_timeout = min(self.attr_timeout, left)
                return e
        try:
            attr = await self._call(self.client.getattr(self._caller(ctx), inode))
        except FsError as e:
            if e.errno != errno.ENOENT:
                raise
            # fstat(2) of a directory that is still open here but was removed
            # (rmdir, or replaced by rename): it stays stat-able until closed,
            # with no links, as on a local file system. (A removed regular file
            # is kept by meta while open: its sessions hold it.)
            gone = next((dh.attr for dh in self.dirs.values() if dh.inode == inode), None)
            if gone is None:
                raise
            attr = meta_pb2.Attr()
            attr.CopyFrom(gone)
            attr.nlink = 0
        return self._entry(attr)

    def _drop_dir_attrs(self, *inodes: int) -> None:
        """Forget kept directory attributes that an op through this mount makes stale."""
        for ino in inodes:
            self.client.dir_attrs.pop(int(ino), None)

    @_guard
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        self._drop_dir_attrs(inode)
        caller = self._caller(ctx)
        handle = self.files[fh].h if fh is not None and fh in self.files else None
        await self._sync_inode(inode, report=True)
        kw: dict[str, Any] = {}
        cur: meta_pb2.Attr | None = None
        if caller.uid != 0 and (fields.update_atime or fields.update_mtime or fields.update_mode):
            cur = await self._call(self.client.getattr(caller, inode))
        # pyfuse3 hides the kernel's UTIME_NOW flags (it fills in its clock).
        # The kernel (default_permissions) already refused explicit times to a
        # non-owner, so a non-owner's time update is a UTIME_NOW: send it as
        # such, which meta allows with write permission. Owners and root send
        # the exact times.
        now_flags = cur is not None and caller.uid != cur.uid
        if fields.update_size:
            kw["size"] = int(attr.st_size)
            kw["fh"] = handle if handle is not None and handle.writable else None
        if fields.update_uid:
            kw["uid"] = int(attr.st_uid)
        if fields.update_gid:
            kw["gid"] = int(attr.st_gid)
        if fields.update_atime:
            if now_flags:
                kw["atime_now"] = True
            else:
                kw["atime_ns"] = int(attr.st_atime_ns)
        if fields.update_mtime:
            if now_flags:
                kw["mtime_now"] = True
            else:
                kw["mtime_ns"] = int(attr.st_mtime_ns)
            ist = self.inodes.get(inode)
            if ist is not None:
                ist.mtime_ns = 0
        mode: int | None = int(attr.st_mode) & 0o7777 if fields.update_mode else None
        result: meta_pb2.Attr | None = None
        if mode is not None and cur is not None:
            old = int(cur.mode) & 0o7777
            if (
                caller.uid != cur.uid
                and mode != old
                and (old & ~mode) & ~_SUID_BITS == 0
                and (mode & ~old) == 0
            ):
                # The kernel clearing S_ISUID/S_ISGID after a write/truncate by a
                # non-owner: apply the rest as the caller (checks), the clearing as root.
                if kw:
                    result = await self._call(self.client.setattr(caller, inode, **kw))
                    kw = {}
                result = await self._call(self.client.setattr(ROOT, inode, mode=mode))
                mode = None
        if mode is not None:
            kw["mode"] = mode
        if kw or result is None:
            result = await self._call(self.client.setattr(caller, inode, **kw))
        if fields.update_size:
            ist = self.inodes.get(inode)
            if ist is not None:
                ist.pending_end = 0
                ist.pending_tv = int(result.truncate_version)
        return self._entry(result)

    @_guard
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return await self._call(self.client.readlink(self._caller(ctx), inode))

    @_guard
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        _check_name(name)
        return self._entry(
            await self._call(self.client.mknod(self._caller(ctx), parent_inode, name, mode, rdev))
        )

    @_guard
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        _check_name(name)
        return self._entry(
            await self._call(self.client.mkdir(self._caller(ctx), parent_inode, name, mode))
        )

    @_guard
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        _check_name(name)
        await self._call(self.client.unlink(self._caller(ctx), parent_inode, name))

    @_guard
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        _check_name(name)
        r = await self._call(self.client.rmdir(self._caller(ctx), parent_inode, name))
        self._drop_dir_attrs(r.inode)

    @_guard
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        _check_name(name)
        return self._entry(
            await self._call(self.client.symlink(self._caller(ctx), parent_inode, name, target))
        )

    @_guard
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        _check_name(name_old)
        _check_name(name_new)
        self._drop_dir_attrs(parent_inode_old, parent_inode_new)
        r = await self._call(
            self.client.rename(
                self._caller(ctx), parent_inode_old, name_old, parent_inode_new, name_new, flags
            )
        )
        self._drop_dir_attrs(parent_inode_old, parent_inode_new, r.inode, r.replaced_inode)

    @_guard
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        _check_name(new_name)
        return self._entry(
            await self._call(self.client.link(self._caller(ctx), inode, new_parent_inode, new_name))
        )

    @_guard
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        r = await self._call(self.client.statfs(self._caller(ctx)))
        bs = int(r.block_size) or 4096
        s = pyfuse3.StatvfsData()
        s.f_bsize = bs
        s.f_frsize = bs
        s.f_blocks = int(r.total_bytes) // bs
        s.f_bfree = int(r.free_bytes) // bs
        s.f_bavail = int(r.avail_bytes) // bs
        s.f_files = int(r.total_files)
        s.f_ffree = int(r.free_files)
        s.f_favail = int(r.free_files)
        s.f_namemax = int(r.name_max) or NAME_MAX
        return s

    @_guard
    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        try:
            await self._call(
                self.client.access(self._caller(ctx), inode, mode & (os.R_OK | os.W_OK | os.X_OK))
            )
        except FsError as e:
            if e.errno == errno.EACCES:
                return False
            raise
        return True

    # ------------------------------------------------------------------ xattrs

    @_guard
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if name == _CAPABILITY:
            # The kernel asks for security.capability before every write (to
            # drop file capabilities); answer from a cache that lives as long
            # as cached attributes do, instead of one meta round trip per write.
            hit = self._caps.get(inode)
            now = time.monotonic()
            if hit is not None and hit[0] > now:
                if hit[1] is None:
                    raise pyfuse3.FUSEError(errno.ENODATA)
                return hit[1]
            try:
                value: bytes | None = await self._call(
                    self.client.getxattr(self._caller(ctx), inode, name)
                )
            except FsError as e:
                if e.errno != errno.ENODATA:
                    raise
                value = None
            if len(self._caps) > 65536:
                self._caps.clear()
            self._caps[inode] = (now + self.attr_timeout, value)
            if value is None:
                raise pyfuse3.FUSEError(errno.ENODATA)
            return value
        return await self._call(self.client.getxattr(self._caller(ctx), inode, name))

    @_guard
    async def setxattr(
        self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext
    ) -> None:
        self._caps.pop(inode, None)
        self._drop_dir_attrs(inode)
        await self._call(self.client.setxattr(self._caller(ctx), inode, name, value))

    @_guard
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return await self._call(self.client.listxattr(self._caller(ctx), inode))

    @_guard
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._caps.pop(inode, None)
        self._drop_dir_attrs(inode)
        await self._call(self.client.removexattr(self._caller(ctx), inode, name))

    # ================================================================== directories

    @_guard
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        """One GetAttr; the read permission is the kernel's check (``default_permissions``).

        The kernel checks it before it sends OPENDIR and only sends OPENDIR for
        a directory; meta checks it again with every ReadDir, so no Access
        round trip is needed here.
        """
        caller = self._caller(ctx)
        attr = await self._call(self.client.getattr(caller, inode))
        if not stat.S_ISDIR(attr.mode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        dh = self._dir_ids
        self._dir_ids += 1
        self.dirs[dh] = DirHandle(inode, caller, attr, time.monotonic())
        return dh

    @staticmethod
    def _dot_entry(ino: int) -> pyfuse3.EntryAttributes:
        """What "." and ".." need in a READDIRPLUS reply: an inode number and a type.

        The kernel does not instantiate "." and ".." from a READDIRPLUS reply
        (fuse_direntplus_link skips them), it only copies d_ino and d_type
        into the dirent, so these cost no GetAttr of the directory's parent.
        """
        e = pyfuse3.EntryAttributes()
        e.st_ino = ino
        e.st_mode = stat.S_IFDIR | 0o755
        e.attr_timeout = 0
        e.entry_timeout = 0
        return e

    async def _dir_page(self, d: DirHandle, cursor: bytes) -> tuple[list[meta_pb2.DirEntry], bool]:
        return await self._call(
            self.client.readdir(d.caller, d.inode, cursor, READDIR_PAGE, with_attrs=True)
        )

    @_guard
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        d = self.dirs.get(fh)
        if d is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if start_id == 0:
            # a listing from the start (opendir, rewinddir): the opendir's attributes
            # while younger than the attribute timeout, else fetched again
            d.end_after = None
            if time.monotonic() - d.attr_at > self.attr_timeout:
                d.attr = await self._call(self.client.getattr(d.caller, d.inode))
                d.attr_at = time.monotonic()
            if not pyfuse3.readdir_reply(token, b".", self._dot_entry(d.inode), 1):
                return
            start_id = 1
        if start_id == 1:
            parent = int(d.attr.parent) or d.inode
            if not pyfuse3.readdir_reply(token, b"..", self._dot_entry(parent), 2):
                return
            start_id = 2
        if start_id == 2:
            cursor = b""
        else:
            name = d.names.get(start_id)
            if name is None:  # an offset this handle never returned, or no longer keeps
                raise pyfuse3.FUSEError(errno.EINVAL)
            cursor = name
        if cursor == d.end_after and not d.buffer:
            return
        while True:
            if d.buffer and d.buffer_after == cursor:
                entries, more = d.buffer, d.buffer_more
            elif d.ahead is not None and d.ahead[0] == cursor:
                task, d.ahead = d.ahead[1], None
                entries, more = await task
            else:
                d.drop_ahead()
                entries, more = await self._dir_page(d, cursor)
            d.buffer, d.buffer_after = [], None
            if more and entries and d.ahead is None:
                after = entries[-1].name
                d.ahead = (after, asyncio.get_running_loop().create_task(self._dir_page(d, after)))
            reply, entry = pyfuse3.readdir_reply, self._entry
            for i, e in enumerate(entries):
                name = e.name
                if not e.HasField("attr"):
                    cursor = name
                    continue  # removed between listing and loading; skip it
                if not reply(token, name, entry(e.attr, seen=False), d.offset_of(name)):
                    d.buffer, d.buffer_after, d.buffer_more = list(entries[i:]), cursor, more
                    return
                cursor = name
            if not more or not entries:
                d.end_after = cursor
                return

    @_guard
    async def releasedir(self, fh: int) -> None:
        d = self.dirs.pop(fh, None)
        if d is not None:
            d.drop_ahead()

    @_guard
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        """Namespace changes are committed KV transactions before they return: nothing to do."""
        if fh not in self.dirs:
            raise pyfuse3.FUSEError(errno.EBADF)

    # ================================================================== files

    async def _open_info(self, of: OpenFile, attr: meta_pb2.Attr) -> pyfuse3.FileInfo:
        """keep_cache only if the file is unchanged since the kernel last heard of it."""
        ino = of.h.inode
        fp = (int(attr.size), _ts_ns(attr.mtime), _ts_ns(attr.ctime))
        seen = self._seen.get(ino)
        keep = seen is not None and seen[0] == fp[0] and seen[1] == fp[1] and not self._busy(of.ist)
        if not keep:
            # before replying: the opener must see the new size. Unknown (the kernel
            # had the attributes from a listing): invalidated too, they may be older.
            await self._invalidate(ino)
        self._seen[ino] = fp
        return pyfuse3.FileInfo(fh=of.h.fh, direct_io=False, keep_cache=keep and not of.direct)

    def _invalidate_soon(self, ino: int) -> None:
        """Drop the kernel's cached attributes and pages of ``ino``, from a worker thread.

        Never from the loop's thread: the kernel may wait for a page lock held by a
        read request that only this daemon (its loop) can answer.
        """
        if self._running:
            self._spawn(self._invalidate(ino))

    async def _invalidate(self, ino: int) -> None:
        try:
            await asyncio.to_thread(pyfuse3.invalidate_inode, ino, False)
        except OSError:
            pass  # the kernel does not know the inode (any more): nothing cached

    @_guard
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        caller = self._caller(ctx)
        if flags & os.O_TRUNC:
            await self._sync_inode(inode, report=True)
        h = await self._call(self.client.open(caller, inode, flags))
        of = self._register(h, bool(flags & os.O_DIRECT))
        if flags & os.O_TRUNC:
            of.ist.pending_end = 0
            of.ist.pending_tv = h.truncate_version
        attr = h.attr
        return await self._open_info(of, attr)

    @_guard
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        _check_name(name)
        h, attr = await self._call(
            self.client.create(self._caller(ctx), parent_inode, name, mode, flags)
        )
        self._register(h, bool(flags & os.O_DIRECT))
        entry = self._entry(attr)
        return pyfuse3.FileInfo(fh=h.fh, direct_io=False, keep_cache=False), entry

    @_guard
    async def read(self, fh: int, off: int, size: int) -> bytes:
        of = self._file(fh)
        st = self.stats
        st.reads += 1
        if size > st.max_read:
            st.max_read = size
            log.info("largest read request so far: %d bytes", size)
        if self._busy(of.ist):
            await self._settle(of.ist)
        buf, free = self._read_buffer(size)
        st.reads_in_flight += 1
        st.read_concurrency += st.reads_in_flight
        if st.reads_in_flight > st.max_reads_in_flight:
            st.max_reads_in_flight = st.reads_in_flight
        sstats = self.client.storage.stats
        retries = sstats["read_retries"]
        loop = asyncio.get_running_loop()
        try:
            n = await self._call(self.client.readinto(of.h, off, buf))
        except BaseException:
            loop.call_later(self._quarantine_s, free)
            raise
        finally:
            st.reads_in_flight -= 1
        if sstats["read_retries"] != retries:
            # An attempt of this read (or of one beside it) failed: a node that timed out
            # may still write into the buffer (one-sided); it is reused only once that
            # attempt's work is long abandoned, never under another read's bytes.
            loop.call_later(self._quarantine_s, free)
        else:
            # pyfuse3 writes the reply from this view in the step this handler returns in
            # (fuse_read_async: fuse_reply_buf right after the await): the buffer is
            # given back after that step, never while the kernel may still be sent it
            loop.call_soon(free)
        return buf[:n]  # type: ignore[return-value]

    def _read_buffer(self, size: int) -> tuple[memoryview, Callable[[], None]]:
        """The buffer a FUSE read lands in, and what gives it back.

        A staging slot of the transport where it has one (:meth:`ClientTransport.staging_buffer`,
        shared memory the same-host storage nodes map): the node writes the bytes straight
        into it (one-sided) instead of sending them through the RPC socket, and no buffer
        of the request's size is allocated and zeroed per read. Elsewhere (no shm, or the
        arenas full) a plain bytearray, received into from the RPC frame.
        """
        got = self.client.transport.staging_buffer(size)
        if got is not None:
            self.stats.staged_reads += 1
            return got
        return memoryview(bytearray(size)), _nothing

    @_guard
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        of = self._file(fh)
        self._raise_deferred(of)
        n = len(buf)
        st = self.stats
        st.writes += 1
        if n > st.max_write:
            st.max_write = n
            log.info("largest write request so far: %d bytes", n)
        if n == 0:
            return 0
        if not of.h.writable:
            raise pyfuse3.FUSEError(errno.EBADF)
        ist = of.ist
        ist.mtime_ns = time.time_ns()
        if of.direct or not self.cfg.write_buffer:
            await self._settle(ist)
            self.stats.storage_writes += 1
            await self._call(self.client.write(of.h, off, buf))
            return n
        if off + n > of.h.chunk_size * (1 << 32):
            raise pyfuse3.FUSEError(errno.EFBIG)
        tv = of.h.truncate_version
        if ist.pending_tv != tv:
            ist.pending_tv = tv
            ist.pending_end = 0
        await self._call(self.client.write(of.h, off, buf, behind=True))
        if off + n > ist.pending_end:
            ist.pending_end = off + n
        return n

    @_guard
    async def fallocate(self, inode: int, fh: int, mode: int, off: int, length: int) -> None:
        """fallocate(2) (bound by fs3.fuse.lowlevel: pyfuse3 has no handler for it).

        The kernel has already written back and, for PUNCH_HOLE/ZERO_RANGE,
        dropped its cached pages of the range, and refuses modes other than
        KEEP_SIZE/PUNCH_HOLE/ZERO_RANGE itself (EOPNOTSUPP); this mount's
        buffered writes are written first so none lands on the range after it.
        """
        of = self._file(fh)
        self._raise_deferred(of)
        await self._sync_inode(inode, report=True)
        attr = await self._call(self.client.fallocate(of.h, mode, off, length))
        ist = of.ist
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            ist.mtime_ns = time.time_ns()
        if attr is not None:
            ist.pending_end = 0
            ist.pending_tv = int(attr.truncate_version)
            self._entry(attr)  # what the kernel will see at its next getattr

    @_guard
    async def flush(self, fh: int) -> None:
        of = self._file(fh)
        await self._settle(of.ist)
        self._raise_deferred(of)
        h = of.h
        # close(2) waits for this: skip the trip to the client loop when the core has
        # nothing to do for the handle (no write in flight, none unreported, no error).
        if h.writable and (h.dirty or self._busy(of.ist) or h.error is not None):
            await self._report(of, fsync=False)

    @_guard
    async def fsync(self, fh: int, datasync: bool) -> None:
        of = self._file(fh)
        ist = of.ist
        await self._settle(ist)
        self._raise_deferred(of)
        for other in list(ist.files):
            if other is not of and other.h.writable and other.h.dirty:
                await self._report(other, fsync=True)
        await self._report(of, fsync=True)

    @_guard
    async def release(self, fh: int) -> None:
        of = self.files.get(fh)
        if of is None:
            return
        ist = of.ist
        try:
            try:
                await self._settle(ist)
            finally:
                if of.h.writable and ist.mtime_ns:
                    self.client.write_mtimes[of.h.fh] = ist.mtime_ns
                try:
                    await self._call(self.client.release(of.h))
                finally:
                    self.client.write_mtimes.pop(of.h.fh, None)
        finally:
            self.files.pop(fh, None)
            ist.files.discard(of)
            if not ist.files:
                self.inodes.pop(ist.inode, None)


class UsrbioBackend:
    """The USRBIO agent's I/O backend for this mount (docs/architecture.md#usrbio).

    Ring I/Os address inodes; like 3FS, an inode must be open in this daemon
    (``reg_fd`` keeps the application's fd, hence its FUSE handle, open) in the
    ring's direction, and the application's credentials must allow it (meta's
    access check, once per ring and inode). Data goes straight between the Iov
    mapping and the client core (``readinto``/``write`` with memoryviews);
    buffered FUSE writes of the inode are written first so both paths agree,
    and the kernel's page cache of the inode is dropped after USRBIO writes.
    """

    def __init__(self, ops: Fs3Operations) -> None:
        self.ops = ops

    def _open_file(self, inode: int, write: bool) -> OpenFile:
        ist = self.ops.inodes.get(inode)
        if ist is not None:
            for of in ist.files:
                if (of.h.writable if write else of.h.readable) and not of.h.closed:
                    return of
        raise FsError(
            Code.BAD_FD,
            f"inode {inode} is not open for {'writing' if write else 'reading'} on this mount",
            errno=errno.EBADF,
        )

    async def authorize(self, inode: int, *, uid: int, gid: int, pid: int, write: bool) -> None:
        self._open_file(inode, write)
        caller = Caller.from_pid(uid, gid, pid)
        await self.ops._call(self.ops.client.access(caller, inode, os.W_OK if write else os.R_OK))

    async def read(self, inode: int, file_offset: int, dest: memoryview) -> int:
        of = self._open_file(inode, False)
        if self.ops._busy(of.ist):
            await self.ops._settle(of.ist)
        return await self.ops._call(self.ops.client.readinto(of.h, file_offset, dest))

    async def read_batch(
        self,
        ios: list[tuple[int, int, memoryview]],
        on_done: Callable[[list[tuple[int, int | BaseException]]], None] | None = None,
    ) -> list[int | BaseException]:
        """Every read of one ring batch started together (see fs3.usrbio.agent).

        The reads go out together on the client's loop (the agent's own loop:
        no crossing; ``readinto_many``: no task per read), so its read batcher
        sends them to each storage node as one request. Each result is the byte
        count or that read's own exception; ``on_done`` hears of reads as they
        finish (the agent completes them at once).
        """
        out: list[int | BaseException | None] = [None] * len(ios)
        todo: list[tuple[int, OpenFile, int, memoryview]] = []
        for i, (inode, off, dest) in enumerate(ios):
            try:
                of = self._open_file(inode, False)
            except FsError as e:
                out[i] = e
                continue
            if self.ops._busy(of.ist):
                await self.ops._settle(of.ist)
            todo.append((i, of, off, dest))
        if todo:

            def done(got: list[tuple[int, int | BaseException]]) -> None:
                assert on_done is not None
                on_done([(todo[k][0], r) for k, r in got])

            got = await self.ops.client.readinto_many(
                [(of.h, off, dest) for _, of, off, dest in todo],
                None if on_done is None else done,
            )
            for (i, _, _, _), r in zip(todo, got, strict=True):
                out[i] = r
        return [r if r is not None else FsError(Code.INTERNAL, "read not run") for r in out]

    async def write(self, inode: int, file_offset: int, src: memoryview) -> int:
        of = self._open_file(inode, True)
        ist = of.ist
        if self.ops._busy(ist):
            await self.ops._settle(ist)
        ist.mtime_ns = time.time_ns()
        n = await self.ops._call(self.ops.client.write(of.h, file_offset, src))
        if ist.pending_tv == of.h.truncate_version:
            ist.pending_end = max(ist.pending_end, file_offset + n)
        self.ops._invalidate_soon(inode)
        return n

    async def attach_region(self, region: Any) -> None:
        await self.ops._call(self.ops.client.transport.register_region(region))

    async def detach_region(self, region: Any) -> None:
        await self.ops._call(self.ops.client.transport.unregister_region(region))
