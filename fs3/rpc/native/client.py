"""Client side of the native transport: a grpc.aio Channel look-alike.

:class:`NativeChannel` implements the four multi-callable factories the
generated stubs call (``unary_unary``, ``unary_stream``, ``stream_stream``,
``stream_unary``), so ``meta_pb2_grpc.MetaServiceStub(NativeChannel(addr))``
is a stub with the same method names, the same ``(request, timeout=...)``
calls and the same streaming call objects, whose calls travel as native
frames. Callers keep their code; only the channel changes.

Failures raise :class:`~fs3.errors.FsError` directly: the server's own
FsError (rebuilt from its ErrorDetail) or a retryable ``UNAVAILABLE`` (cannot
connect, connection lost) / ``TIMEOUT`` (deadline), as ``fs3.rpc.status``
maps gRPC failures.

Bulk payloads: a unary call may pass ``payload=`` (bytes-like, sent after the
request body without a copy into protobuf) and ``into=`` (a writable buffer
the response's payload is received into). A call with ``into`` returns
``(response, payload_len)``; the bytes are then in ``into[:payload_len]``.
``into`` may also be a :data:`Scatter` callable: given the response body and
the payload length once the body has arrived, it returns the buffers the
payload fills in order (adding up to that length), or None to refuse (the
payload is then received into a scratch buffer and dropped).

One connection per channel (reconnected after a failure) carries every call,
multiplexed by request id. Same-host servers are reached over their Unix
socket (:mod:`fs3.rpc.native.endpoints`), others over TCP.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from fs3.errors import Code, FsError
from fs3.proto import common_pb2
from fs3.rpc.native import endpoints, wire
from fs3.rpc.native.methods import BY_PATH
from fs3.rpc.native.wire import (
    CALL,
    CANCEL,
    END,
    ERROR,
    HALF_CLOSE,
    HAS_MESSAGE,
    MESSAGE,
    PACK_HEADER,
    REPLY,
    FrameReceiver,
    ProtocolViolation,
    log,
)

CONNECT_TIMEOUT_S = 10.0

# lays a response payload out over the caller's buffers (see the module docstring)
Scatter = Callable[[bytes | memoryview, int], "list[memoryview] | None"]
Into = memoryview | Scatter


def _scattered(scatter: Scatter, body: bytes | memoryview, length: int) -> list[memoryview] | None:
    """The caller's buffers for a ``length``-byte payload; None if it refused or they
    do not add up to ``length`` (the payload then goes to a scratch buffer)."""
    views = scatter(body, length)
    if views is not None and sum(len(v) for v in views) == length:
        return views
    return None


def _unavailable(what: str, why: str) -> FsError:
    return FsError(Code.UNAVAILABLE, f"{what}: {why}", retryable=True)


def _connect_timeout(what: str, limit: float) -> FsError:
    return FsError(Code.TIMEOUT, f"{what}: connect timed out after {limit:.1f} s", retryable=True)


def _from_detail(body: bytes | memoryview) -> FsError:
    try:
        d = common_pb2.ErrorDetail.FromString(bytes(body))
    except Exception:
        return FsError(Code.INTERNAL, "undecodable error detail from server")
    return FsError(d.code, d.message, errno=d.errno, retryable=d.retryable, leader=d.leader)


def _keepalive(sock: socket.socket) -> None:
    """Detect a dead peer within ~20 s even on an idle or stuck connection."""
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 20_000)


class _StreamState:
    """Receiving half of one streaming call."""

    __slots__ = ("queue", "waiter", "done", "error", "nbytes", "into")

    def __init__(self) -> None:
        # lays out the bulk payload of a response message (StreamCall.set_payload_layout)
        self.into: Scatter | None = None
        self.queue: collections.deque[tuple[bytes | memoryview, int]] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.done = False
        self.error: FsError | None = None
        # queued bytes this stream holds against the connection's max_inflight_bytes;
        # 0 once released (ClientConnection._release_stream)
        self.nbytes = 0

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


class ClientConnection(FrameReceiver):
    """One connection to a server; every call of a channel is multiplexed on it."""

    def __init__(self, channel: NativeChannel) -> None:
        super().__init__()
        self.channel = channel
        self.max_body = channel.max_message_bytes
        self.max_payload = channel.max_payload_bytes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._next_rid = 1
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, _StreamState] = {}
        self._dests: dict[int, Into] = {}
        # unary deadlines (loop time, method id, path, the call's future), enforced by
        # FrameReceiver's sweep from the moment the call starts, queued or sent
        self._deadlines: dict[int, tuple[float, int, str, asyncio.Future[Any]]] = {}
        self._inflight = 0
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._queued_bytes = 0
        self._reading_paused = False

    # -- asyncio -----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            _keepalive(sock)
            self.watch_payloads(sock, tls=transport.get_extra_info("ssl_object") is not None)
        wire.size_unix_send_buffer(sock, self.channel.write_buffer_bytes)
        transport.set_write_buffer_limits(high=self.channel.write_buffer_bytes)
        token = self.channel.token
        if token:  # the credential, checked once per connection (fs3.rpc.auth)
            transport.write(wire.PREFACE + wire.pack(wire.AUTH, wire.HAS_MESSAGE, 0, 0, 0, token))
        else:
            transport.write(wire.PREFACE)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(_unavailable(self.channel.address, f"connection lost ({exc or 'closed'})"))

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._drained is None or self._drained.done():
            self._drained = self._loop.create_future()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def violation(self, message: str) -> None:
        log.warning("closing native connection to %s: %s", self.channel.address, message)
        self.close()

    def close(self) -> None:
        self._broken = True
        if self.transport is not None:
            self.transport.close()
        self._fail_all(_unavailable(self.channel.address, "connection closed"))

    def _fail_all(self, err: FsError) -> None:
        self.closed = True
        self._broken = True
        self.stop_deadlines()
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
        streams, self._streams = self._streams, {}
        for st in streams.values():
            self._release_stream(st)
            if not st.done:
                st.done = True
                st.error = err
                st.wake()
        while self._slot_waiters:
            w = self._slot_waiters.popleft()
            if not w.done():
                w.set_result(None)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self.channel._conn is self:
            self.channel._conn = None

    # -- receiving ---------------------------------------------------------------

    def payload_buffer(
        self, kind: int, request_id: int, length: int, body: bytes | memoryview
    ) -> wire.Payload:
        if kind == MESSAGE:
            st = self._streams.get(request_id)
            if st is not None and st.into is not None:
                views = _scattered(st.into, body, length)
                if views is not None:
                    return views
            return memoryview(bytearray(length))
        dest = self._dests.get(request_id)
        if kind == REPLY and dest is not None:
            if isinstance(dest, memoryview):
                if len(dest) >= length:
                    return dest[:length]
            else:
                views = _scattered(dest, body, length)
                if views is not None:
                    return views
        return memoryview(bytearray(length))

    def frame_received(
        self,
        kind: int,
        flags: int,
        method_id: int,
        request_id: int,
        timeout_ms: int,
        body: bytes | memoryview,
        payload: wire.Payload | None,
    ) -> None:
        if kind == REPLY or kind == ERROR:
            fut = self._pending.pop(request_id, None)
            if fut is not None:
                if not fut.done():
                    if kind == REPLY:
                        fut.set_result((body, payload))
                    else:
                        fut.set_exception(_from_detail(body))
                return
            st = self._streams.pop(request_id, None)
            if st is not None:
                st.done = True
                if kind == ERROR:
                    st.error = _from_detail(body)
                self._release_stream(st)
                st.wake()
            return  # a late answer to a call given up on (cancelled, deadline)
        if kind == MESSAGE:
            st = self._streams.get(request_id)
            if st is not None:
                st.queue.append((body, len(body)))
                st.nbytes += len(body)
                self._queued_bytes += len(body)
                if (
                    self._queued_bytes > self.channel.max_inflight_bytes
                    and not self._reading_paused
                ):
                    self._reading_paused = True
                    if self.transport is not None:
                        self.transport.pause_reading()
                st.wake()
            return
        if kind == END:
            st = self._streams.pop(request_id, None)
            if st is not None:
                st.done = True
                self._release_stream(st)
                st.wake()
            return
        raise ProtocolViolation(f"a server sent a {wire.KIND_NAMES[kind]} frame")

    def _take(self, st: _StreamState) -> bytes | memoryview:
        """The next queued message of a stream, its bytes released if still held."""
        body, n = st.queue.popleft()
        if st.nbytes:
            st.nbytes -= n
            self._consumed(n)
        return body

    def _release_stream(self, st: _StreamState) -> None:
        """A stream that ended (END, ERROR, cancel, connection lost) stops holding the
        connection's reading: no more messages can arrive for it, so its unread ones
        need no backpressure, and a consumer that drops them (or the call) would
        otherwise keep the connection paused, and every call on it waiting, for good.
        What is still queued stays readable and is freed with the call object."""
        n, st.nbytes = st.nbytes, 0
        if n:
            self._consumed(n)

    def _consumed(self, nbytes: int) -> None:
        self._queued_bytes -= nbytes
        if self._reading_paused and self._queued_bytes <= self.channel.max_inflight_bytes // 2:
            self._reading_paused = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()

    # -- sending -------------------------------------------------------------------

    @staticmethod
    async def _wait_unless_failed(w: asyncio.Future[Any], call: asyncio.Future[Any]) -> None:
        """Wait for ``w``, or raise the call's error if it fails first (its deadline
        passed while it waited to be sent)."""
        await asyncio.wait((w, call), return_when=asyncio.FIRST_COMPLETED)
        if call.done():
            call.result()

    async def _acquire_slot(self, call: asyncio.Future[Any]) -> None:
        """Wait for a free call slot; raise the call's error if it fails first."""
        while self._inflight >= self.channel.max_inflight_calls and not self.closed:
            w = self._loop.create_future()
            self._slot_waiters.append(w)
            try:
                await self._wait_unless_failed(w, call)
            except BaseException:
                if w.done():
                    self._wake_slot_waiter()  # the free slot this waiter was given goes on
                else:
                    w.cancel()  # skipped by _wake_slot_waiter
                raise
        if self.closed:
            raise _unavailable(self.channel.address, "connection closed")
        self._inflight += 1

    def _wake_slot_waiter(self) -> None:
        while self._slot_waiters:
            w = self._slot_waiters.popleft()
            if not w.done():
                w.set_result(None)
                break

    async def writable(self, call: asyncio.Future[Any] | None = None) -> None:
        """Wait until the transport takes more bytes; with ``call``, raise its
        error as soon as it fails (deadline) instead."""
        while self._write_paused and not self.closed and self._drained is not None:
            if call is None:
                await asyncio.shield(self._drained)
            else:
                await self._wait_unless_failed(self._drained, call)
        if self.closed:
            raise _unavailable(self.channel.address, "connection closed")

    def send(
        self,
        kind: int,
        flags: int,
        mid: int,
        rid: int,
        timeout_ms: int,
        body: bytes,
        payload: Any = None,
    ) -> None:
        t = self.transport
        if t is None or self.closed:
            raise _unavailable(self.channel.address, "connection closed")
        if payload is None or not len(payload):
            self.write_frame(t, wire.pack(kind, flags, mid, rid, timeout_ms, body))
        else:
            self.write_frame(
                t, wire.pack(kind, flags, mid, rid, timeout_ms, body, len(payload)), payload
            )

    def new_rid(self) -> int:
        rid = self._next_rid
        self._next_rid = rid + 1
        return rid

    def cancel(self, mid: int, rid: int) -> None:
        self._pending.pop(rid, None)
        st = self._streams.pop(rid, None)
        if st is not None:
            st.queue.clear()  # a cancelled stream is not read any more
            self._release_stream(st)
        if self.transport is not None and not self.closed:
            self.write_frame(self.transport, wire.pack(CANCEL, 0, mid, rid, 0, b""))

    async def unary(
        self,
        mid: int,
        path: str,
        body: bytes,
        timeout: float | None,  # noqa: ASYNC109 - travels to the server as the deadline
        payload: Any = None,
        into: Into | None = None,
        deser: Callable[[Any], Any] | None = None,
    ) -> Any:
        """One unary call: ``(body, payload)`` of the answer, or with ``deser``
        the stub's result (the message; with ``into`` or a payload a tuple)."""
        if len(body) > self.max_body or (payload is not None and len(payload) > self.max_payload):
            # the server would close the connection (and every call on it) for this frame
            raise FsError(
                Code.INVALID_ARGUMENT,
                f"{path}: request of {len(body)} + {0 if payload is None else len(payload)} bytes "
                f"exceeds the limits ({self.max_body} + {self.max_payload})",
            )
        rid = self._next_rid
        self._next_rid = rid + 1
        loop = self._loop
        fut: asyncio.Future[Any] = loop.create_future()
        pending = self._pending
        deadline = 0.0
        if timeout is not None:
            # the deadline runs from here: a call waiting for a slot or for a
            # backed-up connection fails with TIMEOUT on time (expire_deadlines)
            deadline = loop.time() + timeout
            self._deadlines[rid] = (deadline, mid, path, fut)
            if deadline < self._sweep_at:
                self.arm_deadline(deadline)
        slot = False
        waited = False
        try:
            if self._inflight >= self.channel.max_inflight_calls:
                waited = True
                await self._acquire_slot(fut)
            else:
                self._inflight += 1
            slot = True
            if self._write_paused:
                waited = True
                await self.writable(fut)
            t = self.transport
            if t is None or self.closed:
                raise _unavailable(self.channel.address, "connection closed")
            tmo = 0
            if waited:
                if fut.done():  # failed (deadline) just as the wait ended
                    fut.result()
                if timeout is not None:
                    tmo = max(1, int((deadline - loop.time()) * 1000))  # what remains
            elif timeout is not None:  # sent at once: all of it (no second clock read)
                tmo = max(1, int(timeout * 1000))
            pending[rid] = fut
            if into is not None:
                self._dests[rid] = into
            if payload is None or not len(payload):
                self.write_one(
                    t, PACK_HEADER(CALL, HAS_MESSAGE, 0, mid, rid, tmo, len(body), 0) + body
                )
            else:
                head = PACK_HEADER(CALL, HAS_MESSAGE, 0, mid, rid, tmo, len(body), len(payload))
                self.write_frame(t, head + body, payload)
            body_in, pl = await fut
            if deser is None:
                return body_in, pl
            resp = deser(body_in)
            if into is not None:
                return resp, wire.payload_len(pl)
            if pl is not None:
                return resp, pl
            return resp
        except asyncio.CancelledError:
            if pending.get(rid) is fut:
                self.cancel(mid, rid)
            raise
        finally:
            if timeout is not None:
                self._deadlines.pop(rid, None)
            if into is not None:
                self._dests.pop(rid, None)
            pending.pop(rid, None)
            if slot:
                self._inflight -= 1
                if self._slot_waiters:
                    self._wake_slot_waiter()

    def expire_deadlines(self, now: float) -> float:
        """Fail every call past its deadline with TIMEOUT (and CANCEL it on the server)."""
        nxt = math.inf
        for rid, (deadline, mid, path, fut) in list(self._deadlines.items()):
            if deadline > now:
                nxt = min(nxt, deadline)
                continue
            del self._deadlines[rid]
            if self._pending.get(rid) is fut:
                self.cancel(mid, rid)  # sent: the server stops working on it too
            if not fut.done():
                fut.set_exception(
                    FsError(Code.TIMEOUT, f"{path}: deadline exceeded", retryable=True)
                )
        return nxt

    def open_stream(
        self, mid: int, body: bytes | None, timeout: float | None
    ) -> tuple[int, _StreamState]:
        rid = self.new_rid()
        st = _StreamState()
        self._streams[rid] = st
        tmo = max(1, int(timeout * 1000)) if timeout else 0
        if body is None:
            self.send(CALL, 0, mid, rid, tmo, b"")
        else:
            self.send(CALL, HAS_MESSAGE, mid, rid, tmo, body)
        return rid, st


