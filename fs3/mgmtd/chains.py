"""The chain state machine of 3FS, as pure functions.

mgmtd turns the *local* states storage nodes report (UPTODATE / ONLINE /
OFFLINE) into the *public* states it publishes (SERVING / LASTSRV / SYNCING /
WAITING / OFFLINE) with one chain-wide pass, :func:`next_chain`, which follows
3FS ``updateChain.cc::generateNewChain`` (see docs/chain-states.md#the-state-machine-in-mgmtd):

* a serving target that died becomes LASTSRV if it is the first serving one to
  die in this round and nothing else serves, otherwise OFFLINE;
* a LASTSRV target that comes back serves again (it holds the newest data);
  while another target serves, a LASTSRV one is demoted to OFFLINE;
* a returning target (ONLINE) enters SYNCING only if the chain has a serving
  target and no other target is syncing (one SYNCING per chain), otherwise it
  WAITs; SYNCING becomes SERVING only when the target reports UPTODATE (its
  predecessor told it the sync is done);
* a target mgmtd had given up on (WAITING/OFFLINE) that still claims UPTODATE
  (e.g. after a partition, it missed writes) is parked in WAITING, never
  promoted directly;
* defensive additions for inputs the machine itself never produces: a second
  SYNCING target waits, a second LASTSRV target goes OFFLINE, unknown states
  count as OFFLINE;
* the result is re-sorted by public state (SERVING, LASTSRV, SYNCING, WAITING,
  OFFLINE; stable within a state), so failed targets move to the end of the
  chain and a recovered target becomes the new tail once serving.

Nothing here does I/O; the chain updater applies the result, bumping the chain
version whenever the (target, state) list changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fs3.proto import mgmtd_pb2

SERVING = mgmtd_pb2.PUBLIC_STATE_SERVING
LASTSRV = mgmtd_pb2.PUBLIC_STATE_LASTSRV
SYNCING = mgmtd_pb2.PUBLIC_STATE_SYNCING
WAITING = mgmtd_pb2.PUBLIC_STATE_WAITING
OFFLINE = mgmtd_pb2.PUBLIC_STATE_OFFLINE

UPTODATE = mgmtd_pb2.LOCAL_STATE_UPTODATE
ONLINE = mgmtd_pb2.LOCAL_STATE_ONLINE
LOCAL_OFFLINE = mgmtd_pb2.LOCAL_STATE_OFFLINE

PUBLIC_STATES = (SERVING, LASTSRV, SYNCING, WAITING, OFFLINE)
LOCAL_STATES = (UPTODATE, ONLINE, LOCAL_OFFLINE)
_ALIVE = (UPTODATE, ONLINE)


@dataclass(frozen=True)
class ChainTarget:
    """One target of a chain as the state machine sees it."""

    target_id: int
    public: int  # PublicTargetState
    local: int  # LocalTargetState (admin-offline and unreported count as OFFLINE)


def normalize_public(state: int) -> int:
    """Unknown/unspecified public states are treated as OFFLINE (the safe side)."""
    return state if state in PUBLIC_STATES else OFFLINE


def normalize_local(state: int) -> int:
    """Unknown/unspecified local states are treated as OFFLINE (never as alive)."""
    return state if state in LOCAL_STATES else LOCAL_OFFLINE


def next_chain(targets: Sequence[ChainTarget]) -> list[ChainTarget]:
    """One round of the 3FS chain state machine.

    Args:
        targets: the chain in its current order, each with its current public
            state and the local state last reported for it.

    Returns:
        The new chain: the same targets, re-ordered, with new public states (local
        states unchanged). Equal to the input when nothing changes.
    """
    ts = [
        ChainTarget(t.target_id, normalize_public(t.public), normalize_local(t.local))
        for t in targets
    ]
    out: dict[int, list[ChainTarget]] = {s: [] for s in PUBLIC_STATES}

    def old(state: int) -> list[ChainTarget]:
        return [t for t in ts if t.public == state]

    def put(t: ChainTarget, state: int) -> None:
        out[state].append(ChainTarget(t.target_id, state, t.local))

    for t in old(SERVING):
        if t.local in _ALIVE:
            put(t, SERVING)
        elif not out[LASTSRV]:
            put(t, LASTSRV)  # the first serving one to die keeps the newest data
        else:
            put(t, OFFLINE)
    for t in old(LASTSRV):
        if out[SERVING]:
            put(t, OFFLINE)
        elif t.local in _ALIVE:
            put(t, SERVING)  # the last serving replica came back: it serves again
        elif not out[LASTSRV]:
            put(t, LASTSRV)
        else:
            put(t, OFFLINE)  # never two authorities (only reachable from bad input)
    for t in old(SYNCING):
        if t.local == UPTODATE:
            put(t, SERVING)  # sync done
        elif t.local == ONLINE:
            # one SYNCING per chain, and only while something serves to sync from
            put(t, SYNCING if out[SERVING] and not out[SYNCING] else WAITING)
        else:
            put(t, OFFLINE)
    for t in old(WAITING) + old(OFFLINE):
        if out[SERVING] and not out[SYNCING] and t.local == ONLINE:
            put(t, SYNCING)
        elif t.local in _ALIVE:
            put(t, WAITING)
        else:
            put(t, OFFLINE)
    if out[SERVING]:
        # A live copy exists again: a LASTSRV target is no longer the authority.
        for t in out[LASTSRV]:
            put(t, OFFLINE)
        out[LASTSRV] = []
    result: list[ChainTarget] = []
    for s in PUBLIC_STATES:
        result.extend(out[s])
    return result


def chain_changed(before: Sequence[ChainTarget], after: Sequence[ChainTarget]) -> bool:
    """True if order or any public state differs (then the chain version is bumped)."""
    return [(t.target_id, normalize_public(t.public)) for t in before] != [
        (t.target_id, t.public) for t in after
    ]


def settle(targets: Sequence[ChainTarget], max_rounds: int = 10) -> list[ChainTarget]:
    """Apply :func:`next_chain` until nothing changes (what repeated updater runs reach)."""
    cur = list(targets)
    for _ in range(max_rounds):
        nxt = next_chain(cur)
        if not chain_changed(cur, nxt):
            return nxt
        cur = nxt
    return cur


def implied_local_state(public: int) -> int:
    """The local state a target in ``public`` state must have been reporting.

    Used when a new leader loads chains from the KV: local states are not
    persisted (3FS), and assuming OFFLINE for everybody would knock every chain
    down at once. Assuming the state that keeps the chain as it is gives nodes a
    full heartbeat timeout to report in; a node that does not is then declared
    offline by the heartbeat checker as usual.
    """
    if public == SERVING:
        return UPTODATE
    if public in (SYNCING, WAITING):
        return ONLINE
    return LOCAL_OFFLINE


def from_chain_info(chain: mgmtd_pb2.ChainInfo, local_of: dict[int, int]) -> list[ChainTarget]:
    """State-machine input for a persisted chain (``local_of``: target -> local state)."""
    return [
        ChainTarget(t.target_id, t.public_state, local_of.get(t.target_id, LOCAL_OFFLINE))
        for t in chain.targets
    ]
