"""A minimal chunk-level client of the storage service (storage tests, benchmarks/storage_io.py).

It speaks the StorageService RPCs directly: writes go to the chain head,
reads to a chosen (default: random serving) replica; retryable errors
(CHAIN_VERSION_MISMATCH, NOT_HEAD, TARGET_NOT_SERVING, unavailable nodes…)
refresh routing and retry with backoff until ``retry_deadline_s``. Each update
carries an exactly-once tag (client id, channel, seqnum) kept across retries.
The full file-level client lives in ``fs3.client``; this one deliberately has
no file or layout logic.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fs3.errors import Code, FsError
from fs3.proto import mgmtd_pb2, storage_pb2, storage_pb2_grpc
from fs3.routing import Routing
from fs3.rpc.channel import ChannelPool, call
from fs3.storage.chunk_engine import crc32c
from fs3.transport import ClientTransport, client_transport, frame_ref, is_inline
from fs3.transport.base import batch_read_scatter

T = TypeVar("T")

# at most the server's per-request limit (operator.MAX_READ_IOS); 256 x 64 KiB keeps an
# answer's bulk payload far below the native transport's payload limit
MAX_BATCH_READS = 256
BATCH_READ_MAX_BYTES = 64 << 10  # only reads up to this size share a BatchRead

# a queued read: (io, its future, the buffer its bytes land in over native frames)
_Read = tuple[storage_pb2.ReadIO, "asyncio.Future[storage_pb2.ReadResult]", memoryview]


class RoutingSource:
    """Anything with ``async get_routing(known_version)`` (a ``MgmtdClient``)."""

    async def get_routing(
        self, known_version: int = 0
    ) -> mgmtd_pb2.RoutingInfo | None:  # pragma: no cover
        raise NotImplementedError


class DirectStorageClient:
    """Chunk reads/writes against a chain, following routing changes.

    Args:
        mgmtd: routing source (``MgmtdClient``).
        transport: ``grpc`` | ``tcp`` | ``shm`` or a ``ClientTransport``.
        retry_deadline_s: keep retrying retryable failures this long.
        rpc_timeout_s: deadline of one RPC.
        capability: the chunk capability every request carries (on a cluster with a
            secret: a service token, ``fs3.security.capability.ServiceToken(...).token``).
    """

    def __init__(
        self,
        mgmtd: Any,
        transport: str | ClientTransport = "grpc",
        *,
        retry_deadline_s: float = 30.0,
        rpc_timeout_s: float = 10.0,
        client_id: str = "",
        capability: Callable[[], bytes] = lambda: b"",
    ) -> None:
        self.mgmtd = mgmtd
        self.capability = capability
        self.client_id = client_id or f"direct-{uuid.uuid4().hex[:12]}"
        self.transport = (
            client_transport(transport, self.client_id) if isinstance(transport, str) else transport
        )
        self.retry_deadline_s = retry_deadline_s
        self.rpc_timeout_s = rpc_timeout_s
        self.routing = Routing.empty()
        self._pool = ChannelPool()
        # chunk bytes as the native frame's payload (not for shm: one-sided is cheaper)
        self._frames = self._pool.carries_payload and self.transport.kind != "shm"
        self._stubs: dict[str, storage_pb2_grpc.StorageServiceStub] = {}
        self._seq = itertools.count(1)
        self._channels = itertools.cycle(range(1, 65536))
        self._rng = random.Random(0)
        self.retries = 0
        self._read_queues: dict[str, list[_Read]] = {}
        self._bg: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        if self._bg:
            await asyncio.gather(*self._bg, return_exceptions=True)
        await self.transport.close()
        await self._pool.close()

    async def refresh(self) -> Routing:
        info = await self.mgmtd.get_routing(0)
        if info is not None and info.version >= self.routing.version:
            self.routing = Routing(info)
        return self.routing

    def stub(self, address: str) -> storage_pb2_grpc.StorageServiceStub:
        s = self._stubs.get(address)
        if s is None:
            s = self._stubs[address] = storage_pb2_grpc.StorageServiceStub(self._pool.get(address))
        return s

    async def _retry(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        deadline = time.monotonic() + self.retry_deadline_s
        delay = 0.02
        if self.routing.version == 0:
            await self.refresh()
        while True:
            try:
                return await fn()
            except FsError as e:
                if not e.retryable and e.code not in (Code.UNKNOWN_CHAIN, Code.UNKNOWN_TARGET):
                    raise
                if time.monotonic() + delay > deadline:
                    raise
                self.retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
                try:
                    await self.refresh()
                except FsError:
                    pass

    # ------------------------------------------------------------------ updates

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
    ) -> storage_pb2.IOResult:
        """One replicated chunk update through the chain head (exactly once across retries)."""
        mv = memoryview(data)
        tag = storage_pb2.UpdateTag(
            client_id=self.client_id,
            request_id=next(self._seq),
            channel_id=next(self._channels),
            seqnum=next(self._seq),
        )
        checksum = crc32c(mv) if type == storage_pb2.UPDATE_WRITE else 0

        async def attempt() -> storage_pb2.IOResult:
            r = self.routing
            head = r.head(chain_id)
            if head is None:
                raise FsError(Code.TARGET_NOT_SERVING, f"chain {chain_id} has no serving target")
            node = r.node_of_target(head)
            io = storage_pb2.UpdateIO(
                chain_id=chain_id,
                chain_version=r.chain_version(chain_id),
                type=type,  # type: ignore[arg-type]
                offset=offset,
                length=len(mv) if length is None else length,
                chunk_size=chunk_size,
                checksum=checksum,
            )
            io.chunk.inode, io.chunk.index = inode, index
            sent: Any = None
            bulk: memoryview | None = None
            if type == storage_pb2.UPDATE_WRITE:
                if self._frames:  # the bytes are the frame's payload (fs3.client.storage_client)
                    bulk = mv
                    io.data.CopyFrom(frame_ref(len(mv)))
                else:
                    ref, sent = await self.transport.write_ref(node.address, node.data_address, mv)
                    io.data.CopyFrom(ref)
            resp = await call(
                self.stub(node.address).Write,
                storage_pb2.WriteRequest(
                    io=io, tag=tag, target_id=head, capability=self.capability()
                ),
                timeout=self.rpc_timeout_s,
                what=f"Write@{node.address}",
                payload=bulk,
            )
            if sent is not None:
                await sent
            return resp.result

        return await self._retry("write", attempt)

    async def write(
        self,
        chain_id: int,
        inode: int,
        index: int,
        offset: int,
        data: bytes | bytearray | memoryview,
        chunk_size: int = 1 << 20,
    ) -> storage_pb2.IOResult:
        return await self.update(
            chain_id, inode, index, offset=offset, data=data, chunk_size=chunk_size
        )

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
    ) -> tuple[bytes | memoryview, storage_pb2.ReadResult]:
        """Read committed bytes from ``target_id`` (0: a random serving replica).

        Returns (bytes, result); the result's error is raised as FsError.
        """
        dest = into if into is not None else memoryview(bytearray(length))

        async def attempt() -> tuple[bytes | memoryview, storage_pb2.ReadResult]:
            r = self.routing
            tid = target_id
            if not tid:
                serving = r.serving_targets(chain_id)
                if not serving:
                    raise FsError(
                        Code.TARGET_NOT_SERVING, f"chain {chain_id} has no serving target"
                    )
                tid = self._rng.choice(serving)
            node = r.node_of_target(tid)
            complete: Any = None
            if self._frames:
                ref = frame_ref(length)
            else:
                ref, complete = await self.transport.read_ref(
                    node.address, node.data_address, dest[:length]
                )
            rio = storage_pb2.ReadIO(
                capability=self.capability(),
                chain_id=chain_id,
                chain_version=r.chain_version(chain_id),
                offset=offset,
                length=length,
                target_id=tid,
            )
            rio.chunk.inode, rio.chunk.index = inode, index
            rio.dest.CopyFrom(ref)
            res = await self._batched_read(node.address, rio, dest[:length])
            if res.error.code:
                raise FsError(res.error.code, res.error.message, retryable=res.error.retryable)
            if is_inline(ref):
                return res.data, res
            if complete is not None:
                await complete(res.length)
            return dest[: res.length], res

        return await self._retry("read", attempt)

    async def _batched_read(
        self, address: str, rio: storage_pb2.ReadIO, dest: memoryview
    ) -> storage_pb2.ReadResult:
        """Send ``rio`` in one ``BatchRead`` together with every read for ``address`` issued meanwhile.

        Why: one RPC costs far more CPU than serving a small read, so concurrent
        small reads to the same node (queue depth > 1) share one request. Reads
        queued during the current event-loop turn go out together on the next
        turn, so a lone read waits one loop iteration and nothing more.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[storage_pb2.ReadResult] = loop.create_future()
        if rio.length > BATCH_READ_MAX_BYTES:
            # Large reads: the RPC overhead is small next to the transfer, and a
            # batch answers only when its slowest read is done (no pipelining).
            await self._send_reads(address, [(rio, fut, dest)])
            return fut.result()
        q = self._read_queues.get(address)
        if q is None:
            q = self._read_queues[address] = []
            loop.call_soon(self._flush_reads, address)
        q.append((rio, fut, dest))
        return await fut

    def _flush_reads(self, address: str) -> None:
        q = self._read_queues.pop(address, [])
        for i in range(0, len(q), MAX_BATCH_READS):
            task = asyncio.get_running_loop().create_task(
                self._send_reads(address, q[i : i + MAX_BATCH_READS])
            )
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)

    async def _send_reads(
        self,
        address: str,
        batch: list[_Read],
    ) -> None:
        live = [(r, f) for r, f, _ in batch if not f.done()]
        dests: list[memoryview | None] = [d for _, f, d in batch if not f.done()]
        if not live:
            return
        try:
            req = storage_pb2.BatchReadRequest(ios=[r for r, _ in live], client_id=self.client_id)
            if self._frames:  # the bytes land in each read's buffer with the answer
                laid = [False]
                resp, n = await call(
                    self.stub(address).BatchRead,
                    req,
                    timeout=self.rpc_timeout_s,
                    what=f"BatchRead@{address}",
                    into=batch_read_scatter(req.ios, dests, laid),
                )
                if n and not laid[0]:
                    raise FsError(
                        Code.TRANSPORT,
                        f"BatchRead@{address}: payload does not match the read lengths",
                        retryable=True,
                    )
            else:
                resp = await call(
                    self.stub(address).BatchRead,
                    req,
                    timeout=self.rpc_timeout_s,
                    what=f"BatchRead@{address}",
                )
            if len(resp.results) != len(live):
                raise FsError(
                    Code.INTERNAL,
                    f"BatchRead@{address}: {len(resp.results)} results for {len(live)} reads",
                )
        except BaseException as e:
            err = (
                e
                if isinstance(e, FsError)
                else FsError(Code.CANCELLED, f"BatchRead@{address}: {e!r}")
            )
            for _, f in live:
                if not f.done():
                    f.set_exception(err)
            if not isinstance(e, Exception):
                raise
            return
        for (_, f), res in zip(live, resp.results, strict=True):
            if not f.done():
                f.set_result(res)

    # ------------------------------------------------------------------ admin

    async def list_chunks(self, target_id: int) -> list[storage_pb2.ChunkMeta]:
        if self.routing.version == 0:
            await self.refresh()
        node = self.routing.node_of_target(target_id)
        resp = await call(
            self.stub(node.address).ListChunks,
            storage_pb2.ListChunksRequest(target_id=target_id),
            timeout=self.rpc_timeout_s,
        )
        return list(resp.metas)

    async def query_last_chunk(self, chain_id: int, inode: int) -> storage_pb2.QueryLastChunkResult:
        async def attempt() -> storage_pb2.QueryLastChunkResult:
            r = self.routing
            serving = r.serving_targets(chain_id)
            if not serving:
                raise FsError(Code.TARGET_NOT_SERVING, f"chain {chain_id} has no serving target")
            node = r.node_of_target(serving[0])
            op = storage_pb2.QueryLastChunkOp(
                chain_id=chain_id,
                chain_version=r.chain_version(chain_id),
                capability=self.capability(),
            )
            op.range.inode = inode
            resp = await call(
                self.stub(node.address).QueryLastChunk,
                storage_pb2.QueryLastChunkRequest(ops=[op]),
                timeout=self.rpc_timeout_s,
            )
            res = resp.results[0]
            if res.error.code:
                raise FsError(res.error.code, res.error.message, retryable=res.error.retryable)
            return res

        return await self._retry("query", attempt)

    async def remove_chunks(self, chain_id: int, inode: int, begin: int = 0, end: int = 0) -> int:
        total = 0
        while True:

            async def attempt() -> storage_pb2.RemoveChunksResult:
                r = self.routing
                head = r.head(chain_id)
                if head is None:
                    raise FsError(
                        Code.TARGET_NOT_SERVING, f"chain {chain_id} has no serving target"
                    )
                node = r.node_of_target(head)
                op = storage_pb2.RemoveChunksOp(
                    chain_id=chain_id,
                    chain_version=r.chain_version(chain_id),
                    capability=self.capability(),
                )
                op.range.inode, op.range.begin, op.range.end = inode, begin, end
                resp = await call(
                    self.stub(node.address).RemoveChunks,
                    storage_pb2.RemoveChunksRequest(ops=[op]),
                    timeout=self.rpc_timeout_s,
                )
                res = resp.results[0]
                if res.error.code:
                    raise FsError(res.error.code, res.error.message, retryable=res.error.retryable)
                return res

            res = await self._retry("remove", attempt)
            total += res.removed
            if not res.more:
                return total