class NativeChannel:
    """A channel to one server address over the native transport."""

    def __init__(
        self,
        address: str,
        *,
        socket_dir: str = endpoints.DEFAULT_SOCKET_DIR,
        prefer_uds: bool = True,
        max_inflight_calls: int = 1024,
        max_inflight_bytes: int = 128 << 20,
        max_message_bytes: int = 256 << 20,
        max_payload_bytes: int = 64 << 20,
        write_buffer_bytes: int = 4 << 20,
        token: str = "",
        ssl: Any = None,
        server_hostname: str = "fs3",
    ) -> None:
        self.address = address
        self.token = token.encode("ascii")  # sent in the AUTH frame ("" = none)
        self.ssl = ssl  # a client SSLContext for TCP (same-host Unix sockets need none)
        self.server_hostname = server_hostname
        self.socket_dir = socket_dir
        self.prefer_uds = prefer_uds
        self.max_inflight_calls = max_inflight_calls
        self.max_inflight_bytes = max_inflight_bytes
        self.max_message_bytes = max_message_bytes
        self.max_payload_bytes = max_payload_bytes
        self.write_buffer_bytes = write_buffer_bytes
        self._conn: ClientConnection | None = None
        self._connecting: asyncio.Task[ClientConnection] | None = None
        self._closed = False
        self.via = ""  # "unix" or "tcp" once connected (tests, logs)

    # -- grpc.aio.Channel surface used by generated stubs --------------------------

    def unary_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        **_: Any,
    ) -> UnaryUnary:
        return UnaryUnary(self, method, response_deserializer)

    def unary_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        **_: Any,
    ) -> StreamFactory:
        return StreamFactory(self, method, response_deserializer, client_streaming=False)

    def stream_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        **_: Any,
    ) -> StreamFactory:
        return StreamFactory(self, method, response_deserializer, client_streaming=True)

    # A stream-unary call streams its requests like a stream-stream one, so the same
    # client-streaming call object serves both.
    stream_unary = stream_stream

    async def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- connecting ------------------------------------------------------------

    async def connection(self, timeout: float | None = None) -> ClientConnection:  # noqa: ASYNC109
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise _unavailable(self.address, "channel closed")
        task = self._connecting
        if task is None or task.done():
            task = self._connecting = asyncio.get_running_loop().create_task(self._connect())
        limit = CONNECT_TIMEOUT_S if timeout is None else min(timeout, CONNECT_TIMEOUT_S)
        try:
            return await asyncio.wait_for(asyncio.shield(task), limit)
        except TimeoutError:
            raise _connect_timeout(self.address, limit) from None

    async def _connect(self) -> ClientConnection:
        loop = asyncio.get_running_loop()
        try:
            if self.prefer_uds:
                path = endpoints.uds_path(self.address, self.socket_dir)
                if endpoints.exists(path):
                    try:
                        _t, proto = await loop.create_unix_connection(
                            lambda: ClientConnection(self), path
                        )
                        self.via = "unix"
                        self._conn = proto
                        return proto
                    except OSError:
                        pass  # a stale socket: TCP decides
            host, _, port = self.address.rpartition(":")
            try:
                _t, proto = await loop.create_connection(
                    lambda: ClientConnection(self),
                    host.strip("[]"),
                    int(port),
                    ssl=self.ssl,
                    server_hostname=self.server_hostname if self.ssl is not None else None,
                )
            except (OSError, ValueError) as e:
                raise _unavailable(self.address, f"cannot connect: {e}") from None
            self.via = "tcp"
            self._conn = proto
            return proto
        finally:
            self._connecting = None


