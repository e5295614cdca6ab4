"""fs3.transport: how chunk payloads move between clients and storage servers.

See :mod:`fs3.transport.base` for the seam. Entry points::

    from fs3.transport import ServerTransport, client_transport, is_inline
"""

from __future__ import annotations

from typing import Any

from fs3.transport.base import (
    KINDS,
    ClientTransport,
    DataRef,
    FrameRef,
    ShmRef,
    TcpRef,
    frame_ref,
    frame_slice,
    inline_read_ref,
    is_inline,
    ref_kind,
    ref_length,
    transport_error,
)
from fs3.transport.region import ShmRegion, buffer_address
from fs3.transport.server import ServerTransport
from fs3.transport.shm import is_region_error


def client_transport(
    kind: str, client_id: str, config: Any = None, **kwargs: Any
) -> ClientTransport:
    """A client transport of ``kind`` (auto | grpc | tcp | shm | rdma); tcp is an alias of grpc.

    ``config`` may be a :class:`fs3.config.TransportSection` whose tunables are
    used; ``kwargs`` override them (tests pass short timeouts).
    """
    from fs3.transport.inline import InlineClientTransport
    from fs3.transport.shm import ShmClientTransport

    if kind in ("grpc", "tcp"):
        # "tcp" once named a separate framed data connection; it folded into the
        # native RPC transport, whose frames carry the bytes as their bulk payload
        # (the storage clients choose that whenever the RPC is native and the kind
        # is not shm). It stays accepted so existing configs keep working.
        return InlineClientTransport(client_id, kind=kind)
    if kind in ("shm", "auto"):
        opts: dict[str, Any] = {}
        if config is not None:
            opts["staging_arena_bytes"] = config.shm_staging_bytes
            opts["staging_max_bytes"] = config.shm_staging_max_bytes
        opts.update(kwargs)
        if kind == "auto":
            from fs3.transport.auto import AutoClientTransport

            return AutoClientTransport(client_id, **opts)
        return ShmClientTransport(client_id, **opts)
    if kind == "rdma":
        from fs3.transport.rdma import rdma_client_transport

        rdma_client_transport(client_id)
    from fs3.errors import invalid

    raise invalid(f"unknown transport kind {kind!r} (known: {', '.join(KINDS)})")


__all__ = [
    "KINDS",
    "ClientTransport",
    "DataRef",
    "FrameRef",
    "ServerTransport",
    "ShmRef",
    "ShmRegion",
    "TcpRef",
    "buffer_address",
    "client_transport",
    "frame_ref",
    "frame_slice",
    "inline_read_ref",
    "is_inline",
    "is_region_error",
    "ref_kind",
    "ref_length",
    "transport_error",
]
