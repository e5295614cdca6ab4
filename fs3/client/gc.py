"""Garbage collection of removed files' chunks (docs/architecture.md#removing-a-file-gc).

When the last link of a file goes and no open session (read or write) holds it, meta puts the
inode (with its layout and last length) in its GC queue. This worker drains the
queue: for each due entry it removes every chunk of the inode on every chain of
its stripe (``RemoveChunks``, replicated along the chain, repeated while the
storage says more remain), and only then acknowledges the entry, so a crash in
between just repeats the (idempotent) removal.

It lives in the client package because it is storage-client work; the meta
server process runs it (meta may import ``fs3.client``), either with direct
calls into its operator or over RPC through :class:`~fs3.client.meta_client.MetaClient`::

    worker = GcWorker(list_gc=..., ack_gc=..., storage=storage_client)
    task = asyncio.create_task(worker.run(stop_event))

or, from a meta server that has a MgmtdClient but no storage client yet::

    worker = await GcWorker.for_meta_server(
        mgmtd_client, list_gc=..., ack_gc=..., client_id="meta-gc-1",
        client=cfg.client, transport=cfg.transport,
    )
    task = asyncio.create_task(worker.run(stop_event))  # await worker.close() when done
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fs3 import config as _config
from fs3.client.retry import RetryPolicy
from fs3.client.storage_client import StorageClient
from fs3.errors import FsError
from fs3.proto import common_pb2, meta_pb2
from fs3.routing import RoutingWatcher
from fs3.rpc.channel import ChannelPool

log = logging.getLogger("fs3.client.gc")

ListGc = Callable[[meta_pb2.ListGcRequest], Awaitable[meta_pb2.ListGcResponse]]
AckGc = Callable[[meta_pb2.AckGcRequest], Awaitable[Any]]

ROOT_USER = common_pb2.UserInfo(uid=0, gid=0)


class GcWorker:
    """Removes chunks of files in meta's GC queue, then acknowledges them.

    Args:
        list_gc: ``await list_gc(ListGcRequest)`` → due entries (meta operator or RPC).
        ack_gc: ``await ack_gc(AckGcRequest)``.
        storage: the storage client that removes chunks.
        interval_s: pause between scans when the queue is empty.
        batch: entries per scan.
    """

    def __init__(
        self,
        *,
        list_gc: ListGc,
        ack_gc: AckGc,
        storage: StorageClient,
        interval_s: float = 1.0,
        batch: int = 64,
    ) -> None:
        self._list = list_gc
        self._ack = ack_gc
        self.storage = storage
        self.interval_s = interval_s
        self.batch = batch
        self.removed_files = 0
        self.removed_chunks = 0
        self._owned: list[Any] = []  # resources created by for_meta_server

    async def run_once(self) -> int:
        """Process one batch of due entries; returns how many were acknowledged."""
        resp = await self._list(meta_pb2.ListGcRequest(user=ROOT_USER, limit=self.batch))
        done: list[bytes] = []
        for e in resp.entries:
            chains = [int(c) for c in e.layout.chain_ids]
            try:
                if chains:
                    self.removed_chunks += await self.storage.remove_chunks(int(e.inode), chains, 0)
            except FsError as err:
                log.warning("gc of inode %d failed (will retry): %s", e.inode, err)
                continue
            done.append(bytes(e.id))
        if done:
            await self._ack(meta_pb2.AckGcRequest(user=ROOT_USER, ids=done))
            self.removed_files += len(done)
        return len(done)

    async def run(self, stop: asyncio.Event) -> None:
        """Drain the queue until ``stop`` is set (errors are logged, never fatal)."""
        while not stop.is_set():
            n = 0
            try:
                n = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("gc scan failed: %s", e)
            if n < self.batch:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)

    @classmethod
    async def for_meta_server(
        cls,
        mgmtd: Any,
        *,
        list_gc: ListGc,
        ack_gc: AckGc,
        client_id: str,
        client: _config.ClientSection | None = None,
        transport: _config.TransportSection | None = None,
        interval_s: float = 1.0,
    ) -> GcWorker:
        """A worker with its own routing watcher and storage client (call :meth:`close`)."""
        from fs3.client.core import make_transport

        c = client or _config.ClientSection()
        t = transport or _config.TransportSection()
        watcher = RoutingWatcher(mgmtd, poll_interval_s=c.routing_refresh_s)
        await watcher.start()
        pool = ChannelPool()
        tr = make_transport(t.kind, client_id, t)
        storage = StorageClient(
            lambda: watcher.current,
            watcher.refresh,
            pool,
            tr,
            client_id,
            RetryPolicy(deadline_s=c.retry_deadline_s, rpc_timeout_s=c.rpc_timeout_s),
            io_depth=c.io_depth,
        )
        w = cls(list_gc=list_gc, ack_gc=ack_gc, storage=storage, interval_s=interval_s)
        w._owned = [watcher, tr, pool]
        return w

    async def close(self) -> None:
        """Release what :meth:`for_meta_server` created."""
        watcher, tr, pool = self._owned or (None, None, None)
        self._owned = []
        if watcher is not None:
            await watcher.stop()
        if tr is not None:
            with contextlib.suppress(Exception):
                await tr.close()
        if pool is not None:
            await pool.close()
