"""Channel helpers for clients of fs3 services, over either transport.

Channels are cached per (address, loop) because creating one costs a
connection handshake. A :class:`ChannelPool` hands out native channels
(``fs3.rpc.native.client.NativeChannel``) or grpc.aio channels, as the
process's ``[rpc] transport`` says; both are accepted by the generated
``*ServiceStub`` classes, so callers are the same for both. :func:`call` turns
``grpc.RpcError`` into ``FsError`` with :mod:`fs3.rpc.status` (native calls
raise ``FsError`` themselves), so callers only ever handle fs3 errors.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from grpc import aio

from fs3.errors import Code, FsError
from fs3.rpc import auth, settings
from fs3.rpc.native.client import NativeChannel
from fs3.rpc.server import MAX_MESSAGE_BYTES
from fs3.rpc.status import from_rpc_error

T = TypeVar("T")

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.enable_retries", 0),
]


def _grpc_tls(cred: auth.Credential) -> tuple[Any, list[tuple[str, Any]]]:
    creds = grpc.ssl_channel_credentials(root_certificates=open(cred.tls_ca, "rb").read())  # noqa: SIM115
    return creds, [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", cred.tls_server_name)]


def insecure_channel(address: str, credential: auth.Credential | None = None) -> aio.Channel:
    """A new grpc.aio channel to ``address`` with fs3's options.

    It carries ``credential`` (default: the process's, :func:`fs3.rpc.auth.default_credential`):
    its token on every call, TLS when it names the cluster's CA.
    """
    cred = credential if credential is not None else auth.default_credential()
    icpt = auth.aio_interceptors(cred)
    if cred.tls_ca:
        creds, opts = _grpc_tls(cred)
        return aio.secure_channel(address, creds, options=opts, interceptors=icpt)
    return aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=icpt)


def sync_channel(address: str, credential: auth.Credential | None = None) -> grpc.Channel:
    """A blocking channel (CLI tools, tests), carrying ``credential`` as :func:`insecure_channel`."""
    cred = credential if credential is not None else auth.default_credential()
    if cred.tls_ca:
        creds, opts = _grpc_tls(cred)
        ch = grpc.secure_channel(address, creds, options=opts)
    else:
        ch = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    icpt = auth.sync_metadata_interceptor(cred)
    return grpc.intercept_channel(ch, icpt) if icpt is not None else ch


def native_channel(
    address: str, rpc: Any = None, credential: auth.Credential | None = None
) -> NativeChannel:
    """A native channel to ``address`` with the limits of ``rpc`` (default: the process's)."""
    r = rpc or settings.current()
    cred = credential if credential is not None else auth.default_credential()
    return NativeChannel(
        address,
        socket_dir=r.socket_dir,
        prefer_uds=r.unix_sockets,
        max_inflight_calls=r.max_inflight_calls,
        max_inflight_bytes=r.max_inflight_bytes,
        max_message_bytes=r.max_message_bytes,
        max_payload_bytes=r.max_payload_bytes,
        write_buffer_bytes=r.write_buffer_bytes,
        token=cred.token,
        ssl=cred.ssl_context(),
        server_hostname=cred.tls_server_name,
    )


class ChannelPool:
    """One channel per address, for the event loop that owns the pool.

    ``transport``: ``"native"`` or ``"grpc"``; default: the process's ``[rpc] transport``.
    ``credential``: what its channels present (default: the process's).
    """

    def __init__(
        self, transport: str | None = None, credential: auth.Credential | None = None
    ) -> None:
        self.transport = transport or settings.current().transport
        self.credential = credential
        self._channels: dict[str, Any] = {}

    @property
    def carries_payload(self) -> bool:
        """True if calls on this pool's channels take ``payload=``/``into=`` (native frames)."""
        return self.transport == "native"

    def get(self, address: str) -> Any:
        ch = self._channels.get(address)
        if ch is None:
            if self.transport == "native":
                ch = native_channel(address, credential=self.credential)
            else:
                ch = insecure_channel(address, self.credential)
            self._channels[address] = ch
        return ch

    async def drop(self, address: str) -> None:
        ch = self._channels.pop(address, None)
        if ch is not None:
            await ch.close()

    async def close(self) -> None:
        chans, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(c.close() for c in chans), return_exceptions=True)


async def call(
    method: Callable[..., Awaitable[T]],
    request: Any,
    *,
    timeout: float | None = None,  # noqa: ASYNC109 - gRPC's deadline travels to the server
    what: str = "",
    payload: Any = None,
    into: Any = None,
) -> T:
    """Invoke a grpc.aio stub method, mapping failures to ``FsError``.

    ``timeout`` is gRPC's per-call deadline (the server sees it too), which is why it is
    a parameter rather than an ``asyncio.timeout`` around the call. ``payload`` and
    ``into`` are bulk bytes beside the message (:mod:`fs3.rpc.native.client`; only
    on a pool whose :attr:`ChannelPool.carries_payload`); with ``into`` the result
    is ``(response, payload_len)``.
    """
    try:
        if payload is not None or into is not None:
            return await method(request, timeout=timeout, payload=payload, into=into)
        return await method(request, timeout=timeout)
    except grpc.RpcError as e:
        raise from_rpc_error(e, what or _method_name(method)) from None


def _method_name(method: Any) -> str:
    name = getattr(method, "_method", None)
    return name.decode(errors="replace") if isinstance(name, bytes) else "rpc"


def call_sync(
    method: Callable[..., T], request: Any, *, timeout: float | None = None, what: str = "rpc"
) -> T:
    """Invoke a blocking stub method, mapping failures to ``FsError``."""
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as e:
        raise from_rpc_error(e, what) from None


class BidiStream:
    """A long-lived grpc.aio bidirectional stream whose failures surface as ``FsError``.

    Why a wrapper: only fs3/rpc may touch grpc, yet the storage client keeps one
    read stream per node open for its whole life. ``method(requests)`` starts
    the call at once (no deadline: per-message timeouts are the caller's); the
    call consumes ``requests`` in gRPC's own task, so the caller has one writer
    (its async iterator) and reads answers with :meth:`responses`.
    """

    def __init__(self, method: Callable[..., Any], requests: Any = None, *, what: str = "") -> None:
        self.what = what or _method_name(method)
        self._call = method(requests) if requests is not None else method()

    async def write(self, request: Any) -> None:
        """Send one message (only without a ``requests`` iterator; one write at a time)."""
        try:
            await self._call.write(request)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.what) from None
        except asyncio.InvalidStateError:
            raise FsError(Code.UNAVAILABLE, f"{self.what}: stream closed", retryable=True) from None

    async def done_writing(self) -> None:
        """Half-close: the server sees the end of the request stream."""
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await self._call.done_writing()

    async def responses(self) -> Any:
        """Answers until the server ends the stream; a failure raises ``FsError``.

        A locally cancelled call (:meth:`cancel`, channel closed) ends with
        ``asyncio.CancelledError`` as grpc.aio does.
        """
        try:
            async for item in self._call:
                yield item
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.what) from None

    def set_payload_layout(self, into: Callable[[Any, int], Any]) -> bool:
        """Receive each answer's bulk payload into the buffers ``into(body, length)`` names.

        False on a call that carries no payloads (gRPC): the caller keeps inline bytes.
        """
        setter = getattr(self._call, "set_payload_layout", None)
        if setter is None:
            return False
        setter(into)
        return True

    def cancel(self) -> None:
        """Abort the call (the server's handler is cancelled too)."""
        self._call.cancel()

    def done(self) -> bool:
        return bool(self._call.done())
