"""Server half of the transports: one :class:`ServerTransport` per storage process.

A storage server accepts every kind of DataRef at once (inline, shm, tcp), so a
cluster can mix clients (a remote client on tcp, a local FUSE daemon on shm,
storage-to-storage forwarding on tcp or inline). Wiring::

    st = ServerTransport.from_config(cfg.transport)
    add_servicer(grpc_server, transport_pb2_grpc.add_TransportServiceServicer_to_server, st.servicer)
    await st.start(host)            # data_address is now "host:port" (tcp) or ""
    ... advertise st.data_address with the node's routing info ...
    payload = await st.fetch(req.data)                          # write path
    await st.deliver_bytes(req.dest, data)  # read path (not inline): verified bytes
    # (deliver_file(req.dest, fd, offset, length) sends from a file without reading it)
    await st.stop()
"""

from __future__ import annotations

from typing import Any

from fs3.config import TransportSection
from fs3.errors import invalid
from fs3.proto import transport_pb2
from fs3.transport.base import ref_kind
from fs3.transport.shm import ShmRegistry, preadv_into
from fs3.transport.tcp import TcpServer


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
        tcp: start the framed TCP data listener (``data_address`` stays "" if not).
        tcp_port: its port (0 picks a free one).
        timeout_s: how long ``fetch`` waits for a tcp frame before a retryable TRANSPORT error.
        region_check_interval_s: how often regions of dead owner pids are dropped.
        pread_thread_threshold: shm reads larger than this run ``preadv`` in a worker thread.
    """

    def __init__(
        self,
        *,
        tcp: bool = True,
        tcp_port: int = 0,
        timeout_s: float = 30.0,
        region_check_interval_s: float = 1.0,
        pread_thread_threshold: int = 256 << 10,
    ) -> None:
        self.regions = ShmRegistry(region_check_interval_s)
        self.servicer = TransportServicer(self.regions)
        self._tcp = TcpServer(port=tcp_port, timeout_s=timeout_s) if tcp else None
        self._pread_thread_threshold = pread_thread_threshold

    @classmethod
    def from_config(cls, cfg: TransportSection) -> ServerTransport:
        return cls(
            tcp=True,
            tcp_port=cfg.tcp_port,
            timeout_s=cfg.timeout_s,
            region_check_interval_s=cfg.region_check_interval_s,
        )

    @property
    def data_address(self) -> str:
        """``host:port`` of the tcp data listener, "" if there is none (or not started)."""
        return self._tcp.address if self._tcp is not None else ""

    @property
    def tcp(self) -> TcpServer | None:
        return self._tcp

    async def start(self, host: str) -> None:
        await self.regions.start()
        if self._tcp is not None:
            await self._tcp.start(host)

    async def stop(self) -> None:
        if self._tcp is not None:
            await self._tcp.stop()
        await self.regions.stop()

    def _tcp_server(self) -> TcpServer:
        if self._tcp is None:
            raise invalid("this storage node does not serve the tcp transport")
        return self._tcp

    # -- write path --------------------------------------------------------------

    async def fetch(self, ref: transport_pb2.DataRef) -> memoryview:
        """The payload ``ref`` names (read-only for inline; a view into the region for shm).

        The view is valid until the caller drops it; do not keep it beyond the request.
        """
        kind = ref_kind(ref)
        if kind == "inline":
            return memoryview(ref.inline)
        if kind == "shm":
            return self.regions.view(ref.shm)
        if kind == "frame":
            raise invalid("a frame DataRef names the request's own payload (fs3.rpc.bulk)")
        return await self._tcp_server().fetch(ref.tcp)

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
        if kind == "tcp":
            return await self._tcp_server().deliver_file(ref.tcp, fd, offset, length)
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
        if kind == "tcp":
            return await self._tcp_server().deliver_bytes(ref.tcp, src)
        raise invalid(
            "inline DataRef: return the bytes in the RPC response instead of delivering them"
        )
