"""The event loop of every fs3 process: uvloop unless ``[rpc] event_loop = "asyncio"``.

Why uvloop: the per-call cost of the native transport is mostly event-loop
work (socket readiness, callbacks, task steps), which uvloop does in C; a
framed call round trip is several times cheaper on it than on the stock loop.

grpc.aio shares the loop: its client and server run on the same uvloop loop in
the same thread (checked with grpcio 1.85; every fs3 process serves gRPC next to
the native transport on it, and the tests run gRPC clients on it too). So there
is no second thread or loop for gRPC; ``[rpc] event_loop = "asyncio"`` is the way
back should a grpcio release stop working on uvloop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop(kind: str = "uvloop") -> asyncio.AbstractEventLoop:
    """A fresh loop of ``kind`` (``uvloop`` or ``asyncio``)."""
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T], kind: str = "uvloop") -> T:
    """``asyncio.run`` on a loop of ``kind``."""
    with asyncio.Runner(loop_factory=lambda: new_event_loop(kind)) as runner:
        return runner.run(main)
