"""How the native server runs a unary handler: its first step inline, the rest in a task.

A handler that finishes without suspending is answered from the frame
callback; one that suspends is handed to a task. Either way it must see what a
task-run handler sees: ``asyncio.current_task()`` (``asyncio.timeout`` and
``TaskGroup`` need it), its own context (a ``ContextVar`` set by one call never
shows in another), cancellation and deadlines. gRPC runs every handler in a
task: the same cases run over it for comparison.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from test_native import TRANSPORTS, _pool, _restore_settings  # noqa: F401 (a fixture)

from fs3.config import RpcSection
from fs3.errors import Code, FsError
from fs3.proto import mgmtd_pb2, mgmtd_pb2_grpc
from fs3.rpc import settings
from fs3.rpc.channel import ChannelPool, call
from fs3.rpc.loop import run
from fs3.rpc.server import add_servicer, bind, create_server

pytestmark = pytest.mark.timeout(60)

PROBE: contextvars.ContextVar[int] = contextvars.ContextVar("probe", default=0)


class Handlers(mgmtd_pb2_grpc.MgmtdServiceServicer):
    """Heartbeat's ``node_id`` picks a behaviour; the answer's version reports the result."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.waiting = 0
        self.lock = asyncio.Lock()  # node_id 11 and 12: a resource a handler holds across a wait
        self.holding = asyncio.Event()
        self.released = asyncio.Event()

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        n = request.node_id
        if n == 1:  # asyncio.timeout around a wait that finishes in time
            async with asyncio.timeout(5):
                await asyncio.sleep(0.01)
            return mgmtd_pb2.HeartbeatResponse(last_hb_version=1)
        if n == 2:  # asyncio.timeout that expires: the handler sees TimeoutError
            try:
                async with asyncio.timeout(0.05):
                    await asyncio.sleep(10)
            except TimeoutError:
                return mgmtd_pb2.HeartbeatResponse(last_hb_version=2)
            return mgmtd_pb2.HeartbeatResponse(last_hb_version=0)
        if n == 3:  # a task group opened in the first step

            async def part(x: int) -> int:
                await asyncio.sleep(0)
                return x

            async with asyncio.TaskGroup() as tg:
                a = tg.create_task(part(1))
                b = tg.create_task(part(2))
            return mgmtd_pb2.HeartbeatResponse(last_hb_version=a.result() + b.result())
        if n == 4:  # a context variable: set here, never seen by another call
            prev = PROBE.get()
            PROBE.set(4)
            return mgmtd_pb2.HeartbeatResponse(last_hb_version=prev)
        if n == 5:  # ... and kept across this call's own suspension
            PROBE.set(5)
            await asyncio.sleep(0.01)
            return mgmtd_pb2.HeartbeatResponse(last_hb_version=PROBE.get())
        if n == 6:  # a current task before and after suspending
            before = asyncio.current_task() is not None
            await asyncio.sleep(0)
            after = asyncio.current_task() is not None
            return mgmtd_pb2.HeartbeatResponse(last_hb_version=int(before) + int(after))
        if n == 7:  # the handler cancels its own task in the first step
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            return mgmtd_pb2.HeartbeatResponse(last_hb_version=0)
        if n == 8:  # fails in the first step, before any suspension
            raise FsError(Code.INVALID_ARGUMENT, "bad at once")
        if n == 10:  # never answers (deadlines)
            self.waiting += 1
            try:
                await asyncio.sleep(3600)
            finally:
                self.waiting -= 1
        if n == 11:  # takes the lock in its first step, then waits for a long time
            async with self.lock:
                self.holding.set()
                try:
                    await asyncio.sleep(3600)
                finally:
                    self.released.set()
        if n == 12:  # needs that lock
            async with asyncio.timeout(5):
                async with self.lock:
                    return mgmtd_pb2.HeartbeatResponse(last_hb_version=12)
        if n == 13:  # the deadline the call arrived with, in ms
            left = context.time_remaining()
            return mgmtd_pb2.HeartbeatResponse(last_hb_version=int(left * 1000))
        if n == 14:  # holds its caller's call slot until released
            self.holding.set()
            await self.released.wait()
            return mgmtd_pb2.HeartbeatResponse(last_hb_version=14)
        if n == 9:  # fails after a suspension
            await asyncio.sleep(0)
            raise FsError(Code.INVALID_ARGUMENT, "bad later")
        return mgmtd_pb2.HeartbeatResponse(last_hb_version=n)


