"""MetaClient against real in-process meta servers (MetaServicer over the memory KV).

The server list is cached per routing object; these tests pin that a routing
change is seen by the very next call, and that the inlined first attempt keeps
the retry policy's behaviour: permanent errors at once, failover after a dead
server, the deadline counted from the call's start.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from fs3.client.meta_client import MetaClient
from fs3.client.retry import RetryPolicy
from fs3.errors import Code, FsError
from fs3.kv.memory import MemoryDatabase
from fs3.meta.operator import MetaOperator
from fs3.meta.service import MetaServicer
from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc, mgmtd_pb2
from fs3.routing import Routing
from fs3.rpc.channel import ChannelPool
from fs3.rpc.server import add_servicer, bind, create_server

pytestmark = pytest.mark.timeout(60)

ROOT_ATTR = meta_pb2.GetAttrRequest(user=common_pb2.UserInfo(uid=0, gid=0), inode=1)


def _closed_port_address() -> str:
    """A local address nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _routing(version: int, *nodes: tuple[str, int]) -> Routing:
    """Routing ``version`` listing META nodes ``(address, status)``."""
    info = mgmtd_pb2.RoutingInfo(version=version)
    for i, (address, status) in enumerate(nodes):
        info.nodes.add(
            node_id=100 + i, type=mgmtd_pb2.NODE_TYPE_META, address=address, status=status
        )
    return Routing(info)


ONLINE = mgmtd_pb2.NODE_STATUS_ONLINE
OFFLINE = mgmtd_pb2.NODE_STATUS_OFFLINE


@asynccontextmanager
async def meta_server() -> AsyncIterator[str]:
    server = create_server()
    add_servicer(
        server,
        meta_pb2_grpc.add_MetaServiceServicer_to_server,
        MetaServicer(MetaOperator(MemoryDatabase())),
    )
    port = bind(server, "127.0.0.1", 0)
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


class RoutingHolder:
    """What the client core passes: the current routing, replaced whole on a change."""

    def __init__(self, routing: Routing) -> None:
        self.current = routing
        self.refreshes = 0
        self.next: Routing | None = None

    async def refresh(self) -> None:
        self.refreshes += 1
        if self.next is not None:
            self.current, self.next = self.next, None


def _client(holder: RoutingHolder, pool: ChannelPool, policy: RetryPolicy, **kw: Any) -> MetaClient:
    return MetaClient(
        lambda: holder.current, holder.refresh, pool, policy, rng=random.Random(7), **kw
    )


def test_server_list_is_cached_per_routing_and_follows_changes() -> None:
    holder = RoutingHolder(_routing(1, ("10.0.0.1:1", ONLINE), ("10.0.0.2:1", OFFLINE)))
    c = _client(holder, ChannelPool("native"), RetryPolicy(), static_addresses=["10.0.0.9:1"])
    assert c.servers() == ["10.0.0.1:1", "10.0.0.9:1"]
    assert c._servers() is c._servers()  # one list per routing, not rebuilt per call
    c.servers().append("x")  # the public copy cannot corrupt the cache
    assert c.servers() == ["10.0.0.1:1", "10.0.0.9:1"]

    holder.current = _routing(2, ("10.0.0.3:1", ONLINE))
    assert c.servers() == ["10.0.0.3:1", "10.0.0.9:1"]
    assert c._choose() in ("10.0.0.3:1", "10.0.0.9:1")

    # nothing online and no static addresses: the offline-marked ones are tried
    c2 = _client(holder, ChannelPool("native"), RetryPolicy())
    holder.current = _routing(3, ("10.0.0.4:1", OFFLINE))
    assert c2.servers() == ["10.0.0.4:1"]
    holder.current = _routing(4)
    assert c2.servers() == []
    with pytest.raises(FsError) as ei:
        c2._choose()
    assert ei.value.code == Code.UNAVAILABLE


