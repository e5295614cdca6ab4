"""Where an RDMA transport plugs in (not shipped: nothing here can test it).

The ``shm`` transport (:mod:`fs3.transport.shm`) already has RDMA's shape:
one-sided transfers into memory the client registered beforehand. An RDMA
transport is one module implementing the same two halves:

* client: ``RdmaClientTransport(ClientTransport)`` — ``register_region`` does
  ``ibv_reg_mr`` on the buffer (USRBIO Iovs, staging arenas) and sends
  ``RegisterRegion`` carrying the rkey/remote address (add fields to
  ``RegisterRegionRequest`` and an ``RdmaRef{region, remote_addr, rkey, length}``
  to the ``DataRef`` oneof in proto/transport.proto); ``write_ref`` /
  ``read_ref`` return that ref and a no-op completion, exactly like shm.
* server: in :class:`fs3.transport.server.ServerTransport`, ``fetch`` posts an
  RDMA READ of the client's range into a registered server buffer and awaits
  its completion; ``deliver_file`` reads the chunk into a registered buffer and
  posts an RDMA WRITE (3FS does the same: storage pulls writes, pushes reads);
  a connection manager (rdma_cm) per client beside the native RPC connection.

This kernel has no InfiniBand/RoCE support and no verbs library, so rather than
ship untested code, selecting ``rdma`` fails clearly.
"""

from __future__ import annotations

from fs3.errors import Code, FsError


def rdma_client_transport(client_id: str) -> None:
    """Always raises: RDMA is not implemented in fs3 (see the module docstring)."""
    raise FsError(
        Code.NOT_IMPLEMENTED,
        "the rdma transport is not implemented (no RDMA on this platform); use grpc (native frame payloads) or shm",
        retryable=False,
    )
