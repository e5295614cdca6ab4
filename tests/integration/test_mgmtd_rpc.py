"""MgmtdClient, RoutingWatcher and the mgmtd gRPC surface, in one process.

Two real mgmtd servers (``fs3.mgmtd.server.serve``) share one SQLite file; the
client is pointed at the follower first, so every call exercises the
NOT_LEADER redirect. Then the leader is shut down and the client, its watch
stream and a RoutingWatcher must carry on with the other one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fs3.client.mgmtd_client import MgmtdClient
from fs3.config import MgmtdConfig, MgmtdSection
from fs3.errors import Code, FsError
from fs3.mgmtd import server
from fs3.proto import mgmtd_pb2 as pb
from fs3.routing import Routing, RoutingWatcher

pytestmark = pytest.mark.integration

CLUSTER = "rpc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class InProc:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ports = [free_port(), free_port()]
        self.addresses = [f"127.0.0.1:{p}" for p in self.ports]
        self.stops = [asyncio.Event(), asyncio.Event()]
        self.tasks: list[asyncio.Task[int] | None] = [None, None]

    def cfg(self, i: int) -> MgmtdConfig:
        c = MgmtdConfig()
        c.node.id = i + 1
        c.node.port = self.ports[i]
        c.cluster.id = CLUSTER
        c.kv.url = f"sqlite://{self.tmp / 'kv.db'}"
        c.mgmtd = MgmtdSection(
            lease_length_s=1.5,
            lease_renew_interval_s=0.3,
            lease_safety_margin_s=0.3,
            heartbeat_interval_s=0.3,
            heartbeat_timeout_s=1.5,
            check_interval_s=0.1,
        )
        return c

    def start(self, i: int) -> None:
        self.stops[i] = asyncio.Event()
        self.tasks[i] = asyncio.create_task(server.serve(self.cfg(i), self.stops[i]))

    async def stop(self, i: int) -> None:
        self.stops[i].set()
        t = self.tasks[i]
        if t is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 10)
        self.tasks[i] = None


@contextlib.asynccontextmanager
async def two_mgmtds(tmp: Path) -> AsyncIterator[InProc]:
    m = InProc(tmp)
    m.start(0)
    try:
        async with MgmtdClient(m.addresses[:1], CLUSTER, timeout_s=1, retry_deadline_s=10) as c:
            await c.get_leader()  # mgmtd-1 leads before mgmtd-2 starts
        m.start(1)
        yield m
    finally:
        await m.stop(0)
        await m.stop(1)


def storage(i: int) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(
        node_id=10000 + i,
        type=pb.NODE_TYPE_STORAGE,
        address=f"127.0.0.1:{40000 + i}",
        name=f"storage-{i}",
        targets=[pb.LocalTargetReport(target_id=i * 100 + 1, local_state=pb.LOCAL_STATE_ONLINE)],
    )


@pytest.mark.timeout(60)
def test_client_follows_redirects_watch_and_failover(tmp_path: Path) -> None:
    async def main() -> None:
        async with two_mgmtds(tmp_path) as m:
            # follower first: every call must be redirected to mgmtd-1
            client = MgmtdClient(
                [m.addresses[1], m.addresses[0]], CLUSTER, timeout_s=1, retry_deadline_s=15
            )
            try:
                leader = await client.get_leader()
                assert leader.address == m.addresses[0]
                first = await client.get_routing(0)
                assert first is not None and first.leader_address == m.addresses[0]
                assert await client.get_routing(first.version) is None  # current: nothing to send

                seen: list[int] = []

                async def watch() -> None:
                    async for info in client.watch_routing(first.version):
                        seen.append(info.version)

                watcher = RoutingWatcher(client, poll_interval_s=0.2)
                adopted: list[int] = []
                watcher.subscribe(lambda r: adopted.append(r.version))
                await watcher.start()
                wtask = asyncio.create_task(watch())

                for i in (1, 2, 3):
                    await client.register_node(storage(i))
                table = await client.create_chain_table(1, 3)
                assert len(table.chains) == 1
                v_done = (await client.get_routing(0)).version  # type: ignore[union-attr]
                r = await watcher.wait_for(
                    lambda r: r.version >= v_done and r.has_chain(1), timeout_s=5
                )
                assert r.table(1).chain_ids == [table.chains[0].chain_id]
                # the watch stream saw every version from the first one on, in order
                await _until(lambda: bool(seen) and seen[-1] >= v_done, 5)
                assert seen[: v_done - first.version] == list(range(first.version + 1, v_done + 1))

                # errors come back as FsError with their code, no retries for bad input
                with pytest.raises(FsError) as ei:
                    await client.create_chain_table(2, 9)
                assert ei.value.code == Code.CANNOT_SATISFY
                with pytest.raises(FsError) as ei:
                    await client.set_target_state(4242, True)
                assert ei.value.code == Code.UNKNOWN_TARGET

                # failover: mgmtd-1 shuts down (releases the lease), mgmtd-2 takes over
                before = watcher.current.version
                await m.stop(0)
                new_leader = await client.get_leader()
                assert new_leader.address == m.addresses[1]
                r2 = await watcher.refresh()
                assert r2.version > before and r2.leader_address == m.addresses[1]
                assert Routing(r2.info).chain(1).targets == r.chain(1).targets
                await _until(lambda: seen[-1] >= r2.version, 10)  # the stream reconnected
                assert seen == sorted(seen) and len(seen) == len(set(seen))
                assert adopted == sorted(adopted) and len(adopted) == len(set(adopted))
                # a watcher never goes back
                assert not await watcher.adopt(first)
                with pytest.raises(FsError) as ei:
                    await watcher.refresh(min_version=r2.version + 1000, timeout_s=0.3)
                assert ei.value.code == Code.TIMEOUT

                # heartbeats with automatic versions keep working across the failover
                hb = await client.heartbeat(
                    pb.HeartbeatRequest(
                        node_id=10001,
                        type=pb.NODE_TYPE_STORAGE,
                        address="127.0.0.1:40001",
                        targets=[
                            pb.LocalTargetReport(target_id=101, local_state=pb.LOCAL_STATE_UPTODATE)
                        ],
                    )
                )
                assert hb.routing_version >= r2.version
                wtask.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await wtask
                await watcher.stop()
            finally:
                await client.close()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_client_gives_up_after_its_deadline_when_nobody_answers() -> None:
    async def main() -> None:
        port = free_port()
        async with MgmtdClient(
            [f"127.0.0.1:{port}"], CLUSTER, timeout_s=0.2, retry_deadline_s=1.0
        ) as c:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(FsError) as ei:
                await c.get_routing(0)
            assert ei.value.retryable and ei.value.code in (Code.UNAVAILABLE, Code.TIMEOUT)
            assert loop.time() - t0 < 3.0

    asyncio.run(main())


def test_client_needs_an_address() -> None:
    with pytest.raises(FsError) as ei:
        MgmtdClient([], CLUSTER)
    assert ei.value.code == Code.INVALID_ARGUMENT


async def _until(pred: object, limit_s: float) -> None:
    """Poll a condition with a deadline (the watch task appends; nothing to await on)."""
    assert callable(pred)
    async with asyncio.timeout(limit_s):
        while not pred():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
