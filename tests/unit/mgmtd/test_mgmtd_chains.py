"""The chain state machine (fs3.mgmtd.chains): exhaustive invariants plus 3FS stories.

Every combination of public x local state for chains of 1, 2 and 3 targets
(15**n inputs) is run through ``next_chain`` and checked against the rules of
docs/chain-states.md#the-state-machine-in-mgmtd; named scenarios then pin the
exact transitions of the failure-and-return story
(docs/chain-states.md#the-failure-and-return-story-end-to-end), LASTSRV and the
partition case.
"""

from __future__ import annotations

import itertools

import pytest

from fs3.mgmtd import chains as sm
from fs3.mgmtd.chains import (
    LASTSRV,
    LOCAL_OFFLINE,
    OFFLINE,
    ONLINE,
    SERVING,
    SYNCING,
    UPTODATE,
    WAITING,
    ChainTarget,
    next_chain,
    settle,
)

RANK = {s: i for i, s in enumerate(sm.PUBLIC_STATES)}
ALIVE = (UPTODATE, ONLINE)


def all_chains(n: int) -> list[list[ChainTarget]]:
    per_target = list(itertools.product(sm.PUBLIC_STATES, sm.LOCAL_STATES))
    return [
        [ChainTarget(i + 1, ps, ls) for i, (ps, ls) in enumerate(combo)]
        for combo in itertools.product(per_target, repeat=n)
    ]


def check_invariants(before: list[ChainTarget], after: list[ChainTarget]) -> None:
    b = {t.target_id: t for t in before}
    a = {t.target_id: t for t in after}
    # same targets, local states untouched
    assert sorted(b) == sorted(a) and len(after) == len(before)
    assert all(a[i].local == b[i].local for i in b)
    # re-sorted by public state
    ranks = [RANK[t.public] for t in after]
    assert ranks == sorted(ranks)
    states = [t.public for t in after]
    assert states.count(SYNCING) <= 1, "only one SYNCING target per chain"
    assert states.count(LASTSRV) <= 1
    assert not (SERVING in states and LASTSRV in states), "LASTSRV only when nothing serves"
    for i, t in a.items():
        old = b[i]
        if t.public == SERVING:
            assert t.local in ALIVE
            assert old.public in (SERVING, LASTSRV, SYNCING), "no promotion from WAITING/OFFLINE"
            if old.public == SYNCING:
                assert t.local == UPTODATE, "SYNCING -> SERVING only after sync done"
        if t.public == SYNCING:
            assert t.local == ONLINE and SERVING in states
        if t.public == WAITING:
            assert t.local in ALIVE
        if t.local == LOCAL_OFFLINE:
            assert t.public in (LASTSRV, OFFLINE)
        if t.public == LASTSRV:
            assert old.public in (SERVING, LASTSRV)
        if old.public == SERVING and old.local in ALIVE:
            assert t.public == SERVING, "a healthy serving target keeps serving"
    # the authoritative copy is never lost: serving/lastsrv in -> serving/lastsrv out
    if any(t.public in (SERVING, LASTSRV) for t in before):
        assert any(t.public in (SERVING, LASTSRV) for t in after)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_state_combination_keeps_the_invariants(n: int) -> None:
    count = 0
    for chain in all_chains(n):
        after = next_chain(chain)
        check_invariants(chain, after)
        # repeated rounds converge to a fixpoint that also keeps the invariants
        fixed = settle(chain)
        assert not sm.chain_changed(fixed, next_chain(fixed))
        check_invariants(fixed, next_chain(fixed))
        count += 1
    assert count == 15**n


@pytest.mark.timeout(10)
def test_single_target_table() -> None:
    """The whole table for a chain of one target."""
    expected = {
        (SERVING, UPTODATE): SERVING,
        (SERVING, ONLINE): SERVING,
        (SERVING, LOCAL_OFFLINE): LASTSRV,
        (LASTSRV, UPTODATE): SERVING,
        (LASTSRV, ONLINE): SERVING,
        (LASTSRV, LOCAL_OFFLINE): LASTSRV,
        (SYNCING, UPTODATE): SERVING,
        (SYNCING, ONLINE): WAITING,  # nothing serves to sync from
        (SYNCING, LOCAL_OFFLINE): OFFLINE,
        (WAITING, UPTODATE): WAITING,
        (WAITING, ONLINE): WAITING,
        (WAITING, LOCAL_OFFLINE): OFFLINE,
        (OFFLINE, UPTODATE): WAITING,
        (OFFLINE, ONLINE): WAITING,
        (OFFLINE, LOCAL_OFFLINE): OFFLINE,
    }
    for (ps, ls), want in expected.items():
        (got,) = next_chain([ChainTarget(1, ps, ls)])
        assert got.public == want, (ps, ls, got.public, want)


def states(chain: list[ChainTarget]) -> list[tuple[int, int]]:
    return [(t.target_id, t.public) for t in chain]


def with_local(chain: list[ChainTarget], **local: int) -> list[ChainTarget]:
    """Copy of chain with new local states for targets named t<id>."""
    out = []
    for t in chain:
        ls = local.get(f"t{t.target_id}", t.local)
        out.append(ChainTarget(t.target_id, t.public, ls))
    return out


