"""The native RPC transport against real servers, and gRPC on the same port.

The server is ``fs3.rpc.server.RpcServer`` (both transports, one address)
serving scripted servicers of the real proto services; the clients are the
generated stubs over a ``ChannelPool`` of each transport, so every case runs
the code fs3 callers run. ``native-uds`` reaches the server through its
same-host Unix socket, ``native-tcp`` with Unix sockets off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fs3.config import RpcSection
from fs3.errors import Code, FsError, posix
from fs3.proto import mgmtd_pb2, mgmtd_pb2_grpc, storage_pb2, storage_pb2_grpc
from fs3.rpc import settings
from fs3.rpc.channel import BidiStream, ChannelPool, call
from fs3.rpc.loop import run
from fs3.rpc.server import add_servicer, bind, create_server
from fs3.rpc.status import from_rpc_error

pytestmark = pytest.mark.timeout(60)

TRANSPORTS = ["native-uds", "native-tcp", "grpc"]


class Mgmtd(mgmtd_pb2_grpc.MgmtdServiceServicer):
    """Scripted mgmtd: every behaviour a transport must carry."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.routing_nodes = 2000  # the size of GetRoutingInfo's answer (~106 bytes a node)

    async def GetLeader(self, request: Any, context: Any) -> Any:
        return mgmtd_pb2.GetLeaderResponse(node_id=7, address="a:1", is_leader=True)

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        if request.node_id == 1:
            raise FsError(Code.NOT_LEADER, "ask the other one", leader="b:2")
        if request.node_id == 2:
            raise posix(errno.ENOENT, "no such node")
        if request.node_id == 3:
            raise RuntimeError("a bug")
        if request.node_id == 4:  # slow: answered after a fast call on the same connection
            await self.release.wait()
        if request.node_id == 5:  # never answers: deadline / cancel
            self.started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return mgmtd_pb2.HeartbeatResponse(last_hb_version=request.node_id)

    async def GetRoutingInfo(self, request: Any, context: Any) -> Any:
        # a big answer (for the peer-that-stops-reading case)
        r = mgmtd_pb2.GetRoutingInfoResponse()
        r.routing.version = request.known_version
        for i in range(self.routing_nodes):
            n = r.routing.nodes.add()
            n.node_id = i
            n.address = "x" * 100
        return r

    async def WatchRoutingInfo(self, request: Any, context: Any) -> AsyncIterator[Any]:
        for v in range(request.known_version + 1, request.known_version + 4):
            yield mgmtd_pb2.RoutingInfo(version=v)
        if request.known_version == 100:
            raise FsError(Code.LEASE_LOST, "lease lost mid-stream")


