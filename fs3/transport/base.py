"""The bulk-data transport seam: what storage servers and clients code against.

A storage RPC never carries a chunk payload itself (except for the ``grpc``
kind); it carries a :class:`~fs3.proto.transport_pb2.DataRef` naming where the
payload is. Client and server agree on the bytes through a transport:

* ``grpc`` (:mod:`fs3.transport.inline`): the bytes are in the DataRef.
* ``tcp``: an alias of ``grpc`` kept for existing configs. It once named a
  separate framed data connection; that folded into the native RPC transport
  (below), one framed protocol for control and bulk. ``TcpRef`` is retired.
* ``shm`` (:mod:`fs3.transport.shm`): the client registers shared-memory
  regions with each storage node; the DataRef names (region, offset, length)
  and the server reads/writes the region directly (one-sided, like RDMA).
* ``auto`` (:mod:`fs3.transport.auto`, the default): ``shm`` for buffers in
  registered regions (USRBIO Iovs) on same-host nodes, the RPC's own path for
  everything else.
* ``rdma`` (:mod:`fs3.transport.rdma`): where verbs would go; not shipped.

Whatever the kind, when the RPC itself travels over the native transport
(``[rpc] transport = "native"``) and the transport does not move the bytes
one-sided (:meth:`ClientTransport.one_sided`), the storage
client and storage-to-storage forwarding put a ``frame`` DataRef instead: the
bytes are the bulk payload of the same RPC frame (:mod:`fs3.rpc.bulk`),
received straight into the destination buffer on either side.

Client side (one :class:`ClientTransport` per process / event loop)::

    ref, sent = await t.write_ref(node_address, data_address, payload)
    resp = await storage_rpc(..., data=ref)
    await sent                                   # keep `sent` alive until the RPC returned

    ref, complete = await t.read_ref(node_address, data_address, dest)
    resp = await storage_rpc(..., dest=ref)
    if is_inline(ref): dest[:n] = resp.data      # grpc: bytes came in the response
    else: await complete(n)                      # n bytes are in dest now

Server side: :class:`fs3.transport.server.ServerTransport` (one per storage
process) — ``await fetch(ref)`` for the write path, ``await deliver_file(ref,
fd, offset, length)`` / ``await deliver_bytes(ref, data)`` for the read path.

Lifetimes: the awaitable returned by ``write_ref`` and the callable returned by
``read_ref`` own transport resources (a staging slot).
They are released when completed, or when the object is garbage-collected
(an RPC that failed before ``complete`` was called simply drops it).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from fs3.errors import Code, FsError
from fs3.proto import storage_pb2, transport_pb2

if TYPE_CHECKING:
    from fs3.transport.region import ShmRegion

DataRef = transport_pb2.DataRef
ShmRef = transport_pb2.ShmRef
TcpRef = transport_pb2.TcpRef
FrameRef = transport_pb2.FrameRef

KINDS = ("auto", "grpc", "tcp", "shm", "rdma")  # tcp: an alias of grpc (see above)

ReadCompletion = Callable[[int], Awaitable[None]]


def ref_kind(ref: transport_pb2.DataRef) -> str:
    """``"inline"``, ``"shm"``, ``"tcp"`` or ``"frame"``; an empty DataRef counts as inline."""
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
    if kind == "frame":
        return int(ref.frame.length)
    return int(ref.tcp.length)


def frame_ref(length: int) -> transport_pb2.DataRef:
    """A DataRef naming the whole bulk payload of its own frame (write: ``length``
    bytes sent with the request; read: a destination of ``length`` bytes)."""
    return transport_pb2.DataRef(frame=transport_pb2.FrameRef(offset=0, length=length))


def frame_slice(ref: transport_pb2.DataRef, payload: memoryview | None) -> memoryview:
    """The bytes a ``frame`` DataRef names inside the request's bulk payload.

    INVALID_ARGUMENT (nothing changes) when the request has no payload (e.g. it
    came over gRPC) or the range is outside it.
    """
    if payload is None:
        raise FsError(
            Code.INVALID_ARGUMENT,
            "frame DataRef without a frame payload (only the native transport carries one)",
        )
    off, n = int(ref.frame.offset), int(ref.frame.length)
    if off + n > len(payload):
        raise FsError(
            Code.INVALID_ARGUMENT,
            f"frame DataRef [{off}, {off + n}) outside the {len(payload)}-byte payload",
        )
    return payload[off : off + n]


def inline_read_ref() -> transport_pb2.DataRef:
    """The DataRef a client sends to ask for the bytes inline in the response."""
    ref = transport_pb2.DataRef()
    ref.inline = b""
    return ref


def batch_read_scatter(
    ios: Sequence[storage_pb2.ReadIO], dests: Sequence[memoryview | None], laid: list[bool]
) -> Callable[[bytes | memoryview, int], list[memoryview] | None]:
    """Lay a BatchRead answer's payload over the reads' own buffers.

    The server appends the bytes of each successful frame-destined read in io
    order, ``results[i].length`` long; anything else (a length beyond the
    buffer, a total that does not match) is refused, the payload is dropped
    and ``laid[0]`` stays False.
    """

    def layout(body: bytes | memoryview, length: int) -> list[memoryview] | None:
        resp = storage_pb2.BatchReadResponse.FromString(bytes(body))
        return scatter_views(ios, dests, resp, length, laid)

    return layout


def scatter_views(
    ios: Sequence[storage_pb2.ReadIO],
    dests: Sequence[memoryview | None],
    resp: storage_pb2.BatchReadResponse,
    length: int,
    laid: list[bool],
) -> list[memoryview] | None:
    """The buffers a parsed BatchRead answer's ``length``-byte payload goes to (see
    :func:`batch_read_scatter`); None (and ``laid[0]`` unchanged) if it does not fit."""
    if len(resp.results) != len(ios):
        return None
    views: list[memoryview] = []
    total = 0
    for io, d, r in zip(ios, dests, resp.results, strict=True):
        if d is None or r.error.code or not r.length or ref_kind(io.dest) != "frame":
            continue
        if r.length > len(d):
            return None
        views.append(d[: r.length])
        total += r.length
    if total != length:
        return None
    laid[0] = True
    return views


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

    async def forward_ref(
        self, node_address: str, data_address: str, data: memoryview
    ) -> tuple[transport_pb2.DataRef, Awaitable[None]] | None:
        """How a storage node forwards ``data`` (a payload it received) to a successor.

        None: send it as the native frame's payload (or inline over gRPC). A
        transport that reaches the node through shared memory copies it into a
        staging arena instead: one ``memmove`` into memory mapped long ago, where a
        frame costs the successor a fresh payload-sized buffer (zeroed, page
        faulted) and a socket copy on each side.
        """
        return None

    def one_sided(self, node_address: str, buf: memoryview) -> bool:
        """True if the bytes of an I/O on ``buf`` with this node move one-sided (shm).

        Otherwise a caller on the native RPC sends a ``frame`` ref and the bytes
        as the frame's payload, received straight into ``buf``.
        """
        return False

    def read_ref_ready(self, node_address: str, dest: memoryview) -> transport_pb2.DataRef | None:
        """The ref of a one-sided read into ``dest`` when it needs no setup (no await,
        no staging: shm with ``dest`` inside a region the node already mapped), else
        None and the caller takes :meth:`one_sided` / :meth:`read_ref`."""
        return None

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

    def staging_buffer(self, size: int) -> tuple[memoryview, Callable[[], None]] | None:
        """A writable buffer of ``size`` bytes that :meth:`write_ref` sends without copying,
        and the function that gives it back; None when no such memory is free or every
        buffer travels alike (the default: the caller uses its own memory).

        Never waits: a writer that gets None uses ordinary memory (one copy later).
        """
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
