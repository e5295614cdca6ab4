"""Routing info as seen by everybody but mgmtd: a fast, immutable view plus a watcher.

Shared by services (storage, meta) and clients alike, so it lives in neither.

mgmtd publishes one versioned ``RoutingInfo`` (nodes, targets, chains, chain
tables). Storage nodes, meta servers and clients keep the newest one they have
seen in a :class:`RoutingWatcher` and look things up through :class:`Routing`,
which indexes the proto once so the data path never scans lists.

Two rules every user relies on (docs/chain-states.md):

* a watcher **never goes back** to a lower routing version, whatever order
  answers arrive in (the watch stream and the poll may race);
* chain order is the proto's list order (index 0 is the head). ``SERVING``
  targets come first, then ``SYNCING`` (mgmtd re-sorts chains by public state),
  so the write path is "serving targets then the syncing one" and reads may go
  to any serving target.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fs3.errors import Code, FsError
from fs3.proto import mgmtd_pb2

if TYPE_CHECKING:
    from fs3.client.mgmtd_client import MgmtdClient

log = logging.getLogger("fs3.routing")

SERVING = mgmtd_pb2.PUBLIC_STATE_SERVING
LASTSRV = mgmtd_pb2.PUBLIC_STATE_LASTSRV
SYNCING = mgmtd_pb2.PUBLIC_STATE_SYNCING
WAITING = mgmtd_pb2.PUBLIC_STATE_WAITING
OFFLINE = mgmtd_pb2.PUBLIC_STATE_OFFLINE

PUBLIC_STATE_NAMES = {
    SERVING: "serving",
    LASTSRV: "lastsrv",
    SYNCING: "syncing",
    WAITING: "waiting",
    OFFLINE: "offline",
    mgmtd_pb2.PUBLIC_STATE_UNSPECIFIED: "unknown",
}
LOCAL_STATE_NAMES = {
    mgmtd_pb2.LOCAL_STATE_UPTODATE: "uptodate",
    mgmtd_pb2.LOCAL_STATE_ONLINE: "online",
    mgmtd_pb2.LOCAL_STATE_OFFLINE: "offline",
    mgmtd_pb2.LOCAL_STATE_UNSPECIFIED: "unknown",
}
NODE_STATUS_NAMES = {
    mgmtd_pb2.NODE_STATUS_ONLINE: "online",
    mgmtd_pb2.NODE_STATUS_OFFLINE: "offline",
    mgmtd_pb2.NODE_STATUS_DISABLED: "disabled",
    mgmtd_pb2.NODE_STATUS_UNSPECIFIED: "unknown",
}
NODE_TYPE_NAMES = {
    mgmtd_pb2.NODE_TYPE_MGMTD: "mgmtd",
    mgmtd_pb2.NODE_TYPE_META: "meta",
    mgmtd_pb2.NODE_TYPE_STORAGE: "storage",
    mgmtd_pb2.NODE_TYPE_CLIENT: "client",
    mgmtd_pb2.NODE_TYPE_FUSE: "fuse",
    mgmtd_pb2.NODE_TYPE_UNSPECIFIED: "unknown",
}


@dataclass(frozen=True)
class Space:
    """Capacity of the storage cluster, raw and as a user can fill it.

    ``raw_*`` count every underlying file system once, however many targets it
    holds (targets report the file system they live on as ``fs_id``). What a
    user can store is the raw figure divided by ``replicas``, the replication
    factor of the chain table new files go to: every byte is written that many
    times. ``raw_used_bytes`` is what the targets' chunks take (all replicas);
    the disks' other files are in neither ``used`` figure but do shrink ``free``.
    """

    raw_capacity_bytes: int
    raw_free_bytes: int
    raw_used_bytes: int
    filesystems: int
    targets: int
    replicas: int

    @property
    def capacity_bytes(self) -> int:
        return self.raw_capacity_bytes // self.replicas

    @property
    def free_bytes(self) -> int:
        return self.raw_free_bytes // self.replicas

    @property
    def used_bytes(self) -> int:
        return self.raw_used_bytes // self.replicas


class Routing:
    """An immutable, indexed view of one ``RoutingInfo``.

    Lookups of missing ids raise ``FsError`` with ``UNKNOWN_CHAIN``,
    ``UNKNOWN_TARGET``, ``UNKNOWN_NODE`` or ``UNKNOWN_CHAIN_TABLE`` (callers
    usually refresh routing and retry once). The wrapped proto must not be
    mutated afterwards.
    """

    __slots__ = ("info", "_nodes", "_targets", "_chains", "_tables", "_latest_table", "_serving")

    def __init__(self, info: mgmtd_pb2.RoutingInfo) -> None:
        self.info = info
        self._nodes = {n.node_id: n for n in info.nodes}
        self._targets = {t.target_id: t for t in info.targets}
        self._chains = {c.chain_id: c for c in info.chains}
        self._tables: dict[tuple[int, int], mgmtd_pb2.ChainTable] = {}
        self._latest_table: dict[int, mgmtd_pb2.ChainTable] = {}
        self._serving: dict[int, list[int]] = {}  # chain -> serving_targets, computed once
        for t in info.chain_tables:
            self._tables[(t.table_id, t.version)] = t
            cur = self._latest_table.get(t.table_id)
            if cur is None or t.version > cur.version:
                self._latest_table[t.table_id] = t

    @classmethod
    def empty(cls) -> Routing:
        """Version 0: nothing known yet."""
        return cls(mgmtd_pb2.RoutingInfo())

    # -- scalars -----------------------------------------------------------------

    @property
    def version(self) -> int:
        return int(self.info.version)

    @property
    def leader_address(self) -> str:
        return self.info.leader_address

    @property
    def bootstrapping(self) -> bool:
        return bool(self.info.bootstrapping)

    # -- lookups -----------------------------------------------------------------

    def chain(self, chain_id: int) -> mgmtd_pb2.ChainInfo:
        c = self._chains.get(chain_id)
        if c is None:
            raise FsError(Code.UNKNOWN_CHAIN, f"chain {chain_id} not in routing v{self.version}")
        return c

    def has_chain(self, chain_id: int) -> bool:
        return chain_id in self._chains

    def chain_version(self, chain_id: int) -> int:
        return int(self.chain(chain_id).version)

    def target(self, target_id: int) -> mgmtd_pb2.TargetInfo:
        t = self._targets.get(target_id)
        if t is None:
            raise FsError(Code.UNKNOWN_TARGET, f"target {target_id} not in routing v{self.version}")
        return t

    def has_target(self, target_id: int) -> bool:
        return target_id in self._targets

    def target_alive(self, target_id: int) -> bool:
        """Registered and last reported up-to-date or online by its node.

        mgmtd builds new chains only from such targets; a storage node reports
        its targets offline for a moment after it starts, so "registered" alone
        is not enough to create a chain table.
        """
        t = self._targets.get(target_id)
        return t is not None and t.local_state in (
            mgmtd_pb2.LOCAL_STATE_UPTODATE,
            mgmtd_pb2.LOCAL_STATE_ONLINE,
        )

    def node(self, node_id: int) -> mgmtd_pb2.NodeInfo:
        n = self._nodes.get(node_id)
        if n is None:
            raise FsError(Code.UNKNOWN_NODE, f"node {node_id} not in routing v{self.version}")
        return n

    def node_of_target(self, target_id: int) -> mgmtd_pb2.NodeInfo:
        return self.node(self.target(target_id).node_id)

    def target_state(self, chain_id: int, target_id: int) -> int:
        """The public state of ``target_id`` in ``chain_id`` (UNKNOWN_TARGET if absent)."""
        for t in self.chain(chain_id).targets:
            if t.target_id == target_id:
                return int(t.public_state)
        raise FsError(Code.UNKNOWN_TARGET, f"target {target_id} not in chain {chain_id}")

    def chain_targets(self, chain_id: int) -> list[int]:
        """Every target of the chain in chain order, whatever its state."""
        return [t.target_id for t in self.chain(chain_id).targets]

    def serving_targets(self, chain_id: int) -> list[int]:
        """SERVING targets in chain order: where reads may go.

        Computed once per chain (every read asks; the snapshot never changes):
        the list is shared, callers must not modify it.
        """
        got = self._serving.get(chain_id)
        if got is None:
            got = self._serving[chain_id] = [
                t.target_id for t in self.chain(chain_id).targets if t.public_state == SERVING
            ]
        return got

    def write_targets(self, chain_id: int) -> list[int]:
        """SERVING then SYNCING targets in chain order: the path a write travels."""
        return [
            t.target_id
            for t in self.chain(chain_id).targets
            if t.public_state in (SERVING, SYNCING)
        ]

    def head(self, chain_id: int) -> int | None:
        """The first SERVING target (where writes enter), None if the chain has none."""
        s = self.serving_targets(chain_id)
        return s[0] if s else None

    def tail(self, chain_id: int) -> int | None:
        """The last SERVING target, None if the chain has none.

        A SYNCING target after it still receives forwarded writes (see
        :meth:`successor`), but it is not readable, so it is not the tail.
        """
        s = self.serving_targets(chain_id)
        return s[-1] if s else None

    def successor(self, chain_id: int, target_id: int) -> int | None:
        """The next target on the write path after ``target_id`` (SERVING or SYNCING).

        None when ``target_id`` is the last one. Raises UNKNOWN_TARGET if
        ``target_id`` is not on the write path of the chain.
        """
        path = self.write_targets(chain_id)
        try:
            i = path.index(target_id)
        except ValueError:
            raise FsError(
                Code.UNKNOWN_TARGET,
                f"target {target_id} is not serving/syncing in chain {chain_id} (routing v{self.version})",
            ) from None
        return path[i + 1] if i + 1 < len(path) else None

    def predecessor(self, chain_id: int, target_id: int) -> int | None:
        """The previous target on the write path (None for the head)."""
        path = self.write_targets(chain_id)
        try:
            i = path.index(target_id)
        except ValueError:
            raise FsError(
                Code.UNKNOWN_TARGET,
                f"target {target_id} is not serving/syncing in chain {chain_id} (routing v{self.version})",
            ) from None
        return path[i - 1] if i > 0 else None

    def table(self, table_id: int, version: int | None = None) -> mgmtd_pb2.ChainTable:
        """A chain table; ``version=None`` (or 0) means the newest version."""
        t = (
            self._latest_table.get(table_id)
            if not version
            else self._tables.get((table_id, version))
        )
        if t is None:
            what = f"chain table {table_id}" + (f" version {version}" if version else "")
            raise FsError(Code.UNKNOWN_CHAIN_TABLE, f"{what} not in routing v{self.version}")
        return t

    def tables(self) -> list[mgmtd_pb2.ChainTable]:
        """The newest version of every chain table, by id."""
        return [self._latest_table[k] for k in sorted(self._latest_table)]

    def chains(self) -> list[mgmtd_pb2.ChainInfo]:
        return [self._chains[k] for k in sorted(self._chains)]

    def targets(self) -> list[mgmtd_pb2.TargetInfo]:
        return [self._targets[k] for k in sorted(self._targets)]

    def nodes(
        self, node_type: int | None = None, *, online_only: bool = False
    ) -> list[mgmtd_pb2.NodeInfo]:
        """Nodes by id, optionally of one type and/or only ONLINE ones."""
        out = []
        for k in sorted(self._nodes):
            n = self._nodes[k]
            if node_type is not None and n.type != node_type:
                continue
            if online_only and n.status != mgmtd_pb2.NODE_STATUS_ONLINE:
                continue
            out.append(n)
        return out

    def storage_nodes(self, *, online_only: bool = False) -> list[mgmtd_pb2.NodeInfo]:
        return self.nodes(mgmtd_pb2.NODE_TYPE_STORAGE, online_only=online_only)

    def meta_nodes(self, *, online_only: bool = False) -> list[mgmtd_pb2.NodeInfo]:
        return self.nodes(mgmtd_pb2.NODE_TYPE_META, online_only=online_only)

    def mgmtd_nodes(self, *, online_only: bool = False) -> list[mgmtd_pb2.NodeInfo]:
        return self.nodes(mgmtd_pb2.NODE_TYPE_MGMTD, online_only=online_only)

    def targets_of_node(self, node_id: int) -> list[mgmtd_pb2.TargetInfo]:
        return [t for t in self.targets() if t.node_id == node_id]

    def space(self, table_id: int = 1) -> Space | None:
        """Capacity of the targets in chain table ``table_id``'s chains (None if none report one).

        Each file system (``fs_id``; a target without one stands alone) counts
        once, with the smallest free figure its targets reported. The
        replication factor is the longest chain of the table (1 when the table
        is unknown, over every target).
        """
        try:
            table = self.table(table_id)
            chains = [self._chains[c] for c in table.chain_ids if c in self._chains]
            tids = {ct.target_id for c in chains for ct in c.targets}
            replicas = max((max(len(c.targets), len(c.preferred_order)) for c in chains), default=1)
        except FsError:
            tids, replicas = set(self._targets), 1
        fss: dict[str, tuple[int, int]] = {}
        used = count = 0
        for tid in sorted(tids):
            t = self._targets.get(tid)
            if t is None or not t.capacity_bytes:
                continue
            count += 1
            used += t.used_bytes
            key = t.fs_id or f"target:{tid}"
            cap, free = fss.get(key, (0, t.free_bytes))
            fss[key] = (max(cap, t.capacity_bytes), min(free, t.free_bytes))
        if not fss:
            return None
        return Space(
            raw_capacity_bytes=sum(c for c, _ in fss.values()),
            raw_free_bytes=sum(f for _, f in fss.values()),
            raw_used_bytes=used,
            filesystems=len(fss),
            targets=count,
            replicas=max(replicas, 1),
        )

    def __repr__(self) -> str:
        return (
            f"Routing(v{self.version}, nodes={len(self._nodes)}, targets={len(self._targets)}, "
            f"chains={len(self._chains)}, tables={len(self._latest_table)})"
        )


Callback = Callable[[Routing], Any]


class RoutingWatcher:
    """Keeps the newest routing info of a cluster, in the background.

    Two sources feed it: mgmtd's ``WatchRoutingInfo`` stream (prompt) and a
    poll every ``poll_interval_s`` (a safety net if the stream silently
    stalls). :meth:`refresh` fetches at once, e.g. after a storage request
    failed with ``CHAIN_VERSION_MISMATCH``. Whatever the order of answers, the
    published version never decreases. Subscribers are called (sync or async)
    with each newer :class:`Routing`.

    Args:
        client: the :class:`~fs3.client.mgmtd_client.MgmtdClient` to use.
        poll_interval_s: period of the fallback poll.
        use_stream: also follow the watch stream (default True).
    """

    def __init__(
        self,
        client: MgmtdClient,
        *,
        poll_interval_s: float = 2.0,
        use_stream: bool = True,
    ) -> None:
        self._client = client
        self._poll_interval_s = poll_interval_s
        self._use_stream = use_stream
        self._current = Routing.empty()
        self._subscribers: list[Callback] = []
        self._tasks: list[asyncio.Task[None]] = []
        # asyncio primitives bind to a loop lazily (3.10+), so this is safe outside one.
        self._changed = asyncio.Condition()
        self.updates = 0  # number of versions adopted (for tests and metrics)

    @property
    def current(self) -> Routing:
        """The newest routing seen (version 0 before the first answer)."""
        return self._current

    def subscribe(self, callback: Callback) -> Callable[[], None]:
        """Call ``callback(routing)`` on every newer version; returns an unsubscribe function."""
        self._subscribers.append(callback)

        def _unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.remove(callback)

        return _unsubscribe

    async def start(self) -> None:
        """Start the background stream and poll tasks (idempotent)."""
        if self._tasks:
            return
        self._tasks.append(asyncio.create_task(self._poll_loop(), name="routing-poll"))
        if self._use_stream:
            self._tasks.append(asyncio.create_task(self._stream_loop(), name="routing-watch"))

    async def stop(self) -> None:
        """Stop the background tasks (the client stays open; the caller owns it)."""
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def __aenter__(self) -> RoutingWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def refresh(self, min_version: int | None = None, *, timeout_s: float = 10.0) -> Routing:
        """Fetch routing from mgmtd now and adopt it if newer.

        With ``min_version``, keep asking (briefly backing off) until a routing of
        at least that version is known or ``timeout_s`` passes; then raise
        ``FsError(TIMEOUT)``. Use it after a storage node said the chain version
        moved on: the node saw a newer routing than this watcher.
        """
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            info = await self._client.get_routing(known_version=0)
            if info is not None:
                await self._adopt(info)
            if min_version is None or self._current.version >= min_version:
                return self._current
            if time.monotonic() + delay > deadline:
                raise FsError(
                    Code.TIMEOUT,
                    f"routing version {min_version} not available within {timeout_s}s "
                    f"(have {self._current.version})",
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def wait_for(
        self, predicate: Callable[[Routing], bool], *, timeout_s: float = 10.0
    ) -> Routing:
        """Wait until ``predicate(current)`` holds (raise FsError(TIMEOUT) otherwise)."""
        cond = self._changed
        try:
            async with asyncio.timeout(timeout_s):
                async with cond:
                    while not predicate(self._current):
                        await cond.wait()
                    return self._current
        except TimeoutError:
            raise FsError(
                Code.TIMEOUT,
                f"routing condition not met within {timeout_s}s (v{self._current.version})",
            ) from None

    async def adopt(self, info: mgmtd_pb2.RoutingInfo) -> bool:
        """Offer a routing learned elsewhere (e.g. a RegisterNode answer); True if adopted."""
        return await self._adopt(info)

    # -- internals -----------------------------------------------------------------

    async def _adopt(self, info: mgmtd_pb2.RoutingInfo) -> bool:
        if info.version <= self._current.version:
            return False
        routing = Routing(info)
        self._current = routing
        self.updates += 1
        async with self._changed:
            self._changed.notify_all()
        for cb in list(self._subscribers):
            try:
                r = cb(routing)
                if inspect.isawaitable(r):
                    await _as_awaitable(r)
            except Exception:
                log.exception("routing subscriber %r failed", cb)
        return True

    async def _poll_loop(self) -> None:
        while True:
            try:
                info = await self._client.get_routing(known_version=self._current.version)
                if info is not None:
                    await self._adopt(info)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("routing poll failed: %s", e)
            await asyncio.sleep(self._poll_interval_s)

    async def _stream_loop(self) -> None:
        while True:
            try:
                async for info in self._client.watch_routing(self._current.version):
                    await self._adopt(info)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("routing watch stream ended: %s", e)
            await asyncio.sleep(self._poll_interval_s / 4)


async def _as_awaitable(r: Awaitable[Any]) -> Any:
    return await r


def routing_from_list(infos: Iterable[mgmtd_pb2.RoutingInfo]) -> Routing:
    """The newest of several routing infos (helper for tests and tools)."""
    best = mgmtd_pb2.RoutingInfo()
    for i in infos:
        if i.version >= best.version:
            best = i
    return Routing(best)
