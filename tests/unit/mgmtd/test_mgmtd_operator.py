"""The mgmtd operator with a memory KV and a fake clock: registry, heartbeats,
timeouts, chain state changes, chain tables, persistence, watch."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from mgmtd_helpers import Heartbeater, Mgmtd, make_mgmtd, storage_register

from fs3.clock import FakeClock
from fs3.errors import Code, FsError
from fs3.kv.memory import MemoryDatabase
from fs3.proto import mgmtd_pb2 as pb
from fs3.routing import Routing

S, SY, W, O, L = (  # noqa: E741
    pb.PUBLIC_STATE_SERVING,
    pb.PUBLIC_STATE_SYNCING,
    pb.PUBLIC_STATE_WAITING,
    pb.PUBLIC_STATE_OFFLINE,
    pb.PUBLIC_STATE_LASTSRV,
)
UP, ON, OFF = pb.LOCAL_STATE_UPTODATE, pb.LOCAL_STATE_ONLINE, pb.LOCAL_STATE_OFFLINE


def run(fn: Callable[..., Awaitable[Any]], **kw: Any) -> Any:
    return asyncio.run(fn(**kw))


async def leader(db: MemoryDatabase, clock: FakeClock, node_id: int = 1, **kw: Any) -> Mgmtd:
    m = make_mgmtd(db, clock, node_id, **kw)
    assert (await m.elector.run_once()).leader
    return m


async def cluster3(
    clock: FakeClock, db: MemoryDatabase | None = None, **kw: Any
) -> tuple[Mgmtd, Heartbeater]:
    """A leader with storage-1..3 (2 targets each) and chain table 1 of 3 replicas."""
    m = await leader(db or MemoryDatabase(), clock, **kw)
    for i in (1, 2, 3):
        await m.op.register_node(storage_register(i))
    resp = await m.op.create_chain_table(pb.CreateChainTableRequest(table_id=1, replicas=3))
    assert len(resp.chains) == 2
    return m, Heartbeater()


def chain_states(m: Mgmtd, chain_id: int) -> list[tuple[int, int]]:
    c = Routing(m.op.routing()).chain(chain_id)
    return [(t.target_id, t.public_state) for t in c.targets]


async def beat_all(
    m: Mgmtd, hb: Heartbeater, states: dict[int, int], nodes: tuple[int, ...] = (1, 2, 3)
) -> None:
    for n in nodes:
        mine = {t: s for t, s in states.items() if t // 100 == n}
        await m.op.heartbeat(hb.request(n, mine))


ALL_UP = {101: UP, 102: UP, 201: UP, 202: UP, 301: UP, 302: UP}


# ----------------------------------------------------------------------------- registry


@pytest.mark.timeout(20)
def test_register_and_bad_requests_change_nothing(clock: FakeClock) -> None:
    async def main() -> None:
        m = await leader(MemoryDatabase(), clock)
        r = await m.op.register_node(storage_register(1))
        assert {t.target_id for t in r.routing.targets} == {101, 102}
        before = m.op.routing()

        bad: list[tuple[pb.RegisterNodeRequest, Code]] = []
        req = storage_register(2)
        req.cluster_id = "other"
        bad.append((req, Code.INVALID_ARGUMENT))
        req = storage_register(2)
        req.node_id = 0
        bad.append((req, Code.INVALID_ARGUMENT))
        req = storage_register(2)
        req.address = "nohost"
        bad.append((req, Code.INVALID_ARGUMENT))
        req = storage_register(2)
        req.targets.append(pb.LocalTargetReport(target_id=201, local_state=ON))
        bad.append((req, Code.INVALID_ARGUMENT))  # same target twice
        req = storage_register(2)
        req.targets[0].local_state = 77
        bad.append((req, Code.INVALID_ARGUMENT))
        req = storage_register(2)
        req.targets.append(pb.LocalTargetReport(target_id=101, local_state=ON))
        bad.append((req, Code.DUPLICATE_NODE))  # a target of live storage-1
        req = storage_register(1)
        req.address = "127.0.0.1:1"
        bad.append((req, Code.DUPLICATE_NODE))  # node id in use by a live node elsewhere
        req = storage_register(1)
        req.type = pb.NODE_TYPE_META
        req.ClearField("targets")
        bad.append((req, Code.DUPLICATE_NODE))  # registered with another type
        req = storage_register(2)
        req.type = pb.NODE_TYPE_CLIENT
        req.ClearField("targets")
        bad.append((req, Code.INVALID_ARGUMENT))
        for req, code in bad:
            with pytest.raises(FsError) as ei:
                await m.op.register_node(req)
            assert ei.value.code == code, (req, ei.value)
        assert m.op.routing() == before, "a refused request changes nothing"

    run(main)


@pytest.mark.timeout(20)
def test_heartbeat_validation(clock: FakeClock) -> None:
    async def main() -> None:
        m = await leader(MemoryDatabase(), clock, allow_unregistered=False)
        hb = Heartbeater()
        with pytest.raises(FsError) as ei:
            await m.op.heartbeat(hb.request(1, {101: ON}))
        assert ei.value.code == Code.UNKNOWN_NODE
        await m.op.register_node(storage_register(1))
        before = m.op.routing()
        ok = hb.request(1, {101: UP, 102: UP})
        await m.op.heartbeat(ok)
        with pytest.raises(FsError) as ei:
            await m.op.heartbeat(ok)  # same hb_version again
        assert ei.value.code == Code.STALE_HEARTBEAT and f"last={ok.hb_version}" in ei.value.message
        malformed = hb.request(1, {101: UP})
        malformed.hb_version = 0
        with pytest.raises(FsError) as ei:
            await m.op.heartbeat(malformed)
        assert ei.value.code == Code.INVALID_ARGUMENT
        wrong = hb.request(1, {101: UP})
        wrong.cluster_id = "nope"
        with pytest.raises(FsError) as ei:
            await m.op.heartbeat(wrong)
        assert ei.value.code == Code.INVALID_ARGUMENT
        assert m.op.routing().version == before.version  # heartbeats alone publish on the tick

    run(main)


@pytest.mark.timeout(20)
def test_first_heartbeat_registers_when_allowed(clock: FakeClock) -> None:
    async def main() -> None:
        m = await leader(MemoryDatabase(), clock, allow_unregistered=True)
        v0 = m.op.routing().version
        await m.op.heartbeat(Heartbeater().request(4, {401: ON}))
        r = Routing(m.op.routing())
        assert r.version > v0
        assert r.node(10004).name == "storage-10004" and r.target(401).node_id == 10004

    run(main)


@pytest.mark.timeout(20)
def test_duplicate_node_id_allowed_once_the_old_one_is_offline(clock: FakeClock) -> None:
    async def main() -> None:
        m = await leader(MemoryDatabase(), clock)
        await m.op.register_node(storage_register(1))
        moved = storage_register(1)
        moved.address = "127.0.0.1:29999"
        with pytest.raises(FsError):
            await m.op.register_node(moved)
        clock.advance(6.0)
        await m.op.run_once()
        assert Routing(m.op.routing()).node(10001).status == pb.NODE_STATUS_OFFLINE
        await m.op.register_node(moved)
        n = Routing(m.op.routing()).node(10001)
        assert n.address == "127.0.0.1:29999" and n.status == pb.NODE_STATUS_ONLINE

    run(main)


# ----------------------------------------------------------------------------- timeouts + chains


@pytest.mark.timeout(20)
def test_new_chains_start_serving_at_version_1(clock: FakeClock) -> None:
    async def main() -> None:
        m, hb = await cluster3(clock)
        r = Routing(m.op.routing())
        for c in r.chains():
            assert c.version == 1 and all(t.public_state == S for t in c.targets)
            assert len({r.target(t.target_id).node_id for t in c.targets}) == 3
        assert r.table(1).chain_ids == [1, 2] and r.table(1).version == 1

    run(main)


@pytest.mark.timeout(20)
def test_silent_node_goes_offline_and_its_targets_move_to_the_end(clock: FakeClock) -> None:
    async def main() -> None:
        m, hb = await cluster3(clock)
        await beat_all(m, hb, ALL_UP)
        await m.op.run_once()
        v = m.op.routing().version
        # storage-2 falls silent; the others keep beating
        for _ in range(6):
            clock.advance(1.0)
            await beat_all(m, hb, ALL_UP, nodes=(1, 3))
            await m.op.run_once()
        r = Routing(m.op.routing())
        assert r.version > v
        assert r.node(10002).status == pb.NODE_STATUS_OFFLINE
        assert r.target(201).local_state == OFF
        for cid in (1, 2):
            c = r.chain(cid)
            assert c.version == 2
            assert [t.public_state for t in c.targets] == [S, S, O]
            assert c.targets[-1].target_id // 100 == 2
            assert r.head(cid) is not None and r.head(cid) // 100 != 2

    run(main)


@pytest.mark.timeout(20)
def test_failed_target_resyncs_then_serves_as_the_new_tail(clock: FakeClock) -> None:
    async def main() -> None:
        m, hb = await cluster3(clock)
        await beat_all(m, hb, ALL_UP)
        await m.op.run_once()
        tid = Routing(m.op.routing()).chain(1).targets[0].target_id  # the head
        down = {**ALL_UP, tid: OFF}
        await beat_all(m, hb, down)
        await m.op.run_once()
        assert chain_states(m, 1)[-1] == (tid, O)
        await beat_all(m, hb, {**ALL_UP, tid: ON})  # restarted: needs sync
        await m.op.run_once()
        assert chain_states(m, 1)[-1] == (tid, SY)
        r = Routing(m.op.routing())
        assert r.successor(1, r.tail(1)) == tid  # forwarded writes reach the syncing target
        await beat_all(m, hb, {**ALL_UP, tid: UP})  # predecessor said sync done
        await m.op.run_once()
        r = Routing(m.op.routing())
        assert chain_states(m, 1)[-1] == (tid, S) and r.tail(1) == tid
        assert r.chain(1).version == 4

    run(main)


@pytest.mark.timeout(20)
def test_stale_chain_version_reports_are_ignored(clock: FakeClock) -> None:
    async def main() -> None:
        m, hb = await cluster3(clock)
        await beat_all(m, hb, ALL_UP)
        await beat_all(m, hb, {**ALL_UP, 101: OFF})
        await m.op.run_once()
        c = Routing(m.op.routing()).chain(Routing(m.op.routing()).target(101).chain_id)
        assert c.version == 2
        # a report based on chain version 1 claiming UPTODATE must not count
        await m.op.heartbeat(hb.request(1, {101: UP, 102: UP}, chain_versions={101: 1}))
        await m.op.run_once()
        assert Routing(m.op.routing()).target(101).local_state == OFF
        await m.op.heartbeat(hb.request(1, {101: ON, 102: UP}, chain_versions={101: 2}))
        await m.op.run_once()
        assert Routing(m.op.routing()).target(101).public_state == SY

    run(main)


@pytest.mark.timeout(20)
def test_admin_offline_and_online(clock: FakeClock) -> None:
    async def main() -> None:
        m, hb = await cluster3(clock)
        await beat_all(m, hb, ALL_UP)
        await m.op.run_once()
        resp = await m.op.set_target_state(pb.SetTargetStateRequest(target_id=201, offline=True))
        assert resp.chain.targets[-1].target_id == 201 and resp.chain.targets[-1].public_state == O
        await beat_all(m, hb, {**ALL_UP, 201: ON})
        await m.op.run_once()
        assert Routing(m.op.routing()).target(201).public_state == O, "admin mark wins"
        await m.op.set_target_state(pb.SetTargetStateRequest(target_id=201, offline=False))
        await m.op.run_once()
        assert Routing(m.op.routing()).target(201).public_state == SY
        with pytest.raises(FsError) as ei:
            await m.op.set_target_state(pb.SetTargetStateRequest(target_id=999, offline=True))
        assert ei.value.code == Code.UNKNOWN_TARGET

    run(main)


# ----------------------------------------------------------------------------- chain tables


@pytest.mark.timeout(20)
def test_chain_table_errors_and_idempotence(clock: FakeClock) -> None:
    async def main() -> None:
        m = await leader(MemoryDatabase(), clock)
        await m.op.register_node(storage_register(1))
        await m.op.register_node(storage_register(2))
        before = m.op.routing()
        for req, code in [
            (pb.CreateChainTableRequest(table_id=1, replicas=3), Code.CANNOT_SATISFY),
            (pb.CreateChainTableRequest(table_id=0, replicas=1), Code.INVALID_ARGUMENT),
            (pb.CreateChainTableRequest(table_id=1, replicas=0), Code.INVALID_ARGUMENT),
            (
                pb.CreateChainTableRequest(table_id=1, replicas=2, node_ids=[10001, 55]),
                Code.UNKNOWN_NODE,
            ),
        ]:
            with pytest.raises(FsError) as ei:
                await m.op.create_chain_table(req)
            assert ei.value.code == code
        assert m.op.routing() == before
        first = await m.op.create_chain_table(pb.CreateChainTableRequest(table_id=1, replicas=2))
        assert len(first.chains) == 2 and first.balance.max_pair == 2
        again = await m.op.create_chain_table(pb.CreateChainTableRequest(table_id=1, replicas=2))
        assert again.table == first.table  # nothing free: same table, no new version
        # a new node with free targets extends the table as a new version
        await m.op.register_node(storage_register(3))
        await m.op.register_node(storage_register(4))
        ext = await m.op.create_chain_table(pb.CreateChainTableRequest(table_id=1, replicas=2))
        assert ext.table.version == 2 and len(ext.table.chain_ids) == 4
        r = Routing(m.op.routing())
        assert r.table(1, 1).chain_ids == [1, 2] and r.table(1).version == 2

    run(main)


@pytest.mark.timeout(20)
def test_six_nodes_four_targets_three_replicas_through_the_operator(clock: FakeClock) -> None:
    async def main() -> None:
        m = await leader(MemoryDatabase(), clock)
        for i in range(1, 7):
            await m.op.register_node(storage_register(i, targets=4))
        resp = await m.op.create_chain_table(pb.CreateChainTableRequest(table_id=1, replicas=3))
        assert len(resp.chains) == 8
        assert (resp.balance.max_pair, resp.balance.min_pair) == (2, 1)

    run(main)


# ----------------------------------------------------------------------------- persistence


@pytest.mark.timeout(20)
def test_new_leader_loses_nothing_and_versions_stay_monotonic(clock: FakeClock) -> None:
    async def main() -> None:
        db = MemoryDatabase()
        m, hb = await cluster3(clock, db)
        await beat_all(m, hb, ALL_UP)
        await beat_all(m, hb, {**ALL_UP, 302: OFF})
        await m.op.run_once()
        await m.op.set_target_state(pb.SetTargetStateRequest(target_id=101, offline=True))
        old = Routing(m.op.routing())
        # every mgmtd "restarts": a fresh operator on the same KV after the lease expired
        clock.advance(11.0)
        m2 = await leader(db, clock, node_id=2)
        new = Routing(m2.op.routing())
        assert new.version > old.version
        assert [(c.chain_id, c.version, list(c.targets)) for c in new.chains()] == [
            (c.chain_id, c.version, list(c.targets)) for c in old.chains()
        ]
        assert new.info.chain_tables == old.info.chain_tables
        assert {n.node_id for n in new.storage_nodes()} == {10001, 10002, 10003}
        assert new.target(101).admin_offline
        assert new.node(10001).address == old.node(10001).address
        # presumed alive for one timeout: no chain changes at once
        await m2.op.run_once()
        assert [c.version for c in Routing(m2.op.routing()).chains()] == [
            c.version for c in old.chains()
        ]
        # nodes that never report again are declared offline; as nobody at all reports, the
        # leader cannot tell this from its own deafness and waits two timeouts, not one
        clock.advance(6.0)
        await m2.op.run_once()
        assert all(
            n.status == pb.NODE_STATUS_ONLINE for n in Routing(m2.op.routing()).storage_nodes()
        )
        assert (await m2.elector.run_once()).leader  # renew the lease meanwhile
        clock.advance(5.0)
        await m2.op.run_once()
        r = Routing(m2.op.routing())
        assert all(n.status == pb.NODE_STATUS_OFFLINE for n in r.storage_nodes())
        assert all(L in [t.public_state for t in c.targets] for c in r.chains())

    run(main)


# ----------------------------------------------------------------------------- watch


@pytest.mark.timeout(20)
def test_watch_delivers_every_version_in_order(clock: FakeClock) -> None:
    async def main() -> None:
        m = await leader(MemoryDatabase(), clock)
        start = m.op.routing().version
        seen: list[int] = []
        done = asyncio.Event()

        async def watch() -> None:
            async for info in m.op.watch_routing(start - 1, recheck_s=0.05):
                seen.append(info.version)
                if info.chain_tables:
                    done.set()
                    return

        task = asyncio.create_task(watch())
        for i in (1, 2, 3):  # several bumps back to back, without yielding in between
            await m.op.register_node(storage_register(i))
        await m.op.create_chain_table(pb.CreateChainTableRequest(table_id=1, replicas=3))
        await asyncio.wait_for(done.wait(), 5)
        await task
        end = m.op.routing().version
        assert seen == list(range(start, end + 1)), "every version, in order, no gaps"

    run(main)


@pytest.mark.timeout(20)
def test_watch_ends_with_not_leader_when_leadership_is_lost(clock: FakeClock) -> None:
    async def main() -> None:
        m = await leader(MemoryDatabase(), clock)

        async def consume() -> None:
            async for _ in m.op.watch_routing(0, recheck_s=0.05):
                clock.advance(20.0)  # lease long gone

        with pytest.raises(FsError) as ei:
            await asyncio.wait_for(consume(), 5)
        assert ei.value.code == Code.NOT_LEADER

    run(main)


@pytest.mark.timeout(60)
def test_cancelled_watchers_end_cleanly(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    """Watch streams cancelled at any moment (streams closed at shutdown) end with
    CancelledError and log nothing at ERROR, also when the cancel lands while a watcher's
    recheck timeout fires as many watchers wake at once; a watcher started afterwards is
    still woken by the next version (nothing was left holding the watchers' wake-up)."""

    async def main() -> None:
        m = await leader(MemoryDatabase(), clock)
        rng = random.Random(17)

        async def watch(known: int) -> None:
            async for _ in m.op.watch_routing(known, recheck_s=0.002):
                pass

        node = 0
        for _ in range(150):
            known = m.op.routing().version
            tasks = [asyncio.create_task(watch(known)) for _ in range(20)]
            for _ in range(10):
                await asyncio.sleep(rng.random() * 0.003)
                node += 1
                await m.op.register_node(storage_register(1 + node % 50))  # wakes them all
                for t in tasks:
                    if rng.random() < 0.1:
                        t.cancel()
            for t in tasks:
                t.cancel()
            ends = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
            wrong = [e for e in ends if not isinstance(e, asyncio.CancelledError)]
            assert not wrong, f"cancelled watchers ended with {wrong}"
        woke = asyncio.Event()

        async def wake(known: int) -> None:
            async for _ in m.op.watch_routing(known, recheck_s=30.0):
                woke.set()
                return

        task = asyncio.create_task(wake(m.op.routing().version))
        await asyncio.sleep(0)
        await m.op.register_node(storage_register(99))
        await asyncio.wait_for(woke.wait(), 5)
        await task

    with caplog.at_level(logging.ERROR):
        run(main)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


@pytest.mark.timeout(20)
def test_usage_only_changes_are_published_with_a_delay(clock: FakeClock) -> None:
    async def main() -> None:
        m, hb = await cluster3(clock)
        await beat_all(m, hb, ALL_UP)
        await m.op.run_once()
        v = m.op.routing().version
        await m.op.heartbeat(hb.request(1, {101: UP, 102: UP}, used=12345))
        await m.op.run_once()
        assert m.op.routing().version == v  # not on every heartbeat
        clock.advance(0.5 * 5)
        await m.op.run_once()
        r = Routing(m.op.routing())
        assert r.version == v + 1 and r.target(101).used_bytes == 12345

    run(main)


@pytest.mark.timeout(10)
def test_report_target_error_counts(clock: FakeClock) -> None:
    async def main() -> None:
        m, hb = await cluster3(clock)
        await m.op.report_target_error(
            pb.ReportTargetErrorRequest(target_id=101, node_id=10001, kind="checksum")
        )
        with pytest.raises(FsError) as ei:
            await m.op.report_target_error(
                pb.ReportTargetErrorRequest(target_id=5, kind="checksum")
            )
        assert ei.value.code == Code.UNKNOWN_TARGET
        with pytest.raises(FsError) as ei:
            await m.op.report_target_error(pb.ReportTargetErrorRequest(target_id=101))
        assert ei.value.code == Code.INVALID_ARGUMENT
        clock.advance(3.0)
        await m.op.run_once()
        assert Routing(m.op.routing()).target(101).error_count == 1

    run(main)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_000_000.0)


