"""AsyncClient: the runtime-independent asyncio core of every fs3 client.

One object per client process holds everything a client needs (3FS's FUSE
daemon does the same; docs/architecture.md#client-mount-and-usrbio): the mgmtd
client and routing watcher, the meta client (failover between meta servers),
the storage client (chunk I/O over a bulk transport) and the open file handles
with their unreported lengths.

Its API mirrors the FUSE low-level operations and works on **inode numbers**
and **bytes names**, taking the caller's identity (:class:`Caller`) on every
namespace operation, so

* the FUSE daemon (:mod:`fs3.fuse.ops`) runs pyfuse3 in asyncio mode on the
  client's own loop and awaits one core call per handler;
* the sync Python API (:mod:`fs3.client.file_api`) resolves paths with
  :meth:`AsyncClient.resolve` and calls the same operations through
  ``bridge.run(...)``;
* the USRBIO agent calls :meth:`readinto`/:meth:`write` with views into its Iov
  mapping.

All coroutines must run on the event loop the client was created on (the
bridge's loop, or the FUSE daemon's). Errors are :class:`~fs3.errors.FsError`;
``err.errno`` is what a POSIX caller should see (``err.to_oserror()``).

Semantics (docs/architecture.md):

* **Writes**: :meth:`write` returns after every piece is committed by its chain
  (the head acks after the tail committed), unless ``behind=True``: then the
  client's one write-behind engine (:mod:`fs3.client.write_behind`, used by the
  FUSE mount and the Python API alike) buffers and sends it in the background;
  flush/fsync/release wait and raise a deferred failure. The
  file length lives in meta; a handle remembers the highest end offset it wrote
  and reports it as a length hint on :meth:`flush`/:meth:`fsync`/:meth:`release`
  and every ``length_report_interval_s`` for long writers. Hints never shrink a
  file and are ignored by meta after a truncate (``truncate_version``).
* **Reads** return bytes up to the file length (meta's length, raised by this
  client's own unreported writes; re-read from meta when a read reaches the
  cached EOF). Holes read as zeros; reads past EOF are short.
* **Truncate** (:meth:`setattr` with ``size``, or ``O_TRUNC``): meta records
  the length and bumps ``truncate_version``; when the file shrank the client
  removes chunks past the new end and cuts the boundary chunk on every replica
  before returning, so a later extension reads zeros.
* **Durability**: :meth:`fsync` and :meth:`release` return after the data is
  committed (background writes included, see writes) and the length is
  recorded in meta.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno as _errno
import itertools
import logging
import os
import socket
import stat as _stat
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fs3 import config as _config
from fs3.client.layout import Layout
from fs3.client.meta_client import MetaClient, new_request_id
from fs3.client.retry import RetryPolicy
from fs3.client.storage_client import StorageClient
from fs3.client.write_behind import WriteBehind
from fs3.errors import Code, FsError, posix
from fs3.proto import common_pb2, meta_pb2
from fs3.routing import Routing, RoutingWatcher
from fs3.rpc import auth as _auth
from fs3.rpc.channel import ChannelPool
from fs3.security.capability import CapabilityCache
from fs3.security.tokens import peek
from fs3.transport.base import ClientTransport

log = logging.getLogger("fs3.client")

ROOT_INODE = 1
MAX_SYMLINK_FOLLOW = 40
NAME_MAX = 255
LOOKUP_PATH_MAX = 64  # names per LookupPath RPC (meta's limit)
CLOSE_SESSIONS_MAX = 1024  # sessions per CloseSessions RPC (meta's limit)
QUIET_CLOSE_DELAY_S = 0.02  # how long a quietly closed session waits for a request to ride on
DIR_CACHE_MAX = 65536  # (parent, name) keys of directories remembered for path resolution

# SetAttr valid bits (meta.proto SetAttrField), re-exported for callers.
SETATTR_MODE = meta_pb2.SETATTR_MODE
SETATTR_UID = meta_pb2.SETATTR_UID
SETATTR_GID = meta_pb2.SETATTR_GID
SETATTR_SIZE = meta_pb2.SETATTR_SIZE
SETATTR_ATIME = meta_pb2.SETATTR_ATIME
SETATTR_MTIME = meta_pb2.SETATTR_MTIME
SETATTR_ATIME_NOW = meta_pb2.SETATTR_ATIME_NOW
SETATTR_MTIME_NOW = meta_pb2.SETATTR_MTIME_NOW

Attr = meta_pb2.Attr
DirEntry = meta_pb2.DirEntry
StatFs = meta_pb2.StatFsResponse


# How long connect() stays silent before saying which mgmtd it waits for: long
# enough that a healthy cluster (answering in milliseconds) prints nothing.
CONNECT_NOTICE_S = 0.5


async def _first_contact(
    watcher: RoutingWatcher,
    mgmtd: Any,
    cluster_file: str,
    timeout_s: float,
    on_wait: Callable[[str], None] | None,
) -> None:
    """Fetch the first routing within ``timeout_s``; say early what is being waited for."""
    addrs = ", ".join(mgmtd.addresses)
    where = f"cluster {mgmtd.cluster_id} ({cluster_file})"

    def notice() -> None:
        msg = f"waiting up to {timeout_s:g} s for an mgmtd leader of {where} at {addrs}"
        if on_wait is not None:
            on_wait(msg)
        else:
            log.warning("fs3: %s", msg)

    timer = asyncio.get_running_loop().call_later(CONNECT_NOTICE_S, notice)
    try:
        async with asyncio.timeout(timeout_s):
            await watcher.refresh()
    except TimeoutError:
        raise FsError(
            Code.TIMEOUT,
            f"no mgmtd leader of {where} answered within {timeout_s:g} s (tried {addrs}); "
            "is mgmtd running? (wait longer with [client] connect_timeout_s "
            "or FS3_CLIENT_CONNECT_TIMEOUT_S)",
        ) from None
    finally:
        timer.cancel()


@dataclass(frozen=True)
class Caller:
    """Who is asking: the identity meta checks permissions against.

    FUSE: ``Caller.from_pid(ctx.uid, ctx.gid, ctx.pid)`` (reads supplementary
    groups from /proc). Python API: :meth:`current` (this process) or explicit.
    """

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    pid: int = 0

    def to_proto(self) -> common_pb2.UserInfo:
        return common_pb2.UserInfo(uid=self.uid, gid=self.gid, groups=list(self.groups))

    @classmethod
    def current(cls) -> Caller:
        """The calling process's uid, gid and supplementary groups."""
        return cls(os.getuid(), os.getgid(), tuple(os.getgroups()), os.getpid())

    @classmethod
    def from_pid(cls, uid: int, gid: int, pid: int) -> Caller:
        """A FUSE request's caller, with the supplementary groups of ``pid`` (if readable)."""
        groups: tuple[int, ...] = ()
        if pid > 0:
            try:
                with open(f"/proc/{pid}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"Groups:"):
                            groups = tuple(int(g) for g in line.split()[1:])
                            break
            except OSError:
                pass
        return cls(uid, gid, groups, pid)


ROOT = Caller(0, 0)


@dataclass(eq=False)
class FileHandle:
    """An open file (one per FUSE ``fh`` / Python file object).

    Attributes:
        fh: unique handle number (FUSE's ``fh``).
        inode: the file's inode.
        flags: the open flags (``os.O_*``).
        session_id: meta's write session ("" for read-only opens).
        attr: attributes at open (layout included).
        chains, chunk_size: the file's layout (where the chunks are).
        truncate_version: the inode's truncate version this handle writes under.
        written_end: highest end offset written under ``truncate_version``.
        dirty: written since the last length report.
    """

    fh: int
    inode: int
    flags: int
    session_id: str
    attr: meta_pb2.Attr
    chains: tuple[int, ...]
    chunk_size: int
    caller: Caller
    truncate_version: int = 0
    written_end: int = 0
    dirty: bool = False
    last_report: float = field(default_factory=time.monotonic)
    known_length: int = 0
    closed: bool = False
    error: FsError | None = (
        None  # a write-behind failure, raised by the next write/flush/fsync/close
    )
    write_mtime_ns: int = 0  # wall clock of the last write not yet reported to meta
    readahead: bool = False  # prefetch ahead of sequential reads (see AsyncClient.readinto)
    ra: list[_Prefetch] = field(default_factory=list)
    ra_next: int = -1
    ra_seq: int = 0

    @property
    def writable(self) -> bool:
        return (self.flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)

    @property
    def readable(self) -> bool:
        return (self.flags & os.O_ACCMODE) in (os.O_RDONLY, os.O_RDWR)


@dataclass
class _CachedDir:
    """A directory met while resolving a path, and until when it may be used unasked."""

    expires: float
    attr: meta_pb2.Attr


@dataclass(eq=False)
class _Prefetch:
    """A read-ahead window: [start, start + len(result)) once the task is done."""

    start: int
    end: int
    task: asyncio.Task[bytes]


# fallocate(2) mode bits (linux/falloc.h).
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10


def _ts(ns: int) -> common_pb2.Timespec:
    return common_pb2.Timespec(sec=ns // 1_000_000_000, nsec=ns % 1_000_000_000)


def _name(name: str | bytes) -> bytes:
    return os.fsencode(name) if isinstance(name, str) else bytes(name)


def layout_of(attr: meta_pb2.Attr) -> Layout:
    """The :class:`~fs3.client.layout.Layout` of a file's attributes."""
    lay = attr.layout
    return Layout(
        chunk_size=int(lay.chunk_size) or (1 << 20),
        stripe=int(lay.stripe) or max(1, len(lay.chain_ids)),
        chain_ids=tuple(int(c) for c in lay.chain_ids),
        table_id=int(lay.table_id),
        table_version=int(lay.table_version),
    )


# Who asks for a chunk capability when no open handle of the inode can (a path
# truncate): set around that storage work, read by AsyncClient._fetch_capability.
_CAP_CALLER: contextvars.ContextVar[tuple[Caller, str] | None] = contextvars.ContextVar(
    "fs3_cap_caller", default=None
)


class AsyncClient:
    """The fs3 client core (asyncio). Create with :meth:`connect`; close with :meth:`close`."""

    # what a client minting its own token from a readable cluster secret presents
    # (fs3.security.tokens kinds; the FUSE daemon's is "mount")
    credential_kind = "service"

    def __init__(
        self,
        *,
        config: _config.ClientConfig,
        mgmtd: Any,
        watcher: RoutingWatcher,
        transport: ClientTransport,
        client_id: str,
        meta_addresses: Sequence[str] = (),
        credential: Any = None,
    ) -> None:
        self.config = config
        self.credential = credential  # fs3.rpc.auth.Credential (None: the process's)
        # who the client's own bookkeeping calls (lengths of open files) run as: root,
        # unless a user token says who this client is (it may act for nobody else)
        self.internal_caller = ROOT
        claims = peek(credential.token) if credential is not None else None
        if claims is not None and claims.kind == "user":
            self.internal_caller = Caller(claims.uid, claims.gid, tuple(claims.groups))
        self.client_id = client_id
        self.mgmtd = mgmtd
        self.routing_watcher = watcher
        self.transport = transport
        c = config.client
        self.policy = RetryPolicy(deadline_s=c.retry_deadline_s, rpc_timeout_s=c.rpc_timeout_s)
        self._pool = ChannelPool(config.rpc.transport, credential)
        self.meta = MetaClient(
            lambda: self.routing_watcher.current,
            self.refresh_routing,
            self._pool,
            self.policy,
            static_addresses=meta_addresses,
        )
        self.storage = StorageClient(
            lambda: self.routing_watcher.current,
            self.refresh_routing,
            self._pool,
            transport,
            client_id,
            self.policy,
            io_depth=c.io_depth,
        )
        # Chunk capabilities from meta (Open/Create answers, then GetCapability), renewed
        # before they expire, so storage I/O of every path (Python API, FUSE, USRBIO) has one.
        self.capabilities = CapabilityCache(self._fetch_capability)
        self.storage.caps = self.capabilities
        #: the one write-behind engine (write(behind=True)); the FUSE mount sets its depth
        self.write_behind = WriteBehind(
            self._storage_write,
            transport,
            self._write_failed,
            depth=c.io_depth,
            max_age_s=config.fuse.write_buffer_age_s,
        )
        self._fh_ids = itertools.count(1)
        self._handles: dict[int, FileHandle] = {}
        self._reporter: asyncio.Task[None] | None = None
        self._closed = False
        # Sessions of handles closed with nothing to report, not yet ended at meta
        # (see release): caller -> [(inode, session id)], and the task ending them.
        self._quiet_closes: dict[tuple[int, int, tuple[int, ...]], list[tuple[int, str]]] = {}
        self._quiet_callers: dict[tuple[int, int, tuple[int, ...]], Caller] = {}
        self._closer: asyncio.Task[None] | None = None
        # The Python API's threads queue and take quiet closes too (release_now,
        # take_quiet_closes): the queue changes under this lock, and _closer_wanted (under
        # it too) says a closer task runs or is being started, so a session queued
        # from any thread is never left without one.
        self._quiet_lock = threading.Lock()
        self._closer_wanted = False
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        # Python API path resolution: directories met on a path, (parent, name) ->
        # {caller key: (expiry, attr)}; see _steps.
        self._dirs: dict[tuple[int, bytes], dict[tuple[int, int, tuple[int, ...]], _CachedDir]] = {}

    # ================================================================== lifecycle

    @classmethod
    async def connect(
        cls,
        cluster_file: str | os.PathLike[str] | None = None,
        *,
        config: _config.ClientConfig | None = None,
        transport: str | None = None,
        client_id: str | None = None,
        meta_addresses: Sequence[str] = (),
        on_wait: Callable[[str], None] | None = None,
        credential: Any = None,
    ) -> AsyncClient:
        """Connect to a cluster: find mgmtd, fetch routing, set up transports.

        ``cluster_file`` defaults to ``config.cluster.cluster_file``, then
        ``$FS3_CLUSTER_FILE``. ``transport`` overrides ``config.transport.kind``.
        Must be awaited on the loop the client will live on (the bridge loop).

        The first contact with mgmtd is bounded by ``[client] connect_timeout_s``
        (not the much longer ``retry_deadline_s`` an established client rides
        failovers with): a cluster that is down fails fast with
        ``FsError(TIMEOUT)`` naming the addresses tried. If no leader has answered
        after :data:`CONNECT_NOTICE_S`, ``on_wait`` (default: a warning on the
        ``fs3.client`` logger, which reaches stderr even when logging is not
        configured) is told which addresses are being waited for.

        ``credential`` (``fs3.rpc.auth.Credential``) is what every call presents;
        default: :func:`fs3.rpc.auth.credential_from` for this cluster file (a token
        from ``$FS3_TOKEN``/``$FS3_TOKEN_FILE``, or the cluster secret beside the
        cluster file when this user may read it).

        Raises:
            FsError: ENOENT/EACCES/EISDIR (the cluster file cannot be read),
                EINVAL (no or malformed cluster file), ETIMEDOUT (no mgmtd leader
                within the connect deadline), or a non-retryable mgmtd refusal.
        """
        from fs3.client.mgmtd_client import MgmtdClient

        cfg = config if config is not None else _config.load(_config.ClientConfig, None)
        path = str(
            cluster_file or cfg.cluster.cluster_file or os.environ.get("FS3_CLUSTER_FILE", "")
        )
        if not path:
            raise FsError(
                Code.INVALID_ARGUMENT,
                "no cluster file (pass one, set [cluster] cluster_file or FS3_CLUSTER_FILE)",
            )
        if credential is None:
            credential = _auth.credential_from(
                token_file=cfg.rpc.token_file or None,
                secret_file=cfg.rpc.secret_file or None,
                cluster_file=path,
                kind=cls.credential_kind,
                tls_ca=cfg.rpc.tls_ca,
            )
            if not _auth.default_credential().token:
                # this process's other channels (e.g. the shm transport's) present it too
                _auth.set_default(credential)
        kind = transport or cfg.transport.kind
        cid = client_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        mgmtd = MgmtdClient.from_cluster_file(
            path,
            timeout_s=cfg.client.rpc_timeout_s,
            retry_deadline_s=cfg.client.retry_deadline_s,
            transport=cfg.rpc.transport,
            credential=credential,
        )
        watcher = RoutingWatcher(mgmtd, poll_interval_s=cfg.client.routing_refresh_s)
        try:
            await _first_contact(watcher, mgmtd, path, cfg.client.connect_timeout_s, on_wait)
            await watcher.start()
            tr = make_transport(kind, cid, cfg.transport)
        except BaseException:
            await watcher.stop()
            await mgmtd.close()
            raise
        self = cls(
            config=cfg,
            mgmtd=mgmtd,
            watcher=watcher,
            transport=tr,
            client_id=cid,
            meta_addresses=meta_addresses,
            credential=credential,
        )
        self._reporter = asyncio.create_task(self._report_loop(), name="fs3-length-reporter")
        return self

    async def close(self) -> None:
        """Release open handles (reporting lengths), stop background tasks, close channels."""
        if self._closed:
            return
        self._closed = True
        for h in list(self._handles.values()):
            with contextlib.suppress(FsError):
                await self.release(h)
        await self.write_behind.close()  # buffered data first: its handles' sessions close after
        await self.flush_closes()
        if self._reporter is not None:
            self._reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reporter
        await self.routing_watcher.stop()
        with contextlib.suppress(Exception):
            await self.transport.close()
        await self.storage.close()  # its read streams live on the pool's channels
        await self._pool.close()
        with contextlib.suppress(Exception):
            await self.mgmtd.close()

    @property
    def routing(self) -> Routing:
        """The newest routing info known."""
        return self.routing_watcher.current

    async def refresh_routing(self) -> Routing:
        """Fetch routing from mgmtd now (after a stale-version refusal)."""
        return await self.routing_watcher.refresh()

    # ================================================================== namespace ops

    async def statfs(self, caller: Caller) -> meta_pb2.StatFsResponse:
        """File system statistics (``statvfs``)."""
        return await self.meta.call("StatFs", meta_pb2.StatFsRequest(user=caller.to_proto()))

    async def lookup(self, caller: Caller, parent: int, name: str | bytes) -> meta_pb2.Attr:
        """Attributes of ``name`` in directory ``parent`` (ENOENT if absent).

        ``.`` and ``..`` are resolved here (meta stores no such entries).
        """
        nb = _name(name)
        if nb == b".":
            return await self.getattr(caller, parent)
        if nb == b"..":
            pattr = await self.getattr(caller, parent)
            if not _stat.S_ISDIR(pattr.mode):
                raise posix(_errno.ENOTDIR)
            return await self.getattr(caller, pattr.parent or ROOT_INODE)
        r = await self.meta.call(
            "Lookup", meta_pb2.LookupRequest(user=caller.to_proto(), parent=parent, name=nb)
        )
        return self._overlay(r.attr)

    async def getattr(self, caller: Caller, inode: int) -> meta_pb2.Attr:
        """Attributes of ``inode``; a file's size includes this client's unreported writes."""
        r = await self.meta.call(
            "GetAttr", meta_pb2.GetAttrRequest(user=caller.to_proto(), inode=inode)
        )
        return self._overlay(r.attr)

    async def setattr(
        self,
        caller: Caller,
        inode: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
        atime_now: bool = False,
        mtime_now: bool = False,
        fh: FileHandle | None = None,
    ) -> meta_pb2.Attr:
        """chmod / chown / truncate / utimensat in one call (fields left None are unchanged).

        ``size`` truncates or extends; when the file shrank, chunks past the new
        end are removed on storage before this returns. Pass ``fh`` for
        ftruncate on a handle opened for write (access was checked at open).
        """
        req = meta_pb2.SetAttrRequest(
            user=caller.to_proto(), request_id=new_request_id(), inode=inode
        )
        valid = 0
        if mode is not None:
            valid |= SETATTR_MODE
            req.mode = mode & 0o7777
        if uid is not None and uid != -1 and uid != 0xFFFFFFFF:
            valid |= SETATTR_UID
            req.uid = uid
        if gid is not None and gid != -1 and gid != 0xFFFFFFFF:
            valid |= SETATTR_GID
            req.gid = gid
        if size is not None:
            if size < 0:
                raise posix(_errno.EINVAL, "negative size")
            valid |= SETATTR_SIZE
            req.size = size
        if atime_now:
            valid |= SETATTR_ATIME_NOW
        elif atime_ns is not None:
            valid |= SETATTR_ATIME
            req.atime.CopyFrom(_ts(atime_ns))
        if mtime_now:
            valid |= SETATTR_MTIME_NOW
        elif mtime_ns is not None:
            valid |= SETATTR_MTIME
            req.mtime.CopyFrom(_ts(mtime_ns))
        if fh is not None and fh.session_id:
            req.session_id = fh.session_id
        req.valid = valid
        if size is not None:
            # Finish and report what was written before, so the truncate applies to a known length.
            await self._wait_inode(inode)
            for h in self._handles_of(inode):
                if h.dirty:
                    await self._report(h)
        r = await self.meta.call("SetAttr", req)
        attr = r.attr
        if _stat.S_ISDIR(attr.mode) and valid & (SETATTR_MODE | SETATTR_UID | SETATTR_GID):
            self._dirs.clear()  # a directory's permissions changed: ask again on every path
        if valid & (SETATTR_MTIME | SETATTR_MTIME_NOW):
            # An explicit mtime wins over writes made before it (cp -p, tar).
            for h in self._handles_of(inode):
                h.write_mtime_ns = 0
        if size is not None:
            if r.need_truncate:
                ctx = _CAP_CALLER.set((caller, req.session_id))
                try:
                    await self._trim(attr, size)
                finally:
                    _CAP_CALLER.reset(ctx)
            self._after_truncate(attr)
        return self._overlay(attr)

    async def fallocate(
        self, fh: FileHandle, mode: int, offset: int, length: int
    ) -> meta_pb2.Attr | None:
        """fallocate(2) on an open handle: allocate, punch a hole or zero a range.

        ``mode`` 0 allocates storage for [offset, offset+length) (replicated
        chunk EXTENDs; only within the file unless the file grows) and grows the
        file to cover it; FALLOC_FL_KEEP_SIZE keeps the length.
        FALLOC_FL_PUNCH_HOLE (always with KEEP_SIZE, as Linux requires) and
        FALLOC_FL_ZERO_RANGE make the range read as zeros: chunks wholly inside
        are removed on every replica, the edges are overwritten with zeros
        through the chain; ZERO_RANGE without KEEP_SIZE also grows the file.
        Other modes (collapse, insert, unshare) fail with EOPNOTSUPP. Returns
        the new attributes when the length changed, else None.
        """
        self._check_open(fh)
        if mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            raise posix(_errno.EOPNOTSUPP, f"fallocate mode {mode:#x} is not supported")
        if mode & FALLOC_FL_PUNCH_HOLE and (
            not mode & FALLOC_FL_KEEP_SIZE or mode & FALLOC_FL_ZERO_RANGE
        ):
            raise posix(_errno.EOPNOTSUPP, "PUNCH_HOLE needs KEEP_SIZE and excludes ZERO_RANGE")
        if offset < 0 or length <= 0:
            raise posix(_errno.EINVAL, "fallocate needs offset >= 0 and length > 0")
        if not fh.writable:
            raise posix(_errno.EBADF, "file not open for writing")
        end = offset + length
        if end > layout_of(fh.attr).max_file_size():
            raise posix(_errno.EFBIG)
        # Settle what was written before, so the range applies to a known length
        # and no write in flight lands on a punched range afterwards.
        await self._wait_inode(fh.inode)
        for h in self._handles_of(fh.inode):
            if h.dirty:
                await self._report(h)
        size = int((await self.getattr(self.internal_caller, fh.inode)).size)
        inode, chains, cs = fh.inode, fh.chains, fh.chunk_size
        grows = not mode & FALLOC_FL_KEEP_SIZE and end > size
        if chains:
            if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
                await self.storage.zero_range(inode, chains, cs, offset, min(end, size))
                for h in self._handles_of(inode):
                    self._drop_prefetch(h)
                fh.write_mtime_ns = time.time_ns()  # data changed: reported like a write's
                fh.dirty = True
            else:
                upto = end if grows else min(end, size)
                if offset < upto:
                    await self.storage.allocate(inode, chains, cs, offset, upto)
        if not grows:
            return None
        return await self.setattr(fh.caller, inode, size=end, fh=fh)

    async def mknod(
        self, caller: Caller, parent: int, name: str | bytes, mode: int, rdev: int = 0
    ) -> meta_pb2.Attr:
        """Create a regular file, FIFO, socket or device node (``mode`` after umask)."""
        r = await self.meta.call(
            "Mknod",
            meta_pb2.MknodRequest(
                user=caller.to_proto(),
                request_id=new_request_id(),
                parent=parent,
                name=_name(name),
                mode=mode,
                rdev=rdev,
            ),
        )
        self._parent_changed(r)
        return r.attr

    async def mkdir(
        self, caller: Caller, parent: int, name: str | bytes, mode: int
    ) -> meta_pb2.Attr:
        """Create a directory (``mode`` after umask)."""
        r = await self.meta.call(
            "Mkdir",
            meta_pb2.MkdirRequest(
                user=caller.to_proto(),
                request_id=new_request_id(),
                parent=parent,
                name=_name(name),
                mode=mode,
            ),
        )
        self._parent_changed(r)
        return r.attr

    async def symlink(
        self, caller: Caller, parent: int, name: str | bytes, target: str | bytes
    ) -> meta_pb2.Attr:
        """Create symlink ``name`` in ``parent`` pointing at ``target``."""
        r = await self.meta.call(
            "Symlink",
            meta_pb2.SymlinkRequest(
                user=caller.to_proto(),
                request_id=new_request_id(),
                parent=parent,
                name=_name(name),
                target=_name(target),
            ),
        )
        self._parent_changed(r)
        return r.attr

    def _parent_changed(self, r: Any) -> None:
        """Hook: a namespace op's reply carried its parent directory's new attributes.

        Meta returns them (``parent_attr``) with every op that adds or removes an
        entry; the FUSE daemon keeps them to answer the kernel's GetAttr of that
        directory (see ``fs3.fuse.ops.FuseClient``). No-op here.
        """

    async def readlink(self, caller: Caller, inode: int) -> bytes:
        """The target of symlink ``inode`` (EINVAL if not a symlink)."""
        r = await self.meta.call(
            "ReadLink", meta_pb2.ReadLinkRequest(user=caller.to_proto(), inode=inode)
        )
        return bytes(r.target)

    async def link(
        self, caller: Caller, inode: int, new_parent: int, new_name: str | bytes
    ) -> meta_pb2.Attr:
        """Hard link ``inode`` as ``new_parent/new_name``."""
        r = await self.meta.call(
            "Link",
            meta_pb2.LinkRequest(
                user=caller.to_proto(),
                request_id=new_request_id(),
                inode=inode,
                new_parent=new_parent,
                new_name=_name(new_name),
            ),
        )
        self._parent_changed(r)
        return self._overlay(r.attr)

    async def unlink(
        self, caller: Caller, parent: int, name: str | bytes
    ) -> meta_pb2.RemoveResponse:
        """Remove a non-directory entry (the inode lives on while write sessions hold it)."""
        return await self._remove("Unlink", caller, parent, name)

    async def rmdir(
        self, caller: Caller, parent: int, name: str | bytes
    ) -> meta_pb2.RemoveResponse:
        """Remove an empty directory."""
        return await self._remove("Rmdir", caller, parent, name)

    async def _remove(
        self, method: str, caller: Caller, parent: int, name: str | bytes
    ) -> meta_pb2.RemoveResponse:
        try:
            r = await self.meta.call(
                method,
                meta_pb2.RemoveRequest(
                    user=caller.to_proto(),
                    request_id=new_request_id(),
                    parent=parent,
                    name=_name(name),
                ),
            )
        finally:
            self._dirs.pop((parent, _name(name)), None)
        self._parent_changed(r)
        return r  # type: ignore[no-any-return]

    async def rename(
        self,
        caller: Caller,
        parent: int,
        name: str | bytes,
        new_parent: int,
        new_name: str | bytes,
        flags: int = 0,
    ) -> meta_pb2.RenameResponse:
        """rename/renameat2 (``flags``: RENAME_NOREPLACE=1, RENAME_EXCHANGE=2)."""
        try:
            return await self.meta.call(
                "Rename",
                meta_pb2.RenameRequest(
                    user=caller.to_proto(),
                    request_id=new_request_id(),
                    parent=parent,
                    name=_name(name),
                    new_parent=new_parent,
                    new_name=_name(new_name),
                    flags=flags,
                ),
            )
        finally:
            self._dirs.pop((parent, _name(name)), None)
            self._dirs.pop((new_parent, _name(new_name)), None)

    async def readdir(
        self,
        caller: Caller,
        inode: int,
        cursor: bytes = b"",
        limit: int = 0,
        *,
        with_attrs: bool = False,
    ) -> tuple[list[meta_pb2.DirEntry], bool]:
        """One page of directory entries after ``cursor`` (a name; b"" = start).

        Returns ``(entries, more)``; pass the last entry's name as the next
        cursor. "." and ".." are not included.
        """
        r = await self.meta.call(
            "ReadDir",
            meta_pb2.ReadDirRequest(
                user=caller.to_proto(),
                inode=inode,
                cursor=cursor,
                limit=limit,
                with_attrs=with_attrs,
            ),
        )
        entries = list(r.entries)
        if with_attrs:
            for e in entries:
                if e.HasField("attr"):
                    e.attr.CopyFrom(self._overlay(e.attr))
        return entries, bool(r.more)

    async def readdir_all(
        self, caller: Caller, inode: int, *, with_attrs: bool = False
    ) -> list[meta_pb2.DirEntry]:
        """Every entry of a directory (pages through :meth:`readdir`)."""
        out: list[meta_pb2.DirEntry] = []
        cursor = b""
        while True:
            entries, more = await self.readdir(caller, inode, cursor, with_attrs=with_attrs)
            out.extend(entries)
            if not more or not entries:
                return out
            cursor = entries[-1].name

    async def access(self, caller: Caller, inode: int, mask: int) -> None:
        """access(2): raise EACCES unless ``caller`` may ``mask`` (R_OK|W_OK|X_OK)."""
        await self.meta.call(
            "Access", meta_pb2.AccessRequest(user=caller.to_proto(), inode=inode, mask=mask)
        )

    async def getxattr(self, caller: Caller, inode: int, name: str | bytes) -> bytes:
        r = await self.meta.call(
            "GetXattr",
            meta_pb2.GetXattrRequest(user=caller.to_proto(), inode=inode, name=_name(name)),
        )
        return bytes(r.value)

    async def setxattr(
        self, caller: Caller, inode: int, name: str | bytes, value: bytes, flags: int = 0
    ) -> None:
        """flags: XATTR_CREATE=1, XATTR_REPLACE=2."""
        await self.meta.call(
            "SetXattr",
            meta_pb2.SetXattrRequest(
                user=caller.to_proto(),
                request_id=new_request_id(),
                inode=inode,
                name=_name(name),
                value=bytes(value),
                flags=flags,
            ),
        )

    async def listxattr(self, caller: Caller, inode: int) -> list[bytes]:
        r = await self.meta.call(
            "ListXattr", meta_pb2.ListXattrRequest(user=caller.to_proto(), inode=inode)
        )
        return [bytes(n) for n in r.names]

    async def removexattr(self, caller: Caller, inode: int, name: str | bytes) -> None:
        await self.meta.call(
            "RemoveXattr",
            meta_pb2.RemoveXattrRequest(
                user=caller.to_proto(), request_id=new_request_id(), inode=inode, name=_name(name)
            ),
        )

    # ================================================================== open files

    async def create(
        self, caller: Caller, parent: int, name: str | bytes, mode: int, flags: int
    ) -> tuple[FileHandle, meta_pb2.Attr]:
        """Create (or, without O_EXCL, open an existing) regular file and open it.

        ``mode``: permission bits after umask. ``flags``: open flags (O_CREAT
        implied; O_EXCL → EEXIST if it exists; O_TRUNC truncates an existing one).
        """
        req = self.create_request(caller, parent, name, mode, flags)
        r = await self._with_quiet_closes("Create", req, caller)
        self._parent_changed(r)
        h = await self._opened(caller, r, flags)
        return h, self._overlay(r.attr)

    def create_request(
        self, caller: Caller, parent: int, name: str | bytes, mode: int, flags: int
    ) -> meta_pb2.CreateRequest:
        """The Create request of :meth:`create` (one request id for all its retries)."""
        return meta_pb2.CreateRequest(
            user=caller.to_proto(),
            request_id=new_request_id(),
            parent=parent,
            name=_name(name),
            mode=mode,
            flags=flags,
            client_id=self.client_id,
        )

    def open_request(self, caller: Caller, inode: int, flags: int) -> meta_pb2.OpenRequest:
        """The Open request of :meth:`open`."""
        return meta_pb2.OpenRequest(
            user=caller.to_proto(),
            request_id=new_request_id(),
            inode=inode,
            flags=flags,
            client_id=self.client_id,
        )

    async def open(self, caller: Caller, inode: int, flags: int) -> FileHandle:
        """Open ``inode`` with ``flags`` (O_ACCMODE, O_TRUNC, O_APPEND ...)."""
        req = self.open_request(caller, inode, flags)
        r = await self._with_quiet_closes("Open", req, caller)
        return await self._opened(caller, r, flags)

    async def _fetch_capability(self, inode: int, write: bool) -> bytes:
        """A fresh grant from meta, asked as an open handle of ``inode`` that has the right
        (renewed by its session), else as the caller doing a path operation (``_CAP_CALLER``)."""
        who: tuple[Caller, str] | None = None
        for h in self._handles_of(inode):
            if not h.closed and (h.writable if write else h.readable or h.writable):
                who = (h.caller, h.session_id)
                if h.writable if write else h.readable:
                    break
        if who is None:
            who = _CAP_CALLER.get()
        if who is None:
            raise FsError(
                Code.PERMISSION_DENIED,
                f"no open handle of inode {inode} to ask meta for a {'write' if write else 'read'} grant",
            )
        r = await self.meta.call(
            "GetCapability",
            meta_pb2.GetCapabilityRequest(
                user=who[0].to_proto(), inode=inode, write=write, session_id=who[1]
            ),
        )
        return bytes(r.capability)

    async def _with_quiet_closes(self, method: str, req: Any, caller: Caller) -> Any:
        """Call ``method`` with the caller's quietly closed sessions riding along.

        Meta ends them in the request's own transaction; if the request fails
        they go back to the queue (ending a session twice is harmless).
        """
        refs = self.take_quiet_closes(req, caller)
        try:
            return await self.meta.call(method, req)
        except BaseException:
            self.requeue_quiet_closes(caller, refs)
            raise

    def take_quiet_closes(self, req: Any, caller: Caller) -> list[tuple[int, str]]:
        """Put the caller's quietly closed sessions into ``req`` (a Create/Open request);
        what was taken, for :meth:`requeue_quiet_closes` if the request fails. Any thread."""
        key = _caller_key(caller)
        with self._quiet_lock:
            refs = self._quiet_closes.pop(key, [])
            if len(refs) > CLOSE_SESSIONS_MAX:
                self._quiet_closes[key] = refs[CLOSE_SESSIONS_MAX:]
                refs = refs[:CLOSE_SESSIONS_MAX]
        for ino, sid in refs:
            req.close_sessions.add(inode=ino, session_id=sid)
        return refs

    def requeue_quiet_closes(self, caller: Caller, refs: list[tuple[int, str]]) -> None:
        """Sessions a failed request carried go back to the queue (ending one twice is
        harmless). Any thread."""
        if refs:
            self._queue_quiet(caller, refs, front=True)

    def opened_now(self, caller: Caller, r: Any, flags: int) -> FileHandle | None:
        """:meth:`_opened` without the loop, for the Python API's threads: the handle,
        or None when the open needs storage work first (``need_truncate``: await
        :meth:`_opened` then). Thread-safe: a capability and a handle are each one
        dict store."""
        if r.need_truncate:
            return None
        h = self._new_handle(caller, r, flags)
        self._handles[h.fh] = h
        return h

    def _new_handle(self, caller: Caller, r: Any, flags: int) -> FileHandle:
        attr = r.attr
        if r.capability:
            self.capabilities.put(r.capability)
        lay = layout_of(attr)
        return FileHandle(
            fh=next(self._fh_ids),
            inode=int(attr.inode),
            flags=flags,
            session_id=r.session_id,
            attr=attr,
            chains=tuple(lay.chain_ids),
            chunk_size=lay.chunk_size,
            caller=caller,
            truncate_version=int(attr.truncate_version),
            known_length=int(attr.size),
        )

    async def _opened(self, caller: Caller, r: meta_pb2.OpenResponse, flags: int) -> FileHandle:
        attr = r.attr
        h = self._new_handle(caller, r, flags)
        if r.need_truncate:
            ctx = _CAP_CALLER.set((caller, r.session_id))
            try:
                await self._wait_inode(h.inode)  # our own writes in flight must not land after it
                await self._trim(attr, int(attr.size))
                self._after_truncate(attr)
            except BaseException:
                if h.session_id:
                    with contextlib.suppress(FsError):
                        await self._close_session(h, with_hint=False)
                raise
            finally:
                _CAP_CALLER.reset(ctx)
        self._handles[h.fh] = h
        return h

    def handle(self, fh: int) -> FileHandle:
        """The open handle numbered ``fh`` (EBADF if unknown)."""
        h = self._handles.get(fh)
        if h is None:
            raise FsError(Code.BAD_FD, f"no open file handle {fh}")
        return h

    async def read(self, fh: FileHandle, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (short at EOF, zeros in holes)."""
        buf = bytearray(max(0, size))
        n = await self.readinto(fh, offset, buf)
        del buf[n:]
        return bytes(buf)

    async def readinto(self, fh: FileHandle, offset: int, buf: memoryview | bytearray) -> int:
        """Read into ``buf`` at file ``offset``; returns bytes read.

        Waits for this client's write-behind writes to the inode first, so a
        read always sees every write that returned before it.
        """
        length = await self._read_length(fh, offset, len(buf))
        if offset >= length:
            return 0
        if not fh.readahead:
            return await self.storage.read(fh.inode, fh.chains, fh.chunk_size, offset, buf, length)
        sequential = offset == fh.ra_next
        fh.ra_seq = fh.ra_seq + 1 if sequential else 0
        n = await self._read_prefetched(fh, offset, buf, length)
        if n is None:
            n = await self.storage.read(fh.inode, fh.chains, fh.chunk_size, offset, buf, length)
        fh.ra_next = offset + n
        if fh.ra_seq >= 1:
            self._prefetch(fh, fh.ra_next, length)
        return n

    async def _read_length(self, fh: FileHandle, offset: int, want: int) -> int:
        """The file length a read of ``want`` bytes at ``offset`` sees (0: nothing to read).

        Checks the handle and offset, and waits for this client's write-behind
        writes to the range first, so a read sees every write that returned before it.
        """
        self._check_open(fh)
        if not fh.readable:
            raise posix(_errno.EBADF, "file not open for reading")
        if offset < 0:
            raise posix(_errno.EINVAL, "negative offset")
        if want == 0:
            return 0
        await self._wait_inode(fh.inode, offset, offset + want)
        length = self._length(fh)
        if offset + want > length:
            # The cached length may be stale (another writer reported more).
            length = await self._refresh_length(fh)
        return length

    async def readinto_many(
        self,
        reads: Sequence[tuple[FileHandle, int, memoryview | bytearray]],
        on_done: Callable[[list[tuple[int, int | BaseException]]], None] | None = None,
    ) -> list[int | BaseException]:
        """Several :meth:`readinto` at once (a USRBIO ring batch): one result per
        read, its byte count or its own exception.

        The checks, write-behind waits and lengths are those of :meth:`readinto`;
        the storage reads then go out together (:meth:`StorageClient.read_many`),
        so a batch of 4 KiB reads costs no task per read. ``on_done`` (as for
        ``read_many``) hears of reads as they finish, indexes into ``reads``.
        """
        out: list[int | BaseException] = [0] * len(reads)
        todo: list[tuple[int, tuple[int, tuple[int, ...], int, int, Any, int]]] = []
        early: list[tuple[int, int | BaseException]] = []
        for i, (fh, offset, buf) in enumerate(reads):
            try:
                if fh.readahead:  # its prefetch windows belong to readinto
                    out[i] = await self.readinto(fh, offset, buf)
                    early.append((i, out[i]))
                    continue
                length = await self._read_length(fh, offset, len(buf))
                if offset >= length:
                    early.append((i, 0))
                    continue
            except FsError as e:
                out[i] = e
                early.append((i, e))
                continue
            todo.append((i, (fh.inode, tuple(fh.chains), fh.chunk_size, offset, buf, length)))
        if early and on_done is not None:
            on_done(early)
        if todo:

            def done(got: list[tuple[int, int | BaseException]]) -> None:
                assert on_done is not None
                on_done([(todo[k][0], r) for k, r in got])

            got = await self.storage.read_many(
                [r for _, r in todo], None if on_done is None else done
            )
            for (i, _), r in zip(todo, got, strict=True):
                out[i] = r
        return out

    async def _read_prefetched(
        self, fh: FileHandle, offset: int, buf: memoryview | bytearray, length: int
    ) -> int | None:
        """Serve a read from read-ahead windows if they cover it; None otherwise."""
        end = min(offset + len(buf), length)
        # Windows before the read are done with; a read elsewhere drops all of them.
        keep = [w for w in fh.ra if w.end > offset]
        for w in fh.ra:
            if w not in keep:
                w.task.cancel()
        fh.ra = keep
        cover = [w for w in fh.ra if w.start < end and w.end > offset]
        if not cover or cover[0].start > offset:
            self._drop_prefetch(fh)
            return None
        mv = memoryview(buf).cast("B")
        pos = offset
        for w in cover:
            if w.start > pos:
                return None
            try:
                data = await w.task
            except (FsError, asyncio.CancelledError):
                self._drop_prefetch(fh)
                return None
            avail = w.start + len(data)
            take = min(end, avail) - pos
            if take <= 0:
                break
            mv[pos - offset : pos - offset + take] = memoryview(data)[
                pos - w.start : pos - w.start + take
            ]
            pos += take
            if pos >= end or avail < w.end:
                break
        if pos < end:
            return None if pos == offset else pos - offset
        return end - offset

    def _prefetch(self, fh: FileHandle, start: int, length: int) -> None:
        """Start read-ahead windows (chunk-aligned) covering the next ``readahead_chunks`` chunks."""
        if self.write_behind.busy(fh.inode):
            return  # a window could read bytes a write in flight is replacing
        cs = fh.chunk_size
        limit = min(length, start + self.config.client.readahead_chunks * cs)
        pos = max([w.end for w in fh.ra] + [start])
        while pos < limit:
            wend = min((pos // cs + 1) * cs, length)
            fh.ra.append(
                _Prefetch(pos, wend, asyncio.create_task(self._read_window(fh, pos, wend, length)))
            )
            pos = wend

    async def _read_window(self, fh: FileHandle, start: int, end: int, length: int) -> bytes:
        buf = bytearray(end - start)
        n = await self.storage.read(fh.inode, fh.chains, fh.chunk_size, start, buf, length)
        del buf[n:]
        return bytes(buf)

    def _drop_prefetch(self, fh: FileHandle) -> None:
        for w in fh.ra:
            w.task.cancel()
            w.task.add_done_callback(_consume)
        fh.ra = []

    async def write(
        self,
        fh: FileHandle,
        offset: int,
        data: bytes | bytearray | memoryview,
        *,
        behind: bool = False,
    ) -> int:
        """Write ``data`` at ``offset``.

        ``behind=False``: returns after every chunk piece is committed on its chain.
        ``behind=True`` (write-behind, like a page cache): copies ``data`` into the
        write-behind engine's staging buffer (:mod:`fs3.client.write_behind`) and
        returns; the engine sends it in the background (overlapping ranges stay in
        order). Reads, truncates, flush, fsync and release wait for it; a failure
        is raised by the next write/flush/fsync/release of the handle (like a
        deferred writeback error).
        """
        self._check_open(fh)
        if not fh.writable:
            raise posix(_errno.EBADF, "file not open for writing")
        if offset < 0:
            raise posix(_errno.EINVAL, "negative offset")
        n = len(memoryview(data))
        if n == 0:
            return 0
        if not fh.chains:
            raise FsError(Code.INTERNAL, f"inode {fh.inode} has no chains in its layout")
        if offset + n > layout_of(fh.attr).max_file_size():
            raise posix(_errno.EFBIG)
        end = offset + n
        self._raise_deferred(fh)
        if not behind:
            await self._wait_inode(fh.inode, offset, end)  # keep overlapping writes in order
            await self.storage.write(fh.inode, fh.chains, fh.chunk_size, offset, data)
            self._written(fh, end)
            return n
        await self.write_behind.write(fh, offset, memoryview(data).cast("B"))
        self._written(fh, end)
        return n

    async def _storage_write(self, fh: FileHandle, offset: int, data: memoryview) -> int:
        """The write-behind engine's way to storage (committed on every replica on return)."""
        return await self.storage.write(fh.inode, fh.chains, fh.chunk_size, offset, data)

    def _written(self, fh: FileHandle, end: int) -> None:
        for h in self._handles_of(fh.inode):
            h.known_length = max(h.known_length, end)
            if h.ra:
                self._drop_prefetch(h)  # read-ahead may hold bytes this write replaced
        if end > fh.written_end:
            fh.written_end = end
        fh.dirty = True
        fh.write_mtime_ns = time.time_ns()

    def _write_failed(self, fh: FileHandle, err: FsError) -> None:
        """A write-behind write of ``fh`` failed: every writable handle of the inode reports
        it (its next write/flush/fsync/close), as the kernel reports writeback errors."""
        for h in {fh, *self._handles_of(fh.inode)}:
            if h.writable and h.error is None:
                h.error = err

    def _raise_deferred(self, fh: FileHandle) -> None:
        err, fh.error = fh.error, None
        if err is not None:
            raise err

    async def _wait_inode(self, inode: int, start: int = 0, end: int | None = None) -> None:
        """Settle write-behind writes to ``inode`` overlapping [start, end) (all if end is None)."""
        await self.write_behind.settle(inode, start, end)

    async def drain(self, fh: FileHandle) -> None:
        """Wait until every write-behind write of ``fh``'s inode finished; raise a failure."""
        await self.write_behind.settle(fh.inode)
        self._raise_deferred(fh)

    async def flush(self, fh: FileHandle) -> None:
        """Finish write-behind writes and report this handle's length to meta if it wrote.

        (FUSE ``flush``, called on every close(2) of a descriptor.)
        """
        self._check_open(fh)
        await self.drain(fh)
        if fh.dirty:
            await self._report(fh)

    async def fsync(self, fh: FileHandle, datasync: bool = False) -> None:
        """Make written data and the file length durable (returns after both)."""
        self._check_open(fh)
        await self.drain(fh)
        if fh.writable:
            await self._report(fh)

    async def release(self, fh: FileHandle) -> None:
        """Close the handle: a writer's final length goes to meta with the session close.

        A handle with nothing to report (it wrote nothing: no length, no mtime)
        costs no round trip: its session is queued and ends in the transaction
        of this caller's next Create/Open, or, if none comes within
        :data:`QUIET_CLOSE_DELAY_S`, in one ``CloseSessions`` request (one KV
        transaction) for the whole queue. Until then the file only looks open to
        meta a little longer (an unlink keeps it as an orphan for those
        milliseconds). :meth:`flush_closes` waits until the queue is empty.

        A write-behind failure is raised after the session is closed.
        """
        if fh.closed:
            return
        self._drop_prefetch(fh)
        err: FsError | None = None
        try:
            try:
                await self.drain(fh)
            except FsError as e:
                err = e
            if fh.session_id:
                if err is None and self._quiet(fh) and not self._closed:
                    self._defer_close(fh)
                else:
                    await self._close_session(fh, with_hint=True)
        finally:
            fh.closed = True
            self._handles.pop(fh.fh, None)
        if err is not None:
            raise err

    def release_now(self, fh: FileHandle) -> bool:
        """:meth:`release` without the loop, for the Python API's threads, when it is only
        bookkeeping: no read-ahead to cancel, no write-behind data of the inode, nothing to
        report (the session then ends later, as in :meth:`release`). False: nothing was
        done, await :meth:`release`."""
        if fh.closed:
            return True
        if self._closed or fh.ra or fh.error is not None or self.write_behind.busy(fh.inode):
            return False
        if fh.session_id and not self._quiet(fh):
            return False
        fh.closed = True
        self._handles.pop(fh.fh, None)
        if fh.session_id:
            self._queue_quiet(fh.caller, [(fh.inode, fh.session_id)])
        return True

    def local_length(self, fh: FileHandle) -> int:
        """The length this client knows without asking meta (last fetch + own writes)."""
        return self._length(fh)

    async def file_length(self, fh: FileHandle) -> int:
        """Current length as this client knows it (meta's, raised by local writes)."""
        return await self._refresh_length(fh)

    # ================================================================== paths (Python API)

    async def resolve(
        self, caller: Caller, path: str | bytes, *, follow: bool = True, base: int = ROOT_INODE
    ) -> meta_pb2.Attr:
        """Attributes of the object at ``path`` (relative to ``base``; leading "/" = root).

        Symlinks in intermediate components are always followed; the last one
        only if ``follow``. ELOOP after 40 links; ENOTDIR when a non-directory
        is used as a directory (also for a trailing slash).
        """
        p = _name(path)
        if not p:
            raise posix(_errno.ENOENT, "empty path")
        start = ROOT_INODE if p.startswith(b"/") else base
        parts = [c for c in p.split(b"/") if c]
        if not parts:
            return await self.getattr(caller, start)
        # Every component in one LookupPath RPC (more only where symlinks lead elsewhere).
        return await self._steps(
            caller,
            meta_pb2.Attr(inode=start, mode=_stat.S_IFDIR),
            parts,
            [0],
            follow_last=follow,
            last_dir=p.endswith(b"/"),
            last_counter=[0],
        )

    async def resolve_parent(
        self, caller: Caller, path: str | bytes, *, base: int = ROOT_INODE
    ) -> tuple[meta_pb2.Attr, bytes]:
        """The directory that holds ``path``'s last component, and that name.

        For paths ending in "/", "." or ".." there is no last name to create or
        remove; the name returned is then b"." or b".." and callers refuse it.
        """
        p = _name(path)
        if not p:
            raise posix(_errno.ENOENT, "empty path")
        parent, last = await self._walk(caller, p, base, 0)
        if last is None:
            return (await self.getattr(caller, parent.inode) if parent.nlink == 0 else parent), b"."
        return parent, last

    async def _walk(
        self, caller: Caller, p: bytes, base: int, depth: int
    ) -> tuple[meta_pb2.Attr, bytes | None]:
        """Resolve every component but the last; returns (dir attr, last name or None).

        The starting directory is not fetched (a lookup below it fails with the
        right errno anyway); it is a placeholder with ``nlink == 0`` that callers
        replace with real attributes when the path names it.
        """
        start = ROOT_INODE if p.startswith(b"/") else base
        cur = meta_pb2.Attr(inode=start, mode=_stat.S_IFDIR)
        parts = [c for c in p.split(b"/") if c]
        if not parts:
            return cur, None
        if len(parts) > 1:
            cur = await self._steps(caller, cur, parts[:-1], [depth], cache_last=True)
        return cur, parts[-1]

    async def _steps(
        self,
        caller: Caller,
        cur: meta_pb2.Attr,
        comps: list[bytes],
        counter: list[int],
        *,
        follow_last: bool = True,
        last_dir: bool = True,
        last_counter: list[int] | None = None,
        cache_last: bool = False,
    ) -> meta_pb2.Attr:
        """:meth:`_step` over ``comps`` in turn, with one LookupPath RPC per run of names.

        Meta resolves names until a symlink or a non-directory, so a path costs
        one RPC plus one per symlink it passes; errors and their order are those
        of a walk one name at a time. ``follow_last``/``last_dir``/``last_counter``
        apply to the final name (as :meth:`_step`'s ``follow``/``must_be_dir``/``counter``).

        Directories met on the way are remembered per caller for
        ``[client] dir_cache_s`` (like the kernel's dentries for a FUSE mount's
        ``entry_timeout_s``) and reused without asking meta: every name but the
        last, and the last too if ``cache_last`` (a parent directory, whose
        attributes the caller does not use). Own rmdir/rename/chmod drop them;
        another client's renames show within ``dir_cache_s``.
        """
        i, n = 0, len(comps)
        who = _caller_key(caller)
        while i < n:
            if not _stat.S_ISDIR(cur.mode):
                raise posix(_errno.ENOTDIR, "not a directory")
            known = self._cached_dir(who, cur.inode, comps[i]) if i < n - 1 or cache_last else None
            if known is not None:
                cur = known
                i += 1
                continue
            batch = comps[i : i + LOOKUP_PATH_MAX]
            for j, c in enumerate(batch):  # a too-long name fails at its own step
                if len(c) > NAME_MAX:
                    if j == 0:
                        raise posix(_errno.ENAMETOOLONG)
                    batch = batch[:j]
                    break
            attrs = await self._lookup_path(caller, cur.inode, batch)
            for attr in attrs:
                if _stat.S_ISDIR(attr.mode):
                    self._remember_dir(who, cur.inode, comps[i], attr)
                final = i == n - 1
                followed = _stat.S_ISLNK(attr.mode)
                cur = await self._after_lookup(
                    caller,
                    cur,
                    attr,
                    follow_last if final else True,
                    last_dir if final else True,
                    (last_counter or counter) if final else counter,
                )
                i += 1
                if followed:
                    break  # the link led elsewhere: continue from there in a new batch
        return cur

    def known_parent(self, caller: Caller, path: str | bytes) -> tuple[int, bytes] | None:
        """What :meth:`resolve_parent` would answer without asking meta: (directory
        inode, last name) when every directory on ``path`` is in the directory cache
        (see :meth:`_steps`) and the last component is a plain name; else None.

        Any thread (the Python API calls it from its callers' threads): each cache
        read is one ``dict.get``, atomic under the GIL, of an entry the loop replaces
        whole and never changes; only the loop writes the cache.
        """
        p = _name(path)
        if not p or p.endswith(b"/"):
            return None
        parts = [c for c in p.split(b"/") if c]
        if not parts or parts[-1] in (b".", b"..") or len(parts[-1]) > NAME_MAX:
            return None
        who = _caller_key(caller)
        cur = ROOT_INODE
        for c in parts[:-1]:
            d = self._cached_dir(who, cur, c)
            if d is None:
                return None
            cur = int(d.inode)
        return cur, parts[-1]

    def _cached_dir(
        self, who: tuple[int, int, tuple[int, ...]], parent: int, name: bytes
    ) -> meta_pb2.Attr | None:
        """A directory this caller met at (parent, name) less than ``dir_cache_s`` ago."""
        got = self._dirs.get((parent, name))
        hit = got.get(who) if got else None
        if hit is None or hit.expires < time.monotonic():
            return None
        return hit.attr

    def _remember_dir(
        self, who: tuple[int, int, tuple[int, ...]], parent: int, name: bytes, attr: meta_pb2.Attr
    ) -> None:
        ttl = self.config.client.dir_cache_s
        if ttl <= 0:
            return
        if len(self._dirs) >= DIR_CACHE_MAX:
            self._dirs.clear()
        self._dirs.setdefault((parent, name), {})[who] = _CachedDir(time.monotonic() + ttl, attr)

    async def _lookup_path(
        self, caller: Caller, parent: int, names: list[bytes]
    ) -> list[meta_pb2.Attr]:
        if len(names) == 1:
            return [await self.lookup(caller, parent, names[0])]
        r = await self.meta.call(
            "LookupPath",
            meta_pb2.LookupPathRequest(user=caller.to_proto(), parent=parent, names=names),
        )
        return [self._overlay(a) for a in r.attrs]

    async def _step(
        self,
        caller: Caller,
        cur: meta_pb2.Attr,
        comp: bytes,
        follow: bool,
        must_be_dir: bool,
        counter: list[int],
    ) -> meta_pb2.Attr:
        if not _stat.S_ISDIR(cur.mode):
            raise posix(_errno.ENOTDIR, "not a directory")
        if len(comp) > NAME_MAX:
            raise posix(_errno.ENAMETOOLONG)
        attr = await self.lookup(caller, cur.inode, comp)
        return await self._after_lookup(caller, cur, attr, follow, must_be_dir, counter)

    async def _after_lookup(
        self,
        caller: Caller,
        cur: meta_pb2.Attr,
        attr: meta_pb2.Attr,
        follow: bool,
        must_be_dir: bool,
        counter: list[int],
    ) -> meta_pb2.Attr:
        """The rest of :meth:`_step` once ``attr`` (a name in ``cur``) is known."""
        if _stat.S_ISLNK(attr.mode) and (follow or must_be_dir):
            counter[0] += 1
            if counter[0] > MAX_SYMLINK_FOLLOW:
                raise posix(_errno.ELOOP, "too many levels of symbolic links")
            target = await self.readlink(caller, attr.inode)
            if not target:
                raise posix(_errno.ENOENT)
            dir_attr, last = await self._walk(caller, target, cur.inode, counter[0])
            if last is None:
                attr = (
                    await self.getattr(caller, dir_attr.inode) if dir_attr.nlink == 0 else dir_attr
                )
            else:
                attr = await self._step(
                    caller, dir_attr, last, True, must_be_dir or target.endswith(b"/"), counter
                )
        if must_be_dir and not _stat.S_ISDIR(attr.mode):
            raise posix(_errno.ENOTDIR, "not a directory")
        return attr

    # ================================================================== GC and internals

    def open_handles(self) -> list[FileHandle]:
        """A snapshot of the open handles; any thread (the Python API's threads add and
        remove handles while the loop reads them: stat's size overlay, reports)."""
        while True:
            try:
                return list(self._handles.values())
            except RuntimeError:  # changed size while copied: copy again
                continue

    def _check_open(self, fh: FileHandle) -> None:
        if fh.closed:
            raise FsError(Code.BAD_FD, "file handle is closed")

    def _handles_of(self, inode: int) -> list[FileHandle]:
        return [h for h in self.open_handles() if h.inode == inode]

    def _local_length(self, inode: int, truncate_version: int) -> int:
        n = 0
        for h in self._handles_of(inode):
            if h.truncate_version == truncate_version and h.written_end > n:
                n = h.written_end
        return n

    def _overlay(self, attr: meta_pb2.Attr) -> meta_pb2.Attr:
        """Raise a regular file's size by this client's unreported writes."""
        if not _stat.S_ISREG(attr.mode):
            return attr
        local = self._local_length(int(attr.inode), int(attr.truncate_version))
        if local <= attr.size:
            return attr
        out = meta_pb2.Attr()
        out.CopyFrom(attr)
        out.size = local
        out.blocks = (local + 511) // 512
        return out

    def _length(self, fh: FileHandle) -> int:
        return max(fh.known_length, self._local_length(fh.inode, fh.truncate_version))

    async def _refresh_length(self, fh: FileHandle) -> int:
        attr = await self.getattr(self.internal_caller, fh.inode)
        if int(attr.truncate_version) != fh.truncate_version:
            # Someone truncated: our unreported hints are void, meta's length rules.
            fh.truncate_version = int(attr.truncate_version)
            fh.written_end = 0
            fh.known_length = int(attr.size)
        else:
            fh.known_length = max(int(attr.size), self._length(fh))
        if self.config.client.eof_length_from_storage and fh.chains:
            # Writers elsewhere report their length only every few seconds; the
            # chunks themselves already show how far the file goes
            # (docs/architecture.md#file-length).
            fh.known_length = max(fh.known_length, await self.storage_length(fh))
        return self._length(fh)

    async def storage_length(self, fh: FileHandle) -> int:
        """The file length as storage sees it (last chunk end over the stripe's chains)."""
        return await self.storage.query_length(fh.inode, fh.chains, fh.chunk_size)

    async def _trim(self, attr: meta_pb2.Attr, new_size: int) -> None:
        lay = layout_of(attr)
        if lay.chain_ids:
            await self.storage.truncate(int(attr.inode), lay.chain_ids, lay.chunk_size, new_size)

    def _after_truncate(self, attr: meta_pb2.Attr) -> None:
        for h in self._handles_of(int(attr.inode)):
            self._drop_prefetch(h)
            h.truncate_version = int(attr.truncate_version)
            h.written_end = 0
            h.known_length = int(attr.size)
            h.dirty = False

    def _hint(self, fh: FileHandle, req: Any) -> None:
        # Never announce a length covering a write still in flight (a reader
        # would see zeros there): with writes pending, report only up to the
        # first pending byte.
        end = fh.written_end
        first = self.write_behind.unsettled_from(fh.inode)
        if first is not None:
            end = min(end, first)
        if end:
            req.has_length_hint = True
            req.length_hint = end
            req.truncate_version = fh.truncate_version
        if fh.write_mtime_ns and not self.write_behind.unsettled_by(fh):
            # Overwrites do not change the length; the report carries their mtime, but
            # only once they are on storage: a mount keeps its cached pages while the
            # file's (size, mtime) is what it saw at open (fs3/fuse/ops.py), so an
            # mtime announced early would let it cache the old bytes under the new
            # mtime and keep serving them after the write is acknowledged.
            req.mtime.CopyFrom(_ts(fh.write_mtime_ns))

    async def _report(self, fh: FileHandle) -> None:
        """Sync: tell meta this handle's length (the write session stays)."""
        if not fh.session_id:
            return
        req = meta_pb2.SyncRequest(
            user=fh.caller.to_proto(),
            request_id=new_request_id(),
            inode=fh.inode,
            session_id=fh.session_id,
        )
        self._hint(fh, req)
        mtime = fh.write_mtime_ns if req.HasField("mtime") else 0
        # an mtime held back (its write is not on storage yet) is reported later
        fh.dirty = bool(fh.write_mtime_ns) and not mtime
        try:
            r = await self.meta.call("Sync", req)
        except BaseException:
            fh.dirty = True
            raise
        fh.last_report = time.monotonic()
        fh.known_length = max(fh.known_length, int(r.attr.size))
        if mtime and fh.write_mtime_ns == mtime:
            fh.write_mtime_ns = 0

    async def _close_session(self, fh: FileHandle, *, with_hint: bool) -> None:
        req = meta_pb2.CloseRequest(
            user=fh.caller.to_proto(),
            request_id=new_request_id(),
            inode=fh.inode,
            session_id=fh.session_id,
        )
        if with_hint:
            self._hint(fh, req)
        await self.meta.call("Close", req)
        fh.dirty = False

    def _quiet(self, fh: FileHandle) -> bool:
        """True if closing ``fh`` has nothing to tell meta but the end of its session."""
        if self.write_behind.busy(fh.inode) or fh.error is not None:
            return False
        probe = meta_pb2.CloseRequest()
        self._hint(fh, probe)
        return not probe.has_length_hint and not probe.HasField("mtime")

    def _defer_close(self, fh: FileHandle) -> None:
        self._queue_quiet(fh.caller, [(fh.inode, fh.session_id)])

    def _queue_quiet(
        self, caller: Caller, refs: list[tuple[int, str]], front: bool = False
    ) -> None:
        """Queue sessions to end later and make sure a closer will run. Any thread."""
        key = _caller_key(caller)
        with self._quiet_lock:
            self._quiet_callers[key] = caller
            q = self._quiet_closes.setdefault(key, [])
            if front:
                q[:0] = refs
            else:
                q.extend(refs)
            start = not self._closer_wanted
            self._closer_wanted = True
        if start:
            if threading.get_ident() == self._loop_thread:
                self._start_closer()
            else:
                with contextlib.suppress(RuntimeError):  # the loop is gone: client closed
                    self._loop.call_soon_threadsafe(self._start_closer)

    def _start_closer(self) -> None:
        if self._closer is None or self._closer.done():
            self._closer = asyncio.create_task(self._end_quiet_sessions(), name="fs3-closer")

    async def _end_quiet_sessions(self) -> None:
        """End the queued sessions, a ``CloseSessions`` request per caller and batch.

        Waits :data:`QUIET_CLOSE_DELAY_S` first: a client opening or creating
        files one after another takes them along with its next request instead.
        """
        try:
            if not self._closed:
                await asyncio.sleep(QUIET_CLOSE_DELAY_S)
            while True:
                with self._quiet_lock:
                    if not self._quiet_closes:
                        self._closer_wanted = False  # with the queue seen empty, atomically
                        return
                    key, refs = next(iter(self._quiet_closes.items()))
                    batch, rest = refs[:CLOSE_SESSIONS_MAX], refs[CLOSE_SESSIONS_MAX:]
                    if rest:
                        self._quiet_closes[key] = rest
                    else:
                        del self._quiet_closes[key]
                    caller = self._quiet_callers[key]
                req = meta_pb2.CloseSessionsRequest(
                    user=caller.to_proto(),
                    sessions=[meta_pb2.SessionRef(inode=i, session_id=s) for i, s in batch],
                )
                try:
                    await self.meta.call("CloseSessions", req)
                except FsError as e:
                    # Like a client that died with files open: meta keeps the sessions
                    # until PruneSessions of this client id.
                    log.warning("ending %d sessions at meta failed: %s", len(batch), e)
        except BaseException:
            with self._quiet_lock:  # a closer that died: the next queued session starts one
                self._closer_wanted = False
            raise

    async def flush_closes(self) -> None:
        """Wait until every session of a quietly closed handle was ended at meta."""
        while self._closer is not None and not self._closer.done():
            await asyncio.shield(self._closer)
        if self._quiet_closes:  # queued while nothing ran (e.g. after a failure)
            self._start_closer()
            assert self._closer is not None
            await self._closer

    async def _report_loop(self) -> None:
        """Report lengths of long writers every ``length_report_interval_s``."""
        interval = self.config.client.length_report_interval_s
        while True:
            await asyncio.sleep(max(0.05, interval / 2))
            now = time.monotonic()
            for h in self.open_handles():
                if h.dirty and not h.closed and now - h.last_report >= interval:
                    try:
                        await self._report(h)
                    except FsError as e:
                        log.warning("periodic length report of inode %d failed: %s", h.inode, e)


def _caller_key(c: Caller) -> tuple[int, int, tuple[int, ...]]:
    return (c.uid, c.gid, tuple(c.groups))


def _consume(t: asyncio.Task[Any]) -> None:
    """Retrieve a dropped task's outcome so asyncio does not log it as never retrieved."""
    if not t.cancelled():
        t.exception()


def make_transport(
    kind: str, client_id: str, config: _config.TransportSection | None = None
) -> ClientTransport:
    """The client transport of ``kind`` (grpc | tcp | shm), tuned by ``config``."""
    from fs3.transport import client_transport

    return client_transport(kind, client_id, config)
