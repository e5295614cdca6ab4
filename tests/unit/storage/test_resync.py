"""Resync of a SYNCING successor versus updates still in flight (fs3.storage.resync).

Regression (found by the power-loss tier, under load): while a restarted chain
was coming back, an update admitted under the previous chain version — where
the successor was not yet in the chain, so it is not forwarded there — was
still staging when the chain changed and the resync listed the predecessor's
chunks. The listing showed the old committed version (or no chunk at all), the
resync skipped the chunk, and the successor turned SERVING without the
acknowledged update: reads served by it returned zeros (the launcher's
self-check after `fs3 cluster up`, the workload's read-your-writes).

Here the predecessor's routing and engine are real; the successor is a
recorded stub, and the in-flight update is played by holding the chunk lock
while the resync lists, then committing before letting go.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fs3.proto import mgmtd_pb2, storage_pb2
from fs3.routing import SERVING, SYNCING, Routing
from fs3.storage.chunk_engine import ChunkKey, ChunkMeta, FileChunkEngine, crc32c
from fs3.storage.craq import REMOVE, WRITE
from fs3.storage.operator import chunk_meta_pb
from fs3.storage.resync import ResyncManager
from fs3.storage.target import StorageTarget, TargetMap

pytestmark = pytest.mark.timeout(20)

CHUNK = 1 << 20
OLD = ChunkKey(0x401, 0)  # both sides have it committed, same version
NEW = ChunkKey(0x402, 0)  # created by the in-flight update
STALE = ChunkKey(0x403, 0)  # only the successor has it (an unacknowledged write's leftover)


def _routing(version: int, chain_version: int, states: dict[int, int]) -> Routing:
    info = mgmtd_pb2.RoutingInfo(version=version)
    info.nodes.add(node_id=1, address="pred:1")
    info.nodes.add(node_id=2, address="succ:1")
    info.targets.add(target_id=101, node_id=1, chain_id=1)
    info.targets.add(target_id=201, node_id=2, chain_id=1)
    ch = info.chains.add(chain_id=1, version=chain_version)
    for tid, st in states.items():
        ch.targets.add(target_id=tid, public_state=st)  # type: ignore[arg-type]
    return Routing(info)


class _Successor:
    """The SYNCING successor's end of the resync RPCs, recording every update."""

    def __init__(self, metas: list[storage_pb2.ChunkMeta]) -> None:
        self.metas = metas
        self.listed = asyncio.Event()
        self.sent: dict[ChunkKey, storage_pb2.UpdateIO] = {}
        self.done = False

    async def SyncStart(self, req: Any, **kw: Any) -> Any:  # noqa: N802
        self.listed.set()
        return storage_pb2.SyncStartResponse(metas=self.metas)

    async def SyncDone(self, req: Any, **kw: Any) -> Any:  # noqa: N802
        self.done = True
        return storage_pb2.SyncDoneResponse()

    def replicator(self) -> SimpleNamespace:
        """What the resync uses of the predecessor's Replicator, wired to this successor."""
        return SimpleNamespace(
            peers=SimpleNamespace(stub=lambda address: self),
            cfg=SimpleNamespace(forward_timeout_s=5.0),
            service_token=lambda: b"",
            run_blocking=lambda fn, *a, **kw: asyncio.sleep(0, fn(*a, **kw)),
            send_update=self.send_update,
        )

    async def send_update(
        self, address: str, data_address: str, io: Any, data: Any, **kw: Any
    ) -> storage_pb2.IOResult:
        k = ChunkKey(io.chunk.inode, io.chunk.index)
        self.sent[k] = io
        return storage_pb2.IOResult(checksum=crc32c(data) if io.type == WRITE else 0)


def _predecessor(tmp_path: Path) -> tuple[FileChunkEngine, StorageTarget, TargetMap]:
    """Target 101, serving alone in chain 1 (chain version 1)."""
    eng = FileChunkEngine(tmp_path, fsync=False)
    t = StorageTarget(101, str(tmp_path), eng)
    tmap = TargetMap([t])
    tmap.apply_routing(_routing(1, 0, {}))
    tmap.apply_routing(_routing(2, 1, {101: SERVING}))
    return eng, t, tmap


def _write(eng: FileChunkEngine, key: ChunkKey, data: bytes, ver: int) -> ChunkMeta:
    p = eng.stage_write(key, 0, data, update_ver=ver, chain_ver=2, chunk_size=CHUNK)
    m = eng.commit(p)
    assert m is not None
    return m


def test_update_in_flight_across_the_chain_change_reaches_the_successor(tmp_path: Path) -> None:
    eng, t, tmap = _predecessor(tmp_path)
    old = _write(eng, OLD, b"a" * 65536, 1)
    # the successor has OLD at the same version, and a STALE chunk the predecessor lacks
    stale = ChunkMeta(STALE, 1, 1, 5, crc32c(b"stale"))
    succ = _Successor([chunk_meta_pb(old), chunk_meta_pb(stale)])

    async def run() -> tuple[int, int]:
        mgr = ResyncManager(tmap, succ.replicator())  # type: ignore[arg-type]
        # Updates of OLD (append: version 2), NEW and STALE (created here) were admitted
        # under chain version 1, where 101 is the tail: they hold their chunk locks.
        holds = [t.locks.hold(k) for k in (OLD, NEW, STALE)]
        for h in holds:
            await h.__aenter__()
        tmap.apply_routing(_routing(3, 2, {101: SERVING, 201: SYNCING}))
        sync = asyncio.ensure_future(mgr._sync_once(t, 201))
        await asyncio.wait_for(succ.listed.wait(), 5)
        for _ in range(20):  # let the resync list and diff while the updates are in flight
            await asyncio.sleep(0)
        _write(eng, OLD, b"a" * 65536 + b"b" * 65536, 2)
        _write(eng, NEW, b"n" * 4096, 1)
        _write(eng, STALE, b"s" * 4096, 1)
        for h in holds:
            await h.__aexit__(None, None, None)
        return await asyncio.wait_for(sync, 5)

    asyncio.run(run())
    assert succ.done
    for k, ver in ((OLD, 2), (NEW, 1), (STALE, 1)):
        io = succ.sent.get(k)
        assert io is not None, f"chunk {k}: committed by an in-flight update, never sent"
        assert io.type == WRITE and io.full_chunk and io.update_ver == ver
        m = eng.get(k)
        assert m is not None and io.checksum == m.checksum and io.length == m.length
    eng.close()


def test_chunks_only_the_successor_has_are_removed(tmp_path: Path) -> None:
    """No update in flight: the plain diff still holds (remove the extra, send the missing)."""
    eng, t, tmap = _predecessor(tmp_path)
    _write(eng, NEW, b"n" * 100, 1)
    succ = _Successor([chunk_meta_pb(ChunkMeta(STALE, 1, 1, 5, crc32c(b"stale")))])
    tmap.apply_routing(_routing(3, 2, {101: SERVING, 201: SYNCING}))
    removed, transferred = asyncio.run(ResyncManager(tmap, succ.replicator())._sync_once(t, 201))  # type: ignore[arg-type]
    assert (removed, transferred) == (1, 1)
    assert succ.sent[STALE].type == REMOVE
    assert succ.sent[NEW].type == WRITE and succ.sent[NEW].update_ver == 1
    eng.close()