@pytest.mark.timeout(10)
def test_metrics_follow_the_state(clock: FakeClock) -> None:
    from prometheus_client import REGISTRY

    async def main() -> None:
        m, hb = await cluster3(clock)
        assert REGISTRY.get_sample_value("fs3_mgmtd_is_leader") == 1
        assert REGISTRY.get_sample_value("fs3_mgmtd_routing_version") == m.op.routing().version
        ok_before = REGISTRY.get_sample_value("fs3_mgmtd_heartbeats_total", {"result": "ok"}) or 0
        await beat_all(m, hb, ALL_UP)
        assert (
            REGISTRY.get_sample_value("fs3_mgmtd_heartbeats_total", {"result": "ok"})
            == ok_before + 3
        )
        clock.advance(6.0)
        await m.op.run_once()
        assert (await m.elector.run_once()).leader
        clock.advance(5.0)  # nobody at all reports: declared after two timeouts
        await m.op.run_once()
        assert REGISTRY.get_sample_value("fs3_mgmtd_nodes", {"status": "offline"}) == 3
        await m.op.on_lease_lost("test")
        assert REGISTRY.get_sample_value("fs3_mgmtd_is_leader") == 0

    run(main)


@pytest.mark.timeout(10)
def test_new_chain_grace_freezes_the_state_machine(clock: FakeClock) -> None:
    async def main() -> None:
        m, hb = await cluster3(clock, new_chain_grace_s=3.0)
        await beat_all(m, hb, {**ALL_UP, 101: OFF})
        await m.op.run_once()
        tchain = Routing(m.op.routing()).target(101).chain_id
        assert Routing(m.op.routing()).chain(tchain).version == 1  # frozen
        clock.advance(3.5)
        await beat_all(m, hb, {**ALL_UP, 101: OFF})
        await m.op.run_once()
        assert Routing(m.op.routing()).chain(tchain).version == 2

    run(main)