async def _serve(
    transport: str, client: RpcSection | None = None
) -> tuple[Handlers, Any, Any, Any]:
    """Handlers on a real server, and a stub over ``transport`` (``client``: a native
    pool with these settings instead)."""
    handlers = Handlers()
    server = create_server(RpcSection())
    add_servicer(server, mgmtd_pb2_grpc.add_MgmtdServiceServicer_to_server, handlers)
    port = bind(server, "127.0.0.1", 0)
    await server.start()
    if client is None:
        pool = _pool(transport)
    else:
        settings.configure(client)
        pool = ChannelPool("native")
    return handlers, server, pool, mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(f"127.0.0.1:{port}"))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_inline_first_step_sees_a_task_and_its_own_context(transport: str) -> None:
    async def main() -> None:
        handlers, server, pool, stub = await _serve(transport)

        async def hb(n: int, timeout: float = 10) -> int:  # noqa: ASYNC109
            r = await call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=n), timeout=timeout)
            return int(r.last_hb_version)

        try:
            assert await hb(1) == 1
            assert await hb(2) == 2
            assert await hb(3) == 3
            # twice: the second call must not see what the first one set
            assert await hb(4) == 0
            assert await hb(4) == 0
            assert await hb(5) == 5
            assert await hb(4) == 0
            assert await hb(6) == 2
            if transport != "grpc":  # (grpc.aio answers nothing: the caller waits for its deadline)
                # a handler cancelled on the server: the caller hears of it at once
                with pytest.raises(FsError) as ei:
                    await hb(7, timeout=30)
                assert handlers.cancelled.is_set()
                assert ei.value.code == Code.CANCELLED and ei.value.retryable, ei.value
            for n in (8, 9):
                with pytest.raises(FsError) as ei:
                    await hb(n)
                assert ei.value.code == Code.INVALID_ARGUMENT, ei.value
            # the connection served all of that and still answers, many at once
            got = await asyncio.gather(*(hb(100 + i) for i in range(32)))
            assert got == [100 + i for i in range(32)]
        finally:
            await pool.close()
            await server.stop(0)

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_earlier_deadline_behind_a_later_one_is_kept(transport: str) -> None:
    """One timer per connection serves every deadline: a short one that comes
    after a long one must still end its call on time, on both sides."""

    async def main() -> None:
        handlers, server, pool, stub = await _serve(transport)
        req = mgmtd_pb2.HeartbeatRequest(node_id=10)
        try:
            long = asyncio.create_task(call(stub.Heartbeat, req, timeout=60))
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            for _ in range(3):
                with pytest.raises(FsError) as ei:
                    await asyncio.wait_for(call(stub.Heartbeat, req, timeout=0.3), 10)
                assert ei.value.code == Code.TIMEOUT, ei.value
            assert loop.time() - t0 < 5
            # the server gave up on the short calls too; only the long one still runs
            async with asyncio.timeout(10):
                while handlers.waiting != 1:  # noqa: ASYNC110 - a count, no event to wait on
                    await asyncio.sleep(0.01)
            assert not long.done()
            long.cancel()
        finally:
            await pool.close()
            await server.stop(0)

    run(main())


def test_a_cancel_read_with_its_call_still_ends_the_handler() -> None:
    """A CALL and its CANCEL in one read (a slow link delivers a request after the
    caller gave up on it): the handler's first step runs inline and suspends holding
    a lock, and the CANCEL comes before the task that continues it has started.
    Cancelling that task outright would never run it: the handler would stay
    suspended with the lock forever and the call would never end (seen as chunk
    updates that wait for a lock nobody releases). The handler must be cancelled
    where it waits, release the lock, and the call must end."""
    from fs3.rpc.native import wire
    from fs3.rpc.native.methods import BY_PATH

    mid = BY_PATH["/fs3.v1.MgmtdService/Heartbeat"].id

    async def main() -> None:
        handlers = Handlers()
        server = create_server(RpcSection())
        add_servicer(server, mgmtd_pb2_grpc.add_MgmtdServiceServicer_to_server, handlers)
        port = bind(server, "127.0.0.1", 0)
        await server.start()
        pool = _pool("native")
        stub = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(f"127.0.0.1:{port}"))
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            body = mgmtd_pb2.HeartbeatRequest(node_id=11).SerializeToString()
            writer.write(
                wire.PREFACE
                + wire.pack(wire.CALL, wire.HAS_MESSAGE, mid, 1, 60_000, body)
                + wire.pack(wire.CANCEL, 0, mid, 1, 0, b"")
            )
            await writer.drain()
            async with asyncio.timeout(10):
                await handlers.holding.wait()
                await handlers.released.wait()
            r = await call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=12), timeout=10)
            assert r.last_hb_version == 12
            # the cancelled call ended: nothing of it is counted against the connection
            conns = server.native._connections
            assert conns and all(not c._calls for c in conns), "a call never ended"
            assert all(c._inflight_bytes == 0 for c in conns)
        finally:
            writer.close()
            await pool.close()
            await server.stop(0)

    run(main())


def test_a_call_carries_its_whole_timeout_or_what_remains_after_waiting() -> None:
    """A call sent at once carries its whole timeout (no second clock read); one
    that waited for a call slot carries only what was left of it when it went."""

    async def main() -> None:
        one_slot = RpcSection(unix_sockets=False, max_inflight_calls=1)
        handlers, server, pool, stub = await _serve("native-tcp", client=one_slot)

        async def hb(n: int, timeout: float) -> int:  # noqa: ASYNC109
            r = await call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=n), timeout=timeout)
            return int(r.last_hb_version)

        try:
            assert 2000 < await hb(13, 2.5) <= 2500
            slot = asyncio.create_task(hb(14, 10))
            async with asyncio.timeout(10):
                await handlers.holding.wait()
            waiting = asyncio.create_task(hb(13, 3.0))
            await asyncio.sleep(0.6)  # the wait being measured, not a guess at an event
            assert not waiting.done()
            handlers.released.set()
            assert await slot == 14
            left = await waiting
            assert 0 < left <= 2500, left
        finally:
            await pool.close()
            await server.stop(0)

    run(main())
