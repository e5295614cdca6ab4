"""The cluster manager's logic (3FS ``MgmtdOperator`` + ``MgmtdData``).

Only the leader serves. On gaining the lease it *bootstraps*: one transaction
loads every persisted record (nodes, targets, chains, tables) and writes
``routing_version + 1``, so versions stay monotonic across leaders. From then
on the leader keeps everything in memory and:

* persists every change of nodes' persistent fields, targets, chains and
  tables in a fenced transaction (:meth:`MgmtdOperator._write`) that also
  bumps the routing version;
* keeps heartbeat-derived facts (node status, local target states, used bytes)
  in memory only (as 3FS does) and publishes them with a version bump from the
  background tick (:meth:`MgmtdOperator.run_once`);
* runs the chain state machine (:mod:`fs3.mgmtd.chains`) on every tick and
  right after a heartbeat changed a local state.

Every routing version has exactly one content: the snapshot is built once per
version and kept (the last ``HISTORY`` versions), so a watch stream delivers
every version in order, not just the newest; watchers are woken on every bump.

After a leader change, local states are not known; each target starts with the
state its public state implies (see ``chains.implied_local_state``) and every
node is presumed alive for one heartbeat timeout. A node that does not report
within that time is then declared offline as usual. This replaces 3FS's
two-minute freeze of all chains ("new-born chains") with something that
reacts exactly as fast as normal failure detection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from prometheus_client import Counter, Gauge

from fs3.clock import Clock, SystemClock
from fs3.config import MgmtdConfig
from fs3.errors import Code, FsError, invalid
from fs3.kv import Database, Transaction
from fs3.logs import event
from fs3.mgmtd import chains as sm
from fs3.mgmtd import placement, store
from fs3.mgmtd.election import Elector, Fenced
from fs3.proto import mgmtd_pb2

log = logging.getLogger("fs3.mgmtd")

T = TypeVar("T")

# -- metrics (process-wide; one mgmtd per process) --------------------------------------

M_IS_LEADER = Gauge("fs3_mgmtd_is_leader", "1 if this mgmtd is the leader")
M_ROUTING_VERSION = Gauge("fs3_mgmtd_routing_version", "routing info version published")
M_NODES = Gauge("fs3_mgmtd_nodes", "registered nodes by status", ["status"])
M_HEARTBEATS = Counter("fs3_mgmtd_heartbeats_total", "heartbeats received", ["result"])
M_CHAIN_UPDATES = Counter("fs3_mgmtd_chain_updates_total", "chain versions bumped")
M_TARGET_ERRORS = Counter("fs3_mgmtd_target_errors_total", "errors reported by storage", ["kind"])

ONLINE = mgmtd_pb2.NODE_STATUS_ONLINE
NODE_OFFLINE = mgmtd_pb2.NODE_STATUS_OFFLINE
SERVER_TYPES = (mgmtd_pb2.NODE_TYPE_MGMTD, mgmtd_pb2.NODE_TYPE_META, mgmtd_pb2.NODE_TYPE_STORAGE)
_TYPE_NAME: dict[int, str] = {
    mgmtd_pb2.NODE_TYPE_MGMTD: "mgmtd",
    mgmtd_pb2.NODE_TYPE_META: "meta",
    mgmtd_pb2.NODE_TYPE_STORAGE: "storage",
}
_STATUS_NAME: dict[int, str] = {
    ONLINE: "online",
    NODE_OFFLINE: "offline",
    mgmtd_pb2.NODE_STATUS_DISABLED: "disabled",
}
_PUBLIC_NAME: dict[int, str] = {
    sm.SERVING: "serving",
    sm.LASTSRV: "lastsrv",
    sm.SYNCING: "syncing",
    sm.WAITING: "waiting",
    sm.OFFLINE: "offline",
}
_LOCAL_NAME: dict[int, str] = {
    sm.UPTODATE: "uptodate",
    sm.ONLINE: "online",
    sm.LOCAL_OFFLINE: "offline",
}

# Used/free bytes alone change with every write; publish them at most this often
# (in check intervals) instead of bumping the routing version on every heartbeat.
MINOR_BUMP_TICKS = 5

# Routing versions kept for watch streams that fall behind.
HISTORY = 64


@dataclass
class LeaderState:
    """What the leader holds in memory for one term."""

    term: float
    started: float  # wall clock
    version: int
    nodes: dict[int, mgmtd_pb2.NodeInfo] = field(default_factory=dict)
    hb_versions: dict[int, int] = field(default_factory=dict)
    targets: dict[int, mgmtd_pb2.TargetInfo] = field(default_factory=dict)
    chains: dict[int, mgmtd_pb2.ChainInfo] = field(default_factory=dict)
    tables: dict[tuple[int, int], mgmtd_pb2.ChainTable] = field(default_factory=dict)
    frozen_until: dict[int, float] = field(default_factory=dict)  # chain -> wall clock
    # When the leader last heard each node / each target's report, on its *monotonic*
    # clock and stamped when the heartbeat arrived (before it waited for the lock): the
    # silence the leader can have observed. NodeInfo.last_heartbeat stays wall time, for display.
    heard: dict[int, float] = field(default_factory=dict)
    reported: dict[int, float] = field(default_factory=dict)
    heard_any: float = 0.0  # monotonic: when the last heartbeat from any node arrived
    deaf: bool = False  # the last check heard nobody for too long (logged once)
    dirty_major: bool = False
    dirty_minor: bool = False
    last_bump: float = 0.0
    bootstrapping: bool = True
    cache: mgmtd_pb2.RoutingInfo | None = None
    history: collections.deque[mgmtd_pb2.RoutingInfo] = field(
        default_factory=lambda: collections.deque(maxlen=HISTORY)
    )


def _split_addr(addr: str) -> bool:
    host, sep, port = addr.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


class MgmtdOperator:
    """mgmtd's request handling and background work; see the module docstring.

    Args:
        db: the KV.
        cfg: the whole mgmtd config (node identity, cluster id, timings).
        elector: the lease holder object of this process.
        address: the advertised gRPC address of this mgmtd.
        clock: wall/monotonic clock (FakeClock in tests).
    """

    def __init__(
        self,
        db: Database,
        cfg: MgmtdConfig,
        elector: Elector,
        address: str,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.db = db
        self.cfg = cfg
        self.mcfg = cfg.mgmtd
        self.elector = elector
        self.node_id = cfg.node.id
        self.address = address
        self.clock: Clock = clock or SystemClock()
        self._state: LeaderState | None = None
        self._lock = asyncio.Lock()
        # Wakes watch streams: set (and replaced by a fresh event) on every new routing
        # version and on loss of leadership. An event, not an asyncio.Condition: a watcher
        # cancelled while its recheck timeout fired could leave a Condition's lock released
        # by the wrong task ("Lock is not acquired") or held for good, so watchers had
        # nothing to wait on; an event holds no lock to hand back on cancellation.
        self._changed = asyncio.Event()
        self.kick = asyncio.Event()  # wakes the background tick early
        self._last_check: tuple[float, float] | None = (
            None  # (term, time.monotonic()) of the previous check
        )
        # node id -> heartbeats received but not applied yet (waiting for the lock)
        self._arriving: collections.Counter[int] = collections.Counter()
        elector.on_gained = self.on_lease_gained
        elector.on_lost = self.on_lease_lost

    # ================================================================== leadership

    async def on_lease_gained(self, term: float) -> None:
        """Bootstrap: load everything, bump the version, register ourselves."""
        now = self.clock.time()
        mono = self.clock.monotonic()
        me = mgmtd_pb2.NodeInfo(
            node_id=self.node_id,
            type=mgmtd_pb2.NODE_TYPE_MGMTD,
            address=self.address,
            hostname=self.cfg.node.host,
            name=f"mgmtd-{self.node_id}",
        )

        def _boot(tr: Transaction) -> store.Snapshot:
            self.elector.fence(tr, term)
            snap = store.load_all(tr)
            if store.persistent_node(snap.nodes.get(self.node_id, mgmtd_pb2.NodeInfo())) != me:
                store.put_node(tr, me)
                snap.nodes[self.node_id] = mgmtd_pb2.NodeInfo()
                snap.nodes[self.node_id].CopyFrom(me)
            snap.version = store.bump_version(tr)
            return snap

        async with self._lock:
            try:
                snap = await self.db.run_async(
                    _boot, timeout_s=self.mcfg.lease_renew_interval_s * 2
                )
            except (FsError, Fenced) as e:
                event(log, "bootstrap failed", logging.WARNING, node=self.node_id, error=str(e))
                return  # stays without state: requests answer UNAVAILABLE until the next term
            st = LeaderState(
                term=term, started=now, version=snap.version, last_bump=now, heard_any=mono
            )
            for nid, n in snap.nodes.items():
                n.status = ONLINE  # presumed alive for one heartbeat timeout
                n.last_heartbeat = now
                st.heard[nid] = mono
                st.nodes[nid] = n
            for tid, t in snap.targets.items():
                t.last_report = now
                st.reported[tid] = mono
                t.local_state = sm.LOCAL_OFFLINE
                st.targets[tid] = t
            grace_end = now + self.mcfg.new_chain_grace_s
            for cid, c in snap.chains.items():
                st.chains[cid] = c
                for ct in c.targets:
                    ti = st.targets.get(ct.target_id)
                    if ti is None:  # chain refers to a target without a record: recreate it
                        ti = mgmtd_pb2.TargetInfo(target_id=ct.target_id, chain_id=cid)
                        st.targets[ct.target_id] = ti
                    ti.public_state = ct.public_state
                    ti.chain_id = cid
                    ti.local_state = cast(Any, sm.implied_local_state(ct.public_state))
                if self.mcfg.new_chain_grace_s > 0:
                    st.frozen_until[cid] = grace_end
            st.tables = dict(snap.tables)
            self._state = st
            self._publish(st)
        M_IS_LEADER.set(1)
        event(
            log,
            "leader bootstrapped",
            node=self.node_id,
            version=st.version,
            nodes=len(st.nodes),
            targets=len(st.targets),
            chains=len(st.chains),
            tables=len(st.tables),
        )

    async def on_lease_lost(self, reason: str) -> None:
        self._state = None
        M_IS_LEADER.set(0)
        self._wake_watchers()  # watch streams end with NOT_LEADER

    def _leader_state(self) -> LeaderState:
        """The state of the current term, or NOT_LEADER / UNAVAILABLE."""
        term = self.elector.term
        if term is None:
            raise self.elector.not_leader()
        st = self._state
        if st is None or st.term != term:
            raise FsError(Code.UNAVAILABLE, f"mgmtd {self.node_id} is becoming leader; retry")
        return st

    async def _write(self, st: LeaderState, fn: Callable[[Transaction], T]) -> tuple[T, int]:
        """Run ``fn`` in a fenced transaction that also bumps the routing version."""

        def _txn(tr: Transaction) -> tuple[T, int]:
            self.elector.fence(tr, st.term)
            result = fn(tr)
            return result, store.bump_version(tr)

        t0 = self.clock.monotonic()
        try:
            result, version = await self.db.run_async(_txn, timeout_s=10.0)
        except Fenced as e:
            raise self.elector.fenced_error(e) from None
        finally:
            took = self.clock.monotonic() - t0
            if took > self.mcfg.heartbeat_timeout_s / 2:
                # Heartbeats wait for the lock the caller holds meanwhile (they count as
                # heard from their arrival, see check_heartbeats).
                event(
                    log, "kv commit slow", logging.WARNING, node=self.node_id, took_s=f"{took:.1f}"
                )
        if self._state is not st:
            raise self.elector.not_leader("lost leadership during a write")
        return result, version

    def _publish(self, st: LeaderState, version: int | None = None) -> None:
        """Adopt ``version`` (after applying the memory changes) and wake watchers."""
        if version is not None:
            st.version = version
        st.cache = self._build_routing(st)
        st.history.append(st.cache)
        st.last_bump = self.clock.time()
        st.dirty_major = st.dirty_minor = False
        M_ROUTING_VERSION.set(st.version)
        self._update_node_metrics(st)
        self._wake_watchers()

    def _wake_watchers(self) -> None:
        """Wake every watch stream waiting now; later waits use a fresh event."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _update_node_metrics(self, st: LeaderState) -> None:
        counts = dict.fromkeys(_STATUS_NAME.values(), 0)
        for n in st.nodes.values():
            counts[_STATUS_NAME.get(n.status, "offline")] += 1
        for k, v in counts.items():
            M_NODES.labels(status=k).set(v)

    # ================================================================== routing

    def routing(self) -> mgmtd_pb2.RoutingInfo:
        """The routing of the current version (built once per version)."""
        st = self._leader_state()
        if st.cache is None:
            st.cache = self._build_routing(st)
        return st.cache

    def _build_routing(self, st: LeaderState) -> mgmtd_pb2.RoutingInfo:
        info = mgmtd_pb2.RoutingInfo(
            version=st.version,
            leader_node_id=self.node_id,
            leader_address=self.address,
            bootstrapping=st.bootstrapping,
        )
        info.nodes.extend(st.nodes[k] for k in sorted(st.nodes))
        info.targets.extend(st.targets[k] for k in sorted(st.targets))
        info.chains.extend(st.chains[k] for k in sorted(st.chains))
        info.chain_tables.extend(st.tables[k] for k in sorted(st.tables))
        return info

    def get_routing(self, known_version: int) -> mgmtd_pb2.GetRoutingInfoResponse:
        info = self.routing()
        if known_version and info.version <= known_version:
            return mgmtd_pb2.GetRoutingInfoResponse(has_routing=False)
        return mgmtd_pb2.GetRoutingInfoResponse(has_routing=True, routing=info)

    async def watch_routing(
        self, known_version: int, *, recheck_s: float = 1.0
    ) -> AsyncIterator[mgmtd_pb2.RoutingInfo]:
        """Current routing if newer than ``known_version``, then every new version.

        Ends with NOT_LEADER when this process stops leading (checked at least
        every ``recheck_s``, so a paused-and-resumed leader ends its streams).
        """
        known = known_version
        while True:
            changed = self._changed  # before the check: a change after it sets this event
            info = self.routing()  # raises NOT_LEADER / UNAVAILABLE
            if info.version > known:
                st = self._state
                newer = [h for h in (st.history if st is not None else ()) if h.version > known]
                if known == 0 or not newer or newer[0].version > known + 1:
                    newer = [info]  # new watcher, or fell behind the history: the newest
                for h in newer:
                    known = h.version
                    yield h
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(recheck_s):
                    await changed.wait()

    def get_leader(self) -> mgmtd_pb2.GetLeaderResponse:
        if self.elector.is_leader():
            lease = self.elector.lease
            return mgmtd_pb2.GetLeaderResponse(
                node_id=self.node_id,
                address=self.address,
                is_leader=True,
                lease_end=lease.lease_end if lease is not None else 0.0,
            )
        lease = self.elector.lease
        return mgmtd_pb2.GetLeaderResponse(
            node_id=self.elector.leader_node_id(),
            address=self.elector.leader_address(),
            is_leader=False,
            lease_end=lease.lease_end if lease is not None else 0.0,
        )

    # ================================================================== nodes

    def _check_cluster(self, cluster_id: str) -> None:
        if cluster_id != self.cfg.cluster.id:
            raise invalid(
                f"request for cluster {cluster_id!r} sent to cluster {self.cfg.cluster.id!r}"
            )

    def _validate_node(
        self,
        node_id: int,
        node_type: int,
        address: str,
        reports: Any,
    ) -> None:
        """Malformed requests fail here, before anything changes."""
        if node_id <= 0:
            raise invalid("node_id must be > 0")
        if node_type not in SERVER_TYPES:
            raise invalid(f"node type {node_type} cannot register (mgmtd, meta or storage only)")
        if node_id == self.node_id:
            raise invalid(f"node id {node_id} is this mgmtd's own id")
        if not _split_addr(address):
            raise invalid(f"node address {address!r} is not host:port")
        seen: set[int] = set()
        for r in reports:
            if r.target_id <= 0:
                raise invalid("target_id must be > 0")
            if r.target_id in seen:
                raise invalid(f"target {r.target_id} reported twice in one request")
            seen.add(r.target_id)
            if r.local_state not in sm.LOCAL_STATES:
                raise invalid(f"target {r.target_id}: bad local state {r.local_state}")
        if reports and node_type != mgmtd_pb2.NODE_TYPE_STORAGE:
            raise invalid("only storage nodes report targets")

    def _check_identity(self, st: LeaderState, node_id: int, node_type: int, address: str) -> None:
        node = st.nodes.get(node_id)
        if node is None:
            return
        if node.type != node_type:
            raise FsError(
                Code.DUPLICATE_NODE,
                f"node id {node_id} is registered as a {_TYPE_NAME.get(node.type, node.type)} node",
            )
        if node.address != address and self._alive(st, node):
            raise FsError(
                Code.DUPLICATE_NODE,
                f"node id {node_id} is in use by a live node at {node.address} (request from {address})",
            )

    def _alive(self, st: LeaderState, node: mgmtd_pb2.NodeInfo) -> bool:
        heard = st.heard.get(node.node_id, float("-inf"))
        return node.status == ONLINE and (
            self.clock.monotonic() - heard <= self.mcfg.heartbeat_timeout_s
        )

    def _check_targets(self, st: LeaderState, node_id: int, reports: Any) -> None:
        for r in reports:
            t = st.targets.get(r.target_id)
            if t is None or t.node_id in (0, node_id):
                continue
            owner = st.nodes.get(t.node_id)
            if owner is not None and self._alive(st, owner):
                raise FsError(
                    Code.DUPLICATE_NODE,
                    f"target {r.target_id} belongs to live node {t.node_id}, not {node_id}",
                )

    def _node_record(
        self,
        node_id: int,
        node_type: int,
        address: str,
        data_address: str,
        hostname: str,
        name: str,
    ) -> mgmtd_pb2.NodeInfo:
        return mgmtd_pb2.NodeInfo(
            node_id=node_id,
            type=cast(Any, node_type),
            address=address,
            data_address=data_address,
            hostname=hostname,
            name=name or f"{_TYPE_NAME.get(node_type, 'node')}-{node_id}",
        )

    async def _upsert_node(
        self,
        st: LeaderState,
        rec: mgmtd_pb2.NodeInfo,
        reports: Any,
        *,
        force_bump: bool,
        arrived: float | None = None,
    ) -> None:
        """Persist what changed (node record, new/moved targets), then apply in memory.

        ``arrived``: when the request reached this process (monotonic), for the
        heartbeat check; now if not given.
        """
        if arrived is None:
            arrived = self.clock.monotonic()
        old = st.nodes.get(rec.node_id)
        node_changed = old is None or store.persistent_node(old) != store.persistent_node(rec)
        new_targets: list[mgmtd_pb2.TargetInfo] = []
        for r in reports:
            t = st.targets.get(r.target_id)
            if t is None or t.node_id != rec.node_id:
                nt = mgmtd_pb2.TargetInfo()
                if t is not None:
                    nt.CopyFrom(t)
                nt.target_id = r.target_id
                nt.node_id = rec.node_id
                if r.capacity_bytes:
                    nt.capacity_bytes = r.capacity_bytes
                new_targets.append(nt)
        if node_changed or new_targets or force_bump:

            def _fn(tr: Transaction) -> None:
                if node_changed:
                    store.put_node(tr, rec)
                for nt in new_targets:
                    store.put_target(tr, nt)

            _, version = await self._write(st, _fn)
            self._apply_node(st, rec, node_changed, arrived)
            for nt in new_targets:
                cur = st.targets.get(nt.target_id)
                if cur is None:
                    nt.local_state = sm.LOCAL_OFFLINE
                    st.targets[nt.target_id] = nt
                else:
                    cur.node_id = rec.node_id
                event(log, "target registered", target=nt.target_id, node=rec.node_id)
            self._apply_reports(st, rec.node_id, reports, arrived)
            self._publish(st, version)
        else:
            self._apply_node(st, rec, False, arrived)
            self._apply_reports(st, rec.node_id, reports, arrived)

    def _apply_node(
        self, st: LeaderState, rec: mgmtd_pb2.NodeInfo, changed: bool, arrived: float
    ) -> None:
        now = self.clock.time()
        node = st.nodes.get(rec.node_id)
        if node is None:
            node = mgmtd_pb2.NodeInfo()
            node.CopyFrom(rec)
            st.nodes[rec.node_id] = node
            event(log, "node registered", node=rec.node_id, name=node.name, address=node.address)
        elif changed:
            status, last = node.status, node.last_heartbeat
            node.CopyFrom(rec)
            node.status, node.last_heartbeat = status, last
        if node.status != ONLINE:
            event(log, "node up", node=node.node_id, name=node.name, address=node.address)
            st.dirty_major = True
            self.kick.set()
        node.status = ONLINE
        node.last_heartbeat = now
        self._heard(st, rec.node_id, arrived)

    def _heard(self, st: LeaderState, node_id: int, arrived: float) -> None:
        """Note a heartbeat from ``node_id``; a long gap before it was the leader's deafness.

        With two or more live nodes heartbeating, the leader hears someone at least every
        heartbeat interval. A longer gap (:meth:`_deaf_after`) with nobody heard means the
        leader (or the whole host) did not receive: its length is added to every node's
        last contact, so that nobody's silence includes it (docstring of check_heartbeats).
        """
        gap = arrived - st.heard_any
        if gap > self._deaf_after() and self._live_count(st) >= 2:
            event(
                log, "leader heard nobody", logging.WARNING, node=self.node_id, for_s=f"{gap:.1f}"
            )
            for nid in st.heard:
                st.heard[nid] += gap
            for tid in st.reported:
                st.reported[tid] += gap
        st.heard_any = max(st.heard_any, arrived)
        st.heard[node_id] = max(st.heard.get(node_id, arrived), arrived)

    def _deaf_after(self) -> float:
        """Hearing nobody for longer than this is the leader's deafness, not the nodes' silence.

        Two heartbeat intervals (a live node's gaps stay below one), and at least half the
        timeout; always below the timeout's double, after which total quiet is an outage.
        """
        return max(2 * self.mcfg.heartbeat_interval_s, self.mcfg.heartbeat_timeout_s / 2)

    def _live_count(self, st: LeaderState) -> int:
        return sum(1 for n in st.nodes.values() if n.node_id != self.node_id and n.status == ONLINE)

    def _apply_reports(self, st: LeaderState, node_id: int, reports: Any, arrived: float) -> None:
        now = self.clock.time()
        for r in reports:
            t = st.targets[r.target_id]
            t.last_report = now
            st.reported[r.target_id] = max(st.reported.get(r.target_id, arrived), arrived)
            for fld in ("used_bytes", "free_bytes", "error_count"):
                v = getattr(r, fld)
                if getattr(t, fld) != v:
                    setattr(t, fld, v)
                    st.dirty_minor = True
            if r.capacity_bytes and t.capacity_bytes != r.capacity_bytes:
                t.capacity_bytes = r.capacity_bytes
                st.dirty_minor = True
            if r.fs_id and t.fs_id != r.fs_id:
                t.fs_id = r.fs_id
                st.dirty_minor = True
            if t.low_space != r.low_space:
                t.low_space = r.low_space
                st.dirty_major = True
            chain = st.chains.get(t.chain_id)
            if chain is not None and r.chain_version and r.chain_version < chain.version:
                # Based on an older chain than ours (3FS): its state may be stale.
                continue
            if t.local_state != r.local_state:
                event(
                    log,
                    "target local state",
                    target=t.target_id,
                    node=node_id,
                    old=_LOCAL_NAME.get(t.local_state, t.local_state),
                    new=_LOCAL_NAME.get(r.local_state, r.local_state),
                )
                t.local_state = r.local_state
                st.dirty_major = True
                self.kick.set()

    async def register_node(
        self, req: mgmtd_pb2.RegisterNodeRequest
    ) -> mgmtd_pb2.RegisterNodeResponse:
        """Register (or re-register) a node and its targets; answers the new routing."""
        self._check_cluster(req.cluster_id)
        self._validate_node(req.node_id, req.type, req.address, req.targets)
        if req.data_address and not _split_addr(req.data_address):
            raise invalid(f"data address {req.data_address!r} is not host:port")
        async with self._lock:
            st = self._leader_state()
            self._check_identity(st, req.node_id, req.type, req.address)
            self._check_targets(st, req.node_id, req.targets)
            rec = self._node_record(
                req.node_id, req.type, req.address, req.data_address, req.hostname, req.name
            )
            await self._upsert_node(
                st, rec, req.targets, force_bump=st.nodes.get(req.node_id) is None
            )
            st.hb_versions.pop(req.node_id, None)  # a re-registered process restarts numbering
            if st.dirty_major:
                await self._bump(st)
        return mgmtd_pb2.RegisterNodeResponse(routing=self.routing())

    async def heartbeat(self, req: mgmtd_pb2.HeartbeatRequest) -> mgmtd_pb2.HeartbeatResponse:
        """One heartbeat: node alive, target local states and usage (3FS HeartbeatOperation)."""
        try:
            self._check_cluster(req.cluster_id)
            self._validate_node(req.node_id, req.type, req.address, req.targets)
            if req.hb_version <= 0:
                raise invalid("hb_version must be > 0")
            # Stamped on arrival: time spent waiting below for the lock (behind a tick's KV
            # commit, say) is the leader's delay, not the node's silence; and while it waits,
            # check_heartbeats sees it in _arriving and does not declare the node down.
            arrived = self.clock.monotonic()
            self._arriving[req.node_id] += 1
            try:
                version = await self._heartbeat_locked(req, arrived)
            finally:
                self._arriving[req.node_id] -= 1
                if self._arriving[req.node_id] <= 0:
                    del self._arriving[req.node_id]
                waited = self.clock.monotonic() - arrived
                if waited > self.mcfg.heartbeat_timeout_s / 2:
                    event(
                        log,
                        "heartbeat delayed",
                        logging.WARNING,
                        node=req.node_id,
                        waited_s=f"{waited:.1f}",
                    )
        except FsError as e:
            M_HEARTBEATS.labels(result=e.code.name.lower()).inc()
            raise
        M_HEARTBEATS.labels(result="ok").inc()
        return mgmtd_pb2.HeartbeatResponse(routing_version=version, last_hb_version=req.hb_version)

    async def _heartbeat_locked(self, req: mgmtd_pb2.HeartbeatRequest, arrived: float) -> int:
        """Apply one heartbeat under the lock; returns the routing version to answer."""
        async with self._lock:
            st = self._leader_state()
            known = st.nodes.get(req.node_id)
            if known is None and not self.mcfg.allow_unregistered:
                raise FsError(
                    Code.UNKNOWN_NODE,
                    f"node {req.node_id} is not registered (allow_unregistered=false)",
                )
            self._check_identity(st, req.node_id, req.type, req.address)
            last = st.hb_versions.get(req.node_id)
            if last is not None and req.hb_version <= last:
                raise FsError(
                    Code.STALE_HEARTBEAT,
                    f"heartbeat version {req.hb_version} of node {req.node_id} is not newer "
                    f"than last={last}",
                )
            self._check_targets(st, req.node_id, req.targets)
            if known is not None:
                rec = self._node_record(
                    req.node_id,
                    req.type,
                    req.address,
                    req.data_address or known.data_address,
                    req.hostname or known.hostname,
                    req.name or known.name,
                )
            else:
                rec = self._node_record(
                    req.node_id, req.type, req.address, req.data_address, req.hostname, req.name
                )
            await self._upsert_node(st, rec, req.targets, force_bump=known is None, arrived=arrived)
            st.hb_versions[req.node_id] = req.hb_version
            return st.version

    # ================================================================== background

    async def run_once(self) -> None:
        """One tick of the leader's background work (3FS background runners).

        Order matters: heartbeat timeouts first (they change local states), then
        the chain state machine, then publish whatever is still unpublished.
        """
        if self.elector.term is None or self._state is None:
            return
        async with self._lock:
            try:
                st = self._leader_state()
            except FsError:
                return
            self.check_heartbeats(st)
            await self.update_chains(st)
            await self.bump_if_dirty(st)

    def check_heartbeats(self, st: LeaderState) -> None:
        """Nodes silent past the timeout go OFFLINE, and so do their targets.

        Only silence the leader could have observed counts
        (docs/chain-states.md#when-it-runs-and-who-triggers-it):

        * silence is measured on the leader's monotonic clock from when a heartbeat
          *arrived* (``LeaderState.heard``): a step of the wall clock is nobody's
          silence, and neither is a wait for the lock behind a slow KV commit;
        * a node with a heartbeat received but not applied yet (``_arriving``) is not silent;
        * if this process did not run for a while (CPU starvation, SIGSTOP), the checks
          came late: the lateness is added to everyone's last contact;
        * if the leader heard *nobody* for a while (:meth:`_deaf_after`) while two or more
          nodes are live, it cannot tell its own deafness (a stalled host, a stuck
          transport) from a cluster-wide death: nobody is declared down until it hears
          someone again (then the gap is discounted, see :meth:`_heard`) or the quiet lasts
          two timeouts (a real total outage, declared one timeout later than a single failure).
        """
        mono = self.clock.monotonic()
        timeout = self.mcfg.heartbeat_timeout_s
        # Real time, so fake clocks in tests are unaffected; only delays detection by the
        # stall, never declares anything earlier.
        real = time.monotonic()
        prev, self._last_check = self._last_check, (st.term, real)
        stall = 0.0
        if prev is not None and prev[0] == st.term and isinstance(self.clock, SystemClock):
            stall = real - prev[1] - 2 * self.mcfg.check_interval_s
        if stall > 0:
            event(log, "leader stalled", logging.WARNING, node=self.node_id, stall_s=f"{stall:.1f}")
            st.heard_any += stall  # the same gap is not discounted twice by _heard
            for nid in st.heard:
                st.heard[nid] += stall
            for tid in st.reported:
                st.reported[tid] += stall
        if st.bootstrapping and self.clock.time() - st.started > timeout:
            st.bootstrapping = False
            st.dirty_major = True
        for node in st.nodes.values():
            if node.node_id == self.node_id:
                node.status, node.last_heartbeat = ONLINE, self.clock.time()
                st.heard[node.node_id] = mono
        quiet = mono - st.heard_any
        if self._live_count(st) >= 2 and self._deaf_after() < quiet <= 2 * timeout:
            if not st.deaf:
                st.deaf = True
                event(
                    log,
                    "leader hears nobody",
                    logging.WARNING,
                    node=self.node_id,
                    quiet_s=f"{quiet:.1f}",
                    action="nobody declared down until a heartbeat arrives or the quiet lasts 2 timeouts",
                )
            return
        st.deaf = False

        def silent(node_id: int, last: dict[int, float]) -> float:
            return 0.0 if node_id in self._arriving else mono - last.get(node_id, float("-inf"))

        for node in st.nodes.values():
            if node.status == ONLINE and silent(node.node_id, st.heard) > timeout:
                node.status = NODE_OFFLINE
                st.dirty_major = True
                event(
                    log,
                    "node down",
                    logging.WARNING,
                    node=node.node_id,
                    name=node.name,
                    silent_s=f"{silent(node.node_id, st.heard):.1f}",
                )
        for t in st.targets.values():
            if t.local_state == sm.LOCAL_OFFLINE:
                continue
            owner = st.nodes.get(t.node_id)
            node_down = owner is None or owner.status != ONLINE
            unreported = t.node_id not in self._arriving and (
                mono - st.reported.get(t.target_id, float("-inf")) > timeout
            )
            if node_down or unreported:
                event(
                    log,
                    "target local state",
                    target=t.target_id,
                    node=t.node_id,
                    old=_LOCAL_NAME.get(t.local_state, t.local_state),
                    new="offline",
                    reason="node down" if node_down else "not reported",
                )
                t.local_state = sm.LOCAL_OFFLINE
                st.dirty_major = True

    def _effective_local(self, st: LeaderState, target_id: int) -> int:
        t = st.targets.get(target_id)
        if t is None or t.admin_offline:
            return sm.LOCAL_OFFLINE
        return sm.normalize_local(t.local_state)

    def _next_chains(
        self, st: LeaderState, only: set[int] | None = None
    ) -> list[mgmtd_pb2.ChainInfo]:
        now = self.clock.time()
        changed: list[mgmtd_pb2.ChainInfo] = []
        for cid in sorted(st.chains):
            if only is not None and cid not in only:
                continue
            if st.frozen_until.get(cid, 0.0) > now:
                continue
            chain = st.chains[cid]
            before = [
                sm.ChainTarget(
                    ct.target_id, ct.public_state, self._effective_local(st, ct.target_id)
                )
                for ct in chain.targets
            ]
            after = sm.next_chain(before)
            if not sm.chain_changed(before, after):
                continue
            new = mgmtd_pb2.ChainInfo(
                chain_id=cid,
                version=chain.version + 1,
                preferred_order=list(chain.preferred_order),
            )
            new.targets.extend(
                mgmtd_pb2.ChainTargetInfo(target_id=t.target_id, public_state=cast(Any, t.public))
                for t in after
            )
            changed.append(new)
        return changed

    async def update_chains(self, st: LeaderState, only: set[int] | None = None) -> list[int]:
        """Run the state machine on every chain; persist and publish changed ones."""
        changed = self._next_chains(st, only)
        if not changed:
            return []

        def _fn(tr: Transaction) -> None:
            for c in changed:
                store.put_chain(tr, c)

        _, version = await self._write(st, _fn)
        for c in changed:
            old = st.chains[c.chain_id]
            old_states = {ct.target_id: ct.public_state for ct in old.targets}
            st.chains[c.chain_id] = c
            for ct in c.targets:
                t = st.targets.get(ct.target_id)
                if t is not None:
                    t.public_state = ct.public_state
                if old_states.get(ct.target_id) != ct.public_state:
                    event(
                        log,
                        "target state",
                        chain=c.chain_id,
                        chain_version=c.version,
                        target=ct.target_id,
                        old=_PUBLIC_NAME.get(old_states.get(ct.target_id, 0), "none"),
                        new=_PUBLIC_NAME.get(ct.public_state, ct.public_state),
                    )
            event(
                log,
                "chain updated",
                chain=c.chain_id,
                version=c.version,
                order=",".join(
                    f"{ct.target_id}:{_PUBLIC_NAME.get(ct.public_state, '?')}" for ct in c.targets
                ),
            )
        M_CHAIN_UPDATES.inc(len(changed))
        self._publish(st, version)
        return [c.chain_id for c in changed]

    async def bump_if_dirty(self, st: LeaderState) -> bool:
        """Publish memory-only changes (statuses, local states, usage) as a new version."""
        now = self.clock.time()
        minor_due = (
            st.dirty_minor and now - st.last_bump >= MINOR_BUMP_TICKS * self.mcfg.check_interval_s
        )
        if not (st.dirty_major or minor_due):
            return False
        await self._bump(st)
        return True

    async def _bump(self, st: LeaderState) -> None:
        _, version = await self._write(st, lambda tr: None)
        self._publish(st, version)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every ``check_interval_s`` or when kicked, until ``stop``."""
        while not stop.is_set():
            try:
                self.kick.clear()
                await self.run_once()
            except FsError as e:
                log.warning("background tick failed: %s", e)
            except Exception:
                log.exception("background tick crashed")
            waiter = asyncio.ensure_future(self.kick.wait())
            stopper = asyncio.ensure_future(stop.wait())
            t0 = time.monotonic()
            try:
                done, _ = await asyncio.wait(
                    {waiter, stopper},
                    timeout=self.mcfg.check_interval_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                waiter.cancel()
                stopper.cancel()
            # The event loop's own lag (a timer firing late: the loop thread was blocked or
            # the process was not scheduled), as opposed to a tick waiting for a KV commit.
            lag = time.monotonic() - t0 - self.mcfg.check_interval_s
            if not done and lag > self.mcfg.heartbeat_timeout_s / 4:
                event(log, "event loop lag", logging.WARNING, node=self.node_id, lag_s=f"{lag:.1f}")

    # ================================================================== admin

    async def create_chain_table(
        self, req: mgmtd_pb2.CreateChainTableRequest
    ) -> mgmtd_pb2.CreateChainTableResponse:
        """Build chains from free targets and publish them as (a new version of) a table.

        New chains start with every target SERVING at version 1 (3FS
        upload-chains). If the table exists, its next version appends the new
        chains; if it exists and no free targets are left, the current version
        is returned unchanged (so retries are harmless).
        """
        if req.table_id <= 0:
            raise invalid("table_id must be > 0")
        if req.replicas < 1 or req.replicas > 16:
            raise invalid("replicas must be 1..16")
        async with self._lock:
            st = self._leader_state()
            storage = {
                n.node_id for n in st.nodes.values() if n.type == mgmtd_pb2.NODE_TYPE_STORAGE
            }
            if req.node_ids:
                for nid in req.node_ids:
                    if nid not in storage:
                        raise FsError(
                            Code.UNKNOWN_NODE, f"node {nid} is not a registered storage node"
                        )
                chosen = set(req.node_ids)
            else:
                chosen = {nid for nid in storage if st.nodes[nid].status == ONLINE}
            free: dict[int, list[int]] = {nid: [] for nid in sorted(chosen)}
            for t in sorted(st.targets.values(), key=lambda t: t.target_id):
                if (
                    t.node_id in free
                    and t.chain_id == 0
                    and not t.admin_offline
                    and t.local_state in (sm.UPTODATE, sm.ONLINE)
                ):
                    free[t.node_id].append(t.target_id)
            latest = self._latest_table(st, req.table_id)
            n_free_nodes = sum(1 for ts in free.values() if ts)
            if latest is not None and n_free_nodes < req.replicas:
                existing = [st.chains[c] for c in latest.chain_ids if c in st.chains]
                bal = placement.balance_of(
                    [
                        [
                            st.targets[ct.target_id].node_id
                            for ct in c.targets
                            if ct.target_id in st.targets
                        ]
                        for c in existing
                    ]
                )
                return mgmtd_pb2.CreateChainTableResponse(
                    table=latest, chains=existing, balance=_balance_pb(bal)
                )
            existing_nodes: list[list[int]] = []
            if latest is not None:
                for cid in latest.chain_ids:
                    c = st.chains.get(cid)
                    if c is not None:
                        existing_nodes.append(
                            [
                                st.targets[ct.target_id].node_id
                                for ct in c.targets
                                if ct.target_id in st.targets
                            ]
                        )
            plan = placement.generate(free, req.replicas, existing_chain_nodes=existing_nodes)
            if not plan.chains:
                raise FsError(
                    Code.CANNOT_SATISFY,
                    f"no chain of {req.replicas} targets on distinct nodes can be formed from "
                    f"the free targets {dict(free)}",
                )
            next_id = max(st.chains, default=0) + 1
            new_chains: list[mgmtd_pb2.ChainInfo] = []
            for i, tids in enumerate(plan.chains):
                c = mgmtd_pb2.ChainInfo(chain_id=next_id + i, version=1, preferred_order=tids)
                c.targets.extend(
                    mgmtd_pb2.ChainTargetInfo(target_id=tid, public_state=sm.SERVING)
                    for tid in tids
                )
                new_chains.append(c)
            table = mgmtd_pb2.ChainTable(
                table_id=req.table_id,
                version=(latest.version + 1) if latest is not None else 1,
                chain_ids=(list(latest.chain_ids) if latest is not None else [])
                + [c.chain_id for c in new_chains],
                desc=req.desc or (latest.desc if latest is not None else ""),
            )
            new_targets: list[mgmtd_pb2.TargetInfo] = []
            for c in new_chains:
                for ct in c.targets:
                    nt = mgmtd_pb2.TargetInfo()
                    nt.CopyFrom(st.targets[ct.target_id])
                    nt.chain_id = c.chain_id
                    nt.public_state = sm.SERVING
                    new_targets.append(nt)

            def _fn(tr: Transaction) -> None:
                for c in new_chains:
                    store.put_chain(tr, c)
                for nt in new_targets:
                    store.put_target(tr, nt)
                store.put_table(tr, table)

            _, version = await self._write(st, _fn)
            for c in new_chains:
                st.chains[c.chain_id] = c
                if self.mcfg.new_chain_grace_s > 0:  # 3FS new-born chains: let nodes report first
                    st.frozen_until[c.chain_id] = self.clock.time() + self.mcfg.new_chain_grace_s
            for nt in new_targets:
                st.targets[nt.target_id] = nt
            st.tables[(table.table_id, table.version)] = table
            self._publish(st, version)
            event(
                log,
                "chain table created",
                table=table.table_id,
                version=table.version,
                chains=len(new_chains),
                replicas=req.replicas,
                balance=plan.balance.summary().replace(" ", "_"),
            )
            return mgmtd_pb2.CreateChainTableResponse(
                table=table, chains=new_chains, balance=_balance_pb(plan.balance)
            )

    def _latest_table(self, st: LeaderState, table_id: int) -> mgmtd_pb2.ChainTable | None:
        best: mgmtd_pb2.ChainTable | None = None
        for (tid, _v), t in st.tables.items():
            if tid == table_id and (best is None or t.version > best.version):
                best = t
        return best

    async def set_target_state(
        self, req: mgmtd_pb2.SetTargetStateRequest
    ) -> mgmtd_pb2.SetTargetStateResponse:
        """Administratively take a target offline (or clear that mark)."""
        if req.target_id <= 0:
            raise invalid("target_id must be > 0")
        async with self._lock:
            st = self._leader_state()
            t = st.targets.get(req.target_id)
            if t is None:
                raise FsError(Code.UNKNOWN_TARGET, f"target {req.target_id} is not registered")
            if t.admin_offline != req.offline:
                nt = mgmtd_pb2.TargetInfo()
                nt.CopyFrom(t)
                nt.admin_offline = req.offline
                _, version = await self._write(st, lambda tr: store.put_target(tr, nt))
                t.admin_offline = req.offline
                self._publish(st, version)
                event(log, "target admin mark", target=t.target_id, offline=req.offline)
                if t.chain_id:
                    await self.update_chains(st, only={t.chain_id})
            chain = st.chains.get(t.chain_id)
            return mgmtd_pb2.SetTargetStateResponse(chain=chain)

    async def report_target_error(self, req: mgmtd_pb2.ReportTargetErrorRequest) -> None:
        """Count an error a storage node saw on a target (published with the routing)."""
        if req.target_id <= 0:
            raise invalid("target_id must be > 0")
        if not req.kind:
            raise invalid("kind is required")
        async with self._lock:
            st = self._leader_state()
            t = st.targets.get(req.target_id)
            if t is None:
                raise FsError(Code.UNKNOWN_TARGET, f"target {req.target_id} is not registered")
            t.error_count += 1
            st.dirty_minor = True
        M_TARGET_ERRORS.labels(kind=req.kind).inc()
        event(
            log,
            "target error reported",
            logging.WARNING,
            target=req.target_id,
            node=req.node_id,
            kind=req.kind,
            detail=req.detail[:200],
        )


def _balance_pb(b: placement.Balance) -> mgmtd_pb2.ChainBalance:
    return mgmtd_pb2.ChainBalance(
        max_pair=b.max_pair,
        min_pair=b.min_pair,
        max_chains_per_target=b.max_chains_per_target,
        min_chains_per_target=b.min_chains_per_target,
        unused_targets=max(0, b.unused_targets),
        max_chains_per_node=b.max_chains_per_node,
        min_chains_per_node=b.min_chains_per_node,
        mean_pair=b.mean_pair,
    )
