"""gRPC adapter of the storage service: every handler forwards to :class:`StorageOperator`.

Thin on purpose (3FS ``StorageSerdeService``): no logic, no grpc imports;
``FsError`` becomes a status with ``ErrorDetail`` in ``fs3.rpc.server``. Over the
native transport the chunk bytes of Write/Update/BatchRead travel as the
frame's bulk payload (``frame`` DataRefs): :mod:`fs3.rpc.bulk` hands them over.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from fs3.proto import storage_pb2, storage_pb2_grpc
from fs3.rpc.bulk import can_reply_payload, request_payload, set_reply_payload, with_payload
from fs3.storage.operator import StorageOperator


class StorageServicer(storage_pb2_grpc.StorageServiceServicer):
    def __init__(self, operator: StorageOperator) -> None:
        self.op = operator

    async def Write(
        self, request: storage_pb2.WriteRequest, context: Any
    ) -> storage_pb2.WriteResponse:
        return await self.op.write(request, request_payload(context))

    async def Update(
        self, request: storage_pb2.UpdateRequest, context: Any
    ) -> storage_pb2.UpdateResponse:
        return await self.op.update(request, request_payload(context))

    async def BatchRead(
        self, request: storage_pb2.BatchReadRequest, context: Any
    ) -> storage_pb2.BatchReadResponse:
        if not can_reply_payload(context):
            return await self.op.batch_read(request)
        reply: list[Any] = []
        resp = await self.op.batch_read(request, reply)
        if reply:
            set_reply_payload(context, reply)
        return resp

    async def ReadStream(
        self, request_iterator: AsyncIterable[storage_pb2.BatchReadRequest], context: Any
    ) -> AsyncIterator[storage_pb2.BatchReadResponse]:
        frames = can_reply_payload(context)
        async for resp, payload in self.op.read_stream(request_iterator, frames=frames):
            yield with_payload(context, resp, payload) if payload else resp

    async def QueryLastChunk(
        self, request: storage_pb2.QueryLastChunkRequest, context: Any
    ) -> storage_pb2.QueryLastChunkResponse:
        return await self.op.query_last_chunk(request)

    async def TruncateChunks(
        self, request: storage_pb2.TruncateChunksRequest, context: Any
    ) -> storage_pb2.TruncateChunksResponse:
        return await self.op.truncate_chunks(request)

    async def RemoveChunks(
        self, request: storage_pb2.RemoveChunksRequest, context: Any
    ) -> storage_pb2.RemoveChunksResponse:
        return await self.op.remove_chunks(request)

    async def SyncStart(
        self, request: storage_pb2.SyncStartRequest, context: Any
    ) -> storage_pb2.SyncStartResponse:
        return await self.op.sync_start(request)

    async def SyncDone(
        self, request: storage_pb2.SyncDoneRequest, context: Any
    ) -> storage_pb2.SyncDoneResponse:
        return await self.op.sync_done(request)

    async def SpaceInfo(
        self, request: storage_pb2.SpaceInfoRequest, context: Any
    ) -> storage_pb2.SpaceInfoResponse:
        return await self.op.space_info(request)

    async def ListChunks(
        self, request: storage_pb2.ListChunksRequest, context: Any
    ) -> storage_pb2.ListChunksResponse:
        return await self.op.list_chunks(request)
