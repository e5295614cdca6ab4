"""The ``auto`` transport (the default): one-sided shm where it can be, the RPC's own path elsewhere.

A USRBIO Iov is a shared-memory region; when the storage node runs on the same
host, the node can map it and ``preadv`` a chunk straight into the application's
buffer (no socket, no Python copy: :mod:`fs3.transport.shm`). Across hosts the
region is of no use to the node; there the bytes ride the native RPC frame as
its bulk payload, which the client's buffered receive scatters straight into the
same buffer (:mod:`fs3.rpc.native.wire`). ``auto`` picks per I/O:

* the node is on this host (its region socket, through which a client hands
  it a region's descriptor, is reachable: :mod:`fs3.transport.shm`) **and** the
  buffer lies inside a registered region (Iovs, registered by the USRBIO agent
  through :meth:`register_region`) or a staging arena it was taken from
  (:meth:`staging_buffer`: the write-behind engine's buffers, written in shm
  in the first place; once the arena is registered on that node, which starts
  in the background at its first use) -> shm;
* anything else -> the storage client sends a ``frame`` ref (native RPC), or,
  over gRPC, the bytes inline. A buffer outside every region is never staged:
  copying it into shm would cost the copy the frame receive avoids.

A node that looked local but cannot take the region (its socket does not
answer, or it refuses the descriptor) is remembered as remote and the I/O is
retried on the frame path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from fs3.errors import Code, FsError
from fs3.proto import transport_pb2
from fs3.rpc import settings
from fs3.rpc.native import endpoints
from fs3.transport.base import DONE, ReadCompletion, _noop_complete, inline_read_ref
from fs3.transport.region import ShmRegion
from fs3.transport.shm import ShmClientTransport, is_region_error, region_socket_path


def same_host(node_address: str) -> bool:
    """True if the storage node advertising ``node_address`` takes shm regions from this
    host: its region socket (:func:`fs3.transport.shm.region_socket_path`) is here."""
    return endpoints.exists(region_socket_path(node_address, settings.current().socket_dir))


class AutoClientTransport(ShmClientTransport):
    """shm for registered regions on same-host nodes; the RPC's own bytes otherwise.

    ``is_local`` decides whether a node shares this host (default :func:`same_host`,
    asked once per node until :meth:`forget_node`); tests pass their own.
    """

    kind = "auto"

    def __init__(
        self,
        client_id: str,
        *,
        is_local: Callable[[str], bool] = same_host,
        **kwargs: object,
    ) -> None:
        super().__init__(client_id, **kwargs)  # type: ignore[arg-type]
        self._is_local = is_local
        self._local: dict[str, bool] = {}
        self._last: tuple[str, memoryview, tuple[ShmRegion, int]] | None = None
        self._hint: tuple[ShmRegion, int] | None = None
        self.stats = {"one_sided": 0, "fallback": 0}

    def node_is_local(self, node_address: str) -> bool:
        local = self._local.get(node_address)
        if local is None:
            local = self._local[node_address] = bool(self._is_local(node_address))
        return local

    def one_sided(self, node_address: str, buf: memoryview) -> bool:
        self._last = None
        if not (self._regions or self._staging.arenas) or not self.node_is_local(node_address):
            return False
        found = super()._locate(memoryview(buf))
        if found is None:
            return False
        if found[0].id not in self._regions and not self._arena_ready(node_address, found[0]):
            return False
        self.stats["one_sided"] += 1
        # the storage client asks for the ref of this very buffer next: spare it a second lookup
        self._last = (node_address, buf, found)
        return True

    def _arena_ready(self, node_address: str, region: ShmRegion) -> bool:
        """True if the staging arena ``region`` is registered on the node already.

        If not, registration starts in the background and this I/O goes as a frame:
        a buffered write never waits for it (registering takes a thread, which a
        process flushing its files at interpreter exit can no longer start).
        """
        st = self._nodes.get(node_address)
        fut = st.registered.get(region.id) if st is not None else None
        if fut is not None and fut.done():
            return not fut.cancelled() and fut.exception() is None
        if fut is None:
            try:
                task = asyncio.get_running_loop().create_task(
                    self._register_quietly(node_address, region)
                )
            except RuntimeError:  # no loop running: nothing to start it on
                return False
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
        return False

    async def _register_quietly(self, node_address: str, region: ShmRegion) -> None:
        # a failure is remembered by _ensure_registered (a node that cannot map our
        # memory gets frames from now on) or retried by the next I/O
        with contextlib.suppress(Exception):
            await self._ensure_registered(node_address, region)

    async def forward_ref(
        self, node_address: str, data_address: str, data: memoryview
    ) -> tuple[transport_pb2.DataRef, Awaitable[None]] | None:
        """Staged into shm for a same-host successor (see the base class), a frame otherwise."""
        if not self.node_is_local(node_address):
            return None
        return await ShmClientTransport.write_ref(self, node_address, data_address, data)

    def read_ref_ready(self, node_address: str, dest: memoryview) -> transport_pb2.DataRef | None:
        ref = super().read_ref_ready(node_address, dest)  # registered there: the node is local
        if ref is not None:
            self.stats["one_sided"] += 1
        return ref

    def _located(self, node_address: str, buf: memoryview) -> tuple[ShmRegion, int] | None:
        """Where ``buf`` lies if it moves one-sided to this node (the last answer reused)."""
        last, self._last = self._last, None
        if last is not None and last[0] == node_address and last[1] is buf:
            return last[2]
        if not self.one_sided(node_address, buf):
            return None
        last, self._last = self._last, None
        return last[2] if last is not None else None

    def _locate(self, view: memoryview) -> tuple[ShmRegion, int] | None:
        # the shm ref code asks before its first await; the hint is the answer for this I/O
        hint, self._hint = self._hint, None
        return hint if hint is not None else super()._locate(view)

    def forget_node(self, node_address: str) -> None:
        super().forget_node(node_address)
        self._local.pop(node_address, None)

    async def _ensure_registered(self, node: str, region: ShmRegion) -> None:
        try:
            await super()._ensure_registered(node, region)
        except FsError as e:
            unreachable = e.code == Code.TRANSPORT and not e.retryable  # no region socket here
            refused = e.code == Code.INVALID_ARGUMENT and not is_region_error(e)
            if not (unreachable or refused):
                raise
            # the node cannot map our memory (not really this host): frames from now on
            self._local[node] = False
            self.stats["fallback"] += 1
            raise FsError(
                Code.TRANSPORT,
                f"node {node} cannot map this process's shared memory ({e.message}); "
                "using the RPC's own payload path",
                retryable=True,
            ) from e

    async def write_ref(
        self, node_address: str, data_address: str, data: memoryview
    ) -> tuple[transport_pb2.DataRef, Awaitable[None]]:
        found = self._located(node_address, data)
        if found is None:
            return transport_pb2.DataRef(inline=bytes(data)), DONE  # gRPC RPCs only
        self._hint = found
        try:
            return await super().write_ref(node_address, data_address, data)
        finally:
            self._hint = None

    async def read_ref(
        self, node_address: str, data_address: str, dest: memoryview
    ) -> tuple[transport_pb2.DataRef, ReadCompletion]:
        found = self._located(node_address, dest)
        if found is None:
            return inline_read_ref(), _noop_complete  # gRPC RPCs only
        self._hint = found
        try:
            return await super().read_ref(node_address, data_address, dest)
        finally:
            self._hint = None
