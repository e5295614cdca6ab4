"""USRBIO, application side: zero-copy batched I/O through shared-memory rings.

Modelled on 3FS's ``hf3fs_usrbio.h``; the names are a contract::

    from fs3.usrbio import Iov, Ior, reg_fd, dereg_fd, prep_io, submit_ios, wait_for_ios

    iov = Iov("/mnt/fs3", 64 << 20)               # shared memory the agent maps too
    ior = Ior("/mnt/fs3", entries=64, for_read=True)
    fd = os.open("/mnt/fs3/data.bin", os.O_RDONLY); reg_fd(fd)
    for i in range(8):
        prep_io(ior, iov, i << 20, fd, i << 20, 1 << 20, userdata=i)
    submit_ios(ior)
    for c in wait_for_ios(ior, max_results=8, min_results=8):
        assert c.result >= 0, os.strerror(-c.result)   # bytes, or -errno
    # the data is in iov.buf (np.frombuffer(iov.buf, np.uint8) wraps it)

Payload never crosses a socket between the application and the agent: the
agent reads/writes ``iov.buf`` in place (and with the shm transport the
storage server does too). Only 56-byte argument records, 16-byte submissions
and 24-byte completions go through the ring. A ring is not thread-safe (use one
per thread), exactly like 3FS's.

Errors: an fd that was not registered, is not on the ring's mount or was not
opened for the ring's direction -> ``FsError(BAD_FD)`` (EBADF); a range outside
the Iov -> ``FsError(INVALID_ARGUMENT)`` (EINVAL); a full ring ->
``FsError(RING_FULL)`` (EAGAIN: reap completions first); per-I/O failures
arrive as negative ``result`` (-errno); a dead agent -> ``FsError(UNAVAILABLE)``
from ``wait_for_ios``/``submit_ios`` instead of a hang.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import json
import os
import select
import socket
import stat
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from fs3.errors import Code, FsError, invalid
from fs3.transport.region import ShmRegion
from fs3.usrbio.ring import IoArgs, Ring, ring_size
from fs3.usrbio.shm import IOR_PREFIX, IOV_PREFIX, agent_socket_path, decode_len, encode

_REPLY_TIMEOUT_S = 10.0


def _agent_gone(where: str) -> FsError:
    return FsError(
        Code.UNAVAILABLE, f"usrbio agent for {where} is gone", errno=_errno.EIO, retryable=False
    )


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionResetError("agent closed the connection")
        out += chunk
    return bytes(out)


def _register(
    mountpoint: str, agent_socket: str | None, msg: dict[str, Any]
) -> tuple[socket.socket, str]:
    """Open a connection to the agent and register one object on it."""
    path = agent_socket or agent_socket_path(mountpoint)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_REPLY_TIMEOUT_S)
    try:
        sock.connect(path)
    except OSError as e:
        sock.close()
        raise FsError(
            Code.UNAVAILABLE,
            f"no usrbio agent serves {mountpoint!r} (socket {path}: {e.strerror}); is it an fs3 mount?",
            errno=_errno.ENODEV,
            retryable=False,
        ) from None
    try:
        sock.sendall(encode(msg))
        reply = json.loads(_recv_exact(sock, decode_len(_recv_exact(sock, 4))))
    except (OSError, ValueError) as e:
        sock.close()
        raise FsError(
            Code.UNAVAILABLE,
            f"usrbio agent for {mountpoint!r} did not answer: {e}",
            errno=_errno.EIO,
        ) from None
    if not reply.get("ok"):
        sock.close()
        raise FsError(
            Code(reply.get("code", Code.INVALID_ARGUMENT)),
            f"usrbio agent refused: {reply.get('message', '?')}",
            errno=int(reply.get("errno", _errno.EINVAL)),
        )
    sock.setblocking(False)
    return sock, path


class Iov:
    """A shared-memory I/O buffer registered with the agent of ``mountpoint``.

    ``buf`` is a writable memoryview over all ``size`` bytes. Close it (or use
    ``with``) to deregister and free the memory; a crashed process's Iovs are
    reclaimed by the agent.

    The /dev/shm file is unlinked as soon as the agent has mapped it (the agent
    hands servers its open descriptor, never the name): the memory then lives
    exactly as long as some process maps it, so an Iov cannot outlive its
    process and the agent, however they end (``kill -9``, ``os._exit``, an
    agent stopped first), where unlinking at close or at exit needs a clean
    exit of one of them. ``path`` names that removed file.
    """

    def __init__(self, mountpoint: str, size: int, *, agent_socket: str | None = None) -> None:
        if size <= 0:
            raise invalid(f"Iov size must be > 0, got {size}")
        self.id = uuid.uuid4()
        self.mountpoint = mountpoint
        self.size = size
        self._region = ShmRegion.create(size, prefix=IOV_PREFIX, region_id=self.id.hex)
        try:
            self._sock, self.agent_socket = _register(
                mountpoint,
                agent_socket,
                {"op": "iov", "id": self.id.hex, "path": self._region.path, "size": size},
            )
        except BaseException:
            self._region.close()
            raise
        self._region.unlink()
        self.buf: memoryview = self._region.buf
        self._fin = weakref.finalize(self, _close_all, self._sock, self._region)

    @property
    def closed(self) -> bool:
        return not self._fin.alive

    @property
    def path(self) -> str:
        return self._region.path

    def fileno(self) -> int:
        """The open descriptor of the shared memory (its file is already unlinked)."""
        return self._region.fd

    def close(self) -> None:
        self._fin()

    def __enter__(self) -> Iov:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_all(sock: socket.socket, region: ShmRegion, ring: Ring | None = None) -> None:
    sock.close()
    if ring is not None:
        ring.release()
    region.close()


@dataclass(frozen=True)
class Completion:
    """One finished I/O: ``result`` = bytes transferred, or ``-errno``."""

    index: int
    result: int
    userdata: Any


class Ior:
    """A submission/completion ring for reads (``for_read=True``) or writes.

    ``entries``: I/Os that may be in flight at once. ``io_depth`` (3FS
    semantics): 0 = the agent takes everything queued per batch; n > 0 =
    batches of exactly n (waiting up to ``timeout`` seconds to fill one); n < 0
    = batches of at most -n.
    """

    def __init__(
        self,
        mountpoint: str,
        entries: int,
        for_read: bool,
        io_depth: int = 0,
        timeout: float | None = None,
        *,
        agent_socket: str | None = None,
    ) -> None:
        if not 1 <= entries <= 65536:
            raise invalid(f"Ior entries must be 1..65536, got {entries}")
        if io_depth > entries:
            raise invalid(f"io_depth {io_depth} exceeds entries {entries}")
        self.mountpoint = mountpoint
        self.entries = entries
        self.for_read = for_read
        self.io_depth = io_depth
        self.timeout = timeout
        try:
            self._dev = os.stat(mountpoint).st_dev
        except OSError as e:
            raise FsError(
                Code.INVALID_ARGUMENT, f"mount point {mountpoint!r}: {e.strerror}", errno=e.errno
            ) from None
        self._region = ShmRegion.create(ring_size(entries), prefix=IOR_PREFIX)
        timeout_ms = -1 if timeout is None else max(0, int(timeout * 1000))
        self._ring = Ring.init(self._region.buf, entries, for_read, io_depth, timeout_ms)
        try:
            self._sock, self.agent_socket = _register(
                mountpoint,
                agent_socket,
                {"op": "ior", "path": self._region.path, "size": self._region.size},
            )
        except BaseException:
            self._ring.release()
            self._region.close()
            raise
        self._region.unlink()  # mapped by the agent now: see Iov
        self._free = list(range(entries - 1, -1, -1))
        self._userdata: list[Any] = [None] * entries
        self._dead: FsError | None = None
        self._fin = weakref.finalize(self, _close_all, self._sock, self._region, self._ring)

    @property
    def in_flight(self) -> int:
        return self.entries - len(self._free)

    @property
    def closed(self) -> bool:
        return not self._fin.alive

    def close(self) -> None:
        """Deregister; I/Os still in flight finish in the agent, their results are lost."""
        self._fin()

    def __enter__(self) -> Ior:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_usable(self) -> None:
        if self.closed:
            raise FsError(Code.INVALID_ARGUMENT, "ring is closed", errno=_errno.EBADF)
        if self._dead is not None:
            raise self._dead


# --------------------------------------------------------------------------- fd registration


@dataclass(frozen=True)
class _RegFd:
    dev: int
    inode: int
    readable: bool
    writable: bool
    pin: int  # a dup that keeps the open file (and its inode) alive while registered


_fds: dict[int, _RegFd] = {}


def reg_fd(fd: int) -> int:
    """Register an fd opened through an fs3 mount for USRBIO; returns ``fd``.

    The fd is ``fstat``-ed once: its inode number is the fs3 inode the agent
    operates on (FUSE inode = fs3 inode) and its device ties it to one mount.
    """
    try:
        st = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError as e:
        raise FsError(Code.BAD_FD, f"reg_fd({fd}): {e.strerror}", errno=_errno.EBADF) from None
    if not stat.S_ISREG(st.st_mode):
        raise FsError(Code.BAD_FD, f"reg_fd({fd}): not a regular file", errno=_errno.EBADF)
    acc = flags & os.O_ACCMODE
    old = _fds.pop(fd, None)
    if old is not None:
        os.close(old.pin)
    _fds[fd] = _RegFd(
        st.st_dev,
        st.st_ino,
        acc in (os.O_RDONLY, os.O_RDWR),
        acc in (os.O_WRONLY, os.O_RDWR),
        os.dup(fd),
    )
    return fd


def dereg_fd(fd: int) -> None:
    """Forget a registration made by :func:`reg_fd` (EBADF if there was none)."""
    reg = _fds.pop(fd, None)
    if reg is None:
        raise FsError(Code.BAD_FD, f"dereg_fd({fd}): fd is not registered", errno=_errno.EBADF)
    os.close(reg.pin)


# --------------------------------------------------------------------------- I/O


def prep_io(
    ior: Ior,
    iov: Iov,
    offset_in_iov: int,
    fd: int,
    file_offset: int,
    length: int,
    userdata: Any = None,
) -> int:
    """Queue one I/O of ``length`` bytes between ``iov.buf[offset_in_iov:]`` and ``fd`` at ``file_offset``.

    Returns the slot index. Nothing starts before :func:`submit_ios`.
    """
    ior._check_usable()
    if iov.closed:
        raise FsError(Code.INVALID_ARGUMENT, "Iov is closed", errno=_errno.EBADF)
    reg = _fds.get(fd)
    if reg is None:
        raise FsError(
            Code.BAD_FD, f"fd {fd} is not registered (call reg_fd first)", errno=_errno.EBADF
        )
    if reg.dev != ior._dev:
        raise FsError(
            Code.BAD_FD, f"fd {fd} is not on mount {ior.mountpoint!r}", errno=_errno.EBADF
        )
    if ior.for_read and not reg.readable:
        raise FsError(Code.BAD_FD, f"fd {fd} is not open for reading", errno=_errno.EBADF)
    if not ior.for_read and not reg.writable:
        raise FsError(Code.BAD_FD, f"fd {fd} is not open for writing", errno=_errno.EBADF)
    if iov.agent_socket != ior.agent_socket:
        raise invalid("Iov and Ior belong to different mounts")
    if offset_in_iov < 0 or length < 0 or offset_in_iov + length > iov.size:
        raise invalid(
            f"range [{offset_in_iov}, {offset_in_iov + length}) is outside the {iov.size}-byte Iov"
        )
    if file_offset < 0 or file_offset + length > 2**63 - 1:
        raise invalid(f"bad file offset {file_offset}")
    if not ior._free:
        raise FsError(
            Code.RING_FULL,
            f"ring full ({ior.entries} I/Os in flight); reap completions first",
            errno=_errno.EAGAIN,
        )
    index = ior._free.pop()
    ior._userdata[index] = userdata
    ior._ring.write_args(
        index, IoArgs(iov.id.bytes, offset_in_iov, reg.inode, file_offset, length, index)
    )
    if not ior._ring.push_sqe(index, index):  # cannot happen: slots bound the queue
        ior._free.append(index)
        raise FsError(Code.RING_FULL, "submission queue full", errno=_errno.EAGAIN)
    return index


def submit_ios(ior: Ior) -> None:
    """Tell the agent there is work (one wake-up byte; never blocks)."""
    ior._check_usable()
    try:
        ior._sock.send(b"s", socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
    except BlockingIOError:
        pass  # the agent has unread wake-ups: it will look at the ring anyway
    except OSError:
        ior._dead = _agent_gone(ior.mountpoint)
        raise ior._dead from None


def wait_for_ios(
    ior: Ior, max_results: int, min_results: int = 1, timeout: float | None = None
) -> list[Completion]:
    """Reap up to ``max_results`` completions, waiting for at least ``min_results``.

    Returns early with fewer when ``timeout`` (seconds) passes, and never waits
    for more completions than there are I/Os in flight. Raises
    ``FsError(UNAVAILABLE)`` if the agent died with I/Os outstanding.
    """
    if ior.closed:
        raise FsError(Code.INVALID_ARGUMENT, "ring is closed", errno=_errno.EBADF)
    if max_results <= 0:
        return []
    deadline = None if timeout is None else time.monotonic() + timeout
    out: list[Completion] = []
    poller = select.poll()
    poller.register(ior._sock, select.POLLIN)
    while True:
        while len(out) < max_results:
            c = ior._ring.pop_cqe()
            if c is None:
                break
            index, result, _ud = c
            if not 0 <= index < ior.entries or index in ior._free:
                continue  # not ours (corrupt entry): ignore rather than free a slot twice
            out.append(Completion(index, result, ior._userdata[index]))
            ior._userdata[index] = None
            ior._free.append(index)
        want = min(min_results, len(out) + ior.in_flight, max_results)
        if len(out) >= want:
            return out
        if ior._dead is not None:
            raise ior._dead
        wait_ms = -1
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            wait_ms = max(1, int(left * 1000))
        if not poller.poll(wait_ms):
            continue
        try:
            data = ior._sock.recv(4096)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if not data:
            ior._dead = _agent_gone(ior.mountpoint)
            # completions posted before it died are still valid: loop once more to reap them
            continue
