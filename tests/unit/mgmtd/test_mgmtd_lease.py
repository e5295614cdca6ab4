"""Lease election over the KV (fs3.mgmtd.election) with a fake clock.

The multi-process versions of these stories (kill -9, SIGSTOP) are in
tests/integration/test_mgmtd_election.py (real processes).
"""

from __future__ import annotations

import asyncio

import pytest
from mgmtd_helpers import SwitchableDatabase, make_mgmtd, storage_register

from fs3.clock import FakeClock
from fs3.errors import Code, FsError
from fs3.kv.memory import MemoryDatabase
from fs3.mgmtd import store
from fs3.mgmtd.election import extend_lease


@pytest.mark.timeout(10)
def test_extend_lease_rules() -> None:
    db = MemoryDatabase()
    # free -> taken
    a = db.run(lambda tr: extend_lease(tr, 1, "a:1", 100.0, 10.0))
    assert (a.node_id, a.lease_start, a.lease_end) == (1, 100.0, 110.0)
    # someone else while valid -> unchanged
    b = db.run(lambda tr: extend_lease(tr, 2, "b:1", 105.0, 10.0))
    assert (b.node_id, b.lease_end) == (1, 110.0)
    # holder renews: same term (start), later end
    a2 = db.run(lambda tr: extend_lease(tr, 1, "a:1", 106.0, 10.0))
    assert (a2.node_id, a2.lease_start, a2.lease_end) == (1, 100.0, 116.0)
    # already long enough -> unchanged
    a3 = db.run(lambda tr: extend_lease(tr, 1, "a:1", 90.0, 10.0))
    assert a3.lease_end == 116.0
    # an older release never takes over, even an expired lease
    old = db.run(lambda tr: extend_lease(tr, 2, "b:1", 200.0, 10.0, release=0))
    assert old.node_id == 1
    # expired -> taken by another node, new term
    b2 = db.run(lambda tr: extend_lease(tr, 2, "b:1", 200.0, 10.0))
    assert (b2.node_id, b2.lease_start, b2.lease_end) == (2, 200.0, 210.0)
    assert db.run(lambda tr: store.get_lease(tr)) == b2


@pytest.mark.timeout(20)
def test_one_leader_followers_redirect_and_takeover_after_expiry() -> None:
    async def main() -> None:
        clock = FakeClock()
        db = MemoryDatabase()
        m1, m2 = make_mgmtd(db, clock, 1), make_mgmtd(db, clock, 2)
        assert (await m1.elector.run_once()).leader
        assert not (await m2.elector.run_once()).leader
        assert m1.elector.is_leader() and not m2.elector.is_leader()
        # a follower answers NOT_LEADER carrying the leader's address
        with pytest.raises(FsError) as ei:
            m2.op.routing()
        assert ei.value.code == Code.NOT_LEADER and ei.value.leader == m1.address
        assert m2.op.get_leader().address == m1.address
        v1 = m1.op.routing().version
        # m1 stops renewing (paused); its trust window closes margin before expiry
        clock.advance(10.0 - 3.0 + 0.01)
        assert not m1.elector.is_leader(), "must stop acting before the lease can expire"
        with pytest.raises(FsError) as ei:
            m1.op.routing()
        assert ei.value.code == Code.NOT_LEADER
        # before expiry nobody else may take it
        assert not (await m2.elector.run_once()).leader
        clock.advance(3.0)
        assert (await m2.elector.run_once()).leader
        assert m2.op.routing().version > v1, "versions stay monotonic across leaders"
        # the old leader wakes up: it follows and redirects
        view = await m1.elector.run_once()
        assert not view.leader and m1.elector.leader_address() == m2.address
        with pytest.raises(FsError) as ei:
            await m1.op.register_node(storage_register(1))
        assert ei.value.code == Code.NOT_LEADER and ei.value.leader == m2.address

    asyncio.run(main())


@pytest.mark.timeout(20)
def test_fencing_rejects_writes_of_a_deposed_leader() -> None:
    """Even if the old leader believed it leads, its write transaction re-reads the lease."""

    async def main() -> None:
        clock = FakeClock()
        db = MemoryDatabase()
        m1, m2 = make_mgmtd(db, clock, 1), make_mgmtd(db, clock, 2)
        await m1.elector.run_once()
        st1 = m1.op._state
        assert st1 is not None
        # m2 takes over behind m1's back (lease expired in the KV)
        clock.advance(10.5)
        await m2.elector.run_once()
        assert m2.elector.is_leader()
        # force m1 to believe it still leads (as a paused process might, without the window)
        m1.elector._trusted_until = clock.monotonic() + 100
        with pytest.raises(FsError) as ei:
            await m1.op._write(st1, lambda tr: None)
        assert ei.value.code == Code.NOT_LEADER
        assert ei.value.leader == m2.address

    asyncio.run(main())


@pytest.mark.timeout(20)
def test_renewal_keeps_the_term_and_the_state() -> None:
    async def main() -> None:
        clock = FakeClock()
        db = MemoryDatabase()
        m1 = make_mgmtd(db, clock, 1)
        await m1.elector.run_once()
        term = m1.elector.term
        await m1.op.register_node(storage_register(1))
        for _ in range(10):
            clock.advance(2.0)
            view = await m1.elector.run_once()
            assert view.leader and view.term == term
        assert 10001 in {n.node_id for n in m1.op.routing().nodes}

    asyncio.run(main())


@pytest.mark.timeout(20)
def test_kv_unavailable_stops_leading_and_recovers() -> None:
    async def main() -> None:
        clock = FakeClock()
        db = SwitchableDatabase()
        m1 = make_mgmtd(db, clock, 1)
        assert (await m1.elector.run_once()).leader
        lost: list[str] = []

        async def on_lost(reason: str) -> None:
            lost.append(reason)
            await m1.op.on_lease_lost(reason)

        m1.elector.on_lost = on_lost
        db.down = True
        clock.advance(2.0)
        assert (await m1.elector.run_once()).leader  # still inside the trust window
        assert m1.elector.last_error is not None
        assert m1.elector.last_error.code == Code.KV_UNAVAILABLE
        clock.advance(5.5)  # past lease_end - margin
        assert not (await m1.elector.run_once()).leader
        assert lost and "cannot renew" in lost[0]
        with pytest.raises(FsError) as ei:
            m1.op.routing()
        assert ei.value.code == Code.NOT_LEADER
        db.down = False
        clock.advance(3.0)  # lease expired: take it again, new term, bootstrap
        assert (await m1.elector.run_once()).leader
        assert m1.op.routing().version >= 2

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_release_lets_a_follower_take_over_at_once() -> None:
    async def main() -> None:
        clock = FakeClock()
        db = MemoryDatabase()
        m1, m2 = make_mgmtd(db, clock, 1), make_mgmtd(db, clock, 2)
        await m1.elector.run_once()
        await m1.elector.release()
        assert not m1.elector.is_leader()
        clock.advance(0.001)
        assert (await m2.elector.run_once()).leader

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_follower_retries_right_when_the_lease_expires() -> None:
    async def main() -> None:
        clock = FakeClock()
        db = MemoryDatabase()
        m1, m2 = make_mgmtd(db, clock, 1), make_mgmtd(db, clock, 2)
        await m1.elector.run_once()
        await m2.elector.run_once()
        assert m2.elector.next_delay() == 2.0  # lease far from expiry: normal interval
        clock.advance(9.0)
        assert 0.9 < m2.elector.next_delay() < 1.1  # wakes at expiry, not a full interval later
        assert m1.elector.next_delay() <= 2.0

    asyncio.run(main())
