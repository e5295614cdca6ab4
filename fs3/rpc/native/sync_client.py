"""Blocking unary calls over the native transport, made from the calling thread.

Why a second client: a synchronous caller of the asyncio client
(:mod:`fs3.rpc.native.client`) has to hand every call to the event loop's
thread and be woken when it ends (``fs3.client.bridge``): two cross-thread
wake-ups per call, which on a busy host cost as much as the RPC itself
(benchmarks/results/meta-ratios-20261201.md measured the same stats 1.5-1.9 x
faster when awaited inside the loop). Here the caller's own thread writes the
CALL frame and reads the answer on a connection of its own: no loop, no hop.

What it shares with the asyncio client, imported rather than copied: the frame
format (:mod:`fs3.rpc.native.wire`), the method ids
(:mod:`fs3.rpc.native.methods`), the connection handshake (the preface and one
``AUTH`` frame with the token, ``fs3.rpc.auth``), where a same-host server's
Unix socket is (:mod:`fs3.rpc.native.endpoints`) and the error mapping: the
server's own ``FsError`` rebuilt from its ErrorDetail, ``UNAVAILABLE``
(retryable) when a connection cannot be made or is lost, ``TIMEOUT``
(retryable) when the deadline passes.

* **One connection per calling thread** (``threading.local``): calls of one
  thread run one at a time, so a connection carries one call at a time and
  needs no locking; Unix socket when the server is on this host, else TCP
  (TLS when the credential names a CA).
* **Deadlines** are socket timeouts, set to what remains before each blocking
  send or receive; the server gets the remaining time in the CALL frame, as
  from the asyncio client. A call that times out closes its connection (its
  answer may be half read; the server cancels the calls of a closed
  connection) and the thread's next call connects again.
* **Reconnect**: a broken connection is dropped and the next call makes a new
  one. An idempotent call (every meta call is: reads are, mutations carry a
  request id meta applies once) that finds a connection *kept from earlier*
  dead before any byte of its answer arrived (the server restarted while the
  connection idled) is sent once more on a new connection at once. Everything
  else surfaces as a retryable error for the caller's retry policy
  (``fs3.client.meta_client``).
* **Bounded**: a header's lengths are checked against ``max_message_bytes``
  and ``max_payload_bytes`` before anything is allocated; a larger answer is
  refused (the connection closes, the call fails, not retryable: it would be
  refused again). Unary answers with a bulk payload are not taken (this client
  serves message-only calls).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl as _ssl
import threading
import time
import weakref
from typing import Any

from fs3.errors import Code, FsError
from fs3.rpc.native import endpoints, wire
from fs3.rpc.native.client import (
    CONNECT_TIMEOUT_S,
    _connect_timeout,
    _from_detail,
    _keepalive,
    _unavailable,
)
from fs3.rpc.native.methods import BY_PATH
from fs3.rpc.native.wire import (
    CALL,
    ERROR,
    HAS_MESSAGE,
    HEADER_SIZE,
    KIND_NAMES,
    KINDS,
    PACK_HEADER,
    REPLY,
    ProtocolViolation,
)

RECV_BYTES = 64 * 1024  # a connection's receive buffer (meta answers are far smaller)

_UNPACK = wire.HEADER.unpack_from

# Bumped in a forked child: a connection made before the fork is the parent's too (the
# thread-local copied with the memory), so the child never uses it, and never closes
# it either (the socket is shared: a shutdown would cut the parent's).
_generation = 0


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


class _Lost(Exception):
    """The connection broke; ``before_reply``: no byte of the answer had arrived."""

    def __init__(self, why: str, before_reply: bool) -> None:
        super().__init__(why)
        self.before_reply = before_reply


class _Conn:
    """One thread's connection: its socket and receive buffer."""

    __slots__ = (
        "sock",
        "via",
        "buf",
        "view",
        "start",
        "end",
        "rid",
        "used",
        "generation",
        "_fin",
        "__weakref__",
    )

    def __init__(self, sock: socket.socket, via: str) -> None:
        self.sock = sock
        self.via = via
        self.buf = bytearray(RECV_BYTES)
        self.view = memoryview(self.buf)
        self.start = 0  # unparsed bytes are buf[start:end]
        self.end = 0
        self.rid = 0
        self.used = False  # a call completed on it (a later failure may be a stale socket)
        self.generation = _generation  # this process's (see _forked)
        # a thread that exits drops its connection: the socket closes with it
        self._fin = weakref.finalize(self, sock.close)

    def close(self) -> None:
        self._fin()

    @property
    def closed(self) -> bool:
        return not self._fin.alive


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return deadline - time.monotonic()