class UnaryUnary:
    """``stub.Method(request, timeout=...)`` → awaitable response."""

    __slots__ = ("_channel", "_mid", "_path", "_deser", "_method")

    def __init__(self, channel: NativeChannel, path: str, deser: Any) -> None:
        self._channel = channel
        self._mid = BY_PATH[path].id
        self._path = path
        self._deser = deser
        self._method = path.encode()  # what fs3.rpc.channel names failures by

    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - travels to the server as the deadline
        payload: Any = None,
        into: Into | None = None,
        **_: Any,
    ) -> Awaitable[Any]:
        # not a coroutine itself: on a live connection the call is that
        # connection's coroutine (one frame less per call)
        conn = self._channel._conn
        body = request.SerializeToString()
        if conn is None or conn.closed:
            return self._connect_and_call(body, timeout, payload, into)
        return conn.unary(self._mid, self._path, body, timeout, payload, into, self._deser)

    async def _connect_and_call(
        self,
        body: bytes,
        timeout: float | None,  # noqa: ASYNC109
        payload: Any,
        into: Into | None,
    ) -> Any:
        start = asyncio.get_running_loop().time()
        conn = await self._channel.connection(timeout)
        if timeout is not None:  # the deadline runs from the call's start
            timeout = max(0.0, timeout - (asyncio.get_running_loop().time() - start))
        return await conn.unary(self._mid, self._path, body, timeout, payload, into, self._deser)


