"""Only silence the leader could have observed declares a node down.

Stall compensation: the leader's own stall is not counted as the nodes' silence.

Seen in the fault soak under heavy CPU load: the leader's event loop did not run for
~2.8 s, then its heartbeat check ran before the queued heartbeats and declared every
node down at once (they were "up" again 100 ms later, but their targets were fenced).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mgmtd_helpers import Heartbeater, make_mgmtd, storage_register

import fs3.mgmtd.operator as operator_mod
from fs3.clock import FakeClock, SystemClock
from fs3.kv.memory import MemoryDatabase
from fs3.proto import mgmtd_pb2 as pb


class SteppedClock(SystemClock):
    """A SystemClock (so stall compensation is active) whose time the test sets."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


@pytest.mark.timeout(20)
def test_stalled_leader_does_not_declare_nodes_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteppedClock()
    real = [0.0]
    monkeypatch.setattr(operator_mod.time, "monotonic", lambda: real[0])

    async def main() -> None:
        m = make_mgmtd(MemoryDatabase(), clock, lease_length_s=60.0)  # type: ignore[arg-type]
        assert (await m.elector.run_once()).leader
        for i in (1, 2):
            await m.op.register_node(storage_register(i))
        hb = Heartbeater()

        async def beat(nodes: tuple[int, ...]) -> None:
            for n in nodes:
                await m.op.heartbeat(hb.request(n, {n * 100 + 1: pb.LOCAL_STATE_UPTODATE}))

        def status(n: int) -> int:
            return next(x.status for x in m.op.routing().nodes if x.node_id == 10000 + n)

        await beat((1, 2))
        await m.op.run_once()
        # the leader stalls for 8 s (timeout 5 s): fake and real time both jump, nobody was heard
        clock.advance(8.0)
        real[0] += 8.0
        await m.op.run_once()
        assert status(1) == status(2) == pb.NODE_STATUS_ONLINE  # our stall, not their silence
        # node 2 really is silent from now on: detected after the timeout of *running* time
        for _ in range(12):
            clock.advance(0.5)
            real[0] += 0.5
            await beat((1,))
            await m.op.run_once()
        assert status(1) == pb.NODE_STATUS_ONLINE
        assert status(2) == pb.NODE_STATUS_OFFLINE

    asyncio.run(main())


# --------------------------------------------------------------------------------------
# The CI failure: every node declared down in the same millisecond although all were
# alive (the check loop itself was on time, so the lateness guard above saw nothing).


class JumpClock(FakeClock):
    """Wall and monotonic time kept apart, so a wall-clock step can be simulated."""

    def __init__(self) -> None:
        super().__init__()
        self.wall_offset = 0.0

    def time(self) -> float:
        return self.now + self.wall_offset


async def _three(clock: FakeClock) -> tuple[Any, Heartbeater]:
    """A leader with three storage nodes that have heartbeated once, all online."""
    m = make_mgmtd(MemoryDatabase(), clock, lease_length_s=60.0)
    assert (await m.elector.run_once()).leader
    for i in (1, 2, 3):
        await m.op.register_node(storage_register(i))
    hb = Heartbeater()
    await _beat(m, hb)
    await m.op.run_once()
    assert _offline(m) == set()
    return m, hb


async def _beat(m: Any, hb: Heartbeater, nodes: tuple[int, ...] = (1, 2, 3)) -> None:
    for n in nodes:
        await m.op.heartbeat(
            hb.request(
                n, {n * 100 + 1: pb.LOCAL_STATE_UPTODATE, n * 100 + 2: pb.LOCAL_STATE_UPTODATE}
            )
        )


def _offline(m: Any) -> set[int]:
    return {
        x.node_id - 10000
        for x in m.op.routing().nodes
        if x.type == pb.NODE_TYPE_STORAGE and x.status != pb.NODE_STATUS_ONLINE
    }


@pytest.mark.timeout(20)
def test_heartbeats_queued_behind_a_slow_commit_are_not_silence() -> None:
    """A tick's KV commit stalls (an fsync on a busy disk) while holding the leader's lock;
    the heartbeats that arrive meanwhile wait behind the next tick. That tick must not
    count the wait as the nodes' silence."""
    clock = FakeClock()

    async def main() -> None:
        m, hb = await _three(clock)
        assert _offline(m) == set()
        release = asyncio.Event()
        real_run_async = m.op.db.run_async

        async def slow_run_async(fn: Any, **kw: Any) -> Any:
            await release.wait()
            return await real_run_async(fn, **kw)

        m.op.db.run_async = slow_run_async  # type: ignore[method-assign]
        m.op._leader_state().dirty_major = True  # the tick has something to publish
        tick1 = asyncio.create_task(m.op.run_once())
        await asyncio.sleep(0)  # tick 1 holds the lock, stuck in its commit
        tick2 = asyncio.create_task(m.op.run_once())
        await asyncio.sleep(0)  # tick 2 queued on the lock before the heartbeats
        clock.advance(1.0)
        beats = asyncio.create_task(_beat(m, hb))
        await asyncio.sleep(0)
        clock.advance(5.5)  # the commit takes longer than the heartbeat timeout
        release.set()
        m.op.db.run_async = real_run_async  # type: ignore[method-assign]
        await asyncio.wait_for(asyncio.gather(tick1, tick2, beats), 10)
        assert _offline(m) == set(), "a heartbeat waiting for the lock was counted as silence"

    asyncio.run(main())


@pytest.mark.timeout(20)
def test_a_wall_clock_step_is_not_silence() -> None:
    clock = JumpClock()

    async def main() -> None:
        m, hb = await _three(clock)
        clock.wall_offset += 8.0  # NTP steps the wall clock; no time passed for the leader
        await m.op.run_once()
        assert _offline(m) == set()

    asyncio.run(main())


@pytest.mark.timeout(20)
def test_every_node_silent_at_once_is_not_declared_down() -> None:
    """The leader's loop runs on time but hears nobody (the senders, the host or the
    transport stalled): it must not declare the whole cluster down; a node that really
    stays silent is still declared, one timeout after the leader hears the others again."""
    clock = FakeClock()

    async def main() -> None:
        m, hb = await _three(clock)
        for _ in range(14):  # 7 s of ticks with no heartbeat at all (timeout 5 s)
            clock.advance(0.5)
            await m.op.run_once()
        assert _offline(m) == set(), "every node declared down at once"
        for _ in range(12):  # heartbeats flow again, except node 3's: it died meanwhile
            clock.advance(0.5)
            await _beat(m, hb, (1, 2))
            await m.op.run_once()
        assert _offline(m) == {3}
        await _beat(m, hb)
        await m.op.run_once()
        assert _offline(m) == set()

    asyncio.run(main())


@pytest.mark.timeout(20)
def test_a_total_outage_is_still_declared() -> None:
    clock = FakeClock()

    async def main() -> None:
        m, hb = await _three(clock)
        for _ in range(16):  # 8 s: deaf or outage, undecided
            clock.advance(0.5)
            await m.op.run_once()
        assert _offline(m) == set()
        assert (await m.elector.run_once()).leader
        for _ in range(6):  # past two timeouts of total quiet: the nodes are gone
            clock.advance(0.5)
            await m.op.run_once()
        assert _offline(m) == {1, 2, 3}

    asyncio.run(main())
