"""The bulk-data transport seam: what storage servers and clients code against.

A storage RPC never carries a chunk payload itself (except for the ``grpc``
kind); it carries a :class:`~fs3.proto.transport_pb2.DataRef` naming where the
payload is. Client and server agree on the bytes through a transport:

* ``grpc`` (:mod:`fs3.transport.inline`): the bytes are in the DataRef.
* ``tcp`` (:mod:`fs3.transport.tcp`): a framed binary protocol on one plain
  socket per (client, storage node), ``recv_into`` the destination and
  ``sendmsg``/``sendfile`` from the source; the DataRef names (connection,
  transfer id).
* ``shm`` (:mod:`fs3.transport.shm`): the client registers shared-memory
  regions with each storage node; the DataRef names (region, offset, length)
  and the server reads/writes the region directly (one-sided, like RDMA).
* ``rdma`` (:mod:`fs3.transport.rdma`): where verbs would go; not shipped.

Client side (one :class:`ClientTransport` per process / event loop)::

    ref, sent = await t.write_ref(node_address, data_address, payload)
    resp = await storage_rpc(..., data=ref)      # meanwhile tcp sends the frame
    await sent                                   # keep `sent` alive until the RPC returned

    ref, complete = await t.read_ref(node_address, data_address, dest)
    resp = await storage_rpc(..., dest=ref)
    if is_inline(ref): dest[:n] = resp.data      # grpc: bytes came in the response
    else: await complete(n)                      # n bytes are in dest now

Server side: :class:`fs3.transport.server.ServerTransport` (one per storage
process) — ``await fetch(ref)`` for the write path, ``await deliver_file(ref,
fd, offset, length)`` / ``await deliver_bytes(ref, data)`` for the read path.

Lifetimes: the awaitable returned by ``write_ref`` and the callable returned by
``read_ref`` own transport resources (a staging slot, a pending tcp transfer).
They are released when completed, or when the object is garbage-collected
(an RPC that failed before ``complete`` was called simply drops it).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from fs3.errors import Code, FsError
from fs3.proto import transport_pb2

if TYPE_CHECKING:
    from fs3.transport.region import ShmRegion

DataRef = transport_pb2.DataRef
ShmRef = transport_pb2.ShmRef
TcpRef = transport_pb2.TcpRef

KINDS = ("grpc", "tcp", "shm", "rdma")

ReadCompletion = Callable[[int], Awaitable[None]]


def ref_kind(ref: transport_pb2.DataRef) -> str:
    """``"inline"``, ``"shm"`` or ``"tcp"``; an empty DataRef counts as inline."""
    return ref.WhichOneof("kind") or "inline"


def is_inline(ref: transport_pb2.DataRef) -> bool:
    """True if the payload travels inside the RPC (request bytes / response bytes)."""
    return ref_kind(ref) == "inline"


def ref_length(ref: transport_pb2.DataRef) -> int:
    """Payload length (write) or capacity of the destination (read) a ref names."""
    kind = ref_kind(ref)
    if kind == "inline":
        return len(ref.inline)
    if kind == "shm":
        return int(ref.shm.length)
    return int(ref.tcp.length)


def inline_read_ref() -> transport_pb2.DataRef:
    """The DataRef a client sends to ask for the bytes inline in the response."""
    ref = transport_pb2.DataRef()
    ref.inline = b""
    return ref


def transport_error(message: str) -> FsError:
    """A failure of the data path (peer gone, timeout): retryable."""
    return FsError(Code.TRANSPORT, message, retryable=True)


class _Done:
    """An already-completed awaitable (for transports with nothing left to send)."""

    def __await__(self):  # type: ignore[no-untyped-def]
        return
        yield  # pragma: no cover  (makes this a generator)


DONE: Awaitable[None] = _Done()


async def _noop_complete(n: int) -> None:
    return None


class ClientTransport(abc.ABC):
    """Client half of a transport; one per client process (or event loop).

    Storage servers use one too, for forwarding writes to their successor.
    """

    kind: str = ""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id

    @abc.abstractmethod
    async def write_ref(
        self, node_address: str, data_address: str, data: memoryview
    ) -> tuple[transport_pb2.DataRef, Awaitable[None]]:
        """Describe ``data`` for a write RPC to the node at ``node_address``.

        Returns the DataRef to put in the request and an awaitable that
        completes when the payload has been handed over (tcp: sent on the data
        connection). ``data`` must not change until the RPC returned.
        """

    @abc.abstractmethod
    async def read_ref(
        self, node_address: str, data_address: str, dest: memoryview
    ) -> tuple[transport_pb2.DataRef, ReadCompletion]:
        """Describe ``dest`` (writable) for a read RPC; ``complete(n)`` waits for n bytes in it."""

    @property
    def regions(self) -> list[ShmRegion]:
        """Shared-memory regions whose buffers travel without copies (shm only)."""
        return []

    async def register_region(self, region: ShmRegion) -> str:
        """Make buffers inside ``region`` usable without copies (shm); others: no-op.

        A region (not an arbitrary buffer) because the server maps it by path:
        create one with ``ShmRegion.create(size)`` (USRBIO Iovs already are).
        Returns the region id.
        """
        return region.id

    async def unregister_region(self, region: ShmRegion) -> None:
        """Undo :meth:`register_region` on every node it reached."""
        return None

    def forget_node(self, node_address: str) -> None:
        """Drop per-node state (registrations, connections), e.g. after the node restarted.

        Call it when a storage RPC fails with an error for which
        :func:`fs3.transport.shm.is_region_error` is true; the next ref
        re-registers lazily.
        """
        return None

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections, staging memory and registrations."""