class Storage(storage_pb2_grpc.StorageServiceServicer):
    async def ReadStream(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        async for req in requests:
            resp = storage_pb2.BatchReadResponse()
            for io in req.ios:
                r = resp.results.add()
                r.length = io.length
            yield resp


class Node:
    def __init__(self, rpc: RpcSection | None = None) -> None:
        self.rpc = rpc or RpcSection()
        self.mgmtd = Mgmtd()
        self.server = create_server(self.rpc)
        add_servicer(self.server, mgmtd_pb2_grpc.add_MgmtdServiceServicer_to_server, self.mgmtd)
        add_servicer(self.server, storage_pb2_grpc.add_StorageServiceServicer_to_server, Storage())
        self.address = ""

    async def __aenter__(self) -> Node:
        port = bind(self.server, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{port}"
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)


def _pool(transport: str) -> ChannelPool:
    if transport == "native-tcp":
        settings.configure(RpcSection(unix_sockets=False))
    else:
        settings.configure(RpcSection())
    return ChannelPool("grpc" if transport == "grpc" else "native")


@pytest.fixture(autouse=True)
def _restore_settings() -> Any:
    yield
    settings.configure(RpcSection())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unary_errors_streams(transport: str) -> None:
    async def main() -> None:
        async with Node() as node:
            pool = _pool(transport)
            ch = pool.get(node.address)
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(ch)
            r = await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
            assert (r.node_id, r.address, r.is_leader) == (7, "a:1", True)
            if transport != "grpc":
                assert ch.via == ("unix" if transport == "native-uds" else "tcp")
            # FsError crosses as the same FsError
            with pytest.raises(FsError) as ei:
                await call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=1), timeout=5)
            assert ei.value.code == Code.NOT_LEADER and ei.value.leader == "b:2"
            assert ei.value.retryable
            with pytest.raises(FsError) as ei:
                await call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=2), timeout=5)
            assert ei.value.code == Code.POSIX and ei.value.errno == errno.ENOENT
            with pytest.raises(FsError) as ei:
                await call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=3), timeout=5)
            assert ei.value.code == Code.INTERNAL and "RuntimeError" in ei.value.message
            # server streaming, ended well and ended by an error
            got = [
                i.version
                async for i in stub.WatchRoutingInfo(
                    mgmtd_pb2.WatchRoutingInfoRequest(known_version=10)
                )
            ]
            assert got == [11, 12, 13]
            seen = []
            try:
                async for i in stub.WatchRoutingInfo(
                    mgmtd_pb2.WatchRoutingInfoRequest(known_version=100)
                ):
                    seen.append(i.version)
                raise AssertionError("the stream should have failed")
            except Exception as e:  # gRPC's raw stream raises RpcError: callers map it
                err = e if isinstance(e, FsError) else from_rpc_error(e)  # type: ignore[arg-type]
            assert seen == [101, 102, 103] and err.code == Code.LEASE_LOST
            # bidi streaming, the way the storage client holds its read stream
            sstub = storage_pb2_grpc.StorageServiceStub(ch)
            bidi = BidiStream(sstub.ReadStream)
            for n in (1, 2, 3):
                req = storage_pb2.BatchReadRequest()
                req.ios.add().length = n
                await bidi.write(req)
            await bidi.done_writing()
            lengths = [r.results[0].length async for r in bidi.responses()]
            assert lengths == [1, 2, 3]
            await pool.close()

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_out_of_order_deadline_cancel(transport: str) -> None:
    async def main() -> None:
        async with Node() as node:
            pool = _pool(transport)
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(node.address))
            # a slow call does not hold up a fast one on the same connection
            slow = asyncio.create_task(
                call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=4), timeout=10)
            )
            fast = await call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=9), timeout=5)
            assert fast.last_hb_version == 9 and not slow.done()
            node.mgmtd.release.set()
            assert (await slow).last_hb_version == 4
            # deadline: the caller gets TIMEOUT, the server's handler is cancelled
            with pytest.raises(FsError) as ei:
                await call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=5), timeout=0.3)
            assert ei.value.code == Code.TIMEOUT and ei.value.retryable
            await asyncio.wait_for(node.mgmtd.cancelled.wait(), 5)
            # cancellation by the caller reaches the server too
            node.mgmtd.cancelled.clear()
            node.mgmtd.started.clear()
            t = asyncio.create_task(
                call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=5), timeout=30)
            )
            await asyncio.wait_for(node.mgmtd.started.wait(), 5)
            t.cancel()
            await asyncio.wait_for(node.mgmtd.cancelled.wait(), 5)
            # 64 in flight on one connection
            rs = await asyncio.gather(
                *(
                    call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=100 + i), timeout=5)
                    for i in range(64)
                )
            )
            assert [r.last_hb_version for r in rs] == [100 + i for i in range(64)]
            await pool.close()

    run(main())


def test_unreachable_is_unavailable() -> None:
    async def main() -> None:
        pool = ChannelPool("native")
        stub = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get("127.0.0.1:1"))
        with pytest.raises(FsError) as ei:
            await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=2)
        assert ei.value.code == Code.UNAVAILABLE and ei.value.retryable
        await pool.close()

    run(main())


def test_server_restart_reconnects() -> None:
    """A lost connection fails its calls retryably; the next call reconnects."""

    async def main() -> None:
        pool = ChannelPool("native")
        async with Node() as node:
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(node.address))
            await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
            host, port = node.address.rsplit(":", 1)
        with pytest.raises(FsError) as ei:
            await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
        assert ei.value.retryable
        node2 = Node()
        node2.server.bind(host, int(port))
        await node2.server.start()
        try:
            r = await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
            assert r.node_id == 7
        finally:
            await node2.server.stop(0)
        await pool.close()

    run(main())


def test_asyncio_loop_switch() -> None:
    """``[rpc] event_loop = "asyncio"``: the same calls on the stock loop."""

    async def main() -> str:
        async with Node() as node:
            pool = ChannelPool("native")
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(node.address))
            await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
            await pool.close()
        return type(asyncio.get_running_loop()).__module__

    assert run(main(), "asyncio").startswith("asyncio")
    assert run(main(), "uvloop").startswith("uvloop")


def test_limits_from_config() -> None:
    async def main() -> int:
        node = Node(dataclasses.replace(RpcSection(), max_inflight_calls=3))
        return node.server.native.limits.max_inflight_calls

    assert run(main()) == 3


def test_oversized_request_fails_alone() -> None:
    """A request above the frame limit is refused at the caller (INVALID_ARGUMENT);
    the connection, and every other call on it, lives on."""

    async def main() -> None:
        async with Node() as node:
            settings.configure(RpcSection(max_message_bytes=4096))
            pool = ChannelPool("native")
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(node.address))
            await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
            with pytest.raises(FsError) as ei:
                await call(
                    stub.Heartbeat,
                    mgmtd_pb2.HeartbeatRequest(node_id=9, name="x" * 5000),
                    timeout=5,
                )
            assert ei.value.code == Code.INVALID_ARGUMENT and "exceeds" in ei.value.message
            r = await call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=9), timeout=5)
            assert r.last_hb_version == 9
            assert node.server.native.connections == 1
            await pool.close()

    run(main())
