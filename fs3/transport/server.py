"""Server half of the transports: one :class:`ServerTransport` per storage process.

A storage server accepts inline and shm DataRefs here, so a cluster can mix
clients (a remote client over the network, a local FUSE daemon on shm).
``frame`` refs (the bytes are the native RPC frame's bulk payload) never get
here: the storage servicer takes them from the call (:mod:`fs3.rpc.bulk`).
Wiring::

    st = ServerTransport.from_config(cfg.transport)
    add_servicer(grpc_server, transport_pb2_grpc.add_TransportServiceServicer_to_server, st.servicer)
    await st.start(host)
    ... advertise st.data_address with the node's routing info ...
    payload = await st.fetch(req.data)                          # write path
    await st.deliver_bytes(req.dest, data)  # read path (not inline): verified bytes
    # (deliver_file(req.dest, fd, offset, length) sends from a file without reading it)
    await st.stop()
"""

from __future__ import annotations

import asyncio
from typing import Any

from fs3.config import TransportSection
from fs3.errors import invalid
from fs3.proto import transport_pb2
from fs3.transport.base import ref_kind
from fs3.transport.region import PrivateCopies
from fs3.transport.shm import ShmRegistry, preadv_into, region_socket_path

_NOT_HERE = (
    "{kind} DataRef: the tcp data transport is the native RPC's frame payload now; "
    "frame refs are served by the storage service itself"
)


class TransportServicer:
    """``TransportService``: region registration for the shm transport."""

    def __init__(self, registry: ShmRegistry) -> None:
        self._registry = registry

    async def RegisterRegion(
        self, request: transport_pb2.RegisterRegionRequest, context: Any
    ) -> transport_pb2.RegisterRegionResponse:
        self._registry.register(request)
        return transport_pb2.RegisterRegionResponse()

    async def UnregisterRegion(
        self, request: transport_pb2.UnregisterRegionRequest, context: Any
    ) -> transport_pb2.UnregisterRegionResponse:
        self._registry.unregister(request.client_id, request.region)
        return transport_pb2.UnregisterRegionResponse()


class ServerTransport:
    """Serves DataRefs of every kind for one storage process.

    Args:
        region_check_interval_s: how often regions of dead owner pids are dropped.
        pread_thread_threshold: shm reads larger than this run ``preadv`` in a worker thread.
        copy_thread_threshold: shm write payloads this large are copied in a worker
            thread (:meth:`fetch`); smaller ones on the event loop (a thread hop costs
            more than copying them).
    """

    def __init__(
        self,
        *,
        region_check_interval_s: float = 1.0,
        pread_thread_threshold: int = 256 << 10,
        copy_thread_threshold: int = 4 << 20,
    ) -> None:
        self.regions = ShmRegistry(region_check_interval_s)
        self.servicer = TransportServicer(self.regions)
        self._pread_thread_threshold = pread_thread_threshold
        self._copy_thread_threshold = copy_thread_threshold
        self.copies = PrivateCopies()

    @classmethod
    def from_config(cls, cfg: TransportSection) -> ServerTransport:
        return cls(region_check_interval_s=cfg.region_check_interval_s)

    @property
    def data_address(self) -> str:
        """Always "": no separate data listener (bulk bytes ride the RPC connection)."""
        return ""

    async def start(self, host: str, address: str = "", socket_dir: str | None = None) -> None:
        """Start the region sweeper and, given the node's RPC ``address``, the region
        socket beside its RPC socket where same-host clients register regions by handle."""
        await self.regions.start()
        if address:
            await self.regions.serve_handles(region_socket_path(address, socket_dir))

    async def stop(self) -> None:
        await self.regions.stop()

    # -- write path --------------------------------------------------------------

    async def fetch(self, ref: transport_pb2.DataRef) -> memoryview:
        """The payload ``ref`` names, as bytes the sender can no longer change.

        inline: a read-only view of the request's bytes. shm (one-sided): the
        payload is in the sender's shared memory, which the sender reuses once
        it gives up on the request (a timeout) while this node may still be
        staging or forwarding it; bytes read from there after the checksum
        check could be other bytes, and a head's re-drive would commit them.
        So it is copied once, here, into private page-aligned memory
        (:class:`~fs3.transport.region.PrivateCopies`), and the caller checksums,
        stages and forwards only that copy: the bytes stored are exactly the
        bytes verified. Large payloads are copied in a worker thread, off the
        event loop.
        """
        kind = ref_kind(ref)
        if kind == "inline":
            return memoryview(ref.inline)
        if kind == "shm":
            # No release() of the view: on cancellation the worker thread may still
            # be copying from it; the last reference going keeps the mapping till then.
            view = self.regions.view(ref.shm)
            if view.nbytes >= self._copy_thread_threshold:
                return await asyncio.to_thread(self.copies.copy, view)
            return self.copies.copy(view)
        raise invalid(_NOT_HERE.format(kind=kind))

    # -- read path ----------------------------------------------------------------

    async def deliver_file(
        self, ref: transport_pb2.DataRef, fd: int, offset: int, length: int
    ) -> int:
        """Move ``length`` bytes of file ``fd`` at ``offset`` to the destination ``ref`` names.

        Returns the bytes delivered (fewer at end of file). Inline refs are
        refused: the bytes go in the RPC response (check :func:`is_inline`).
        """
        if length < 0 or offset < 0:
            raise invalid(f"bad file range offset={offset} length={length}")
        kind = ref_kind(ref)
        if kind == "shm":
            view = self.regions.view(ref.shm)
            if length > len(view):
                raise invalid(
                    f"cannot deliver {length} bytes into a {len(view)}-byte shm destination"
                )
            try:
                return await preadv_into(
                    fd, view[:length], offset, thread_threshold=self._pread_thread_threshold
                )
            finally:
                view.release()
        if kind != "inline":
            raise invalid(_NOT_HERE.format(kind=kind))
        raise invalid(
            "inline DataRef: return the bytes in the RPC response instead of delivering them"
        )

    def shm_dest_view(self, ref: transport_pb2.DataRef) -> memoryview | None:
        """The client memory a shm read destination names (writable, bounds-checked), else None.

        Lets the read path ``preadv`` chunk data straight into a USRBIO region and
        verify it there (no intermediate buffer). The caller must ``release()`` it.
        Raises INVALID_ARGUMENT for an unknown region or out-of-bounds range.
        """
        if ref_kind(ref) != "shm":
            return None
        return self.regions.view(ref.shm)

    async def deliver_bytes(
        self, ref: transport_pb2.DataRef, data: memoryview | bytes | bytearray
    ) -> int:
        """Like :meth:`deliver_file` for bytes already in memory."""
        kind = ref_kind(ref)
        src = (
            memoryview(data).cast("B")
            if not isinstance(data, memoryview) or data.format != "B"
            else data
        )
        if kind == "shm":
            view = self.regions.view(ref.shm)
            try:
                if len(src) > len(view):
                    raise invalid(
                        f"cannot deliver {len(src)} bytes into a {len(view)}-byte shm destination"
                    )
                view[: len(src)] = src
                return len(src)
            finally:
                view.release()
        if kind != "inline":
            raise invalid(_NOT_HERE.format(kind=kind))
        raise invalid(
            "inline DataRef: return the bytes in the RPC response instead of delivering them"
        )
