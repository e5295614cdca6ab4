"""USRBIO, agent side: drains the rings of a mount and performs their I/O.

The agent runs inside the FUSE daemon (as 3FS's does). It is written on
**anyio**; the backend's coroutines are awaited in the agent's own runtime.
The FUSE daemon runs ``agent.serve`` as an asyncio task on the client's loop
(see :mod:`fs3.fuse.main`)::

    agent = UsrbioAgent(backend)
    sock = agent_socket_path(mountpoint)          # compute before mounting
    task = loop.create_task(agent.serve(sock, task_status=started))
    ...                                           # cancel the task to stop

The backend (duck-typed, see :class:`IoBackend`) does the actual file I/O::

    async def read(inode, file_offset, dest: memoryview) -> int   # bytes read (short = EOF)
    async def write(inode, file_offset, src: memoryview) -> int   # bytes written
    # optional:
    async def read_batch(ios: list[(inode, file_offset, dest)]) -> list[int | BaseException]
    # optional hooks:
    async def authorize(inode, *, uid, gid, pid, write) -> None   # raise FsError to refuse
    async def attach_region(region: ShmRegion) -> None             # an Iov appeared
    async def detach_region(region: ShmRegion) -> None             # it is going away

``read_batch`` (when the backend has it) gets a ring batch's reads in one
call, so they reach the storage client in one loop turn and coalesce into one
request per storage node (a USRBIO ring with 64 4 KiB reads in flight becomes
about one RPC per node instead of up to 64). Its result list has one entry per
I/O: the byte count, or the exception of that I/O alone.

``dest``/``src`` are views into the agent's mapping of the application's Iov:
the agent never copies payload. For zero copy end to end, ``attach_region``
should pass the region to the client's shm transport
(``ClientTransport.register_region(region)``) so the storage servers map the
Iov and read/write it directly; ``detach_region`` unregisters it. Backends
must refuse inodes the application has no business with (3FS requires the
inode to be open in the daemon; ``authorize`` is called once per ring and
inode with the application's credentials from ``SO_PEERCRED``).

Safety: every ring entry is re-validated (slot index, buffer id, range inside
the Iov, buffer owned by the same uid); a bad entry completes with -EINVAL or
-EACCES, never touches memory outside the Iov. An application that exits or
crashes closes its sockets: the agent waits for that ring's in-flight I/Os,
then unmaps its rings and Iovs (and unlinks their /dev/shm files if the
process is gone). Mappings still referenced by a backend are closed when the
last view is released.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import inspect
import json
import logging
import os
import socket
import struct
import termios
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from anyio.abc import SocketAttribute, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from fs3.errors import Code, FsError
from fs3.logs import event
from fs3.transport.region import SHM_DIR, ShmRegion, process_start_time
from fs3.usrbio.ring import IoArgs, Ring
from fs3.usrbio.shm import IOR_PREFIX, IOV_PREFIX, LEN, decode_len, encode, peer_credentials

log = logging.getLogger("fs3.usrbio.agent")

_HANDSHAKE_TIMEOUT_S = 10.0
_CQ_FULL_GIVE_UP_S = 5.0
# Batches of reads this large on average complete each read as it finishes (see
# _read_batch); smaller ones complete together.
STREAM_MIN_READ = 64 << 10


class IoBackend(Protocol):
    async def read(self, inode: int, file_offset: int, dest: memoryview) -> int: ...

    async def write(self, inode: int, file_offset: int, src: memoryview) -> int: ...


@dataclass
class _Peer:
    pid: int
    uid: int
    gid: int
    start_time: str | None


@dataclass
class _AgentIov:
    id: bytes
    region: ShmRegion
    uid: int
    users: int = 0
    closing: bool = False
    idle: anyio.Event = field(default_factory=anyio.Event)


class _RefusedError(Exception):
    def __init__(self, err: int, message: str) -> None:
        super().__init__(message)
        self.errno = err
        self.message = message


def _validated_path(path: Any, prefix: str, size: Any, uid: int) -> tuple[str, int]:
    if not isinstance(path, str) or not isinstance(size, int) or size <= 0:
        raise _RefusedError(_errno.EINVAL, "registration needs a path and a positive size")
    real = os.path.realpath(path)
    if os.path.dirname(real) != SHM_DIR or not os.path.basename(real).startswith(prefix + "-"):
        raise _RefusedError(_errno.EINVAL, f"{path!r} is not a {prefix} file under {SHM_DIR}")
    try:
        st = os.stat(real)
    except OSError as e:
        raise _RefusedError(e.errno or _errno.ENOENT, f"{path!r}: {e.strerror}") from None
    if uid != 0 and st.st_uid != uid:
        raise _RefusedError(_errno.EACCES, f"{path!r} belongs to another user")
    if st.st_size < size:
        raise _RefusedError(_errno.EINVAL, f"{path!r} is smaller than {size} bytes")
    return real, size


def _errno_of(exc: BaseException) -> int:
    if isinstance(exc, FsError):
        return exc.errno or _errno.EIO
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    return _errno.EIO


class UsrbioAgent:
    """Serves USRBIO Iovs and rings of one mount point over a Unix socket.

    Args:
        io_backend: performs reads/writes (see the module docstring).
        max_concurrent_ios: I/Os the agent runs at once over all rings.
    """

    def __init__(self, io_backend: Any, *, max_concurrent_ios: int = 64) -> None:
        self.backend = io_backend
        self._limiter = anyio.CapacityLimiter(max_concurrent_ios)
        # a read_batch(ios, on_done) reports reads as they finish: each is completed at once
        rb = getattr(io_backend, "read_batch", None)
        self._streams_reads = rb is not None and "on_done" in inspect.signature(rb).parameters
        self._iovs: dict[bytes, _AgentIov] = {}
        self._rings = 0
        self.stats = {"ios": 0, "errors": 0, "batches": 0, "bytes": 0}
        self.socket_path = ""

    @property
    def iov_count(self) -> int:
        return len(self._iovs)

    @property
    def ring_count(self) -> int:
        return self._rings

    # -- serving ------------------------------------------------------------------

    async def serve(
        self, socket_path: str, *, task_status: Any = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on ``socket_path`` until cancelled (reports started once listening)."""
        _prepare_socket_path(socket_path)
        listener = await anyio.create_unix_listener(socket_path)
        os.chmod(socket_path, 0o666)  # every local user of the mount may use USRBIO
        self.socket_path = socket_path
        event(log, "usrbio agent listening", socket=socket_path)
        try:
            task_status.started()
            await listener.serve(self._handle)
        finally:
            _remove_socket(socket_path)
            with anyio.CancelScope(shield=True):
                await listener.aclose()

    async def _handle(self, stream: SocketStream) -> None:
        async with stream:
            try:
                raw = stream.extra(SocketAttribute.raw_socket)
                pid, uid, gid = peer_credentials(raw)
                peer = _Peer(pid, uid, gid, process_start_time(pid))
                buffered = BufferedByteReceiveStream(stream)
                with anyio.fail_after(_HANDSHAKE_TIMEOUT_S):
                    n = decode_len(await buffered.receive_exactly(LEN.size))
                    msg = json.loads(await buffered.receive_exactly(n))
                if not isinstance(msg, dict):
                    raise _RefusedError(_errno.EINVAL, "registration must be a JSON object")
                op = msg.get("op")
                if op == "iov":
                    await self._serve_iov(stream, buffered, msg, peer)
                elif op == "ior":
                    await self._serve_ring(stream, buffered, msg, peer)
                else:
                    raise _RefusedError(_errno.EINVAL, f"unknown op {op!r}")
            except _RefusedError as e:
                await _reply(stream, {"ok": False, "errno": e.errno, "message": e.message})
            except (
                anyio.EndOfStream,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
                TimeoutError,
            ):
                pass
            except (ValueError, OSError) as e:
                log.warning("usrbio: bad registration: %s", e)
            except Exception:  # one bad client must never take the agent down
                log.exception("usrbio connection failed")

    # -- Iovs -----------------------------------------------------------------------

    async def _serve_iov(
        self,
        stream: SocketStream,
        buffered: BufferedByteReceiveStream,
        msg: dict[str, Any],
        peer: _Peer,
    ) -> None:
        try:
            iov_id = bytes.fromhex(str(msg.get("id", "")))
        except ValueError:
            iov_id = b""
        if len(iov_id) != 16:
            raise _RefusedError(_errno.EINVAL, "iov id must be 16 bytes (hex)")
        if iov_id in self._iovs:
            raise _RefusedError(_errno.EEXIST, "iov id already registered")
        path, size = _validated_path(msg.get("path"), IOV_PREFIX, msg.get("size"), peer.uid)
        try:
            # the owner is checked again on the open descriptor (the path could change)
            region = ShmRegion.open(path, size, region_id=iov_id.hex(), owner_uid=peer.uid)
        except FsError as e:
            raise _RefusedError(e.errno, e.message) from None
        iov = _AgentIov(iov_id, region, peer.uid)
        self._iovs[iov_id] = iov
        try:
            hook = getattr(self.backend, "attach_region", None)
            if hook is not None:
                try:
                    await hook(region)
                except Exception as e:
                    log.exception("usrbio attach_region failed")
                    raise _RefusedError(_errno_of(e), f"cannot attach the Iov: {e}") from None
            await _reply(stream, {"ok": True})
            event(log, "usrbio iov registered", pid=peer.pid, size=size)
            await _until_eof(buffered)
        finally:
            with anyio.CancelScope(shield=True):
                await self._drop_iov(iov, peer)

    async def _drop_iov(self, iov: _AgentIov, peer: _Peer) -> None:
        iov.closing = True
        if iov.users:
            await iov.idle.wait()
        self._iovs.pop(iov.id, None)
        hook = getattr(self.backend, "detach_region", None)
        if hook is not None:
            try:
                await hook(iov.region)
            except Exception:
                log.exception("usrbio detach_region failed")
        iov.region.close(unlink=_gone(peer))

    # -- rings ----------------------------------------------------------------------

    async def _serve_ring(
        self,
        stream: SocketStream,
        buffered: BufferedByteReceiveStream,
        msg: dict[str, Any],
        peer: _Peer,
    ) -> None:
        path, size = _validated_path(msg.get("path"), IOR_PREFIX, msg.get("size"), peer.uid)
        try:
            region = ShmRegion.open(path, size, owner_uid=peer.uid)
        except FsError as e:
            raise _RefusedError(e.errno, e.message) from None
        try:
            ring = Ring(region.buf)
        except ValueError as e:
            region.close(unlink=False)
            raise _RefusedError(_errno.EINVAL, str(e)) from None
        raw = stream.extra(SocketAttribute.raw_socket)
        ctx = _RingCtx(ring, raw, peer)
        self._rings += 1
        try:
            await _reply(stream, {"ok": True})
            event(
                log,
                "usrbio ring registered",
                pid=peer.pid,
                entries=ring.entries,
                for_read=ring.for_read,
            )
            async with anyio.create_task_group() as tg:
                await self._ring_loop(ctx, buffered, tg)
            # leaving the task group waited for every batch of this ring
        finally:
            self._rings -= 1
            ring.release()
            region.close(unlink=_gone(peer))

    async def _ring_loop(self, ctx: _RingCtx, buffered: BufferedByteReceiveStream, tg: Any) -> None:
        ring = ctx.ring
        depth = ring.io_depth
        fill_wait = None if ring.timeout_ms < 0 else ring.timeout_ms / 1000
        pending_since: float | None = None
        while True:
            wait: float | None = None
            if pending_since is not None and fill_wait is not None:
                wait = max(0.0, pending_since + fill_wait - time.monotonic())
            with anyio.move_on_after(wait) as scope:
                try:
                    await buffered.receive(4096)  # wake-up bytes: their value does not matter
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return
            timed_out = scope.cancelled_caught
            while True:
                queued = ring.sqes_queued()
                if queued == 0:
                    pending_since = None
                    break
                if depth > 0:
                    if queued >= depth:
                        take = depth
                    elif timed_out:
                        take = queued
                    else:
                        pending_since = pending_since or time.monotonic()
                        break
                elif depth < 0:
                    take = min(queued, -depth)
                else:
                    take = queued
                pending_since = None
                batch = []
                for _ in range(take):
                    sqe = ring.pop_sqe()
                    if sqe is None:
                        break
                    batch.append(sqe)
                self.stats["batches"] += 1
                tg.start_soon(self._run_batch, ctx, batch)

    async def _run_batch(self, ctx: _RingCtx, batch: list[tuple[int, int]]) -> None:
        results: list[tuple[int, int, int]] = []

        async def one(index: int, userdata: int) -> None:
            results.append((index, await self._one_io(ctx, index), userdata))

        batched = ctx.ring.for_read and getattr(self.backend, "read_batch", None) is not None
        reads: list[tuple[int, int]] = []
        async with anyio.create_task_group() as tg:
            for index, userdata in batch:
                if not 0 <= index < ctx.ring.entries or index in ctx.inflight:
                    results.append((index, -_errno.EINVAL, userdata))
                    continue
                ctx.inflight.add(index)
                if batched:
                    reads.append((index, userdata))
                else:
                    tg.start_soon(one, index, userdata)
            if reads:
                results.extend(await self._read_batch(ctx, reads))
        deadline = time.monotonic() + _CQ_FULL_GIVE_UP_S
        while results:
            results = self._complete(ctx, results)
            if results:  # the completion queue is full: wait for the application to reap
                if time.monotonic() > deadline:  # the application stopped reaping: drop
                    log.warning(
                        "usrbio: completion queue of pid %d stays full; dropping", ctx.peer.pid
                    )
                    for index, _, _ in results:
                        ctx.inflight.discard(index)
                    break
                await anyio.sleep(0.001)

    @staticmethod
    def _complete(ctx: _RingCtx, results: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """Post completions and wake the application; returns those the full queue refused."""
        posted = 0
        for k, (index, result, userdata) in enumerate(results):
            if not ctx.ring.push_cqe(index, result, userdata):
                left = results[k:]
                break
            ctx.inflight.discard(index)
            posted += 1
        else:
            left = []
        if posted and not _wake_up_pending(ctx.sock):
            try:
                ctx.sock.send(b"c", socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except OSError:
                pass  # buffer full (wake-ups pending) or app gone (EOF handled by the loop)
        return left

    def _check_entry(self, ctx: _RingCtx, index: int) -> tuple[IoArgs, _AgentIov] | int:
        """The entry's arguments and Iov, or -errno if the entry is invalid (or 0 for an empty I/O)."""
        args = ctx.ring.read_args(index)
        self.stats["ios"] += 1
        iov = self._iovs.get(args.buf_id)
        if iov is None or iov.closing:
            return self._fail(_errno.EINVAL)
        if iov.uid != ctx.peer.uid and ctx.peer.uid != 0:
            return self._fail(_errno.EACCES)
        if args.buf_off + args.io_len > iov.region.size:
            return self._fail(_errno.EINVAL)
        if args.file_off + args.io_len > 2**63 - 1:
            return self._fail(_errno.EINVAL)
        if args.io_len == 0:
            return 0
        return args, iov

    async def _authorize(self, ctx: _RingCtx, inode: int, write: bool) -> None:
        key = (inode, write)
        if key not in ctx.authorized:
            hook = getattr(self.backend, "authorize", None)
            if hook is not None:
                await hook(inode, uid=ctx.peer.uid, gid=ctx.peer.gid, pid=ctx.peer.pid, write=write)
            ctx.authorized.add(key)

    async def _read_batch(
        self, ctx: _RingCtx, entries: list[tuple[int, int]]
    ) -> list[tuple[int, int, int]]:
        """Every read of one ring batch through the backend's ``read_batch`` (one call)."""
        out: list[tuple[int, int, int]] = []
        todo: list[tuple[int, int, IoArgs, _AgentIov, memoryview]] = []
        for index, userdata in entries:
            checked = self._check_entry(ctx, index)
            if isinstance(checked, int):
                out.append((index, checked, userdata))
                continue
            args, iov = checked
            if (args.inode, False) not in ctx.authorized:  # asked once per ring and inode
                try:
                    await self._authorize(ctx, args.inode, False)
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception as e:
                    out.append((index, self._fail(_errno_of(e)), userdata))
                    continue
            iov.users += 1
            view = iov.region.buf[args.buf_off : args.buf_off + args.io_len]
            todo.append((index, userdata, args, iov, view))
        if not todo:
            return out
        # Large reads (1 MiB blocks: the disk and the transfer dominate) complete one by
        # one as they finish, so the application refills its ring instead of waiting for
        # the slowest read of the batch (a ring in lockstep). Small reads complete with
        # their batch: there CPU per I/O is the limit, and per-read completions cost more
        # wake-ups and smaller batches on every side (measured: about a third more CPU
        # per 4 KiB read).
        stream = self._streams_reads and sum(a.io_len for _, _, a, _, _ in todo) >= (
            STREAM_MIN_READ * len(todo)
        )
        reported: set[int] = set()  # positions in todo already completed through on_done
        late: list[tuple[int, int, int]] = []  # those the full completion queue refused

        def on_done(got: list[tuple[int, Any]]) -> None:
            done = []
            for k, r in got:
                if k in reported or not 0 <= k < len(todo):
                    continue
                reported.add(k)
                index, userdata, args = todo[k][0], todo[k][1], todo[k][2]
                done.append((index, self._read_result(r, args.io_len), userdata))
            late.extend(self._complete(ctx, done))

        try:
            async with self._limiter:
                try:
                    calls = [(a.inode, a.file_off, v) for _, _, a, _, v in todo]
                    got: list[Any] = list(
                        await self.backend.read_batch(calls, on_done)
                        if stream
                        else await self.backend.read_batch(calls)
                    )
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception as e:  # the whole call failed: every read of it fails alike
                    if not isinstance(e, FsError | OSError):
                        log.exception("usrbio backend read_batch failed")
                    got = [e] * len(todo)
            if len(got) != len(todo):
                log.error("usrbio read_batch returned %d results for %d ios", len(got), len(todo))
                got = [FsError(Code.INTERNAL, "read_batch result count")] * len(todo)
            for k, ((index, userdata, args, _, _), r) in enumerate(zip(todo, got, strict=True)):
                if k not in reported:
                    out.append((index, self._read_result(r, args.io_len), userdata))
            return out + late
        finally:
            for _, _, _, iov, view in todo:
                self._release_view(iov, view)

    def _read_result(self, r: Any, io_len: int) -> int:
        """A backend read's outcome as a completion result (bytes, or -errno)."""
        if isinstance(r, BaseException):
            if not isinstance(r, FsError | OSError):
                log.error("usrbio backend read failed: %r", r)
            return self._fail(_errno_of(r))
        if not isinstance(r, int) or not 0 <= r <= io_len:
            log.error("usrbio backend returned %r for a %d-byte io", r, io_len)
            return self._fail(_errno.EIO)
        self.stats["bytes"] += r
        return r

    @staticmethod
    def _release_view(iov: _AgentIov, view: memoryview) -> None:
        try:
            view.release()
        except BufferError:
            pass  # the backend kept a view; the mapping closes when it drops it
        iov.users -= 1
        if iov.users == 0 and iov.closing:
            iov.idle.set()

    async def _one_io(self, ctx: _RingCtx, index: int) -> int:
        checked = self._check_entry(ctx, index)
        if isinstance(checked, int):
            return checked
        args, iov = checked
        write = not ctx.ring.for_read
        iov.users += 1
        view = iov.region.buf[args.buf_off : args.buf_off + args.io_len]
        try:
            await self._authorize(ctx, args.inode, write)
            async with self._limiter:
                if write:
                    n = await self.backend.write(args.inode, args.file_off, view.toreadonly())
                else:
                    n = await self.backend.read(args.inode, args.file_off, view)
            if not isinstance(n, int) or not 0 <= n <= args.io_len:
                log.error("usrbio backend returned %r for a %d-byte io", n, args.io_len)
                return self._fail(_errno.EIO)
            self.stats["bytes"] += n
            return n
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as e:
            if not isinstance(e, FsError | OSError):
                log.exception("usrbio backend failed")
            return self._fail(_errno_of(e))
        finally:
            self._release_view(iov, view)

    def _fail(self, err: int) -> int:
        self.stats["errors"] += 1
        return -err


@dataclass
class _RingCtx:
    ring: Ring
    sock: socket.socket
    peer: _Peer
    inflight: set[int] = field(default_factory=set)
    authorized: set[tuple[int, bool]] = field(default_factory=set)


def _wake_up_pending(sock: socket.socket) -> bool:
    """True if the application has not yet read our last wake-up byte.

    Then it will return from its next wait at once and look at the completion
    queue, where the completions just posted already are: another byte would
    only cost a send and a wake-up. (The application reads the bytes, then
    reaps, so a byte it reads after this check still leads it to our entries.)
    ``SIOCOUTQ`` on a Unix stream socket: bytes sent and not yet read by the peer.
    """
    try:
        return bool(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])
    except OSError:
        return False


async def _reply(stream: SocketStream, msg: dict[str, Any]) -> None:
    try:
        await stream.send(encode(msg))
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass


async def _until_eof(buffered: BufferedByteReceiveStream) -> None:
    while True:
        try:
            await buffered.receive(4096)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return


def _gone(peer: _Peer) -> bool:
    """True if the registering process no longer exists (then its shm files are ours to remove)."""
    now = process_start_time(peer.pid)
    return now is None or bool(peer.start_time and now and now != peer.start_time)


def _prepare_socket_path(path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if os.path.exists(path):
        if _socket_alive(path):
            raise FsError(
                Code.UNAVAILABLE, f"another usrbio agent is serving {path}", retryable=False
            )
        os.unlink(path)  # stale: a previous daemon crashed


def _remove_socket(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _socket_alive(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()
