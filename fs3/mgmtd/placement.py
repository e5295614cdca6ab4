"""Chain table generation: scatter replicas so recovery load spreads evenly.

3FS computes chain tables offline with an integer program (a balanced
incomplete block design: every pair of nodes shares the same number of
chains). fs3 ships a deterministic heuristic that
gets close on small clusters and reports how close it got:

1. **Capacity.** In fs3 (as in 3FS) every target belongs to exactly one chain,
   so the number of chains is the largest ``b`` with
   ``sum(min(free_i, b)) >= b * replicas`` (no chain may hold two targets of one
   node); targets beyond that stay free and are reported.
2. **Greedy.** Chains are formed one at a time from the node set that (a) keeps
   the rest feasible (``max(rem) * k <= sum(rem)``, the exact condition for
   splitting what is left into groups of ``k`` distinct nodes), (b) minimises
   the largest pair co-occurrence it creates, then (c) the sum of the pair
   counts it touches, then (d) prefers nodes with more targets left.
3. **Local search.** Swapping one node between two chains is accepted when it
   lowers the sum of squared pair counts (the variance of the recovery traffic)
   without putting two targets of one node into a chain.
4. **Heads.** Within a chain the node with the fewest heads so far goes first,
   so writes (which enter at the head) spread over the nodes too.

Pure functions, no I/O; :func:`balance_of` measures any list of chains.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fs3.errors import Code, FsError

Pair = tuple[int, int]

_MAX_COMBOS = 20_000  # candidate node sets examined per chain


@dataclass
class Balance:
    """How evenly a set of chains spreads over nodes."""

    max_pair: int = 0
    min_pair: int = 0
    mean_pair: float = 0.0
    max_chains_per_node: int = 0
    min_chains_per_node: int = 0
    max_chains_per_target: int = 0
    min_chains_per_target: int = 0
    unused_targets: int = 0
    pair_counts: dict[Pair, int] = field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"pairs max={self.max_pair} min={self.min_pair} mean={self.mean_pair:.2f}; "
            f"chains/node max={self.max_chains_per_node} min={self.min_chains_per_node}; "
            f"chains/target max={self.max_chains_per_target} min={self.min_chains_per_target}; "
            f"unused targets={self.unused_targets}"
        )


@dataclass
class Placement:
    """Generated chains (target ids, head first) and their nodes."""

    chains: list[list[int]]
    chain_nodes: list[list[int]]
    balance: Balance


def _pair(a: int, b: int) -> Pair:
    return (a, b) if a < b else (b, a)


def max_chains(free: Mapping[int, int], k: int) -> int:
    """The most chains of ``k`` distinct nodes that ``free`` (node -> free targets) allows."""
    total = sum(free.values())
    for b in range(total // k, 0, -1):
        if sum(min(r, b) for r in free.values()) >= b * k:
            return b
    return 0


def generate(
    free_targets: Mapping[int, Sequence[int]],
    replicas: int,
    *,
    existing_chain_nodes: Sequence[Sequence[int]] = (),
    local_search_passes: int = 30,
) -> Placement:
    """Build chains from free targets.

    Args:
        free_targets: node id -> ids of its free targets (in the order to use them).
        replicas: targets per chain (k).
        existing_chain_nodes: node sets of chains already in the table, so an
            extension balances against them.
        local_search_passes: bound on improvement passes.

    Raises:
        FsError(INVALID_ARGUMENT) for replicas < 1; FsError(CANNOT_SATISFY) when
        fewer than ``replicas`` nodes have a free target.
    """
    k = replicas
    if k < 1:
        raise FsError(Code.INVALID_ARGUMENT, f"replicas must be >= 1, got {k}")
    nodes = sorted(n for n, ts in free_targets.items() if ts)
    if len(nodes) < k:
        raise FsError(
            Code.CANNOT_SATISFY,
            f"{k} replicas need {k} storage nodes with free targets, only {len(nodes)} have any",
        )
    avail = {n: len(free_targets[n]) for n in nodes}
    b = max_chains(avail, k)
    rem = {n: min(avail[n], b) for n in nodes}
    pairs: Counter[Pair] = Counter()
    for ch in existing_chain_nodes:
        for a, c in itertools.combinations(sorted(set(ch)), 2):
            pairs[_pair(a, c)] += 1

    groups: list[list[int]] = []
    for _ in range(b):
        g = _pick_group(rem, pairs, k)
        groups.append(g)
        for n in g:
            rem[n] -= 1
        for a, c in itertools.combinations(g, 2):
            pairs[_pair(a, c)] += 1

    _improve(groups, pairs, local_search_passes)

    # Assign concrete targets and head order.
    queues = {n: list(free_targets[n]) for n in nodes}
    heads: Counter[int] = Counter()
    chains: list[list[int]] = []
    chain_nodes: list[list[int]] = []
    for g in groups:
        order = sorted(g, key=lambda n: (heads[n], n))
        heads[order[0]] += 1
        chain_nodes.append(order)
        chains.append([queues[n].pop(0) for n in order])
    all_chain_nodes = [list(c) for c in existing_chain_nodes] + chain_nodes
    bal = balance_of(all_chain_nodes, nodes)
    used = {t for c in chains for t in c}
    bal.unused_targets = sum(len(ts) for ts in free_targets.values()) - len(used)
    bal.max_chains_per_target = 1 if chains else 0
    bal.min_chains_per_target = 1 if chains and bal.unused_targets == 0 else 0
    return Placement(chains=chains, chain_nodes=chain_nodes, balance=bal)


def _pick_group(rem: dict[int, int], pairs: Counter[Pair], k: int) -> list[int]:
    live = [n for n in sorted(rem) if rem[n] > 0]
    total = sum(rem.values())
    # Bound the search on big clusters: the nodes with most targets left matter most.
    cand_nodes = sorted(live, key=lambda n: (-rem[n], n))
    m = len(cand_nodes)
    while m > k and _ncr(m, k) > _MAX_COMBOS:
        m -= 1
    cand_nodes = sorted(cand_nodes[:m])
    best: tuple[tuple[int, int, int, tuple[int, ...]], list[int]] | None = None
    for combo in itertools.combinations(cand_nodes, k):
        after_total = total - k
        after_max = max(rem[n] - (1 if n in combo else 0) for n in live)
        if after_max * k > after_total:
            continue  # would leave an unsplittable remainder
        ps = [pairs[_pair(a, c)] + 1 for a, c in itertools.combinations(combo, 2)]
        score = (max(ps, default=0), sum(ps), -sum(rem[n] for n in combo), combo)
        if best is None or score < best[0]:
            best = (score, list(combo))
    if best is None:  # cannot happen when b was computed by max_chains; be safe
        return sorted(live, key=lambda n: (-rem[n], n))[:k]
    return best[1]


def _ncr(n: int, r: int) -> int:
    from math import comb

    return comb(n, r)


def _improve(groups: list[list[int]], pairs: Counter[Pair], passes: int) -> None:
    """Swap nodes between chains while the sum of squared pair counts drops."""
    for _ in range(passes):
        improved = False
        for i, j in itertools.combinations(range(len(groups)), 2):
            a, b = groups[i], groups[j]
            for x in list(a):
                if x in b:
                    continue
                for y in list(b):
                    if y in a or x not in a:
                        continue
                    delta: Counter[Pair] = Counter()
                    for o in a:
                        if o != x:
                            delta[_pair(x, o)] -= 1
                            delta[_pair(y, o)] += 1
                    for o in b:
                        if o != y:
                            delta[_pair(y, o)] -= 1
                            delta[_pair(x, o)] += 1
                    gain = sum((pairs[p] + d) ** 2 - pairs[p] ** 2 for p, d in delta.items() if d)
                    if gain < 0:
                        a[a.index(x)] = y
                        b[b.index(y)] = x
                        for p, d in delta.items():
                            pairs[p] += d
                        improved = True
                        break
        if not improved:
            return


def balance_of(chain_nodes: Sequence[Sequence[int]], nodes: Sequence[int] | None = None) -> Balance:
    """Pair co-occurrence and per-node chain counts of ``chain_nodes``.

    ``nodes`` lists every node that should count (pairs that share nothing count
    as 0); defaults to the nodes that appear in the chains.
    """
    all_nodes = sorted(set(nodes) if nodes is not None else {n for c in chain_nodes for n in c})
    pc: dict[Pair, int] = {_pair(a, b): 0 for a, b in itertools.combinations(all_nodes, 2)}
    per_node = dict.fromkeys(all_nodes, 0)
    for c in chain_nodes:
        for n in c:
            per_node[n] = per_node.get(n, 0) + 1
        for a, b in itertools.combinations(sorted(set(c)), 2):
            pc[_pair(a, b)] = pc.get(_pair(a, b), 0) + 1
    vals = list(pc.values())
    return Balance(
        max_pair=max(vals, default=0),
        min_pair=min(vals, default=0),
        mean_pair=(sum(vals) / len(vals)) if vals else 0.0,
        max_chains_per_node=max(per_node.values(), default=0),
        min_chains_per_node=min(per_node.values(), default=0),
        pair_counts=pc,
    )