@pytest.mark.parametrize("transport", ["native", "grpc"])
def test_routing_change_is_seen_by_the_next_call(transport: str) -> None:
    async def main() -> None:
        pool = ChannelPool(transport)
        async with meta_server() as a, meta_server() as b:
            holder = RoutingHolder(_routing(1, (a, ONLINE)))
            c = _client(holder, pool, RetryPolicy(deadline_s=10, rpc_timeout_s=2))
            r = await c.call("GetAttr", ROOT_ATTR)
            assert r.attr.inode == 1
            assert c._current == a

            # routing now lists only b (a left the cluster): the next call goes to b
            # straight away; a stale list would try a first and fail over
            holder.current = _routing(2, (b, ONLINE))
            r = await c.call("GetAttr", ROOT_ATTR)
            assert r.attr.inode == 1
            assert c._current == b
            assert c.failovers == 0
        await pool.close()

    asyncio.run(main())


@pytest.mark.parametrize("transport", ["native", "grpc"])
def test_permanent_error_is_raised_at_once(transport: str) -> None:
    async def main() -> None:
        pool = ChannelPool(transport)
        async with meta_server() as a:
            holder = RoutingHolder(_routing(1, (a, ONLINE)))
            c = _client(holder, pool, RetryPolicy(deadline_s=10, rpc_timeout_s=2))
            req = meta_pb2.GetAttrRequest(user=common_pb2.UserInfo(uid=0, gid=0), inode=987654)
            with pytest.raises(FsError) as ei:
                await c.call("GetAttr", req)
            assert not ei.value.retryable
            assert "gave up" not in ei.value.message
            assert c.failovers == 0 and holder.refreshes == 0
        await pool.close()

    asyncio.run(main())


@pytest.mark.parametrize("transport", ["native", "grpc"])
def test_dead_first_server_fails_over_through_a_routing_refresh(transport: str) -> None:
    async def main() -> None:
        pool = ChannelPool(transport)
        dead = _closed_port_address()
        async with meta_server() as b:
            holder = RoutingHolder(_routing(1, (dead, ONLINE)))
            holder.next = _routing(2, (dead, OFFLINE), (b, ONLINE))
            c = _client(holder, pool, RetryPolicy(deadline_s=10, rpc_timeout_s=2))
            r = await c.call("GetAttr", ROOT_ATTR)
            assert r.attr.inode == 1
            # attempt 1 failed on the dead server: marked failed (a failover), routing
            # refreshed because it was the only one, attempt 2 on the new routing's b
            assert c.failovers == 1
            assert holder.refreshes == 1
            assert c._current == b
        await pool.close()

    asyncio.run(main())


def test_no_server_known_refreshes_routing_before_the_first_attempt() -> None:
    async def main() -> None:
        pool = ChannelPool("native")
        async with meta_server() as a:
            holder = RoutingHolder(_routing(1))
            holder.next = _routing(2, (a, ONLINE))
            c = _client(holder, pool, RetryPolicy(deadline_s=10, rpc_timeout_s=2))
            r = await c.call("GetAttr", ROOT_ATTR)
            assert r.attr.inode == 1
            assert holder.refreshes == 1 and c.failovers == 0
        await pool.close()

    asyncio.run(main())


def test_deadline_runs_from_the_start_of_the_call() -> None:
    async def main() -> None:
        pool = ChannelPool("native")
        holder = RoutingHolder(_routing(1, (_closed_port_address(), ONLINE)))
        c = _client(holder, pool, RetryPolicy(deadline_s=60, rpc_timeout_s=2))
        t0 = time.monotonic()
        with pytest.raises(FsError) as ei:
            await c.call("GetAttr", ROOT_ATTR, deadline_s=0.5)
        took = time.monotonic() - t0
        assert ei.value.code == Code.UNAVAILABLE
        assert "gave up after" in ei.value.message and "in 0.5s" in ei.value.message
        assert not ei.value.retryable
        assert took < 0.5 + 0.3  # the last backoff never crosses the deadline
        await pool.close()

    asyncio.run(main())


def test_request_ids_are_unique_and_time_ordered() -> None:
    """32 hex digits, distinct, and increasing with time (meta's idempotency records
    of consecutive mutations share B-tree pages)."""
    import time

    from fs3.client.meta_client import new_request_id

    ids = []
    for _ in range(200):
        ids.append(new_request_id())
        t = time.time_ns()
        while time.time_ns() == t:  # the next id is at a later nanosecond
            pass
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