class StreamFactory:
    """``stub.Method(...)`` for streaming methods → a :class:`StreamCall`."""

    def __init__(
        self, channel: NativeChannel, path: str, deser: Any, client_streaming: bool
    ) -> None:
        self._channel = channel
        self._method = path.encode()
        self._path = path
        self._mid = BY_PATH[path].id
        self._deser = deser
        self._client_streaming = client_streaming

    def __call__(
        self, request: Any = None, *, timeout: float | None = None, **_: Any
    ) -> StreamCall:  # noqa: ASYNC109
        return StreamCall(self, request, timeout)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a failed opening as seen: its error reaches the caller on its next use."""
    if not task.cancelled():
        task.exception()


class StreamCall:
    """A streaming call: async-iterate the responses; ``write``/``done_writing`` for
    a request stream; ``cancel`` abandons it (the server's handler is cancelled).

    Like grpc.aio's call objects it starts at once; a request iterator given at
    creation is sent by a task of its own.
    """

    def __init__(self, factory: StreamFactory, request: Any, timeout: float | None) -> None:  # noqa: ASYNC109
        self._f = factory
        self._conn: ClientConnection | None = None
        self._rid = 0
        self._st: _StreamState | None = None
        self._cancelled = False
        self._finished = False
        self._writer: asyncio.Task[None] | None = None
        self._into: Scatter | None = None
        loop = asyncio.get_running_loop()
        # the call's deadline (loop time) runs from here, like a unary call's
        self._deadline = None if not timeout else loop.time() + timeout
        iterator = None
        first: bytes | None = None
        if request is not None:
            if factory._client_streaming:
                iterator = request
            else:
                first = request.SerializeToString()
        self._open = asyncio.get_running_loop().create_task(self._start(first, timeout))
        self._open.add_done_callback(_retrieve)
        if iterator is not None:
            self._writer = asyncio.get_running_loop().create_task(self._pump(iterator))

    async def _start(self, first: bytes | None, timeout: float | None) -> None:  # noqa: ASYNC109
        conn = await self._f._channel.connection(timeout)
        self._conn = conn
        if self._deadline is not None:  # the server gets what remains
            timeout = max(0.001, self._deadline - conn._loop.time())
        self._rid, self._st = conn.open_stream(self._f._mid, first, timeout)
        self._st.into = self._into

    def set_payload_layout(self, into: Scatter) -> None:
        """Receive the bulk payload of each response message into the buffers
        ``into(body, length)`` names (None: into a scratch buffer, dropped)."""
        self._into = into
        if self._st is not None:
            self._st.into = into

    async def _ready(self) -> ClientConnection:
        if self._cancelled:
            raise asyncio.CancelledError()
        await asyncio.shield(self._open)
        assert self._conn is not None
        return self._conn

    async def _pump(self, iterator: Any) -> None:
        with contextlib.suppress(FsError, asyncio.CancelledError):
            if hasattr(iterator, "__aiter__"):
                async for req in iterator:
                    await self.write(req)
            else:
                for req in iterator:
                    await self.write(req)
            await self.done_writing()

    async def write(self, request: Any) -> None:
        conn = await self._ready()
        if self._st is None or self._st.done or self._finished:
            raise _unavailable(self._f._path, "stream closed")
        if conn._write_paused:
            try:
                async with asyncio.timeout_at(self._deadline):
                    await conn.writable()
            except TimeoutError:
                raise self._deadline_passed() from None
        conn.send(MESSAGE, HAS_MESSAGE, self._f._mid, self._rid, 0, request.SerializeToString())

    async def done_writing(self) -> None:
        conn = await self._ready()
        if self._st is not None and not self._st.done and not conn.closed:
            conn.send(HALF_CLOSE, 0, self._f._mid, self._rid, 0, b"")

    def _deadline_passed(self) -> FsError:
        """End the call with TIMEOUT (its deadline passed while a write waited):
        cancelled on the server, the error for its reader too."""
        err = FsError(Code.TIMEOUT, f"{self._f._path}: deadline exceeded", retryable=True)
        conn, st = self._conn, self._st
        if conn is not None and st is not None and not st.done:
            conn.cancel(self._f._mid, self._rid)
            st.done = True
            st.error = err
            st.wake()
        return err

    def __aiter__(self) -> StreamCall:
        return self

    async def __anext__(self) -> Any:
        conn = await self._ready()
        st = self._st
        assert st is not None
        while True:
            if self._cancelled:
                raise asyncio.CancelledError()
            if st.queue:
                return self._f._deser(conn._take(st))
            if st.done:
                self._finished = True
                if st.error is not None:
                    raise st.error
                raise StopAsyncIteration
            st.waiter = conn._loop.create_future()
            try:
                await st.waiter
            finally:
                st.waiter = None

    def cancel(self) -> bool:
        if self._finished or self._cancelled:
            return False
        self._cancelled = True
        if not self._open.done():
            self._open.cancel()
        if self._writer is not None:
            self._writer.cancel()
        if self._conn is not None and self._st is not None and not self._st.done:
            self._conn.cancel(self._f._mid, self._rid)
            self._st.done = True
        if self._st is not None:
            self._st.wake()
        return True

    def done(self) -> bool:
        return self._finished or self._cancelled


__all__ = ["NativeChannel", "ClientConnection", "StreamCall", "UnaryUnary"]
