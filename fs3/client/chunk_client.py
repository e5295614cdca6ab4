"""A chunk-level facade over the storage client, for tools, storage tests and benchmarks.

fs3 has one storage client (:class:`fs3.client.storage_client.StorageClient`):
retries, replica choice, read batching and the transports live there. Storage
tests and ``benchmarks/storage_io.py`` address chunks (chain, inode, index)
rather than files and want the storage service's answers (commit versions,
checksums, replica contents); this class gives them that through the same
client, with its own routing copy fetched from mgmtd, a channel pool and a
transport::

    cl = ChunkClient(mgmtd_client, "auto")
    await cl.refresh()
    res = await cl.write(chain, inode, index, offset, data, chunk_size=cs)
    data, rr = await cl.read(chain, inode, index, 0, cs, target_id=tid)
    await cl.close()
"""

from __future__ import annotations

import uuid
from typing import Any

from fs3.client.retry import RetryPolicy
from fs3.client.storage_client import StorageClient
from fs3.errors import invalid
from fs3.proto import storage_pb2, storage_pb2_grpc
from fs3.routing import Routing
from fs3.rpc.channel import ChannelPool
from fs3.transport import ClientTransport, client_transport


class ChunkClient:
    """Chunk reads/writes/updates against chains, following routing changes.

    Args:
        mgmtd: routing source (anything with ``async get_routing(known_version)``,
            e.g. a ``MgmtdClient``).
        transport: a transport kind (``auto`` | ``grpc`` | ``tcp`` | ``shm``) or a
            ``ClientTransport`` (then the caller keeps owning it).
        retry_deadline_s: keep retrying retryable failures this long.
        rpc_timeout_s: deadline of one RPC.
    """

    def __init__(
        self,
        mgmtd: Any,
        transport: str | ClientTransport = "auto",
        *,
        retry_deadline_s: float = 30.0,
        rpc_timeout_s: float = 10.0,
        client_id: str = "",
        io_depth: int = 16,
    ) -> None:
        self.mgmtd = mgmtd
        self.client_id = client_id or f"chunks-{uuid.uuid4().hex[:12]}"
        self._owns_transport = isinstance(transport, str)
        self.transport = (
            client_transport(transport, self.client_id) if isinstance(transport, str) else transport
        )
        self.routing = Routing.empty()
        self._pool = ChannelPool()
        self.storage = StorageClient(
            lambda: self.routing,
            self.refresh,
            self._pool,
            self.transport,
            self.client_id,
            RetryPolicy(deadline_s=retry_deadline_s, rpc_timeout_s=rpc_timeout_s),
            io_depth=io_depth,
        )

    async def close(self) -> None:
        await self.storage.close()
        if self._owns_transport:
            await self.transport.close()
        await self._pool.close()

    async def refresh(self) -> Routing:
        """Fetch routing from mgmtd (never goes back to an older version)."""
        info = await self.mgmtd.get_routing(0)
        if info is not None and info.version >= self.routing.version:
            self.routing = Routing(info)
        return self.routing

    async def _routed(self) -> None:
        if self.routing.version == 0:
            await self.refresh()

    @property
    def retries(self) -> int:
        """Attempts that were retries (reads and writes)."""
        st = self.storage.stats
        return st["read_retries"] + st["write_retries"]

    def stub(self, address: str) -> storage_pb2_grpc.StorageServiceStub:
        return self.storage.stub(address)

    # ------------------------------------------------------------------ updates

    async def write(
        self,
        chain_id: int,
        inode: int,
        index: int,
        offset: int,
        data: bytes | bytearray | memoryview,
        chunk_size: int = 1 << 20,
    ) -> storage_pb2.IOResult:
        """One replicated chunk write through the chain head (exactly once across retries)."""
        await self._routed()
        return await self.storage.write_chunk(inode, chain_id, index, chunk_size, offset, data)

    async def update(
        self,
        chain_id: int,
        inode: int,
        index: int,
        *,
        type: int = storage_pb2.UPDATE_WRITE,
        offset: int = 0,
        data: bytes | bytearray | memoryview = b"",
        length: int | None = None,
        chunk_size: int = 1 << 20,
    ) -> None:
        """A write, truncate (to ``length``) or extend (to ``length``, never shrinking)."""
        await self._routed()
        if type == storage_pb2.UPDATE_WRITE:
            await self.write(chain_id, inode, index, offset, data, chunk_size)
            return
        if type not in (storage_pb2.UPDATE_TRUNCATE, storage_pb2.UPDATE_EXTEND) or length is None:
            raise invalid(f"update type {type} needs write data or a truncate/extend length")
        await self.storage.truncate_chunk(
            inode,
            chain_id,
            index,
            length,
            chunk_size,
            only_extend=type == storage_pb2.UPDATE_EXTEND,
        )

    async def remove_chunks(self, chain_id: int, inode: int, begin: int = 0, end: int = 0) -> int:
        """Remove chunks ``begin <= index < end`` (end 0: no limit); returns how many."""
        await self._routed()
        return await self.storage.remove_chunks(inode, [chain_id], begin, end)

    # ------------------------------------------------------------------ reads

    async def read(
        self,
        chain_id: int,
        inode: int,
        index: int,
        offset: int,
        length: int,
        *,
        target_id: int = 0,
        into: memoryview | None = None,
    ) -> tuple[memoryview, storage_pb2.ReadResult]:
        """Committed bytes from ``target_id`` (0: the least-loaded serving replica).

        Returns (the bytes read, inside ``into`` when given, and the result); a
        missing chunk raises ``CHUNK_NOT_FOUND``.
        """
        await self._routed()
        dest = into[:length] if into is not None else memoryview(bytearray(length))
        res = await self.storage.read_chunk(
            inode, chain_id, index, offset, dest, target_id=target_id
        )
        return dest[: res.length], res

    async def query_last_chunk(self, chain_id: int, inode: int) -> storage_pb2.QueryLastChunkResult:
        await self._routed()
        return await self.storage.query_last_chunk(inode, chain_id)

    async def list_chunks(self, target_id: int) -> list[storage_pb2.ChunkMeta]:
        await self._routed()
        return await self.storage.list_chunks(target_id)