class SyncNativeClient:
    """Blocking unary calls to one server address, one connection per calling thread.

    Args mirror :class:`fs3.rpc.native.client.NativeChannel`'s (same limits,
    same credential); see :func:`sync_client` for one built from the process's
    ``[rpc]`` settings.
    """

    def __init__(
        self,
        address: str,
        *,
        socket_dir: str = endpoints.DEFAULT_SOCKET_DIR,
        prefer_uds: bool = True,
        max_message_bytes: int = 256 << 20,
        max_payload_bytes: int = 64 << 20,
        token: str = "",
        ssl: _ssl.SSLContext | None = None,
        server_hostname: str = "fs3",
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.address = address
        self.socket_dir = socket_dir
        self.prefer_uds = prefer_uds
        self.max_message_bytes = max_message_bytes
        self.max_payload_bytes = max_payload_bytes
        self.token = token.encode("ascii")
        self.ssl = ssl
        self.server_hostname = server_hostname
        self.connect_timeout_s = connect_timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: weakref.WeakSet[_Conn] = weakref.WeakSet()
        self._closed = False
        self.connects = 0  # connections made (tests, metrics)

    # ------------------------------------------------------------------ calls

    def call(
        self,
        path: str,
        request: Any,
        *,
        timeout: float | None = None,
        idempotent: bool = True,
    ) -> Any:
        """Call the unary method at gRPC ``path`` (``/fs3.v1.MetaService/Stat``).

        Returns the response message; raises :class:`FsError` (see the module
        docstring for which, and when a call is sent twice).
        """
        method = BY_PATH.get(path)
        if method is None or method.client_streaming or method.server_streaming:
            raise FsError(Code.INVALID_ARGUMENT, f"{path}: not a unary fs3 method")
        body = request.SerializeToString()
        if len(body) > self.max_message_bytes:
            raise FsError(
                Code.INVALID_ARGUMENT,
                f"{path}: request of {len(body)} bytes exceeds the limit "
                f"({self.max_message_bytes})",
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        conn = self._connection(deadline)
        reused = conn.used
        try:
            reply = self._exchange(conn, method.id, path, body, deadline)
        except _Lost as e:
            self._drop(conn)
            if not (reused and idempotent and e.before_reply):
                raise _unavailable(self.address, f"connection lost ({e})") from None
            conn = self._connection(deadline)  # the server restarted while it idled
            try:
                reply = self._exchange(conn, method.id, path, body, deadline)
            except _Lost as e2:
                self._drop(conn)
                raise _unavailable(self.address, f"connection lost ({e2})") from None
        return method.response.FromString(reply)

    def _exchange(
        self, conn: _Conn, mid: int, path: str, body: bytes, deadline: float | None
    ) -> bytes:
        """Send one CALL and read frames until its answer; the answer's body."""
        conn.rid += 1
        rid = conn.rid
        tmo = 0
        left = _remaining(deadline)
        if left is not None:
            if left <= 0:
                raise FsError(Code.TIMEOUT, f"{path}: deadline exceeded", retryable=True)
            tmo = max(1, int(left * 1000))
        frame = PACK_HEADER(CALL, HAS_MESSAGE, 0, mid, rid, tmo, len(body), 0) + body
        try:
            self._settimeout(conn, deadline, path)
            conn.sock.sendall(frame)
            while True:
                kind, rid_in, blen = self._read_header(conn, deadline, path)
                answer = self._read_body(conn, blen, deadline, path)
                if rid_in != rid:
                    continue  # cannot happen on a connection closed at every timeout; harmless
                if kind == REPLY:
                    conn.used = True
                    return answer
                if kind == ERROR:
                    conn.used = True
                    raise _from_detail(answer)
                raise ProtocolViolation(f"a server sent a {KIND_NAMES[kind]} frame to a unary call")
        except TimeoutError:
            self._drop(conn)
            raise FsError(Code.TIMEOUT, f"{path}: deadline exceeded", retryable=True) from None
        except ProtocolViolation as e:
            self._drop(conn)
            raise FsError(
                Code.UNAVAILABLE,
                f"{self.address}: {path}: refused the answer: {e}",
                retryable=False,  # the same answer would be refused again
            ) from None
        except (ConnectionError, _ssl.SSLError) as e:
            raise _Lost(str(e) or type(e).__name__, conn.end == conn.start) from None
        except OSError as e:
            self._drop(conn)
            raise _unavailable(self.address, f"{path}: {e}") from None
        except FsError:
            raise  # the server's answer: the connection is in step
        except BaseException:
            # interrupted (KeyboardInterrupt in a blocking receive): the answer may be
            # half read, so the connection is out of step for good
            self._drop(conn)
            raise

    # ------------------------------------------------------------------ reading

    def _settimeout(self, conn: _Conn, deadline: float | None, path: str) -> None:
        left = _remaining(deadline)
        if left is not None and left <= 0:
            raise TimeoutError(path)
        conn.sock.settimeout(left)

    def _fill(self, conn: _Conn, need: int, deadline: float | None, path: str) -> None:
        """Receive until ``need`` unparsed bytes are buffered (``need`` <= the buffer)."""
        while conn.end - conn.start < need:
            if conn.end + (need - (conn.end - conn.start)) > len(conn.buf):
                n = conn.end - conn.start  # make room: the partial frame to the front
                conn.buf[:n] = conn.buf[conn.start : conn.end]
                conn.start, conn.end = 0, n
            self._settimeout(conn, deadline, path)
            got = conn.sock.recv_into(conn.view[conn.end :])
            if got == 0:
                raise ConnectionResetError("closed by the server")
            conn.end += got

    def _read_header(self, conn: _Conn, deadline: float | None, path: str) -> tuple[int, int, int]:
        self._fill(conn, HEADER_SIZE, deadline, path)
        kind, _flags, _res, _mid, rid, _tmo, blen, plen = _UNPACK(conn.buf, conn.start)
        if kind not in KINDS:
            raise ProtocolViolation(f"bad frame kind {kind}")
        if blen > self.max_message_bytes:
            raise ProtocolViolation(
                f"answer of {blen} bytes exceeds the limit {self.max_message_bytes}"
            )
        if plen:
            raise ProtocolViolation(
                f"an answer with a {plen}-byte payload (this client takes message-only calls)"
            )
        conn.start += HEADER_SIZE
        return kind, rid, blen

    def _read_body(self, conn: _Conn, blen: int, deadline: float | None, path: str) -> bytes:
        if blen <= len(conn.buf):
            self._fill(conn, blen, deadline, path)
            out = bytes(conn.view[conn.start : conn.start + blen])
            conn.start += blen
            if conn.start == conn.end:
                conn.start = conn.end = 0
            return out
        # larger than the buffer (checked against the limit already): its own buffer
        big = bytearray(blen)
        have = conn.end - conn.start
        big[:have] = conn.view[conn.start : conn.end]
        conn.start = conn.end = 0
        view = memoryview(big)
        while have < blen:
            self._settimeout(conn, deadline, path)
            got = conn.sock.recv_into(view[have:])
            if got == 0:
                raise ConnectionResetError("closed by the server")
            have += got
        return bytes(big)

    # ------------------------------------------------------------------ connections

    def _connection(self, deadline: float | None) -> _Conn:
        conn: _Conn | None = getattr(self._local, "conn", None)
        if conn is not None and not conn.closed:
            if conn.generation == _generation:
                return conn
            conn._fin.detach()  # the parent's connection (see _forked): leave it alone
        if self._closed:
            raise _unavailable(self.address, "client closed")
        conn = self._connect(deadline)
        self._local.conn = conn
        with self._lock:
            if self._closed:
                conn.close()
                raise _unavailable(self.address, "client closed")
            self._conns.add(conn)
        return conn

    def _connect(self, deadline: float | None) -> _Conn:
        left = _remaining(deadline)
        limit = self.connect_timeout_s if left is None else min(left, self.connect_timeout_s)
        if limit <= 0:
            raise FsError(Code.TIMEOUT, f"{self.address}: deadline exceeded", retryable=True)
        sock: socket.socket | None = None
        via = "unix"
        if self.prefer_uds:
            path = endpoints.uds_path(self.address, self.socket_dir)
            if endpoints.exists(path):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(limit)
                    sock.connect(path)
                except OSError:
                    sock.close()
                    sock = None  # a stale socket: TCP decides
        if sock is None:
            via = "tcp"
            host, _, port = self.address.rpartition(":")
            try:
                sock = socket.create_connection((host.strip("[]"), int(port)), timeout=limit)
            except TimeoutError:
                raise _connect_timeout(self.address, limit) from None
            except (OSError, ValueError) as e:
                raise _unavailable(self.address, f"cannot connect: {e}") from None
            _keepalive(sock)
            if self.ssl is not None:
                try:
                    sock = self.ssl.wrap_socket(sock, server_hostname=self.server_hostname)
                except (OSError, _ssl.SSLError) as e:
                    sock.close()
                    raise _unavailable(self.address, f"TLS handshake failed: {e}") from None
        hello = wire.PREFACE
        if self.token:  # the credential, checked once per connection (fs3.rpc.auth)
            hello += wire.pack(wire.AUTH, HAS_MESSAGE, 0, 0, 0, self.token)
        try:
            sock.sendall(hello)
        except OSError as e:
            sock.close()
            raise _unavailable(self.address, f"cannot connect: {e}") from None
        self.connects += 1
        return _Conn(sock, via)

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with self._lock:
            self._conns.discard(conn)

    @property
    def via(self) -> str:
        """``unix`` or ``tcp``: how this thread's connection goes ("" before it has one)."""
        conn: _Conn | None = getattr(self._local, "conn", None)
        return conn.via if conn is not None and not conn.closed else ""

    def close(self) -> None:
        """Close every thread's connection; later calls fail with UNAVAILABLE."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), weakref.WeakSet()
        for c in conns:
            if c.generation != _generation:
                c._fin.detach()  # made before a fork: the parent's
                continue
            with contextlib.suppress(OSError):
                c.sock.shutdown(socket.SHUT_RDWR)  # a thread blocked in a call wakes up
            c.close()


def sync_client(address: str, rpc: Any = None, credential: Any = None) -> SyncNativeClient:
    """A :class:`SyncNativeClient` to ``address`` configured exactly as the asyncio
    channel :func:`fs3.rpc.channel.native_channel` builds for it: the limits of
    ``rpc`` (default: the process's ``[rpc]``), ``credential`` (default: the process's)."""
    from fs3.rpc.channel import native_channel

    ch = native_channel(address, rpc, credential)  # only configured: it connects on first use
    return SyncNativeClient(
        address,
        socket_dir=ch.socket_dir,
        prefer_uds=ch.prefer_uds,
        max_message_bytes=ch.max_message_bytes,
        max_payload_bytes=ch.max_payload_bytes,
        token=ch.token.decode("ascii"),
        ssl=ch.ssl,
        server_hostname=ch.server_hostname,
    )


class SyncPool:
    """One :class:`SyncNativeClient` per address, shared by a process's threads."""

    def __init__(self, rpc: Any = None, credential: Any = None) -> None:
        self._rpc = rpc
        self._credential = credential
        self._clients: dict[str, SyncNativeClient] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, address: str) -> SyncNativeClient:
        c = self._clients.get(address)
        if c is not None:
            return c
        with self._lock:
            if self._closed:
                raise _unavailable(address, "client closed")
            c = self._clients.get(address)
            if c is None:
                c = sync_client(address, self._rpc, self._credential)
                self._clients[address] = c
            return c

    def close(self) -> None:
        with self._lock:
            self._closed = True
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()


__all__ = ["SyncNativeClient", "SyncPool", "sync_client"]
