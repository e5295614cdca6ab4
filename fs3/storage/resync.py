"""Resync of a SYNCING successor by its predecessor (docs/chain-states.md#resync).

When routing shows that the successor of one of our targets is SYNCING, we are
its predecessor (the last serving target) and run, per chain:

1. ``SyncStart`` → the successor's chunk metadata;
2. diff against ours: chunks only the remote has are removed, chunks that
   differ (version, length, checksum, or pending remotely) or that only we have
   are transferred as full-chunk replacements (``Update`` with
   ``is_syncing``), each under our chunk lock so it cannot interleave with a
   normal write of the same chunk — normal writes meanwhile are forwarded to the
   syncing target as full-chunk replacements by the write path;
3. ``SyncDone`` → the successor turns local UPTODATE and mgmtd promotes it.

A failed run is retried (after ``retry_delay_s``) for as long as routing still
shows the successor SYNCING behind us.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fs3.errors import Code, FsError
from fs3.logs import event
from fs3.proto import storage_pb2
from fs3.routing import SERVING, SYNCING, Routing
from fs3.rpc.channel import call
from fs3.storage import metrics as M
from fs3.storage.chunk_engine import ChunkKey
from fs3.storage.craq import REMOVE, WRITE, Replicator
from fs3.storage.target import StorageTarget, TargetMap

log = logging.getLogger("fs3.storage.resync")

CONCURRENCY = 8


class ResyncManager:
    """Starts and supervises one sync task per (chain, syncing successor)."""

    def __init__(self, targets: TargetMap, rep: Replicator, *, retry_delay_s: float = 1.0) -> None:
        self.targets = targets
        self.rep = rep
        self.retry_delay_s = retry_delay_s
        self._tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self.completed: list[tuple[int, int]] = []  # (chain, target) of finished syncs, for tests

    def on_routing(self, routing: Routing) -> None:
        """Start syncs for every chain where a local serving target precedes a SYNCING one."""
        for t in self.targets.targets.values():
            if not t.chain_id or t.public_state != SERVING or not t.serving:
                continue
            try:
                succ = routing.successor(t.chain_id, t.target_id)
            except FsError:
                continue
            if succ is None or routing.target_state(t.chain_id, succ) != SYNCING:
                continue
            key = (t.chain_id, succ)
            task = self._tasks.get(key)
            if task is None or task.done():
                self._tasks[key] = asyncio.create_task(
                    self._run(t, succ), name=f"resync-{t.chain_id}-{succ}"
                )

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _still_needed(self, t: StorageTarget, succ: int) -> bool:
        r = self.targets.routing
        try:
            return (
                t.serving
                and t.public_state == SERVING
                and r.successor(t.chain_id, t.target_id) == succ
                and r.target_state(t.chain_id, succ) == SYNCING
            )
        except FsError:
            return False

    async def _run(self, t: StorageTarget, succ: int) -> None:
        chain = t.chain_id
        while self._still_needed(t, succ):
            started = time.monotonic()
            try:
                n_rm, n_tx = await self._sync_once(t, succ)
            except FsError as e:
                M.SYNC_RUNS.labels(str(chain), "error").inc()
                event(
                    log,
                    "sync failed",
                    level=logging.WARNING,
                    chain=chain,
                    target=succ,
                    error=str(e),
                )
                await asyncio.sleep(self.retry_delay_s)
                continue
            M.SYNC_RUNS.labels(str(chain), "ok").inc()
            self.completed.append((chain, succ))
            event(
                log,
                "sync done",
                chain=chain,
                target=succ,
                removed=n_rm,
                transferred=n_tx,
                seconds=round(time.monotonic() - started, 3),
            )
            return

    async def _sync_once(self, t: StorageTarget, succ: int) -> tuple[int, int]:
        routing = self.targets.routing
        node = routing.node_of_target(succ)
        stub = self.rep.peers.stub(node.address)
        chain, cver = t.chain_id, t.chain_version
        timeout = max(self.rep.cfg.forward_timeout_s, 30.0)
        event(log, "sync start", chain=chain, version=cver, target=succ, node=node.node_id)

        async def sync_call(name: str, request: type[Any]) -> Any:
            """``name`` (SyncStart or SyncDone) on the successor for this chain version."""
            return await call(
                getattr(stub, name),
                request(
                    chain_id=chain,
                    chain_version=cver,
                    target_id=succ,
                    from_target_id=t.target_id,
                    capability=self.rep.service_token(),
                ),
                timeout=timeout,
                what=f"{name}@target{succ}",
            )

        resp = await sync_call("SyncStart", storage_pb2.SyncStartRequest)
        remote = {ChunkKey(m.chunk.inode, m.chunk.index): m for m in resp.metas}
        # Same event-loop step as the listing (no await between): every update still in
        # flight holds or awaits its chunk lock. One admitted under the previous chain
        # version may not forward to this successor (it was not in that chain) and may
        # commit only after the listing, so each such chunk is transferred under its
        # lock whatever the listing says — else the successor turns SERVING without it.
        in_flight = set(t.locks.busy())
        local = {m.key: m for m in t.engine.list()}
        removes = [k for k in remote if k not in local and k not in in_flight]
        transfers = []
        for k, m in local.items():
            r = remote.get(k)
            if (
                k in in_flight
                or r is None
                or r.uncommitted
                or r.commit_ver != m.commit_ver
                or r.length != m.length
                or r.checksum != m.checksum
            ):
                transfers.append(k)
        transfers += sorted(k for k in in_flight if k not in local)
        M.SYNC_REMAINING.labels(str(chain)).set(len(removes) + len(transfers))
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(k: ChunkKey, remove: bool) -> None:
            async with sem:
                await self._transfer(t, succ, k, remove, cver)
                M.SYNC_REMAINING.labels(str(chain)).dec()

        await asyncio.gather(*(one(k, True) for k in removes))
        await asyncio.gather(*(one(k, False) for k in transfers))
        if t.chain_version != cver:
            raise FsError(Code.CHAIN_VERSION_MISMATCH, f"chain {chain} changed during sync")
        await sync_call("SyncDone", storage_pb2.SyncDoneRequest)
        return len(removes), len(transfers)

    async def _transfer(
        self, t: StorageTarget, succ: int, k: ChunkKey, remove: bool, cver: int
    ) -> None:
        """Send one chunk (or its removal) as a full-chunk replace, under the chunk lock."""
        if t.chain_version != cver:
            raise FsError(Code.CHAIN_VERSION_MISMATCH, f"chain {t.chain_id} changed during sync")
        routing = self.targets.routing
        node = routing.node_of_target(succ)
        async with t.locks.hold(k):
            meta = t.engine.get(k)
            io = storage_pb2.UpdateIO(chain_id=t.chain_id, chain_version=cver)
            io.chunk.inode, io.chunk.index = k.inode, k.index
            if meta is None:
                io.type = REMOVE  # removed locally meanwhile, or an update that never committed
            else:
                # (also when created meanwhile: an update admitted under the previous chain
                # version did not forward it here)
                _m, data = await self.rep.run_blocking(t.engine.read, k, 0, meta.length)
                io.type = WRITE
                io.offset, io.length, io.chunk_size = 0, len(data), max(len(data), 1)
                io.checksum = meta.checksum
                io.update_ver = meta.commit_ver
                io.full_chunk = True
            result = await self.rep.send_update(
                node.address,
                node.data_address,
                io,
                data if io.type == WRITE else None,
                is_syncing=True,
                from_target=t.target_id,
                to_target=succ,
            )
            if meta is not None and result.checksum != meta.checksum:
                raise FsError(
                    Code.CHECKSUM_MISMATCH, f"sync of chunk {k}: receiver checksum differs"
                )
            M.SYNC_CHUNKS.labels(str(t.target_id), "remove" if io.type == REMOVE else "write").inc()
