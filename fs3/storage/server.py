"""``fs3 storage --config FILE``: one storage node.

:class:`StorageNode` wires the parts: a chunk engine per target directory, the
gRPC server (StorageService + the transport's TransportService), the server
transport (shm regions), and the loops that talk to mgmtd:

- registration, then a heartbeat every ``heartbeat_interval_s`` and right after
  any local state change, reporting each target's local state, space and the
  chain version it is based on (docs/chain-states.md);
- routing: poll ``GetRoutingInfo`` every ``routing_refresh_s`` (and at once when a
  request showed a stale chain version, or a heartbeat answer names a newer
  routing version); each new routing updates the targets' chain views and local
  states (:mod:`fs3.storage.target`) and starts resyncs (:mod:`fs3.storage.resync`).

A graceful stop sends one last heartbeat with every target OFFLINE.

The bound address is printed on stdout as ``fs3-storage listening on HOST:PORT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from fs3.config import StorageConfig
from fs3.errors import Code, FsError
from fs3.logs import event
from fs3.proto import mgmtd_pb2, storage_pb2_grpc, transport_pb2_grpc
from fs3.routing import Routing
from fs3.rpc.server import add_servicer, bind, create_server
from fs3.security.capability import (
    CapabilitySigner,
    CapabilityVerifier,
    ServiceToken,
    capability_key,
)
from fs3.service import service_main
from fs3.storage import metrics as M
from fs3.storage.chunk_data import read_fds_per_target
from fs3.storage.chunk_engine import FileChunkEngine
from fs3.storage.craq import InlinePayloadIO, PayloadIO, Peers, Replicator
from fs3.storage.operator import StorageOperator
from fs3.storage.resync import ResyncManager
from fs3.storage.service import StorageServicer
from fs3.storage.target import StorageTarget, TargetMap
from fs3.transport import ClientTransport, client_transport

log = logging.getLogger("fs3.storage")


class MgmtdLink(Protocol):
    """What a storage node needs from mgmtd (``fs3.client.mgmtd_client.MgmtdClient`` has it)."""

    async def register_node(
        self, req: mgmtd_pb2.RegisterNodeRequest
    ) -> mgmtd_pb2.RegisterNodeResponse: ...

    async def heartbeat(self, req: mgmtd_pb2.HeartbeatRequest) -> mgmtd_pb2.HeartbeatResponse: ...

    async def get_routing(self, known_version: int = 0) -> mgmtd_pb2.RoutingInfo | None: ...

    async def report_target_error(
        self, target_id: int, node_id: int, kind: str, detail: str = ""
    ) -> None: ...


def target_layout(cfg: StorageConfig) -> list[tuple[int, str]]:
    """(target id, directory) of every target of the node, from ``[storage]``."""
    s, node = cfg.storage, cfg.node
    base = Path(node.data_dir or ".")
    if s.targets:
        dirs = list(s.targets)
        ids = list(s.target_ids) or [node.id * 100 + i + 1 for i in range(len(dirs))]
    else:
        ids = list(s.target_ids) or [node.id * 100 + 1]
        dirs = [str(base / f"t{i + 1}") for i in range(len(ids))]
    if len(set(ids)) != len(ids) or any(i <= 0 for i in ids):
        raise FsError(
            Code.INVALID_ARGUMENT, f"[storage] target ids must be distinct and > 0: {ids}"
        )
    return list(zip(ids, dirs, strict=True))


class StorageNode:
    """A running storage node (also used in-process by tests).

    Args:
        cfg: the node's configuration.
        mgmtd: the link to mgmtd (a ``MgmtdClient`` in production).
        payload: server transport; default: a ``fs3.transport.server.ServerTransport``
            if available, else inline-only.
    """

    def __init__(
        self, cfg: StorageConfig, mgmtd: MgmtdLink, *, payload: PayloadIO | None = None
    ) -> None:
        self.cfg = cfg
        self.mgmtd = mgmtd
        self.node_id = cfg.node.id
        self.address = ""
        self._transport: Any = None
        if payload is None:
            try:
                from fs3.transport.server import ServerTransport

                self._transport = ServerTransport.from_config(cfg.transport)
                payload = self._transport
            except ImportError:  # pragma: no cover - transport package incomplete
                payload = InlinePayloadIO()
        self.payload: PayloadIO = payload  # type: ignore[assignment]
        self.executor = ThreadPoolExecutor(
            max_workers=cfg.storage.io_threads, thread_name_prefix=f"storage{self.node_id}-io"
        )
        targets = []
        layout = target_layout(cfg)
        read_fds = read_fds_per_target(len(layout))
        for tid, d in layout:
            os.makedirs(d, exist_ok=True)
            eng = FileChunkEngine(
                d,
                fsync=cfg.storage.fsync,
                reserved_bytes=cfg.storage.reserved_bytes,
                direct_write=cfg.storage.direct_write,
                read_fds=read_fds,
            )
            targets.append(StorageTarget(tid, d, eng))
        self.targets = TargetMap(targets)
        self.peers = Peers()
        self._refresh = asyncio.Event()
        self._hb_now = asyncio.Event()
        self.forward: ClientTransport | None = None
        if cfg.transport.kind != "grpc" and self._transport is not None:
            self.forward = client_transport(
                cfg.transport.kind, f"storage-{self.node_id}-fwd", cfg.transport
            )
        self.rep = Replicator(
            self.targets,
            cfg.storage,
            self.payload,
            self.peers,
            self.executor,
            self._refresh.set,
            self.forward,
        )
        self.rep.on_local_change = self._hb_now.set
        self.op = StorageOperator(
            self.node_id,
            self.targets,
            self.rep,
            self._report_error,
            self._hb_now.set,
            read_buffer_bytes=cfg.storage.read_buffer_bytes,
        )
        key = capability_key(cfg.rpc.secret_file, cfg.cluster.cluster_file)
        if key is not None:
            self.op.caps = CapabilityVerifier(key)
            self.rep.service_token = ServiceToken(CapabilitySigner(key)).token
        else:
            log.warning(
                "no cluster secret (see [rpc] secret_file): chunk capabilities are not checked"
            )
        self.resync = ResyncManager(self.targets, self.rep)
        self._server = create_server()
        if self._server.auth is not None:
            self._server.auth.lookup = getattr(mgmtd, "get_user", None)  # confirmed by mgmtd
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        self.heartbeats = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        add_servicer(
            self._server,
            storage_pb2_grpc.add_StorageServiceServicer_to_server,
            StorageServicer(self.op),
        )
        if self._transport is not None:
            add_servicer(
                self._server,
                transport_pb2_grpc.add_TransportServiceServicer_to_server,
                self._transport.servicer,
            )
        port = bind(self._server, self.cfg.node.host, self.cfg.node.port)
        self.address = f"{self.cfg.node.host}:{port}"
        await self._server.start()
        if self._transport is not None:
            await self._transport.start(
                self.cfg.node.host, address=self.address, socket_dir=self.cfg.rpc.socket_dir
            )
        event(
            log,
            "storage node started",
            node=self.node_id,
            address=self.address,
            data=self.data_address,
            targets=",".join(str(t) for t in self.targets.targets),
        )
        self._tasks.append(asyncio.create_task(self._register_and_run(), name="storage-mgmtd"))

    @property
    def data_address(self) -> str:
        return str(getattr(self._transport, "data_address", "") or "")

    async def stop(self, *, graceful: bool = True) -> None:
        if self._stopped:
            return
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.resync.stop()
        if graceful:
            with contextlib.suppress(FsError, asyncio.TimeoutError):
                await asyncio.wait_for(self._send_heartbeat(force_offline=True), timeout=2.0)
        await self._server.stop(0.5)
        if self._transport is not None:
            with contextlib.suppress(Exception):
                await self._transport.stop()
        if self.forward is not None:
            with contextlib.suppress(Exception):
                await self.forward.close()
        await self.peers.close()
        self.executor.shutdown(wait=True)
        for t in self.targets.targets.values():
            t.engine.close()
        event(log, "storage node stopped", node=self.node_id)

    # ------------------------------------------------------------------ mgmtd

    def _hb_request(self, *, force_offline: bool = False) -> mgmtd_pb2.HeartbeatRequest:
        return mgmtd_pb2.HeartbeatRequest(
            node_id=self.node_id,
            type=mgmtd_pb2.NODE_TYPE_STORAGE,
            address=self.address,
            data_address=self.data_address,
            targets=self.targets.reports(force_offline=force_offline),
            timestamp=time.time(),
            hostname=socket.gethostname(),
            name=self.cfg.node.name,
        )

    async def _send_heartbeat(self, *, force_offline: bool = False) -> None:
        resp = await self.mgmtd.heartbeat(self._hb_request(force_offline=force_offline))
        self.heartbeats += 1
        for t in self.targets.targets.values():
            M.USED_BYTES.labels(str(t.target_id)).set(t.engine.space().used_bytes)
        if resp.routing_version > self.targets.routing.version:
            self._refresh.set()

    async def _register_and_run(self) -> None:
        delay = 0.1
        while True:
            try:
                req = mgmtd_pb2.RegisterNodeRequest(
                    node_id=self.node_id,
                    type=mgmtd_pb2.NODE_TYPE_STORAGE,
                    address=self.address,
                    data_address=self.data_address,
                    hostname=socket.gethostname(),
                    targets=self.targets.reports(force_offline=True),
                    name=self.cfg.node.name,
                )
                resp = await self.mgmtd.register_node(req)
                break
            except FsError as e:
                log.warning("registration with mgmtd failed (%s); retrying", e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        if resp.HasField("routing"):
            self._apply(resp.routing)
        self._tasks.append(asyncio.create_task(self._routing_loop(), name="storage-routing"))
        await self._heartbeat_loop()

    async def _heartbeat_loop(self) -> None:
        interval = self.cfg.storage.heartbeat_interval_s
        while True:
            self._hb_now.clear()
            try:
                await self._send_heartbeat()
            except FsError as e:
                log.warning("heartbeat failed: %s", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hb_now.wait(), timeout=interval)

    async def _routing_loop(self) -> None:
        interval = self.cfg.storage.routing_refresh_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._refresh.wait(), timeout=interval)
            self._refresh.clear()
            try:
                info = await self.mgmtd.get_routing(self.targets.routing.version)
            except FsError as e:
                log.warning("routing refresh failed: %s", e)
                await asyncio.sleep(min(interval, 0.5))
                continue
            if info is not None:
                self._apply(info)

    def _apply(self, info: mgmtd_pb2.RoutingInfo) -> None:
        if info.version <= self.targets.routing.version:
            return
        routing = Routing(info)
        if self.targets.apply_routing(routing):
            self._hb_now.set()
        self.resync.on_routing(routing)

    async def _report_error(self, target_id: int, kind: str, detail: str) -> None:
        await self.mgmtd.report_target_error(target_id, self.node_id, kind, detail)


async def serve(cfg: StorageConfig, stop: asyncio.Event) -> int:
    from fs3.client.mgmtd_client import MgmtdClient

    if cfg.node.id <= 0:
        raise FsError(Code.INVALID_ARGUMENT, "[node] id must be > 0 for storage")
    if not cfg.cluster.cluster_file:
        raise FsError(Code.INVALID_ARGUMENT, "[cluster] cluster_file is required for storage")
    # One attempt must end well before the next heartbeat is due: a leader that
    # silently drops traffic (partition) would otherwise hold each heartbeat for
    # the whole timeout before the standby is tried, and the new leader would
    # declare this healthy node dead.
    attempt_s = max(1.0, min(5.0, cfg.storage.heartbeat_interval_s))
    mgmtd = MgmtdClient.from_cluster_file(
        cfg.cluster.cluster_file, retry_deadline_s=5.0, timeout_s=attempt_s
    )
    node = StorageNode(cfg, mgmtd)
    await node.start()
    print(f"fs3-storage listening on {node.address}", flush=True)
    try:
        await stop.wait()
    finally:
        await node.stop(graceful=True)
        await mgmtd.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    return service_main(
        list(sys.argv[1:] if argv is None else argv), "fs3 storage", StorageConfig, serve
    )