@pytest.mark.timeout(10)
def test_failure_and_return_story() -> None:
    """[A, B, C] serving, B dies, returns, syncs, serves as the new tail.

    The failure-and-return story of docs/chain-states.md.
    """
    c = [
        ChainTarget(1, SERVING, UPTODATE),
        ChainTarget(2, SERVING, UPTODATE),
        ChainTarget(3, SERVING, UPTODATE),
    ]
    assert not sm.chain_changed(c, next_chain(c))
    c = next_chain(with_local(c, t2=LOCAL_OFFLINE))
    assert states(c) == [(1, SERVING), (3, SERVING), (2, OFFLINE)]  # moved to the end
    c = next_chain(with_local(c, t2=ONLINE))
    assert states(c) == [(1, SERVING), (3, SERVING), (2, SYNCING)]
    assert not sm.chain_changed(c, next_chain(c))  # stays syncing while ONLINE
    c = next_chain(with_local(c, t2=UPTODATE))  # predecessor said sync done
    assert states(c) == [(1, SERVING), (3, SERVING), (2, SERVING)]  # new tail


@pytest.mark.timeout(10)
def test_last_serving_replica_must_come_back_first() -> None:
    c = [
        ChainTarget(1, SERVING, UPTODATE),
        ChainTarget(2, SERVING, UPTODATE),
        ChainTarget(3, SERVING, UPTODATE),
    ]
    c = next_chain(with_local(c, t1=LOCAL_OFFLINE))
    assert states(c) == [(2, SERVING), (3, SERVING), (1, OFFLINE)]
    c = next_chain(with_local(c, t2=LOCAL_OFFLINE))
    assert states(c) == [(3, SERVING), (1, OFFLINE), (2, OFFLINE)]
    c = next_chain(with_local(c, t3=LOCAL_OFFLINE))
    assert states(c) == [(3, LASTSRV), (1, OFFLINE), (2, OFFLINE)]  # last to die
    # others come back first: they wait, nothing can sync them
    c = next_chain(with_local(c, t1=ONLINE, t2=ONLINE))
    assert states(c) == [(3, LASTSRV), (1, WAITING), (2, WAITING)]
    # the last serving one returns: serves directly, then one target syncs at a time
    c = next_chain(with_local(c, t3=ONLINE))
    assert states(c) == [(3, SERVING), (1, SYNCING), (2, WAITING)]
    c = next_chain(with_local(c, t1=UPTODATE))
    assert states(c) == [(3, SERVING), (1, SERVING), (2, SYNCING)]
    c = next_chain(with_local(c, t2=UPTODATE))
    assert states(c) == [(3, SERVING), (1, SERVING), (2, SERVING)]


@pytest.mark.timeout(10)
def test_simultaneous_failure_gives_lastsrv_to_the_first_in_chain_order() -> None:
    c = [ChainTarget(1, SERVING, LOCAL_OFFLINE), ChainTarget(2, SERVING, LOCAL_OFFLINE)]
    assert states(next_chain(c)) == [(1, LASTSRV), (2, OFFLINE)]


@pytest.mark.timeout(10)
def test_partitioned_target_claiming_uptodate_is_parked_in_waiting() -> None:
    """mgmtd declared it offline; it never noticed and still says UPTODATE: it missed writes."""
    c = [ChainTarget(1, SERVING, UPTODATE), ChainTarget(2, OFFLINE, UPTODATE)]
    assert states(next_chain(c)) == [(1, SERVING), (2, WAITING)]
    # after the storage node fences it and restarts it (local ONLINE) it resyncs
    c = next_chain(with_local(next_chain(c), t2=ONLINE))
    assert states(c) == [(1, SERVING), (2, SYNCING)]


@pytest.mark.timeout(10)
def test_returning_lastsrv_is_demoted_when_another_target_serves() -> None:
    c = [ChainTarget(1, SERVING, UPTODATE), ChainTarget(2, LASTSRV, ONLINE)]
    assert states(next_chain(c)) == [(1, SERVING), (2, OFFLINE)]


@pytest.mark.timeout(10)
def test_syncing_target_dies_or_loses_its_source() -> None:
    c = [ChainTarget(1, SERVING, UPTODATE), ChainTarget(2, SYNCING, LOCAL_OFFLINE)]
    assert states(next_chain(c)) == [(1, SERVING), (2, OFFLINE)]
    c = [ChainTarget(1, SERVING, LOCAL_OFFLINE), ChainTarget(2, SYNCING, ONLINE)]
    assert states(next_chain(c)) == [(1, LASTSRV), (2, WAITING)]


@pytest.mark.timeout(10)
def test_unknown_states_are_treated_as_offline() -> None:
    (t,) = next_chain([ChainTarget(1, 0, 0)])
    assert t.public == OFFLINE and t.local == LOCAL_OFFLINE


@pytest.mark.timeout(10)
def test_implied_local_state_keeps_a_loaded_chain_unchanged() -> None:
    for ps in sm.PUBLIC_STATES:
        chain = [ChainTarget(1, SERVING, UPTODATE), ChainTarget(2, ps, sm.implied_local_state(ps))]
        after = next_chain(chain)
        if ps in (SERVING, SYNCING, OFFLINE):
            assert not sm.chain_changed(chain, after), ps
