"""gRPC server helpers: error mapping for every handler, standard options.

Servicers are thin: they call an operator and return its message. Wrapping each
servicer with :func:`guard_servicer` (done by :func:`add_servicer`) guarantees
that no exception escapes as a Python traceback: ``FsError`` becomes a status
plus ``ErrorDetail``; anything else is logged with its traceback on the server
and answered as ``INTERNAL``.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

import grpc
from grpc import aio

from fs3.errors import Code, FsError
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


def _wrap_unary(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def handler(request: Any, context: aio.ServicerContext) -> Any:
        try:
            return await fn(request, context)
        except aio.AbortError:
            raise
        except Exception as exc:  # every failure becomes a status
            await _abort(context, _to_fs_error(exc, name))

    return handler


def _wrap_stream(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def handler(request: Any, context: aio.ServicerContext) -> Any:
        try:
            async for item in fn(request, context):
                yield item
        except aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, _to_fs_error(exc, name))

    return handler


def guard_servicer(servicer: Any) -> Any:
    """Wrap every public async handler of ``servicer`` with error mapping (in place)."""
    for name, fn in inspect.getmembers(servicer, predicate=inspect.ismethod):
        if name.startswith("_"):
            continue
        qual = f"{type(servicer).__name__}.{name}"
        if inspect.isasyncgenfunction(fn):
            setattr(servicer, name, _wrap_stream(fn, qual))
        elif inspect.iscoroutinefunction(fn):
            setattr(servicer, name, _wrap_unary(fn, qual))
    return servicer


def create_server() -> aio.Server:
    """A grpc.aio server with fs3's standard options."""
    return aio.server(options=SERVER_OPTIONS)


def add_servicer(
    server: aio.Server, add_fn: Callable[[Any, aio.Server], None], servicer: Any
) -> None:
    """Register ``servicer`` (guarded) with ``add_fn`` (the generated add_*_to_server)."""
    add_fn(guard_servicer(servicer), server)


def bind(server: aio.Server, host: str, port: int) -> int:
    """Bind an insecure port; returns the actual port (``port=0`` picks a free one)."""
    actual = server.add_insecure_port(f"{host}:{port}")
    if actual == 0:
        raise FsError(
            Code.UNAVAILABLE, f"cannot listen on {host}:{port} (address in use?)", retryable=False
        )
    return actual


__all__ = ["create_server", "add_servicer", "bind", "guard_servicer", "MAX_MESSAGE_BYTES", "grpc"]
