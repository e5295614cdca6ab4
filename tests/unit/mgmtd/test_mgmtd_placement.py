"""Chain table generation (fs3.mgmtd.placement): scatter, balance, refusal."""

from __future__ import annotations

import itertools

import pytest

from fs3.errors import Code, FsError
from fs3.mgmtd import placement


def cluster(nodes: int, targets: int) -> dict[int, list[int]]:
    """storage-i's j-th target is i*100+j (the local cluster's numbering)."""
    return {i: [i * 100 + j for j in range(1, targets + 1)] for i in range(1, nodes + 1)}


def node_of(tid: int) -> int:
    return tid // 100


def check_valid(free: dict[int, list[int]], plan: placement.Placement, k: int) -> None:
    used: set[int] = set()
    for chain in plan.chains:
        assert len(chain) == k
        assert len({node_of(t) for t in chain}) == k, f"two targets of one node in {chain}"
        for t in chain:
            assert t in free[node_of(t)]
            assert t not in used, "a target belongs to exactly one chain"
            used.add(t)


@pytest.mark.timeout(30)
def test_six_nodes_four_targets_three_replicas_is_balanced() -> None:
    free = cluster(6, 4)
    plan = placement.generate(free, 3)
    check_valid(free, plan, 3)
    b = plan.balance
    assert len(plan.chains) == 8 and b.unused_targets == 0
    # 8 chains x 3 pairs = 24 pair slots over 15 node pairs: 1.6 on average, so 1..2 is optimal
    assert (b.max_pair, b.min_pair) == (2, 1), b.summary()
    assert b.max_chains_per_node == b.min_chains_per_node == 4
    assert b.max_chains_per_target == b.min_chains_per_target == 1
    # heads spread over nodes: no node heads more than 2 of the 8 chains
    heads = [node_of(c[0]) for c in plan.chains]
    assert max(heads.count(n) for n in free) <= 2
    print(f"6x4x3: {b.summary()}")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("nodes", "targets", "k"),
    [(3, 2, 3), (5, 6, 3), (4, 4, 2), (7, 3, 3), (10, 16, 3), (3, 1, 1), (8, 5, 4)],
)
def test_balance_is_near_optimal(nodes: int, targets: int, k: int) -> None:
    free = cluster(nodes, targets)
    plan = placement.generate(free, k)
    check_valid(free, plan, k)
    b = plan.balance
    total = nodes * targets
    assert len(plan.chains) == total // k
    if k > 1:
        mean = len(plan.chains) * k * (k - 1) / 2 / (nodes * (nodes - 1) / 2)
        assert b.max_pair - b.min_pair <= 1 or b.max_pair <= mean + 1.5, b.summary()
    assert b.max_chains_per_node - b.min_chains_per_node <= 1


@pytest.mark.timeout(10)
def test_fewer_nodes_than_replicas_cannot_be_satisfied() -> None:
    with pytest.raises(FsError) as ei:
        placement.generate(cluster(2, 4), 3)
    assert ei.value.code == Code.CANNOT_SATISFY
    with pytest.raises(FsError) as ei:
        placement.generate({1: [101], 2: [], 3: []}, 2)
    assert ei.value.code == Code.CANNOT_SATISFY
    with pytest.raises(FsError) as ei:
        placement.generate(cluster(3, 1), 0)
    assert ei.value.code == Code.INVALID_ARGUMENT


@pytest.mark.timeout(10)
def test_uneven_nodes_use_what_fits_and_report_the_rest() -> None:
    free = {1: [101, 102, 103, 104, 105], 2: [201], 3: [301]}
    plan = placement.generate(free, 3)
    check_valid(free, plan, 3)
    assert len(plan.chains) == 1 and plan.balance.unused_targets == 4
    assert placement.max_chains({1: 5, 2: 2, 3: 2}, 3) == 2


@pytest.mark.timeout(10)
def test_extension_balances_against_existing_chains() -> None:
    # existing chains all on nodes 1,2,3; new nodes 4,5,6 plus spare targets on 1..3
    existing = [[1, 2, 3]] * 3
    free = {n: [n * 100 + 9] for n in range(1, 7)}
    plan = placement.generate(free, 3, existing_chain_nodes=existing)
    check_valid(free, plan, 3)
    # 2 new chains must take the 3 old nodes between them, so one old pair is
    # unavoidably reused once; the generator reuses no more than that.
    reused = sum(
        1
        for nodes in plan.chain_nodes
        for a, b in itertools.combinations(sorted(nodes), 2)
        if a in (1, 2, 3) and b in (1, 2, 3)
    )
    assert reused == 1
    assert plan.balance.max_pair == 4


@pytest.mark.timeout(10)
def test_deterministic() -> None:
    free = cluster(7, 5)
    assert placement.generate(free, 3).chains == placement.generate(free, 3).chains


@pytest.mark.timeout(10)
def test_balance_of_counts_every_pair() -> None:
    b = placement.balance_of([[1, 2, 3], [1, 2, 4]], [1, 2, 3, 4, 5])
    assert b.pair_counts[(1, 2)] == 2 and b.pair_counts[(4, 5)] == 0
    assert b.max_pair == 2 and b.min_pair == 0
    assert len(b.pair_counts) == len(list(itertools.combinations(range(5), 2)))
