"""MetaService servicer: a thin adapter from gRPC to :class:`MetaOperator`.

Each handler runs the (blocking) operator method on a worker thread so the
event loop keeps serving; errors are mapped to statuses by
``fs3.rpc.server.guard_servicer``, so nothing here catches exceptions. The
context is typed ``Any``: servicers never touch grpc directly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Histogram

from fs3.errors import FsError
from fs3.meta.operator import MetaOperator
from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc

REQUESTS = Counter(
    "fs3_meta_requests_total", "meta requests by operator method and outcome", ["method", "outcome"]
)
LATENCY = Histogram(
    "fs3_meta_request_seconds", "meta request latency by operator method", ["method"]
)


class MetaServicer(meta_pb2_grpc.MetaServiceServicer):
    """Forwards every RPC to the operator (on a thread)."""

    def __init__(self, op: MetaOperator) -> None:
        self.op = op

    async def _run(self, fn: Callable[[Any], Any], request: Any) -> Any:
        name = getattr(fn, "__name__", "op")
        t0 = time.perf_counter()
        outcome = "ok"
        try:
            return await asyncio.to_thread(fn, request)
        except FsError as e:
            outcome = e.code.name.lower() if e.code.name != "POSIX" else f"errno_{e.errno}"
            raise
        except Exception:
            outcome = "internal"
            raise
        finally:
            REQUESTS.labels(name, outcome).inc()
            LATENCY.labels(name).observe(time.perf_counter() - t0)

    async def StatFs(
        self, request: meta_pb2.StatFsRequest, context: Any
    ) -> meta_pb2.StatFsResponse:
        return await self._run(self.op.statfs, request)  # type: ignore[no-any-return]

    async def Lookup(self, request: meta_pb2.LookupRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.lookup, request)  # type: ignore[no-any-return]

    async def GetAttr(
        self, request: meta_pb2.GetAttrRequest, context: Any
    ) -> meta_pb2.AttrResponse:
        return await self._run(self.op.getattr, request)  # type: ignore[no-any-return]

    async def SetAttr(
        self, request: meta_pb2.SetAttrRequest, context: Any
    ) -> meta_pb2.SetAttrResponse:
        return await self._run(self.op.setattr, request)  # type: ignore[no-any-return]

    async def Create(self, request: meta_pb2.CreateRequest, context: Any) -> meta_pb2.OpenResponse:
        return await self._run(self.op.create, request)  # type: ignore[no-any-return]

    async def Open(self, request: meta_pb2.OpenRequest, context: Any) -> meta_pb2.OpenResponse:
        return await self._run(self.op.open, request)  # type: ignore[no-any-return]

    async def Close(self, request: meta_pb2.CloseRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.close, request)  # type: ignore[no-any-return]

    async def Sync(self, request: meta_pb2.SyncRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.sync, request)  # type: ignore[no-any-return]

    async def Mknod(self, request: meta_pb2.MknodRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.mknod, request)  # type: ignore[no-any-return]

    async def Mkdir(self, request: meta_pb2.MkdirRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.mkdir, request)  # type: ignore[no-any-return]

    async def Symlink(
        self, request: meta_pb2.SymlinkRequest, context: Any
    ) -> meta_pb2.AttrResponse:
        return await self._run(self.op.symlink, request)  # type: ignore[no-any-return]

    async def ReadLink(
        self, request: meta_pb2.ReadLinkRequest, context: Any
    ) -> meta_pb2.ReadLinkResponse:
        return await self._run(self.op.readlink, request)  # type: ignore[no-any-return]

    async def Link(self, request: meta_pb2.LinkRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.link, request)  # type: ignore[no-any-return]

    async def Unlink(
        self, request: meta_pb2.RemoveRequest, context: Any
    ) -> meta_pb2.RemoveResponse:
        return await self._run(self.op.unlink, request)  # type: ignore[no-any-return]

    async def Rmdir(self, request: meta_pb2.RemoveRequest, context: Any) -> meta_pb2.RemoveResponse:
        return await self._run(self.op.rmdir, request)  # type: ignore[no-any-return]

    async def Rename(
        self, request: meta_pb2.RenameRequest, context: Any
    ) -> meta_pb2.RenameResponse:
        return await self._run(self.op.rename, request)  # type: ignore[no-any-return]

    async def ReadDir(
        self, request: meta_pb2.ReadDirRequest, context: Any
    ) -> meta_pb2.ReadDirResponse:
        return await self._run(self.op.readdir, request)  # type: ignore[no-any-return]

    async def GetXattr(
        self, request: meta_pb2.GetXattrRequest, context: Any
    ) -> meta_pb2.GetXattrResponse:
        return await self._run(self.op.getxattr, request)  # type: ignore[no-any-return]

    async def SetXattr(self, request: meta_pb2.SetXattrRequest, context: Any) -> common_pb2.Empty:
        return await self._run(self.op.setxattr, request)  # type: ignore[no-any-return]

    async def ListXattr(
        self, request: meta_pb2.ListXattrRequest, context: Any
    ) -> meta_pb2.ListXattrResponse:
        return await self._run(self.op.listxattr, request)  # type: ignore[no-any-return]

    async def RemoveXattr(
        self, request: meta_pb2.RemoveXattrRequest, context: Any
    ) -> common_pb2.Empty:
        return await self._run(self.op.removexattr, request)  # type: ignore[no-any-return]

    async def Access(self, request: meta_pb2.AccessRequest, context: Any) -> common_pb2.Empty:
        return await self._run(self.op.access, request)  # type: ignore[no-any-return]

    async def SetLayout(
        self, request: meta_pb2.SetLayoutRequest, context: Any
    ) -> meta_pb2.AttrResponse:
        return await self._run(self.op.setlayout, request)  # type: ignore[no-any-return]

    async def PruneSessions(
        self, request: meta_pb2.PruneSessionsRequest, context: Any
    ) -> meta_pb2.PruneSessionsResponse:
        return await self._run(self.op.prune_sessions, request)  # type: ignore[no-any-return]

    async def ListGc(
        self, request: meta_pb2.ListGcRequest, context: Any
    ) -> meta_pb2.ListGcResponse:
        return await self._run(self.op.list_gc, request)  # type: ignore[no-any-return]

    async def AckGc(self, request: meta_pb2.AckGcRequest, context: Any) -> common_pb2.Empty:
        return await self._run(self.op.ack_gc, request)  # type: ignore[no-any-return]
