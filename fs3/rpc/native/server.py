"""Server side of the native transport: the same servicers, framed calls.

:class:`NativeServer` dispatches each call to the servicer object that gRPC
serves (the generated ``<Service>Servicer`` subclass, after
``fs3.rpc.server.guard_servicer``), passing a small :class:`NativeContext`
that implements what those handlers and the guard use. So there is exactly one
handler per method, whichever transport carried the call.

One :class:`ServerConnection` per peer:

* calls are multiplexed and answered as they finish (out of order); each runs
  in its own task; a CANCEL frame cancels that task, a deadline (the CALL's
  ``timeout_ms``) cancels it and answers ``TIMEOUT``;
* flow control: while more than ``max_inflight_calls`` calls or
  ``max_inflight_bytes`` request bytes (bodies + payloads + queued stream
  messages) are in flight, or while the peer is not reading our replies, the
  connection stops reading (TCP backpressure reaches the sender); replies wait
  for the transport to drain; a peer that has not read anything (no byte of
  the write buffer drained) for ``stall_timeout_s`` is disconnected; a slow
  peer that keeps reading is not. Memory per connection is therefore bounded by the limits,
  whatever the peer sends;
* a malformed frame (bad kind or length, unknown method, undecodable body,
  payload above the maximum) closes that connection with one log line; every
  other connection is untouched.

A listener also accepts gRPC: a connection whose first bytes are the HTTP/2
preface is relayed to the process's grpc.aio server on a private Unix socket
(:class:`GrpcRelay`), so one advertised ``host:port`` serves both transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import math
import socket
import types
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from fs3.errors import Code, FsError
from fs3.proto import common_pb2
from fs3.rpc.native import wire
from fs3.rpc.native.methods import BY_ID, Method, service_methods
from fs3.rpc.native.pool import MIN_CLASS, BufferPool
from fs3.rpc.native.wire import (
    AUTH,
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
    describe_peer,
    log,
)
from fs3.rpc.status import DETAIL_KEY, detail_of

# What asyncio's own eager tasks (3.12) use to make a first step run inline see
# a current task; stable private API of 3.11+.
_enter_task: Callable[[Any, Any], None] = asyncio.tasks._enter_task
_leave_task: Callable[[Any, Any], None] = asyncio.tasks._leave_task

# memory a server keeps for receiving request payloads (fs3.rpc.native.pool)
PAYLOAD_POOL_BYTES = 32 << 20


class Limits:
    """Per-connection bounds (``[rpc]`` config keys of the same names)."""

    def __init__(
        self,
        *,
        max_inflight_calls: int = 1024,
        max_inflight_bytes: int = 128 << 20,
        max_message_bytes: int = 256 << 20,
        max_payload_bytes: int = 64 << 20,
        write_buffer_bytes: int = 4 << 20,
        stall_timeout_s: float = 30.0,
    ) -> None:
        self.max_inflight_calls = max_inflight_calls
        self.max_inflight_bytes = max_inflight_bytes
        self.max_message_bytes = max_message_bytes
        self.max_payload_bytes = max_payload_bytes
        self.write_buffer_bytes = write_buffer_bytes
        self.stall_timeout_s = stall_timeout_s

    @classmethod
    def from_config(cls, section: Any) -> Limits:
        return cls(
            max_inflight_calls=section.max_inflight_calls,
            max_inflight_bytes=section.max_inflight_bytes,
            max_message_bytes=section.max_message_bytes,
            max_payload_bytes=section.max_payload_bytes,
            write_buffer_bytes=section.write_buffer_bytes,
            stall_timeout_s=section.stall_timeout_s,
        )


class StreamItem:
    """A response-stream message with a bulk payload (see :func:`fs3.rpc.bulk.with_payload`)."""

    __slots__ = ("message", "payload")

    def __init__(self, message: Any, payload: list[memoryview]) -> None:
        self.message = message
        self.payload = payload


class _Aborted(Exception):
    """Raised by :meth:`NativeContext.abort`; carries the serialized ErrorDetail."""

    def __init__(self, detail: bytes) -> None:
        super().__init__("aborted")
        self.detail = detail


class NativeContext:
    """What fs3 handlers (and ``guard_servicer``) use of a grpc ServicerContext.

    ``payload`` is the request's bulk payload (None without one), received
    straight into its own buffer; a handler that answers with bulk bytes sets
    :attr:`reply_payload` to one buffer or a list of buffers sent in order
    (written with the header in one ``writelines``, never joined). Handlers
    reach both through :mod:`fs3.rpc.bulk`, which also works on gRPC contexts.
    """

    __slots__ = ("payload", "reply_payload", "_detail", "_deadline", "peer_name", "principal")

    def __init__(
        self, payload: wire.Payload | None, deadline: float | None, peer: str, principal: Any = None
    ) -> None:
        self.payload = payload
        self.principal = principal  # the connection's (fs3.rpc.auth.Principal; None: no AUTH)
        self.reply_payload: Any = None
        self._detail: bytes | None = None
        self._deadline = deadline
        self.peer_name = peer

    def set_trailing_metadata(self, metadata: Any) -> None:
        for key, value in metadata or ():
            if key == DETAIL_KEY:
                self._detail = value

    async def abort(self, code: Any, details: str = "") -> None:
        detail = self._detail
        if detail is None:
            detail = detail_of(FsError(Code.INTERNAL, details or str(code)))
        raise _Aborted(detail)

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return self.peer_name


def _error_detail(exc: BaseException, method: str) -> bytes:
    if isinstance(exc, _Aborted):
        return exc.detail
    if isinstance(exc, FsError):
        return detail_of(exc)
    log.error("unexpected error in %s: %s: %s", method, type(exc).__name__, exc, exc_info=exc)
    return detail_of(FsError(Code.INTERNAL, f"internal error in {method}: {type(exc).__name__}"))


_EOF = object()


async def _done(value: Any) -> Any:
    return value


@types.coroutine
def _resume(coro: Any, step: Any, cancel: bool = False) -> Any:
    """Continue driving ``coro`` (already run up to its first suspension, which
    yielded ``step``) inside whichever task awaits this: the task receives
    ``step`` as if it had run that first step itself, then every value, result
    and exception (cancellation too) passes through unchanged.

    ``cancel``: the first step asked to cancel its task; as ``Task.cancel``
    does, what it waits on is cancelled and it resumes with CancelledError.
    """
    if cancel:
        if isinstance(step, asyncio.Future):
            step.cancel()
        else:
            step = None  # a bare yield: resumed on the next loop turn, with the error below
    while True:
        try:
            if cancel:
                cancel = False
                yield step
                raise asyncio.CancelledError()
            sent = yield step
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                step = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                step = coro.send(sent)
            except StopIteration as stop:
                return stop.value


class _Call(NativeContext):
    """One call in flight, and the context its handler gets (one object per call).

    While a unary handler runs its first step inline (see
    :meth:`ServerConnection._start_call`) there is no task yet: the call stands
    in as :func:`asyncio.current_task` (what ``asyncio.timeout`` and
    ``TaskGroup`` use) and forwards ``cancel``/``uncancel`` to the task that
    takes the handler over if it suspends.
    """

    __slots__ = (
        "task",
        "timed_out",
        "peer_cancelled",
        "queue",
        "nbytes",
        "method",
        "started",
        "stop_requested",
        "_cancels",
    )

    def __init__(
        self,
        method: Method,
        nbytes: int,
        deadline: float | None,  # loop time; the connection's sweep enforces it
        payload: wire.Payload | None,
        peer: str,
        principal: Any,
    ) -> None:
        self.payload = payload
        self.principal = principal
        self.reply_payload = None
        self._detail = None
        self._deadline = deadline
        self.peer_name = peer
        self.method = method
        self.task: asyncio.Task[None] | None = None
        self.timed_out = False
        self.peer_cancelled = False
        self.queue: asyncio.Queue[Any] | None = None
        self.nbytes = nbytes
        self._cancels = 0  # cancel() requests made before the task existed
        self.started = False  # the task running the call has taken its first step
        self.stop_requested = False  # stop() came before that first step

    # -- the asyncio.Task surface used on asyncio.current_task() ---------------------

    def cancel(self, msg: Any = None) -> bool:
        if self.task is not None:
            return self.task.cancel(msg)
        self._cancels += 1
        return True

    def cancelling(self) -> int:
        return self.task.cancelling() if self.task is not None else self._cancels

    def uncancel(self) -> int:
        if self.task is not None:
            return self.task.uncancel()
        self._cancels = max(0, self._cancels - 1)
        return self._cancels

    def done(self) -> bool:
        return self.task.done() if self.task is not None else False

    # -- the server's side -------------------------------------------------------------

    def stop(self) -> None:
        """End the handler (a CANCEL frame, the deadline, the connection lost).

        A task cancelled before its first step never runs its coroutine at
        all: the call's wrapper (whose ``finally`` ends the call) would not
        run, and a handler whose first step already ran inline would stay
        suspended for good, keeping whatever it holds (a chunk lock: every
        later update of that chunk then waits for it). A CANCEL frame read in
        the same buffer as its CALL does exactly that. So before the first
        step the request is noted, and the wrapper cancels its own task as it
        starts (:meth:`ServerConnection._begin`), which reaches the handler
        where it waits, as a cancellation of a running task does.
        """
        if self.task is None:
            return
        if self.started:
            self.task.cancel()
        else:
            self.stop_requested = True


class _RequestStream:
    """The request iterator a client-streaming handler consumes."""

    def __init__(self, conn: ServerConnection, rid: int, call: _Call) -> None:
        self._conn = conn
        self._rid = rid
        self._call = call

    def __aiter__(self) -> _RequestStream:
        return self

    async def __anext__(self) -> Any:
        q = self._call.queue
        assert q is not None
        item, size = await q.get()
        if item is _EOF:
            raise StopAsyncIteration
        self._conn._release(size)
        return item


class ServerConnection(FrameReceiver):
    expect_preface = True

    def __init__(self, server: NativeServer) -> None:
        super().__init__()
        self.server = server
        lim = server.limits
        self.max_body = lim.max_message_bytes
        self.max_payload = lim.max_payload_bytes
        self._lim = lim
        self._handlers = server.handlers
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, _Call] = {}
        self._inflight_bytes = 0
        self._reading_paused = False
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._stall_unsent = 0  # write buffer size when the stall timer was last armed
        self._closed = False
        self._relay: GrpcRelay | None = None
        self.peer = "unknown peer"
        self.principal: Any = None  # set by the AUTH frame (fs3.rpc.auth)
        self._authing = False  # its check is running: no call is read before it ends
        self._any_frame = False  # AUTH is only allowed as the first frame

    # -- asyncio ------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self.peer = describe_peer(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.watch_payloads(sock, tls=transport.get_extra_info("ssl_object") is not None)
        wire.size_unix_send_buffer(sock, self._lim.write_buffer_bytes)
        transport.set_write_buffer_limits(high=self._lim.write_buffer_bytes)
        self.server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._broken = True
        self.server._connections.discard(self)
        if self._stall is not None:
            self._stall.cancel()
        self.stop_deadlines()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        for call in list(self._calls.values()):
            call.stop()
        self._calls.clear()
        if self._relay is not None:
            self._relay.front_lost()

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._drained is None or self._drained.done():
            self._drained = self._loop.create_future()
        self._update_reading()
        if self._stall is None:
            self._arm_stall()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._update_reading()

    def _arm_stall(self) -> None:
        assert self._transport is not None
        self._stall_unsent = self._transport.get_write_buffer_size()
        self._stall = self._loop.call_later(self._lim.stall_timeout_s, self._stalled)

    def _stalled(self) -> None:
        """``stall_timeout_s`` after the timer was armed: if the write buffer went
        down since, the peer is reading, only slowly: watch another period. A peer
        that reads nothing is closed after ``stall_timeout_s``, one that stops
        reading later within twice that.

        While writing is paused the replies wait for the drain, so the buffer only
        grows by the odd frame written regardless (errors, cancels): it shrinking
        is bytes the peer took."""
        self._stall = None
        if self._closed or self._transport is None:
            return
        if self._transport.get_write_buffer_size() < self._stall_unsent:
            self._arm_stall()
            return
        log.warning(
            "closing native connection from %s: peer stopped reading (%d bytes unsent for %.0f s)",
            self.peer,
            self._transport.get_write_buffer_size(),
            self._lim.stall_timeout_s,
        )
        self._close(abort=True)

    # -- preface / relay --------------------------------------------------------------

    def preface_received(self, preface: bytes) -> bool:
        if preface == wire.PREFACE:
            return True
        if preface == wire.HTTP2_PREFACE_START and self.server.grpc_relay_path:
            # a gRPC client: relay the whole connection to the grpc.aio server
            data = preface + bytes(self._buf[self._start : self._end])
            self._start = self._end = 0
            self._relay = GrpcRelay(self, self.server.grpc_relay_path, data)
            # every later byte goes to the relay as it arrives; no override of the
            # receiving methods, so native connections pay nothing for the relay
            self._broken = True
            self._divert = self._relay.forward
            return False
        raise ProtocolViolation(f"not an fs3 connection (starts with {preface!r})")

    def payload_buffer(
        self, kind: int, request_id: int, length: int, body: bytes | memoryview
    ) -> wire.Payload:
        """A call's payload goes into pooled memory, reused once the handler (and
        whoever it handed the bytes to) keeps no view of it: no fresh buffer to
        zero per payload. Small ones and stream messages' get their own."""
        if kind == CALL and length >= MIN_CLASS:
            return self.server.payload_pool.take(length)
        return memoryview(bytearray(length))

    # -- frames ---------------------------------------------------------------------

    def violation(self, message: str) -> None:
        log.warning("closing native connection from %s: %s", self.peer, message)
        self._close(abort=True)

    def _close(self, abort: bool = False) -> None:
        self._broken = True
        if self._transport is not None and not self._closed:
            self._uncork()  # answers of this loop turn go out before the close
            self._closed = True
            if abort:
                self._transport.abort()
            else:
                self._transport.close()

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
        if kind == CALL:
            self._any_frame = True
            self._start_call(flags, method_id, request_id, timeout_ms, body, payload)
            return
        first = not self._any_frame
        self._any_frame = True
        if kind == AUTH:
            self._authenticate(bytes(body), first)
        elif kind == MESSAGE:
            call = self._calls.get(request_id)
            if call is None:
                return  # the call already ended (answered or cancelled): drop its stragglers
            if call.queue is None:
                raise ProtocolViolation(
                    f"stream message for {call.method.path}, which takes no request stream"
                )
            msg = self._decode(call.method, body)
            size = len(body) + wire.payload_len(payload)
            self._acquire(size)
            call.queue.put_nowait((msg, size))
        elif kind == HALF_CLOSE:
            call = self._calls.get(request_id)
            if call is not None and call.queue is not None:
                call.queue.put_nowait((_EOF, 0))
        elif kind == CANCEL:
            call = self._calls.get(request_id)
            if call is not None and call.task is not None:
                call.peer_cancelled = True
                call.stop()
        else:
            raise ProtocolViolation(f"a client sent a {wire.KIND_NAMES[kind]} frame")

    def _authenticate(self, token: bytes, first: bool) -> None:
        """Check the connection's credential before reading any call (one task per connection)."""
        if not first:
            raise ProtocolViolation("AUTH is only allowed as the first frame")
        auth = self.server.auth
        if auth is None:
            return  # this server does not authenticate
        self._authing = True
        self._update_reading()
        self._loop.create_task(self._check_auth(auth, token))

    async def _check_auth(self, auth: Any, token: bytes) -> None:
        try:
            self.principal = await auth.authenticate(token)
        except FsError as e:
            if e.code == Code.UNAUTHENTICATED:
                log.warning("refused credential from %s: %s", self.peer, e.message)
                self.auth_error = e  # every call of this connection is answered with it
            else:  # could not check (user records unreachable): the client reconnects
                log.warning("cannot check the credential of %s: %s", self.peer, e.message)
                self._close()
        except Exception as e:  # never crash on a credential
            log.warning("cannot check the credential of %s: %s", self.peer, e)
            self._close()
        finally:
            self._authing = False
            self._update_reading()

    auth_error: FsError | None = None

    def _decode(self, method: Method, body: bytes | memoryview) -> Any:
        try:
            return method.request.FromString(body)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise ProtocolViolation(
                f"undecodable {method.path} request ({len(body)} bytes): {e}"
            ) from None

    def _start_call(
        self,
        flags: int,
        mid: int,
        rid: int,
        timeout_ms: int,
        body: bytes | memoryview,
        payload: wire.Payload | None,
    ) -> None:
        entry = self._handlers.get(mid)
        if entry is None:
            known = BY_ID.get(mid)
            what = f"{known.path} (not served here)" if known else f"unknown method id {mid:#010x}"
            self._send(
                ERROR,
                mid,
                rid,
                detail_of(FsError(Code.NOT_IMPLEMENTED, f"{what}")),
            )
            raise ProtocolViolation(what)
        method, handler, unary = entry
        if rid in self._calls:
            raise ProtocolViolation(f"request id {rid} reused while its call is in flight")
        if flags & HAS_MESSAGE:
            request = self._decode(method, body)
        elif method.client_streaming:
            request = None
        else:
            raise ProtocolViolation(f"CALL of {method.path} without its request message")
        size = len(body) if payload is None else len(body) + wire.payload_len(payload)
        # a refused AUTH: every call of the connection is answered with the reason
        call = _Call(
            method,
            size,
            self._loop.time() + timeout_ms / 1000.0 if timeout_ms else None,
            payload,
            self.peer,
            self.auth_error or self.principal,
        )
        if unary:
            self._start_unary(rid, call, handler(request, call))
            return
        self._register(rid, call)
        if method.client_streaming:
            call.queue = asyncio.Queue()
            if request is not None:
                call.queue.put_nowait((request, 0))
            coro: Any = self._run_stream(rid, call, handler(_RequestStream(self, rid, call), call))
        else:
            coro = self._run_stream(rid, call, handler(request, call))
        call.task = self._loop.create_task(coro)

    def _register(self, rid: int, call: _Call) -> None:
        """A call that outlives its frame callback: it counts against the limits
        (flow control), CANCEL frames and the deadline sweep find it."""
        calls = self._calls
        calls[rid] = call
        self._inflight_bytes += call.nbytes
        lim = self._lim
        if len(calls) >= lim.max_inflight_calls or self._inflight_bytes >= lim.max_inflight_bytes:
            self._update_reading()
        d = call._deadline
        if d is not None and d < self._sweep_at:
            self.arm_deadline(d)

    def _start_unary(self, rid: int, call: _Call, hc: Any) -> None:
        """Run the handler's first step inline; answer at once if that finishes it.

        Most handlers (point reads, cached answers) finish without suspending:
        they are answered from the frame callback, without a task and a loop
        turn (what Python 3.12's eager tasks do), and never count as in flight.
        A handler that suspends is registered and continued by a task: the
        step it stopped at is handed over, nothing runs twice. The first step
        runs in the context the task then keeps, as a task's would.
        """
        loop = self._loop
        cv = contextvars.copy_context()
        try:
            _enter_task(loop, call)
        except RuntimeError:  # called from inside a task (not from the protocol callback)
            self._register(rid, call)
            call.task = loop.create_task(self._run_unary(rid, call, hc), context=cv)
            return
        try:
            step = cv.run(hc.send, None)
        except StopIteration as stop:
            if self._write_paused:
                self._register(rid, call)
                coro = self._run_unary(rid, call, _done(stop.value))
                call.task = loop.create_task(coro, context=cv)
                return
            try:
                self._reply(rid, call, stop.value)
            except Exception as exc:
                method = call.method
                self._send(ERROR, method.id, rid, _error_detail(exc, method.path))
            return
        except Exception as exc:
            method = call.method
            self._send(ERROR, method.id, rid, _error_detail(exc, method.path))
            return
        finally:
            _leave_task(loop, call)
        self._register(rid, call)
        cancel = call._cancels > 0  # the first step cancelled its own (stand-in) task
        coro = self._run_unary(rid, call, _resume(hc, step, cancel))
        call.task = loop.create_task(coro, context=cv)

    def _reply(self, rid: int, call: _Call, resp: Any) -> None:
        body = resp.SerializeToString()
        n = len(body)
        if n > self.max_body:
            # the client would drop the connection (and every call on it) for this frame
            raise FsError(
                Code.INVALID_ARGUMENT,
                f"{call.method.path}: answer of {n} bytes exceeds {self.max_body}",
            )
        pl = call.reply_payload
        if pl is not None:
            self._check_reply_payload(call.method, pl)
            self._send(REPLY, call.method.id, rid, body, pl)
            return
        t = self._transport
        if t is not None and not self._closed:
            self.write_one(
                t, PACK_HEADER(REPLY, HAS_MESSAGE, 0, call.method.id, rid, 0, n, 0) + body
            )

    def expire_deadlines(self, now: float) -> float:
        """Cancel every call past its deadline (its handler answers TIMEOUT)."""
        nxt = math.inf
        for call in list(self._calls.values()):
            d = call._deadline
            if d is None or call.timed_out:
                continue
            if d <= now:
                if call.task is not None:
                    call.timed_out = True
                    call.stop()
            elif d < nxt:
                nxt = d
        return nxt

    @staticmethod
    def _begin(call: _Call) -> None:
        """First thing a call's task does: apply a :meth:`_Call.stop` that came earlier."""
        call.started = True
        if call.stop_requested and call.task is not None:
            call.task.cancel()  # delivered at the handler's next suspension

    async def _run_unary(self, rid: int, call: _Call, coro: Any) -> None:
        self._begin(call)
        method = call.method
        try:
            resp = await coro
            if self._write_paused:
                await self._writable()
            self._reply(rid, call, resp)
        except asyncio.CancelledError:
            self._send_cancelled(rid, call)
        except Exception as exc:
            self._send(ERROR, method.id, rid, _error_detail(exc, method.path))
        finally:
            self._end_call(rid, call)

    def _check_reply_payload(self, method: Method, payload: Any) -> None:
        """An answer's payload above the limit would make the client drop the connection."""
        n = wire.payload_len(payload)
        if n > self.max_payload:
            raise FsError(
                Code.INVALID_ARGUMENT,
                f"{method.path}: answer payload of {n} bytes exceeds {self.max_payload} "
                "(ask for less per call)",
            )

    async def _run_stream(self, rid: int, call: _Call, agen: Any) -> None:
        self._begin(call)
        method = call.method
        try:
            async for item in agen:
                if self._write_paused:
                    await self._writable()
                if isinstance(item, StreamItem):
                    self._check_reply_payload(method, item.payload)
                    self._send(
                        MESSAGE, method.id, rid, item.message.SerializeToString(), item.payload
                    )
                    continue
                self._send(MESSAGE, method.id, rid, item.SerializeToString())
            self._send(END, method.id, rid, b"")
        except asyncio.CancelledError:
            self._send_cancelled(rid, call)
        except Exception as exc:
            self._send(ERROR, method.id, rid, _error_detail(exc, method.path))
        finally:
            with contextlib.suppress(Exception):
                await agen.aclose()
            self._end_call(rid, call)

    def _send_cancelled(self, rid: int, call: _Call) -> None:
        """A cancelled handler: the caller learns why, unless it cancelled the call itself."""
        if call.peer_cancelled:
            return
        path = call.method.path
        if call.timed_out:
            err = FsError(Code.TIMEOUT, f"{path}: deadline exceeded", retryable=True)
        else:
            err = FsError(Code.CANCELLED, f"{path}: cancelled on the server", retryable=True)
        self._send(ERROR, call.method.id, rid, detail_of(err))

    def _end_call(self, rid: int, call: _Call) -> None:
        if self._calls.get(rid) is call:
            del self._calls[rid]
        if call.queue is not None:
            # stream messages nobody consumed
            while not call.queue.empty():
                _item, size = call.queue.get_nowait()
                call.nbytes += size
        self._inflight_bytes -= call.nbytes
        if self._reading_paused:
            self._update_reading()

    async def _writable(self) -> None:
        while self._write_paused and not self._closed and self._drained is not None:
            await asyncio.shield(self._drained)

    def _send(self, kind: int, mid: int, rid: int, body: bytes, payload: Any = None) -> None:
        t = self._transport
        if t is None or self._closed:
            return
        n = wire.payload_len(payload)
        if not n:
            self.write_frame(t, wire.pack(kind, HAS_MESSAGE, mid, rid, 0, body))
        elif isinstance(payload, list):
            self.write_frame(t, wire.pack(kind, HAS_MESSAGE, mid, rid, 0, body, n), *payload)
        else:
            self.write_frame(t, wire.pack(kind, HAS_MESSAGE, mid, rid, 0, body, n), payload)

    # -- flow control -------------------------------------------------------------

    def _acquire(self, nbytes: int) -> None:
        self._inflight_bytes += nbytes
        self._update_reading()

    def _release(self, nbytes: int) -> None:
        self._inflight_bytes -= nbytes
        self._update_reading()

    def _resume_buffered(self) -> None:
        if not self._reading_paused and not self._closed:
            self.resume_parsing()

    def _update_reading(self) -> None:
        t = self._transport
        if t is None or self._closed:
            return
        pause = (
            self._authing
            or self._write_paused
            or len(self._calls) >= self._lim.max_inflight_calls
            or self._inflight_bytes >= self._lim.max_inflight_bytes
        )
        if pause and not self._reading_paused:
            self._reading_paused = True
            self._parse_paused = True
            t.pause_reading()
        elif not pause and self._reading_paused:
            self._reading_paused = False
            t.resume_reading()
            # frames that were already buffered come first (not from inside a frame callback)
            self._loop.call_soon(self._resume_buffered)


