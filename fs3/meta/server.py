"""``fs3 meta --config FILE``: one stateless metadata server.

All state is in the KV (``[kv] url``), so any number of these processes can
serve the same namespace at once. With a cluster file (``[cluster]
cluster_file``) the server

* follows mgmtd's routing info (chain tables for placing new files, target
  capacities for statfs), and
* heartbeats mgmtd as a META node, which is how clients find meta servers.

Without one it still serves (files then get an empty chain list: fine for
metadata-only tests and benchmarks). Background jobs: pruning old idempotency
records and, with a cluster file, deleting removed files' chunks (GC). Prints ``fs3-meta listening on HOST:PORT`` once it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fs3.config import MetaConfig
from fs3.errors import FsError
from fs3.kv import open_database
from fs3.logs import event
from fs3.meta.layout import ChainTableSource, NoChainTables
from fs3.meta.operator import MetaOperator
from fs3.meta.service import MetaServicer
from fs3.proto import meta_pb2_grpc, mgmtd_pb2
from fs3.rpc.server import add_servicer, bind, create_server
from fs3.security.capability import CapabilitySigner, ServiceCapabilities, capability_key
from fs3.service import service_main

log = logging.getLogger("fs3.meta")

IDEM_PRUNE_INTERVAL_S = 60.0

#: Worker threads for the operations the servicer runs off the event loop
#: (``asyncio.to_thread``: mutations, range reads). A mutation's thread waits in
#: the KV's group commit until its batch is durable, so the threads bound how many
#: transactions can share one commit (one WAL fsync): asyncio's default executor
#: (cores + 4 threads, 6 on a 2-core host) would cap a batch there however many
#: clients wait. Threads start only when needed.
OP_THREADS = 64


def use_op_threads(loop: asyncio.AbstractEventLoop) -> None:
    """Give ``loop`` an executor of :data:`OP_THREADS` (shut down with the loop by asyncio.run)."""
    loop.set_default_executor(ThreadPoolExecutor(OP_THREADS, thread_name_prefix="meta-op"))


class RoutingChainTables:
    """A :class:`ChainTableSource` over a routing watcher's current routing info."""

    def __init__(self, watcher: Any, table_id: int = 1) -> None:
        self.watcher = watcher
        self.table_id = table_id
        # table id -> (the routing's ChainTable message, what latest_table made of it):
        # every create asks, and a table of many chains is not copied each time
        self._made: dict[int, tuple[Any, tuple[int, list[int]]]] = {}

    def latest_table(self, table_id: int) -> tuple[int, list[int]] | None:
        try:
            t = self.watcher.current.table(table_id)
        except FsError:
            return None
        made = self._made.get(table_id)
        if made is not None and made[0] is t:
            return made[1]
        out = int(t.version), [int(c) for c in t.chain_ids]
        self._made[table_id] = (t, out)
        return out

    def space(self) -> tuple[int, int, int] | None:
        """What a user can store: each disk once, divided by the default table's replication."""
        sp = self.watcher.current.space(self.table_id)
        if sp is None:
            return None
        return sp.capacity_bytes, sp.used_bytes, sp.free_bytes


async def _heartbeats(client: Any, cfg: MetaConfig, address: str, stop: asyncio.Event) -> None:
    name = cfg.node.name or f"meta-{cfg.node.id}"
    while not stop.is_set():
        try:
            await client.heartbeat(
                mgmtd_pb2.HeartbeatRequest(
                    node_id=cfg.node.id,
                    type=mgmtd_pb2.NODE_TYPE_META,
                    address=address,
                    hostname=socket.gethostname(),
                    name=name,
                )
            )
        except FsError as e:
            log.debug("heartbeat to mgmtd failed: %s", e)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=cfg.meta.heartbeat_interval_s)


