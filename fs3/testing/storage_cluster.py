"""An in-process storage cluster for tests: a real mgmtd and real storage nodes on loopback.

Everything runs in the caller's event loop: ``fs3.mgmtd.server.serve`` (with an
in-memory KV and short timers) and :class:`fs3.storage.server.StorageNode`
instances talking to it through real ``MgmtdClient``s over gRPC. "Killing" a
node stops it without the graceful last heartbeat (mgmtd notices by heartbeat
timeout, as with a crash); "restarting" builds a new node on the same target
directories. Real-process tests use :mod:`fs3.testing.procs` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from pathlib import Path

from fs3.client.mgmtd_client import MgmtdClient
from fs3.config import (
    ClusterSection,
    KvSection,
    MgmtdConfig,
    MgmtdSection,
    NodeSection,
    StorageConfig,
    StorageSection,
    TransportSection,
)
from fs3.errors import Code, FsError
from fs3.routing import SERVING, Routing
from fs3.storage.server import StorageNode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class InProcessCluster:
    """mgmtd + ``nodes`` storage nodes (one target each) + one chain table.

    Args:
        root: a temporary directory for targets and the cluster file.
        nodes: storage nodes (node ids 10001.., target ids 101, 201, ...).
        replicas: replicas per chain (chain table 1 is created by :meth:`start`).
        fsync: chunk engine fsync (off by default: tests run on tmp dirs).
        heartbeat_timeout_s: how fast mgmtd declares a silent node offline.
        transport: the nodes' ``[transport] kind`` (used for forwarding to successors).
    """

    def __init__(
        self,
        root: Path,
        *,
        nodes: int = 3,
        replicas: int = 3,
        fsync: bool = False,
        heartbeat_interval_s: float = 0.2,
        heartbeat_timeout_s: float = 1.5,
        forward_retry_s: float = 20.0,
        create_table: bool = True,
        transport: str = "grpc",
    ) -> None:
        self.root = root
        self.n = nodes
        self.replicas = replicas
        self.fsync = fsync
        self.hb = heartbeat_interval_s
        self.hb_timeout = heartbeat_timeout_s
        self.forward_retry_s = forward_retry_s
        self.create_table = create_table
        self.transport = transport
        self.mgmtd_port = free_port()
        self.cluster_file = str(root / "cluster")
        Path(self.cluster_file).write_text(f"fs3@127.0.0.1:{self.mgmtd_port}\n")
        self.nodes: dict[int, StorageNode] = {}
        self._links: dict[int, MgmtdClient] = {}
        self._mgmtd_stop = asyncio.Event()
        self._mgmtd_task: asyncio.Task[int] | None = None
        self.admin: MgmtdClient | None = None

    # ------------------------------------------------------------------ setup

    def storage_config(self, i: int) -> StorageConfig:
        node_id = 10001 + i
        return StorageConfig(
            node=NodeSection(
                id=node_id,
                host="127.0.0.1",
                port=0,
                data_dir=str(self.root / f"storage-{i + 1}"),
                name=f"storage-{i + 1}",
            ),
            cluster=ClusterSection(id="fs3", cluster_file=self.cluster_file),
            storage=StorageSection(
                targets=[str(self.root / f"storage-{i + 1}" / "t1")],
                target_ids=[(i + 1) * 100 + 1],
                fsync=self.fsync,
                forward_timeout_s=2.0,
                forward_retry_s=self.forward_retry_s,
                heartbeat_interval_s=self.hb,
                routing_refresh_s=self.hb,
            ),
            transport=TransportSection(kind=self.transport),
        )

    async def start(self) -> None:
        from fs3.mgmtd.server import serve as mgmtd_serve

        mcfg = MgmtdConfig(
            node=NodeSection(id=1, host="127.0.0.1", port=self.mgmtd_port),
            cluster=ClusterSection(id="fs3", cluster_file=self.cluster_file),
            kv=KvSection(url="memory://"),
            mgmtd=MgmtdSection(
                lease_length_s=10.0,
                lease_renew_interval_s=1.0,
                lease_safety_margin_s=2.0,
                heartbeat_interval_s=self.hb,
                heartbeat_timeout_s=self.hb_timeout,
                check_interval_s=0.1,
            ),
        )
        self._mgmtd_task = asyncio.create_task(mgmtd_serve(mcfg, self._mgmtd_stop))
        self.admin = MgmtdClient.from_cluster_file(
            self.cluster_file, timeout_s=2.0, retry_deadline_s=20.0
        )
        await self.admin.get_leader()
        for i in range(self.n):
            await self.start_node(i)
        await self.wait(
            lambda r: all(r.target_alive(t) for t in self.target_ids()), what="targets alive"
        )
        if self.create_table:
            await self.admin.create_chain_table(1, self.replicas)
            await self.wait_all_serving()

    async def start_node(self, i: int) -> StorageNode:
        link = MgmtdClient.from_cluster_file(self.cluster_file, timeout_s=2.0, retry_deadline_s=5.0)
        node = StorageNode(self.storage_config(i), link)
        await node.start()
        self.nodes[i] = node
        self._links[i] = link
        return node

    async def kill_node(self, i: int) -> None:
        """Stop node ``i`` like a crash: no last heartbeat."""
        node = self.nodes.pop(i)
        await node.stop(graceful=False)
        await self._links.pop(i).close()

    async def restart_node(self, i: int) -> StorageNode:
        return await self.start_node(i)

    async def stop(self) -> None:
        for i in list(self.nodes):
            with contextlib.suppress(Exception):
                node = self.nodes.pop(i)
                await node.stop(graceful=True)
                await self._links.pop(i).close()
        if self.admin is not None:
            await self.admin.close()
        self._mgmtd_stop.set()
        if self._mgmtd_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._mgmtd_task, timeout=10)

    # ------------------------------------------------------------------ queries

    def target_ids(self) -> list[int]:
        return [(i + 1) * 100 + 1 for i in range(self.n)]

    async def routing(self) -> Routing:
        assert self.admin is not None
        info = await self.admin.get_routing(0)
        assert info is not None
        return Routing(info)

    async def wait(
        self, pred: Callable[[Routing], bool], *, timeout_s: float = 20.0, what: str = ""
    ) -> Routing:
        deadline = time.monotonic() + timeout_s
        while True:
            r = await self.routing()
            if pred(r):
                return r
            if time.monotonic() > deadline:
                raise FsError(Code.TIMEOUT, f"timed out waiting for {what or pred}: {r.chains()}")
            await asyncio.sleep(0.05)

    async def wait_all_serving(self, timeout_s: float = 30.0) -> Routing:
        def ok(r: Routing) -> bool:
            chains = r.chains()
            return bool(chains) and all(
                len(c.targets) == self.replicas
                and all(t.public_state == SERVING for t in c.targets)
                for c in chains
            )

        r = await self.wait(ok, timeout_s=timeout_s, what="all targets serving")
        # and every node has adopted it
        deadline = time.monotonic() + timeout_s
        while any(n.targets.routing.version < r.version for n in self.nodes.values()):
            if time.monotonic() > deadline:
                raise FsError(Code.TIMEOUT, "nodes did not adopt the routing")
            await asyncio.sleep(0.02)
        return r

    def node_of_target(self, target_id: int) -> int:
        return target_id // 100 - 1
