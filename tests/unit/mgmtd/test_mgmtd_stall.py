"""The leader's own stall is not counted as the nodes' silence (heartbeat check stall compensation).

Seen in the fault soak under heavy CPU load: the leader's event loop did not run for
~2.8 s, then its heartbeat check ran before the queued heartbeats and declared every
node down at once (they were "up" again 100 ms later, but their targets were fenced).
"""

from __future__ import annotations

import asyncio

import pytest
from mgmtd_helpers import Heartbeater, make_mgmtd, storage_register

import fs3.mgmtd.operator as operator_mod
from fs3.clock import SystemClock
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
