"""Calling fs3 services as one particular client, over one transport (test helpers).

The authentication tests (unit tests on a bare ``RpcServer``, the security tier on a
real cluster) make the same calls with different credentials over every transport
and compare the fs3 code each call ends with; these are the pieces they share.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fs3.config import RpcSection
from fs3.errors import Code, FsError
from fs3.rpc import auth, settings
from fs3.rpc.channel import ChannelPool

#: native RPC over unix sockets (same host), native over TCP, gRPC
TRANSPORTS = ["native-uds", "native-tcp", "grpc"]


def channel_pool(transport: str, cred: auth.Credential) -> ChannelPool:
    """A pool that calls over ``transport`` (one of :data:`TRANSPORTS`) presenting ``cred``.

    Switches this process's RPC settings to unix sockets or not, as the transport
    needs; tests restore them with ``settings.configure(RpcSection())``.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
    settings.configure(RpcSection(unix_sockets=transport != "native-tcp"))
    return ChannelPool("grpc" if transport == "grpc" else "native", cred)


@contextlib.asynccontextmanager
async def pooled(transport: str, cred: auth.Credential) -> AsyncIterator[ChannelPool]:
    """:func:`channel_pool`, closed when the block ends."""
    pool = channel_pool(transport, cred)
    try:
        yield pool
    finally:
        await pool.close()


async def code_of(call: Awaitable[Any]) -> Code | str:
    """The fs3 code ``call`` fails with, or ``"ok"`` if it succeeds."""
    try:
        await call
    except FsError as e:
        return e.code
    return "ok"


__all__ = ["TRANSPORTS", "channel_pool", "code_of", "pooled"]
