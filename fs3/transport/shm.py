"""The ``shm`` transport: one-sided transfers through shared memory (same host).

This is the local stand-in for RDMA READ/WRITE. A client registers a region (a
file under /dev/shm, :class:`~fs3.transport.region.ShmRegion`) with a storage
node through ``TransportService.RegisterRegion``; the node maps the file. A
write RPC then names ``(region, offset, length)`` and the server reads the
payload straight out of the client's memory; a read RPC names the destination
and the server ``preadv``s the chunk file straight into it. No byte goes
through a socket or through a Python-level copy on the server.

Safety, server side (:class:`ShmRegistry`):

* a region is registered *by handle*, never by name: the client passes the open
  file descriptor over the node's region socket (a Unix socket beside its RPC
  socket, :func:`region_socket_path`) with ``SCM_RIGHTS``, and the owner pid and
  uid come from the kernel (``SO_PEERCRED``), not from the request. So a server
  (often root) maps only memory the caller itself could open read-write; the
  old ``RegisterRegion`` RPC naming a /dev/shm path is refused;
* region ids are random and never part of a file name, so another local user
  who lists /dev/shm cannot name someone else's region in a data request;
* every ``(offset, length)`` is validated against the registered size:
  unknown region or out-of-bounds range -> ``FsError(INVALID_ARGUMENT)``;
* a region is dropped on ``UnregisterRegion``, when its owner pid is gone
  (checked periodically, with the process start time so a reused pid does not
  keep it alive) and at ``stop()``. A mapping with live views (a fetch still in
  progress) is closed as soon as the last view is gone.

Client side (:class:`ShmClientTransport`): buffers that lie inside a region
registered with :meth:`ShmClientTransport.register_region` (USRBIO Iovs, the
FUSE daemon's buffers) are used in place; any other buffer is copied into an
internal staging region first (one memcpy, still no socket). Regions are
registered with each storage node lazily, on first use, and unregistered on
``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as _errno
import functools
import itertools
import logging
import os
import socket
import struct
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fs3.errors import Code, FsError, invalid
from fs3.logs import event
from fs3.proto import common_pb2, transport_pb2, transport_pb2_grpc
from fs3.rpc import settings as rpc_settings
from fs3.rpc.channel import ChannelPool, call
from fs3.rpc.native.endpoints import prepare as prepare_socket
from fs3.rpc.native.endpoints import remove as remove_socket
from fs3.rpc.native.endpoints import uds_path
from fs3.transport.base import (
    DONE,
    ClientTransport,
    ReadCompletion,
    _noop_complete,
    inline_read_ref,
)
from fs3.transport.region import ShmRegion, buffer_address, process_start_time

log = logging.getLogger("fs3.transport.shm")

UNKNOWN_REGION = "unknown shm region"


def regions_lost(transport: ClientTransport, node_address: str, err: FsError) -> FsError:
    """``err`` as a caller of a write RPC should raise it.

    A node that answers with :func:`is_region_error` restarted and forgot the
    regions registered there: forget them here too and make the error retryable,
    so the retry registers again (the node refused before applying anything).
    """
    if not is_region_error(err):
        return err
    transport.forget_node(node_address)
    return FsError(Code.TRANSPORT, err.message, retryable=True)


def is_region_error(err: BaseException) -> bool:
    """True if a storage RPC failed because the node does not know our region.

    Happens after the storage process restarted; call
    ``transport.forget_node(node_address)`` and retry (registration is lazy).
    """
    return (
        isinstance(err, FsError)
        and err.code == Code.INVALID_ARGUMENT
        and err.message.startswith(UNKNOWN_REGION)
    )


# --------------------------------------------------------------------------- registration by handle

MAX_REGISTRATION_BYTES = 4096  # one RegisterRegionRequest (ids are short)
MAX_REGION_BYTES = 1 << 40  # sanity bound of one region's size
REGISTRATION_TIMEOUT_S = 5.0  # a peer that connects and sends nothing is dropped after this
MAX_PENDING_REGISTRATIONS = 64  # connections served at once; more wait in the backlog
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def region_socket_path(address: str, socket_dir: str | None = None) -> str:
    """The region socket of the storage node advertising ``address`` (same host only)."""
    base = uds_path(address, socket_dir or rpc_settings.current().socket_dir)
    return base.removesuffix(".sock") + ".regions.sock"


def send_region(
    path: str, client_id: str, region: ShmRegion, timeout_s: float = REGISTRATION_TIMEOUT_S
) -> None:
    """Register ``region`` with the node listening at ``path``: its descriptor travels
    with ``SCM_RIGHTS``. Blocking (run it in a thread); raises the node's refusal."""
    if region.fd < 0:
        raise invalid(f"region {region.id!r} has no open descriptor to hand over")
    req = transport_pb2.RegisterRegionRequest(
        client_id=client_id, region=region.id, size=region.size
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
            socket.send_fds(sock, [req.SerializeToString()], [region.fd])
            answer = sock.recv(MAX_REGISTRATION_BYTES)
        except OSError as e:
            raise FsError(
                Code.TRANSPORT,
                f"cannot register shm region at {path}: {e.strerror or e} "
                "(the shm transport needs a storage node on this host)",
                retryable=False,
            ) from None
    if not answer:
        raise FsError(
            Code.TRANSPORT, f"the node at {path} closed without answering", retryable=True
        )
    detail = common_pb2.ErrorDetail.FromString(answer)
    if detail.code:
        raise FsError(detail.code, detail.message, errno=detail.errno or None)


# --------------------------------------------------------------------------- server side


@dataclass
class _Registered:
    client_id: str
    region_id: str
    pid: int
    start_time: str | None
    region: ShmRegion
    uid: int = -1


class ShmRegistry:
    """The regions a storage server was told about, keyed by region id.

    Region ids are random (uuid4) per client; an id registered by one client
    cannot be taken over by another.
    """

    def __init__(self, check_interval_s: float = 1.0) -> None:
        self.check_interval_s = check_interval_s
        self._regions: dict[str, _Registered] = {}
        self._graveyard: list[ShmRegion] = []
        self._task: asyncio.Task[None] | None = None
        self._listener: socket.socket | None = None
        self._accepter: asyncio.Task[None] | None = None
        self._socket_path = ""
        self._conns: set[asyncio.Task[None]] = set()
        self._conn_slots = asyncio.Semaphore(MAX_PENDING_REGISTRATIONS)
        # maps a new region's allocated pages off the event loop, one region at a time
        self._populator: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self._regions)

    def has(self, region_id: str) -> bool:
        return region_id in self._regions

    # -- registration ---------------------------------------------------------

    def register(self, req: transport_pb2.RegisterRegionRequest) -> None:
        """``RegisterRegion`` by path: refused. A server must not map memory by a name a
        caller chose (another user's /dev/shm file); regions come by handle instead."""
        raise FsError(
            Code.PERMISSION_DENIED,
            "RegisterRegion by path is refused: hand the region's file descriptor to the "
            "node's region socket (fs3.transport.shm.send_region)",
        )

    def register_handle(
        self,
        req: transport_pb2.RegisterRegionRequest,
        fd: int,
        pid: int,
        uid: int,
    ) -> None:
        """Map a region handed over by descriptor; ``pid``/``uid`` are the kernel's word
        (``SO_PEERCRED``). Takes ownership of ``fd`` (closed on any refusal)."""
        try:
            if not req.client_id or not req.region:
                raise invalid("RegisterRegion needs client_id and region")
            if len(req.region) > 128 or len(req.client_id) > 256:
                raise invalid("RegisterRegion: client_id or region id too long")
            if not 0 < req.size <= MAX_REGION_BYTES:
                raise invalid(f"RegisterRegion: size must be in (0, {MAX_REGION_BYTES}]")
            start = process_start_time(pid)
            if start is None:
                raise invalid(f"RegisterRegion: peer pid {pid} is gone")
            old = self._regions.get(req.region)
            if old is not None and (old.client_id != req.client_id or old.uid != uid):
                raise FsError(
                    Code.PERMISSION_DENIED,
                    f"RegisterRegion: region {req.region!r} belongs to another client",
                )
        except BaseException:
            os.close(fd)
            raise
        region = ShmRegion.from_fd(fd, req.size, req.region)
        if old is not None:
            self._bury(old.region)
        self._regions[req.region] = _Registered(req.client_id, req.region, pid, start, region, uid)
        # Reads into the region then fault no page that its owner already has
        # (ShmRegion.populate_allocated); requests are served meanwhile.
        if self._populator is None:
            self._populator = ThreadPoolExecutor(1, thread_name_prefix="shm-populate")
        self._populator.submit(region.populate_allocated)
        event(
            log,
            "shm region registered",
            client=req.client_id,
            region=req.region[:8],  # a prefix: logs may be readable by users the id must not reach
            size=req.size,
            pid=pid,
            uid=uid,
        )

    async def serve_handles(self, path: str) -> None:
        """Listen for registrations by handle on the Unix socket ``path``."""
        prepare_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.bind(path)
            os.chmod(path, 0o666)  # any local user may register *their own* memory
            sock.listen(MAX_PENDING_REGISTRATIONS)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._listener, self._socket_path = sock, path
        self._accepter = asyncio.create_task(self._accept(sock), name="shm-region-socket")

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as e:
                log.warning("region socket accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            await self._conn_slots.acquire()
            t = asyncio.create_task(self._serve_conn(conn))
            self._conns.add(t)
            t.add_done_callback(self._conn_done)

    def _conn_done(self, t: asyncio.Task[None]) -> None:
        self._conns.discard(t)
        self._conn_slots.release()

    async def _serve_conn(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        fds: list[int] = []
        try:
            conn.setblocking(False)
            pid, uid, _gid = _UCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            )
            try:
                async with asyncio.timeout(REGISTRATION_TIMEOUT_S):
                    msg, fds = await _recv_with_fds(loop, conn)
                if len(fds) != 1:
                    raise invalid(f"RegisterRegion: expected one descriptor, got {len(fds)}")
                req = transport_pb2.RegisterRegionRequest.FromString(msg)
                fd = fds.pop()
                self.register_handle(req, fd, pid, uid)
                answer = common_pb2.ErrorDetail(message="registered")  # never empty
            except TimeoutError:
                return
            except FsError as e:
                answer = common_pb2.ErrorDetail(code=int(e.code), errno=e.errno, message=e.message)
            except Exception as e:  # malformed message, mmap failure: refuse, never crash
                answer = common_pb2.ErrorDetail(
                    code=int(Code.INVALID_ARGUMENT), message=f"RegisterRegion: {e}"
                )
            with contextlib.suppress(OSError):
                await loop.sock_sendall(conn, answer.SerializeToString())
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()

    def unregister(self, client_id: str, region_id: str) -> bool:
        reg = self._regions.get(region_id)
        if reg is None or reg.client_id != client_id:
            return False
        del self._regions[region_id]
        self._bury(reg.region)
        event(log, "shm region dropped", client=client_id, region=region_id[:8])
        return True

    def _bury(self, region: ShmRegion) -> None:
        if not region.close(unlink=False):
            self._graveyard.append(region)

    def sweep(self) -> int:
        """Drop regions whose owner process is gone; retry closing busy mappings."""
        dropped = 0
        for rid, reg in list(self._regions.items()):
            now = process_start_time(reg.pid)
            if now is None or (reg.start_time and now and now != reg.start_time):
                self._regions.pop(rid, None)
                self._bury(reg.region)
                dropped += 1
                event(
                    log, "shm region owner gone", client=reg.client_id, region=rid[:8], pid=reg.pid
                )
        self._graveyard = [r for r in self._graveyard if not r.close(unlink=False)]
        return dropped

    # -- access ---------------------------------------------------------------

    def view(self, ref: transport_pb2.ShmRef) -> memoryview:
        """The bytes ``ref`` names, validated against the region bounds."""
        reg = self._regions.get(ref.region)
        if reg is None:
            raise invalid(f"{UNKNOWN_REGION} {ref.region!r} (not registered with this node)")
        end = ref.offset + ref.length
        if end > reg.region.size:
            raise invalid(
                f"shm range [{ref.offset}, {end}) outside region {ref.region!r} of {reg.region.size} bytes"
            )
        return reg.region.buf[ref.offset : end]

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="shm-region-sweeper")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_s)
            try:
                self.sweep()
            except Exception:  # the sweeper must survive anything
                log.exception("shm region sweep failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._accepter is not None:
            self._accepter.cancel()
            await asyncio.gather(self._accepter, *self._conns, return_exceptions=True)
            self._accepter = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            remove_socket(self._socket_path)
        for rid, reg in list(self._regions.items()):
            self.unregister(reg.client_id, rid)
        if self._populator is not None:
            # a region closed meanwhile stops its populate at the next step
            self._populator.shutdown(wait=False, cancel_futures=True)
            self._populator = None
        self._graveyard = [r for r in self._graveyard if not r.close(unlink=False)]


async def _recv_with_fds(
    loop: asyncio.AbstractEventLoop, conn: socket.socket
) -> tuple[bytes, list[int]]:
    """One SEQPACKET message and the descriptors that came with it (at most 4; a
    message truncated or with more descriptors is refused, and they are closed)."""
    fut: asyncio.Future[tuple[bytes, list[int]]] = loop.create_future()

    def ready() -> None:
        if fut.done():
            return
        try:
            msg, fds, flags, _addr = socket.recv_fds(conn, MAX_REGISTRATION_BYTES, 4)
        except BlockingIOError:
            return
        except OSError as e:
            fut.set_exception(e)
            return
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            for fd in fds:
                os.close(fd)
            fut.set_exception(invalid("RegisterRegion: message or descriptors truncated"))
            return
        fut.set_result((msg, fds))

    loop.add_reader(conn.fileno(), ready)
    try:
        return await fut
    finally:
        loop.remove_reader(conn.fileno())


async def preadv_into(fd: int, view: memoryview, offset: int, *, thread_threshold: int) -> int:
    """``preadv`` a file range into ``view`` until full or EOF; returns bytes read.

    Reads larger than ``thread_threshold`` run in a worker thread so a slow
    disk does not stall the server's event loop.
    """

    def read_all() -> int:
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:
                break
            done += n
        return done

    if len(view) > thread_threshold:
        return await asyncio.to_thread(read_all)
    return read_all()


# --------------------------------------------------------------------------- client side

PAGE = 4096


class _Arena:
    """A staging region with a first-fit allocator (4 KiB granules)."""

    def __init__(self, region: ShmRegion, dedicated: bool) -> None:
        self.region = region
        self.dedicated = dedicated
        self.free: list[tuple[int, int]] = [(0, region.size)]
        self.used = 0

    def alloc(self, size: int) -> int | None:
        size = max(PAGE, (size + PAGE - 1) // PAGE * PAGE)
        for i, (off, n) in enumerate(self.free):
            if n >= size:
                if n == size:
                    del self.free[i]
                else:
                    self.free[i] = (off + size, n - size)
                self.used += size
                return off
        return None

    def release(self, off: int, size: int) -> None:
        size = max(PAGE, (size + PAGE - 1) // PAGE * PAGE)
        self.used -= size
        self.free.append((off, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, n in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((o, n))
        self.free = merged


@dataclass
class _Slot:
    arena: _Arena
    offset: int
    size: int
    view: memoryview


class _Staging:
    """Staging memory for buffers that are not in a registered region."""

    def __init__(self, arena_bytes: int, max_bytes: int) -> None:
        self.arena_bytes = arena_bytes
        self.max_bytes = max_bytes
        self.arenas: list[_Arena] = []
        self._waiters: list[asyncio.Future[None]] = []
        self.on_new_arena: Any = None  # callback(region) -> None
        self.on_drop_arena: Any = None

    def total(self) -> int:
        return sum(a.region.size for a in self.arenas)

    def try_alloc(self, size: int) -> _Slot | None:
        """A slot of ``size`` bytes, or None if that needs waiting for a free."""
        for arena in self.arenas:
            if arena.dedicated:
                continue
            off = arena.alloc(size)
            if off is not None:
                return _Slot(arena, off, size, arena.region.buf[off : off + size])
        want = self.arena_bytes if size <= self.arena_bytes else (size + (1 << 20) - 1) >> 20 << 20
        if self.total() + want <= self.max_bytes or not self.arenas:
            region = ShmRegion.create(want, prefix="fs3-staging")
            # Nodes get the arena by descriptor (SCM_RIGHTS), never by name, so its
            # file is removed at once: the memory lives while some process maps it,
            # and no end of this process (kill -9 included) leaves it in /dev/shm.
            region.unlink()
            arena = _Arena(region, dedicated=size > self.arena_bytes)
            self.arenas.append(arena)
            off = arena.alloc(size)
            assert off is not None
            return _Slot(arena, off, size, arena.region.buf[off : off + size])
        return None

    async def alloc(self, size: int) -> _Slot:
        while True:
            slot = self.try_alloc(size)
            if slot is not None:
                return slot
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    def free(self, slot: _Slot) -> None:
        slot.view.release()
        slot.arena.release(slot.offset, slot.size)
        if slot.arena.dedicated and slot.arena.used == 0:
            self.arenas.remove(slot.arena)
            if self.on_drop_arena is not None:
                self.on_drop_arena(slot.arena.region)
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                try:  # may run from a GC finalizer, outside the loop's thread or after it closed
                    w.get_loop().call_soon_threadsafe(_set_none, w)
                except RuntimeError:
                    pass


def _set_none(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _StagedWrite:
    """Awaitable returned by ``write_ref`` when the payload was staged.

    Already complete (the payload was copied); it frees the staging slot when
    garbage-collected or ``release()``d, i.e. once the caller is done with the RPC.
    """

    def __init__(self, staging: _Staging, slot: _Slot) -> None:
        self._fin = weakref.finalize(self, staging.free, slot)

    def release(self) -> None:
        self._fin()

    def __await__(self):  # type: ignore[no-untyped-def]
        return DONE.__await__()


class _StagedRead:
    """``complete(n)`` for a staged read: copy n bytes into the caller's buffer."""

    def __init__(self, staging: _Staging, slot: _Slot, dest: memoryview) -> None:
        self._slot = slot
        self._dest = dest
        self._fin = weakref.finalize(self, staging.free, slot)

    async def __call__(self, n: int) -> None:
        if not 0 <= n <= len(self._dest):
            raise invalid(
                f"read completion of {n} bytes does not fit a {len(self._dest)}-byte buffer"
            )
        self._dest[:n] = self._slot.view[:n]
        self._fin()


@dataclass
class _NodeState:
    registered: dict[str, asyncio.Future[None]] = field(default_factory=dict)


class ShmClientTransport(ClientTransport):
    kind = "shm"

    def __init__(
        self,
        client_id: str,
        *,
        staging_arena_bytes: int = 64 << 20,
        staging_max_bytes: int = 512 << 20,
        rpc_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(client_id)
        self._regions: dict[str, ShmRegion] = {}
        self._nodes: dict[str, _NodeState] = {}
        self._pool = ChannelPool()
        self._staging = _Staging(staging_arena_bytes, max(staging_max_bytes, staging_arena_bytes))
        self._staging.on_drop_arena = self._drop_staging_region
        self._rpc_timeout_s = rpc_timeout_s
        self._closed = False
        self._bg: set[asyncio.Task[None]] = set()
        self._last_region: ShmRegion | None = None

    def one_sided(self, node_address: str, buf: memoryview) -> bool:
        return True  # every buffer: in place, or staged into an arena

    async def forward_ref(
        self, node_address: str, data_address: str, data: memoryview
    ) -> tuple[transport_pb2.DataRef, Awaitable[None]] | None:
        return await ShmClientTransport.write_ref(self, node_address, data_address, data)

    @property
    def regions(self) -> list[ShmRegion]:
        """Regions usable in place: registered ones plus staging arenas."""
        return list(self._regions.values()) + [a.region for a in self._staging.arenas]

    # -- regions ----------------------------------------------------------------

    async def register_region(self, region: ShmRegion) -> str:
        self._check_open()
        self._regions[region.id] = region
        return region.id

    async def unregister_region(self, region: ShmRegion) -> None:
        self._regions.pop(region.id, None)
        if self._last_region is region:
            self._last_region = None
        await self._unregister_everywhere(region.id)

    async def _unregister_everywhere(self, region_id: str) -> None:
        calls = []
        for node, st in self._nodes.items():
            fut = st.registered.pop(region_id, None)
            if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
                calls.append(self._unregister_on(node, region_id))
        await asyncio.gather(*calls, return_exceptions=True)

    async def _unregister_on(self, node: str, region_id: str) -> None:
        stub = transport_pb2_grpc.TransportServiceStub(self._pool.get(node))
        req = transport_pb2.UnregisterRegionRequest(client_id=self.client_id, region=region_id)
        await call(stub.UnregisterRegion, req, timeout=self._rpc_timeout_s)

    def _drop_staging_region(self, region: ShmRegion) -> None:
        rid = region.id
        for st in self._nodes.values():
            st.registered.pop(rid, None)
        region.close()
        if not self._closed:
            try:
                task = asyncio.get_running_loop().create_task(self._unregister_everywhere_ids(rid))
            except RuntimeError:
                return
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)

    async def _unregister_everywhere_ids(self, region_id: str) -> None:
        await asyncio.gather(
            *(self._unregister_on(node, region_id) for node in list(self._nodes)),
            return_exceptions=True,
        )

    async def _ensure_registered(self, node: str, region: ShmRegion) -> None:
        st = self._nodes.setdefault(node, _NodeState())
        fut = st.registered.get(region.id)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            st.registered[region.id] = fut
            try:
                await asyncio.to_thread(
                    send_region,
                    region_socket_path(node),
                    self.client_id,
                    region,
                    self._rpc_timeout_s,
                )
            except BaseException as e:
                st.registered.pop(region.id, None)
                fut.set_exception(
                    e if isinstance(e, Exception) else FsError(Code.CANCELLED, "cancelled")
                )
                fut.exception()  # mark retrieved: other waiters see it through await
                raise
            fut.set_result(None)
            return
        await asyncio.shield(fut)

    def forget_node(self, node_address: str) -> None:
        self._nodes.pop(node_address, None)

    def _locate(self, view: memoryview) -> tuple[ShmRegion, int] | None:
        addr, n = buffer_address(view)
        last = self._last_region  # consecutive I/Os mostly land in one Iov: ask it first
        if last is not None and not last.closed and last.contains(addr, n):
            return last, addr - last.address
        for region in itertools.chain(
            self._regions.values(), (a.region for a in self._staging.arenas)
        ):
            if not region.closed and region.contains(addr, n):
                self._last_region = region
                return region, addr - region.address
        return None

    def read_ref_ready(self, node_address: str, dest: memoryview) -> transport_pb2.DataRef | None:
        """The shm ref of ``dest`` when it lies in a region already registered on the node.

        Why: this is every I/O of a USRBIO ring once its Iov reached the node; the
        general :meth:`read_ref` (a coroutine chain, registration, staging) stays
        for the first I/O and for buffers outside every region.
        """
        st = self._nodes.get(node_address)
        if st is None or self._closed or dest.readonly:
            return None
        found = self._locate(dest)
        if found is None:
            return None
        region, offset = found
        fut = st.registered.get(region.id)
        if fut is None or not fut.done():  # a failed registration leaves no entry
            return None
        ref = transport_pb2.DataRef()  # field by field: half the cost of nested keywords
        shm = ref.shm
        shm.region = region.id
        shm.offset = offset
        shm.length = dest.nbytes
        return ref

    def _check_open(self) -> None:
        if self._closed:
            raise FsError(Code.INVALID_ARGUMENT, "shm transport is closed", errno=_errno.EBADF)

    def staging_buffer(self, size: int) -> tuple[memoryview, Callable[[], None]] | None:
        """A slot of the staging arenas: :meth:`write_ref` finds it in place (no copy)."""
        if self._closed or size <= 0 or size > self._staging.arena_bytes:
            return None
        slot = self._staging.try_alloc(size)
        if slot is None:
            return None
        return slot.view, functools.partial(self._staging.free, slot)

    # -- refs ---------------------------------------------------------------------

    async def write_ref(
        self, node_address: str, data_address: str, data: memoryview
    ) -> tuple[transport_pb2.DataRef, Awaitable[None]]:
        self._check_open()
        data = memoryview(data)
        if data.format != "B" or data.ndim != 1:
            data = data.cast("B")
        n = data.nbytes
        if n == 0:
            return transport_pb2.DataRef(inline=b""), DONE
        found = self._locate(data)
        done: Awaitable[None] = DONE
        if found is None:
            slot = await self._staging.alloc(n)
            slot.view[:] = data
            done = _StagedWrite(self._staging, slot)
            region, offset = slot.arena.region, slot.offset
        else:
            region, offset = found
        await self._ensure_registered(node_address, region)
        ref = transport_pb2.DataRef(
            shm=transport_pb2.ShmRef(region=region.id, offset=offset, length=n)
        )
        return ref, done

    async def read_ref(
        self, node_address: str, data_address: str, dest: memoryview
    ) -> tuple[transport_pb2.DataRef, ReadCompletion]:
        self._check_open()
        dest = memoryview(dest)
        if dest.readonly:
            raise invalid("read destination must be writable")
        if dest.format != "B" or dest.ndim != 1:
            dest = dest.cast("B")
        n = dest.nbytes
        if n == 0:
            return inline_read_ref(), _noop_complete
        found = self._locate(dest)
        complete: ReadCompletion = _noop_complete
        if found is None:
            slot = await self._staging.alloc(n)
            complete = _StagedRead(self._staging, slot, dest)
            region, offset = slot.arena.region, slot.offset
        else:
            region, offset = found
        await self._ensure_registered(node_address, region)
        ref = transport_pb2.DataRef(
            shm=transport_pb2.ShmRef(region=region.id, offset=offset, length=n)
        )
        return ref, complete

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ids = list(self._regions) + [a.region.id for a in self._staging.arenas]
        try:
            await asyncio.wait_for(
                asyncio.gather(
                    *(self._unregister_everywhere(rid) for rid in ids), return_exceptions=True
                ),
                timeout=self._rpc_timeout_s,
            )
        except TimeoutError:
            pass
        if self._bg:
            await asyncio.gather(*self._bg, return_exceptions=True)
        self._regions.clear()
        self._last_region = None
        for arena in self._staging.arenas:
            arena.region.close()
        self._staging.arenas.clear()
        await self._pool.close()