class _RelayBackend(asyncio.Protocol):
    def __init__(self, relay: GrpcRelay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.to_front(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.backend_lost()

    def pause_writing(self) -> None:
        self.relay.front_pause(True)

    def resume_writing(self) -> None:
        self.relay.front_pause(False)


class GrpcRelay:
    """Pipes one gRPC client connection to the local grpc.aio server's Unix socket.

    Why: both transports share the advertised address (fs3 addresses are one
    ``host:port`` everywhere: cluster files, routing, configs). Only gRPC
    connections pay the extra hop; native ones are served directly.
    """

    def __init__(self, front: ServerConnection, path: str, initial: bytes) -> None:
        self.front = front
        self.path = path
        self._backend: asyncio.Transport | None = None
        self._queued = [initial]
        self._closed = False
        assert front._transport is not None
        front._transport.pause_reading()
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_unix_connection(lambda: _RelayBackend(self), self.path)
        except OSError as e:
            log.warning("cannot relay gRPC connection from %s: %s", self.front.peer, e)
            self.front._close(abort=True)
            return
        if self._closed:
            transport.close()
            return
        self._backend = transport
        for data in self._queued:
            transport.write(data)
        self._queued = []
        if self.front._transport is not None and not self.front._closed:
            self.front._transport.resume_reading()

    def forward(self, data: bytes) -> None:
        if self._backend is not None:
            self._backend.write(data)
        else:
            self._queued.append(data)

    def to_front(self, data: bytes) -> None:
        t = self.front._transport
        if t is not None and not self.front._closed:
            t.write(data)

    def front_pause(self, paused: bool) -> None:
        t = self.front._transport
        if t is None or self.front._closed:
            return
        if paused:
            t.pause_reading()
        else:
            t.resume_reading()

    def front_lost(self) -> None:
        self._closed = True
        if self._backend is not None:
            self._backend.close()

    def backend_lost(self) -> None:
        self._closed = True
        self.front._close()


class NativeServer:
    """Native listeners (TCP and Unix) for a set of servicers."""

    def __init__(self, limits: Limits | None = None, auth: Any = None) -> None:
        self.limits = limits or Limits()
        self.auth = auth  # fs3.rpc.auth.Authenticator; None: calls are not authenticated
        # method id -> (method, handler, unary: neither side streams)
        self.handlers: dict[int, tuple[Method, Callable[..., Any], bool]] = {}
        self.grpc_relay_path = ""
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[ServerConnection] = set()
        # request payloads of every connection are received into these: bytearrays,
        # as fresh ones were, not page-aligned mappings (an aligned payload turns
        # the storage node's chunk writes to O_DIRECT, fs3.storage.chunk_data)
        self.payload_pool = BufferPool(PAYLOAD_POOL_BYTES, bytearray)

    def add_servicer(self, service: str, servicer: Any) -> None:
        """Serve every method of proto ``service`` (full name) that ``servicer`` implements."""
        for m in service_methods(service):
            handler = getattr(servicer, m.name, None)
            # the generated base class's placeholders are plain functions: not served
            if inspect.iscoroutinefunction(handler) or inspect.isasyncgenfunction(handler):
                unary = not m.client_streaming and not m.server_streaming
                self.handlers[m.id] = (m, handler, unary)

    def _factory(self) -> ServerConnection:
        return ServerConnection(self)

    async def listen_socket(self, sock: socket.socket, ssl: Any = None) -> None:
        """Serve TCP on ``sock`` (``ssl``: a server SSLContext, fs3.rpc.auth.server_ssl_context)."""
        loop = asyncio.get_running_loop()
        self._servers.append(
            await loop.create_server(self._factory, sock=sock, backlog=1024, ssl=ssl)
        )

    async def listen_unix(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_unix_server(self._factory, path, backlog=1024))

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def stop(self) -> None:
        for s in self._servers:
            s.close()
        for c in list(self._connections):
            c._close(abort=True)
        for s in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.wait_closed(), 1.0)
        self._servers = []


__all__ = ["Limits", "NativeContext", "NativeServer", "ServerConnection", "wire", "common_pb2"]
