"""RPC server helpers: error mapping for every handler, both transports on one port.

Servicers are thin: they call an operator and return its message. Wrapping each
servicer with :func:`guard_servicer` (done by :func:`add_servicer`) guarantees
that no exception escapes as a Python traceback: ``FsError`` becomes a status
plus ``ErrorDetail``; anything else is logged with its traceback on the server
and answered as ``INTERNAL``.

:func:`create_server` returns an :class:`RpcServer`: the guarded servicers are
served by grpc.aio *and* by the native transport (``fs3.rpc.native``), the
very same handler objects. The advertised ``host:port`` is a native listener
that relays connections starting with the HTTP/2 preface to the grpc.aio
server on a private Unix socket, so every address in cluster files and
routing serves both; same-host native peers may also use the Unix socket of
``fs3.rpc.native.endpoints.uds_path(address)``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import socket
import tempfile
from collections.abc import Callable
from typing import Any

import grpc
from grpc import aio

from fs3.errors import Code, FsError
from fs3.rpc import auth as _auth
from fs3.rpc import settings
from fs3.rpc.native import endpoints
from fs3.rpc.native.methods import service_of_adder
from fs3.rpc.native.server import Limits, NativeServer
from fs3.rpc.status import status_for, trailing_metadata

log = logging.getLogger("fs3.rpc")

MAX_MESSAGE_BYTES = 256 * 1024 * 1024

SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    # Clients ping every 10 s; without these the server answers GOAWAY
    # "too_many_pings" (its default minimum ping interval is 5 minutes).
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


def _to_fs_error(exc: BaseException, method: str) -> FsError:
    if isinstance(exc, FsError):
        return exc
    log.exception("unexpected error in %s", method)
    return FsError(Code.INTERNAL, f"internal error in {method}: {type(exc).__name__}: {exc}")


async def _abort(context: aio.ServicerContext, err: FsError) -> None:
    context.set_trailing_metadata(trailing_metadata(err))
    await context.abort(status_for(err), err.message)


def _wrap_unary(
    fn: Callable[..., Any], name: str, gate: _auth.Authenticator | None, level: int
) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def handler(request: Any, context: aio.ServicerContext) -> Any:
        try:
            if gate is not None and not gate.check_now(context, level, request, name):
                await gate.check(context, level, request, name)
            return await fn(request, context)
        except aio.AbortError:
            raise
        except Exception as exc:  # every failure becomes a status
            await _abort(context, _to_fs_error(exc, name))

    return handler


def _wrap_stream(
    fn: Callable[..., Any], name: str, gate: _auth.Authenticator | None, level: int
) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def handler(request: Any, context: aio.ServicerContext) -> Any:
        try:
            if gate is not None:
                # a request stream (iterator) carries no ``user`` field to check
                msg = request if hasattr(request, "DESCRIPTOR") else None
                if not gate.check_now(context, level, msg, name):
                    await gate.check(context, level, msg, name)
            async for item in fn(request, context):
                yield item
        except aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, _to_fs_error(exc, name))

    return handler


def guard_servicer(
    servicer: Any, gate: _auth.Authenticator | None = None, service: str = ""
) -> Any:
    """Wrap every public async handler of ``servicer`` with error mapping (in place).

    With ``gate``, each call is first authenticated and authorized
    (:meth:`fs3.rpc.auth.Authenticator.check`, levels by ``service``'s method names).
    """
    for name, fn in inspect.getmembers(servicer, predicate=inspect.ismethod):
        if name.startswith("_"):
            continue
        qual = f"{type(servicer).__name__}.{name}"
        level = _auth.level_of(service, name)
        if inspect.isasyncgenfunction(fn):
            setattr(servicer, name, _wrap_stream(fn, qual, gate, level))
        elif inspect.iscoroutinefunction(fn):
            setattr(servicer, name, _wrap_unary(fn, qual, gate, level))
    return servicer


class RpcServer:
    """gRPC and native serving of the same servicers on one advertised address."""

    def __init__(self, rpc: Any = None) -> None:
        self.rpc = rpc or settings.current()
        self.grpc = aio.server(options=SERVER_OPTIONS)
        # None: no cluster secret configured, calls are not authenticated (fs3.rpc.auth)
        self.auth = _auth.server_authenticator(self.rpc)
        self.native = NativeServer(Limits.from_config(self.rpc), self.auth)
        self._sock: socket.socket | None = None
        self._grpc_path = ""
        self._uds_path = ""
        self.address = ""
        self.grpc_port = 0  # a direct gRPC port ([rpc] grpc_port), 0: none

    def add(self, add_fn: Callable[[Any, aio.Server], None], servicer: Any) -> None:
        service = service_of_adder(add_fn)
        guarded = guard_servicer(servicer, self.auth, service)
        add_fn(guarded, self.grpc)
        self.native.add_servicer(service, guarded)

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """gRPC-only handlers of services outside ``proto/`` (test doubles)."""
        self.grpc.add_generic_rpc_handlers(handlers)

    def bind(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        bare = host.strip("[]")
        family = socket.AF_INET6 if ":" in bare else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((bare, port))
            sock.listen(1024)
        except OSError as e:
            sock.close()
            raise FsError(
                Code.UNAVAILABLE, f"cannot listen on {host}:{port}: {e}", retryable=False
            ) from None
        sock.setblocking(False)
        self._sock = sock
        actual = int(sock.getsockname()[1])
        self.address = f"{host}:{actual}"
        # grpc.aio listens privately; the public port relays HTTP/2 connections to it.
        # Its socket sits beside the native one, keyed by the address, so a server
        # killed with SIGKILL leaves one stale file that its successor replaces.
        self._grpc_path = endpoints.uds_path(self.address, self.rpc.socket_dir)[:-5] + ".grpc.sock"
        try:
            endpoints.prepare(self._grpc_path)
        except OSError:
            self._grpc_path = os.path.join(tempfile.mkdtemp(prefix="fs3-grpc-"), "grpc.sock")
        if self.grpc.add_insecure_port(f"unix:{self._grpc_path}") == 0:
            raise FsError(
                Code.UNAVAILABLE, f"cannot listen on unix:{self._grpc_path}", retryable=False
            )
        self.native.grpc_relay_path = self._grpc_path
        if self.rpc.grpc_port >= 0:
            self.grpc_port = _auth.add_grpc_port(
                self.grpc, f"{host}:{self.rpc.grpc_port}", self.rpc
            )
            if self.grpc_port == 0:
                raise FsError(
                    Code.UNAVAILABLE,
                    f"cannot listen on {host}:{self.rpc.grpc_port}",
                    retryable=False,
                )
        return actual

    async def start(self) -> None:
        await self.grpc.start()
        if self._sock is not None:
            await self.native.listen_socket(self._sock, _auth.server_tls(self.rpc))
            if self.rpc.unix_sockets:
                path = endpoints.uds_path(self.address, self.rpc.socket_dir)
                try:
                    endpoints.prepare(path)
                    await self.native.listen_unix(path)
                    self._uds_path = path
                except OSError as e:
                    log.warning(
                        "no Unix socket for %s (%s): same-host peers use TCP", self.address, e
                    )

    async def stop(self, grace: float | None = None) -> None:
        await self.native.stop()
        if self._uds_path:
            endpoints.remove(self._uds_path)
        await self.grpc.stop(grace)
        if self._grpc_path:
            endpoints.remove(self._grpc_path)
            if os.path.basename(os.path.dirname(self._grpc_path)).startswith("fs3-grpc-"):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(self._grpc_path))


def create_server(rpc: Any = None) -> RpcServer:
    """A server for both transports with fs3's standard options (``rpc``: an ``[rpc]`` section)."""
    return RpcServer(rpc)


def add_servicer(
    server: RpcServer, add_fn: Callable[[Any, aio.Server], None], servicer: Any
) -> None:
    """Serve ``servicer`` (guarded) on both transports; ``add_fn`` is the generated add_*_to_server."""
    server.add(add_fn, servicer)


def bind(server: RpcServer, host: str, port: int) -> int:
    """Listen on ``host:port``; returns the actual port (``port=0`` picks a free one)."""
    return server.bind(host, port)


__all__ = [
    "RpcServer",
    "create_server",
    "add_servicer",
    "bind",
    "guard_servicer",
    "MAX_MESSAGE_BYTES",
    "grpc",
]