async def _prune_requests(op: MetaOperator, ttl_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=IDEM_PRUNE_INTERVAL_S)
        if stop.is_set():
            return
        try:
            n = await asyncio.to_thread(op.prune_requests, ttl_s)
            if n:
                event(log, "pruned idempotency records", count=n)
        except FsError as e:
            log.warning("pruning idempotency records failed: %s", e)


async def serve(cfg: MetaConfig, stop: asyncio.Event) -> int:
    use_op_threads(asyncio.get_running_loop())
    db = open_database(cfg.kv.url)
    mgmtd: Any = None
    watcher: Any = None
    source: ChainTableSource = NoChainTables()
    tasks: list[asyncio.Task[None]] = []
    gc: Any = None
    server = create_server()
    try:
        if cfg.cluster.cluster_file:
            from fs3.client.mgmtd_client import MgmtdClient
            from fs3.routing import RoutingWatcher

            # an attempt ends before the next heartbeat is due (see fs3/storage/server.py)
            mgmtd = MgmtdClient.from_cluster_file(
                cfg.cluster.cluster_file,
                timeout_s=max(1.0, min(5.0, cfg.meta.heartbeat_interval_s)),
            )
            if server.auth is not None:
                server.auth.lookup = mgmtd.get_user  # user tokens: confirmed by mgmtd
            watcher = RoutingWatcher(mgmtd, poll_interval_s=cfg.meta.routing_refresh_s)
            await watcher.start()
            source = RoutingChainTables(watcher, cfg.meta.default_chain_table)
        op = await asyncio.to_thread(MetaOperator, db, cfg.meta, source)
        key = capability_key(cfg.rpc.secret_file, cfg.cluster.cluster_file)
        if key is not None:
            op.signer = CapabilitySigner(key)
            op.capability_ttl_s = cfg.security.capability_ttl_s
        add_servicer(server, meta_pb2_grpc.add_MetaServiceServicer_to_server, MetaServicer(op))
        port = bind(server, cfg.node.host, cfg.node.port)
        address = f"{cfg.node.host}:{port}"
        await server.start()
        print(f"fs3-meta listening on {address}", flush=True)
        event(
            log,
            "meta started",
            node=cfg.node.id,
            address=address,
            kv=db.engine,
            routing=bool(cfg.cluster.cluster_file),
        )
        if mgmtd is not None:
            tasks.append(
                asyncio.create_task(_heartbeats(mgmtd, cfg, address, stop), name="meta-heartbeat")
            )
        tasks.append(
            asyncio.create_task(
                _prune_requests(op, cfg.meta.request_record_ttl_s, stop), name="meta-prune-requests"
            )
        )
        if mgmtd is not None:
            # Removed files' chunks are deleted by the meta servers themselves
            # (3FS runs GC inside meta); every server may run it: removal and
            # acknowledgement are idempotent.
            from fs3.client.gc import GcWorker

            gc = await GcWorker.for_meta_server(
                mgmtd,
                list_gc=lambda req: asyncio.to_thread(op.list_gc, req),
                ack_gc=lambda req: asyncio.to_thread(op.ack_gc, req),
                client_id=f"meta-gc-{cfg.node.id}",
                client=cfg.client,
                transport=cfg.transport,
            )
            if op.signer is not None:  # chunk removal of GC: meta's own service capability
                gc.storage.caps = ServiceCapabilities(op.signer)
            tasks.append(asyncio.create_task(gc.run(stop), name="meta-gc"))
        await stop.wait()
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await server.stop(grace=0.5)
        if gc is not None:
            with contextlib.suppress(Exception):
                await gc.close()
        if watcher is not None:
            await watcher.stop()
        if mgmtd is not None:
            await mgmtd.close()
        db.close()
        event(log, "meta stopped", node=cfg.node.id)
    return 0


def main(argv: list[str] | None = None) -> int:
    return service_main(list(sys.argv[1:] if argv is None else argv), "fs3 meta", MetaConfig, serve)


if __name__ == "__main__":
    sys.exit(main())
