"""Storage targets and their local state (3FS ``TargetMap``).

A storage node owns targets; each target is a directory with its own chunk
engine and belongs to at most one chain. The node learns chain membership,
chain versions and public states from mgmtd's routing info and derives each
target's *local* state from them, following 3FS
(docs/chain-states.md#local-states-on-the-storage-node):

- start-up: report every target ``OFFLINE`` until routing shows none of this
  node's targets SERVING/SYNCING/WAITING (mgmtd noticed the absence), then report
  ``ONLINE`` — so a restarted target always goes through a resync;
- ``ONLINE`` + public ``SERVING`` → ``UPTODATE`` (new chain, or LASTSRV back);
- ``UPTODATE`` + public ``OFFLINE``/``LASTSRV``/``WAITING`` → ``OFFLINE`` and fenced
  (self-fencing: mgmtd gave up on it, it may have missed writes). A fenced target
  *rejoins* the way a starting node does, without a process restart: it reports
  ``OFFLINE`` until routing shows it neither SERVING, SYNCING nor WAITING, then
  ``ONLINE``. mgmtd then makes a returning LASTSRV target SERVING again (it holds
  the newest data) and an OFFLINE one SYNCING (resynced from a serving
  predecessor). While fenced it takes no update at all, and once ONLINE it only
  takes what the routing of a newer chain version allows (every request carries
  its chain version), so an update admitted under the old chain never lands;
- ``syncDone`` from the predecessor → ``UPTODATE`` (:meth:`TargetMap.sync_done`);
- a disk I/O error (EIO/EROFS) → ``OFFLINE`` until restart (:meth:`TargetMap.disk_error`):
  a broken disk does not come back by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fs3.errors import Code, FsError
from fs3.logs import event
from fs3.proto import mgmtd_pb2
from fs3.routing import LASTSRV, OFFLINE, SERVING, SYNCING, WAITING, Routing
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine

log = logging.getLogger("fs3.storage.target")

L_UPTODATE = mgmtd_pb2.LOCAL_STATE_UPTODATE
L_ONLINE = mgmtd_pb2.LOCAL_STATE_ONLINE
L_OFFLINE = mgmtd_pb2.LOCAL_STATE_OFFLINE

LOCAL_NAMES: dict[int, str] = {
    int(L_UPTODATE): "uptodate",
    int(L_ONLINE): "online",
    int(L_OFFLINE): "offline",
}


class ChunkLocks:
    """Per-chunk asyncio locks, created on demand and dropped when unused.

    The head's lock serialises every update of a chunk (docs/architecture.md,
    data flow of a write, step 4);
    successors lock too so a forwarded update and a resync transfer never
    interleave on one chunk.
    """

    def __init__(self) -> None:
        self._locks: dict[ChunkKey, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: ChunkKey) -> AsyncIterator[None]:
        lock, n = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, n + 1)
        try:
            async with lock:
                yield
        finally:
            lk, n = self._locks[key]
            if n <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lk, n - 1)

    def locked(self, key: ChunkKey) -> bool:
        e = self._locks.get(key)
        return e is not None and e[0].locked()

    def busy(self) -> list[ChunkKey]:
        """Chunks with an update holding or awaiting their lock (in flight) right now."""
        return list(self._locks)


@functools.cache
def filesystem_id(path: str) -> str:
    """Names the local file system holding ``path``: ``host:st_dev:f_fsid`` (hex).

    Targets on one disk share its free space; capacity figures (``Routing.space``)
    count each ``fs_id`` once. The host name keeps equal device numbers on
    different machines apart. Cached: a target's directory does not move.
    """
    try:
        dev = os.stat(path).st_dev
        fsid = os.statvfs(path).f_fsid
    except OSError:
        return ""
    return f"{socket.gethostname()}:{dev:x}:{fsid:x}"


@dataclass
class StorageTarget:
    """One target: its engine, chain membership and local state."""

    target_id: int
    path: str
    engine: FileChunkEngine
    local_state: int = int(L_OFFLINE)
    chain_id: int = 0
    chain_version: int = 0
    public_state: int = 0
    fenced: bool = False
    # Fenced by routing (not by a disk error): rejoins once mgmtd shows it down.
    rejoin: bool = False
    error_count: int = 0
    locks: ChunkLocks = field(default_factory=ChunkLocks)

    @property
    def serving(self) -> bool:
        """May serve reads: local UPTODATE (and not fenced)."""
        return self.local_state == L_UPTODATE and not self.fenced

    def report(self, *, force_offline: bool = False) -> mgmtd_pb2.LocalTargetReport:
        sp = self.engine.space()
        return mgmtd_pb2.LocalTargetReport(
            fs_id=filesystem_id(self.path),
            target_id=self.target_id,
            local_state=L_OFFLINE if force_offline else self.local_state,  # type: ignore[arg-type]
            used_bytes=sp.used_bytes,
            free_bytes=sp.free_bytes,
            capacity_bytes=sp.capacity_bytes,
            chain_id=self.chain_id,
            chain_version=self.chain_version,
            error_count=self.error_count,
            low_space=sp.capacity_bytes > 0 and (1 - sp.free_bytes / sp.capacity_bytes) >= 0.96,
        )


class TargetMap:
    """The node's targets, indexed by id and by chain, with the local-state rules."""

    def __init__(self, targets: list[StorageTarget]) -> None:
        self.targets = {t.target_id: t for t in targets}
        self._by_chain: dict[int, StorageTarget] = {}
        self.starting = True
        self.routing = Routing.empty()

    def by_chain(self, chain_id: int) -> StorageTarget:
        t = self._by_chain.get(chain_id)
        if t is None:
            raise FsError(Code.UNKNOWN_CHAIN, f"no local target of chain {chain_id} on this node")
        return t

    def by_id(self, target_id: int) -> StorageTarget:
        t = self.targets.get(target_id)
        if t is None:
            raise FsError(Code.UNKNOWN_TARGET, f"target {target_id} is not on this node")
        return t

    def resolve(self, chain_id: int, target_id: int = 0) -> StorageTarget:
        """The local target of ``chain_id`` (checked against ``target_id`` when given).

        Before the first routing arrives a just-started node does not know its chains
        yet: that is a retryable "not serving", not a definite "not in that chain"
        (mgmtd may still publish the previous incarnation as serving, so a client can
        reach the node within a second of its start).
        """
        if not self.routing.version:
            raise FsError(
                Code.TARGET_NOT_SERVING,
                f"chain {chain_id}: this storage node has just started and has no routing yet",
            )
        if target_id:
            t = self.by_id(target_id)
            if chain_id and t.chain_id != chain_id:
                raise FsError(
                    Code.UNKNOWN_CHAIN,
                    f"target {target_id} is not in chain {chain_id} (it is in {t.chain_id})",
                )
            return t
        return self.by_chain(chain_id)

    def apply_routing(self, routing: Routing) -> bool:
        """Adopt ``routing``; update chain views and local states. True if a local state changed."""
        if routing.version < self.routing.version:
            return False
        self.routing = routing
        membership: dict[int, tuple[int, int, int]] = {}
        for ch in routing.chains():
            for ct in ch.targets:
                if ct.target_id in self.targets:
                    membership[ct.target_id] = (ch.chain_id, ch.version, ct.public_state)
        by_chain: dict[int, StorageTarget] = {}
        for t in self.targets.values():
            cid, cver, ps = membership.get(t.target_id, (0, 0, 0))
            if (cid, cver, ps) != (t.chain_id, t.chain_version, t.public_state):
                event(
                    log,
                    "chain view",
                    target=t.target_id,
                    chain=cid,
                    version=cver,
                    public=_pub(ps),
                    local=LOCAL_NAMES.get(t.local_state, t.local_state),
                )
            t.chain_id, t.chain_version, t.public_state = cid, cver, ps
            if cid:
                by_chain[cid] = t
        self._by_chain = by_chain
        changed = False
        if self.starting:
            busy = [
                t for t in self.targets.values() if t.public_state in (SERVING, SYNCING, WAITING)
            ]
            if busy:
                return False
            self.starting = False
            for t in self.targets.values():
                changed |= self._set(t, L_ONLINE, "start-up: mgmtd sees the targets down")
        for t in self.targets.values():
            if t.fenced:
                continue
            if t.local_state == L_ONLINE and t.public_state == SERVING:
                changed |= self._set(t, L_UPTODATE, "public serving")
            elif t.local_state == L_UPTODATE and t.public_state in (OFFLINE, LASTSRV, WAITING):
                t.fenced = t.rejoin = True
                changed |= self._set(t, L_OFFLINE, f"fenced: published {_pub(t.public_state)}")
        for t in self.targets.values():
            # The start-up rule, per target: once mgmtd shows the fenced target neither
            # serving nor in a resync it knows the target is out, and an ONLINE report
            # makes it SERVING again (LASTSRV) or starts its resync (OFFLINE).
            if t.rejoin and t.public_state not in (SERVING, SYNCING, WAITING):
                t.fenced = t.rejoin = False
                changed |= self._set(
                    t, L_ONLINE, f"rejoin: mgmtd sees the target {_pub(t.public_state)}"
                )
        return changed

    def sync_done(self, t: StorageTarget) -> bool:
        """The predecessor finished syncing ``t``: it is up to date."""
        if t.fenced or t.local_state == L_OFFLINE:
            return False
        return self._set(t, L_UPTODATE, "sync done")

    def disk_error(self, t: StorageTarget, detail: str) -> bool:
        """A disk I/O error on ``t``: stop serving it (local OFFLINE until restart), like 3FS diskError."""
        t.error_count += 1
        if t.fenced:
            return False
        t.fenced = True
        return self._set(t, L_OFFLINE, f"disk error: {detail}")

    def _set(self, t: StorageTarget, state: int, why: str) -> bool:
        if t.local_state == state:
            return False
        event(
            log,
            "local state",
            target=t.target_id,
            chain=t.chain_id,
            old=LOCAL_NAMES.get(t.local_state),
            new=LOCAL_NAMES.get(state),
            why=why,
        )
        t.local_state = state
        return True

    def reports(self, *, force_offline: bool = False) -> list[mgmtd_pb2.LocalTargetReport]:
        off = force_offline or self.starting
        return [t.report(force_offline=off) for t in self.targets.values()]


_PUB_NAMES: dict[int, str] = {
    int(SERVING): "serving",
    int(LASTSRV): "lastsrv",
    int(SYNCING): "syncing",
    int(WAITING): "waiting",
    int(OFFLINE): "offline",
}


def _pub(ps: int) -> str:
    return _PUB_NAMES.get(ps, "none")
