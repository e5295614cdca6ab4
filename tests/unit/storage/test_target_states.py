"""Storage-side local-state rules, fed routing by hand.

See docs/chain-states.md#local-states-on-the-storage-node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fs3.errors import Code, FsError
from fs3.proto import mgmtd_pb2
from fs3.routing import LASTSRV, OFFLINE, SERVING, SYNCING, WAITING, Routing
from fs3.storage.chunk_engine import FileChunkEngine
from fs3.storage.target import L_OFFLINE, L_ONLINE, L_UPTODATE, StorageTarget, TargetMap

pytestmark = pytest.mark.timeout(10)


def routing(version: int, chain_version: int, states: dict[int, int]) -> Routing:
    info = mgmtd_pb2.RoutingInfo(version=version)
    ch = info.chains.add(chain_id=1, version=chain_version)
    for tid, st in states.items():
        ch.targets.add(target_id=tid, public_state=st)  # type: ignore[arg-type]
    return Routing(info)


@pytest.fixture
def tmap(tmp_path: Path) -> TargetMap:
    return TargetMap([StorageTarget(101, str(tmp_path), FileChunkEngine(tmp_path, fsync=False))])


def test_startup_waits_until_mgmtd_sees_the_target_down(tmap: TargetMap) -> None:
    t = tmap.targets[101]
    assert tmap.reports()[0].local_state == L_OFFLINE
    # mgmtd still shows it serving (previous incarnation): keep reporting OFFLINE
    assert not tmap.apply_routing(routing(1, 1, {101: SERVING, 201: SERVING}))
    assert tmap.starting and tmap.reports()[0].local_state == L_OFFLINE
    assert tmap.reports()[0].chain_version == 1  # report based on the chain version seen
    # now mgmtd marked it offline: report ONLINE (needs a resync)
    assert tmap.apply_routing(routing(2, 2, {201: SERVING, 101: OFFLINE}))
    assert not tmap.starting and t.local_state == L_ONLINE and not t.serving
    # syncing → still ONLINE; sync done → UPTODATE; then serving
    assert not tmap.apply_routing(routing(3, 3, {201: SERVING, 101: SYNCING}))
    assert tmap.sync_done(t) and t.local_state == L_UPTODATE
    assert not tmap.apply_routing(routing(4, 4, {201: SERVING, 101: SERVING}))
    assert t.serving and tmap.by_chain(1) is t


def test_a_request_before_the_first_routing_is_retryable(tmap: TargetMap) -> None:
    """Regression (found by the power-loss tier: a cut right after `fs3 cluster up`, then up
    again): mgmtd still showed the previous incarnation serving, the launcher's check write
    reached the new process before its first routing and got a final UNKNOWN_CHAIN."""
    for args in ((1, 101), (1, 0)):
        with pytest.raises(FsError) as ei:
            tmap.resolve(*args)
        assert ei.value.code == Code.TARGET_NOT_SERVING and ei.value.retryable
    tmap.apply_routing(routing(1, 1, {101: SERVING}))
    assert tmap.resolve(1, 101) is tmap.targets[101]
    with pytest.raises(FsError) as ei:
        tmap.resolve(2, 101)  # with routing: a definite answer
    assert ei.value.code == Code.UNKNOWN_CHAIN


def test_online_plus_serving_becomes_uptodate(tmap: TargetMap) -> None:
    tmap.apply_routing(routing(1, 0, {}))  # not in any chain yet
    assert tmap.targets[101].local_state == L_ONLINE
    assert tmap.apply_routing(routing(2, 1, {101: SERVING}))
    assert tmap.targets[101].local_state == L_UPTODATE


@pytest.mark.parametrize("published", [OFFLINE, LASTSRV, WAITING])
def test_uptodate_but_published_down_fences(tmap: TargetMap, published: int) -> None:
    tmap.apply_routing(routing(1, 0, {}))
    tmap.apply_routing(routing(2, 1, {101: SERVING}))
    t = tmap.targets[101]
    assert t.local_state == L_UPTODATE
    assert tmap.apply_routing(routing(3, 2, {101: published}))
    assert t.local_state == L_OFFLINE and t.fenced
    # fenced until restart, even if published serving again
    tmap.apply_routing(routing(4, 3, {101: SERVING}))
    assert t.local_state == L_OFFLINE and not t.serving


def test_older_routing_is_ignored(tmap: TargetMap) -> None:
    tmap.apply_routing(routing(5, 3, {101: SERVING}))
    assert not tmap.apply_routing(routing(4, 2, {101: OFFLINE}))
    assert tmap.targets[101].chain_version == 3


def test_force_offline_reports(tmap: TargetMap) -> None:
    tmap.apply_routing(routing(1, 0, {}))
    tmap.apply_routing(routing(2, 1, {101: SERVING}))
    assert tmap.reports()[0].local_state == L_UPTODATE
    assert tmap.reports(force_offline=True)[0].local_state == L_OFFLINE


def test_disk_error_takes_target_offline(tmap: TargetMap) -> None:
    tmap.apply_routing(routing(1, 0, {}))
    tmap.apply_routing(routing(2, 1, {101: SERVING}))
    t = tmap.targets[101]
    assert t.serving
    assert tmap.disk_error(t, "EIO")
    assert not t.serving and t.local_state == L_OFFLINE and t.error_count == 1
    assert not tmap.disk_error(t, "EIO again")  # already down: no new state change


@pytest.mark.parametrize(
    ("error", "offline"),
    [
        (FsError(Code.INTERNAL, "fdatasync: EIO", errno=5), True),
        (FsError(Code.CHUNK_BUSY, "chunk 1:0: replaced by a newer stage"), False),
        (FsError(Code.NO_SPACE, "metadata row"), False),
    ],
)
def test_only_a_disk_failure_of_a_staged_update_sync_takes_the_target_offline(
    tmap: TargetMap, error: FsError, offline: bool
) -> None:
    """A sync (prepare) that failed because a newer stage of the chunk replaced the
    update (the retry of a cancelled update, its first stage still running in the
    I/O pool) says nothing about the disk: the update fails, the target serves on.
    Before, that took the target offline until restart (seen under a slow link)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from fs3.config import StorageSection
    from fs3.storage.craq import Replicator

    tmap.apply_routing(routing(1, 0, {}))
    tmap.apply_routing(routing(2, 1, {101: SERVING}))
    t = tmap.targets[101]

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            rep = Replicator(tmap, StorageSection(), None, None, pool, lambda: None)  # type: ignore[arg-type]
            sync: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            sync.set_exception(error)
            with pytest.raises(FsError) as ei:
                await rep._wait_sync(t, sync)
            assert ei.value is error

    asyncio.run(main())
    assert t.serving is not offline


def test_a_cancelled_update_never_leaves_its_stage_running(tmap: TargetMap) -> None:
    """An update whose RPC is cancelled (its deadline passed) while its stage runs in the
    I/O pool must not release the chunk before that stage ends.

    Before, the stage went on alone: the client's retry and its next write committed
    meanwhile, then the orphaned stage left its update pending (built on the newer
    committed bytes, with the old write's bytes and version), and the chunk's next
    update re-drove it, putting back bytes older than an acknowledged write. (With a
    one-sided shm payload the orphan even copied whatever the client's buffer held by
    then.)"""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from fs3.config import StorageSection
    from fs3.proto import storage_pb2
    from fs3.storage.chunk_engine import ChunkKey, crc32c
    from fs3.storage.craq import InlinePayloadIO, Replicator

    tmap.apply_routing(routing(1, 0, {}))
    tmap.apply_routing(routing(2, 1, {101: SERVING}))  # the head, no successor
    t = tmap.targets[101]
    eng = t.engine
    cs = 1 << 16
    entered, gate, staged = threading.Event(), threading.Event(), threading.Event()
    real_stage = eng.stage_write
    calls = 0

    def stage_write(*a: object, **kw: object) -> object:
        nonlocal calls
        calls += 1
        if calls != 2:
            return real_stage(*a, **kw)  # type: ignore[arg-type]
        entered.set()  # the first attempt of write B: held in the I/O pool
        gate.wait(10)
        try:
            return real_stage(*a, **kw)  # type: ignore[arg-type]
        finally:
            staged.set()

    eng.stage_write = stage_write  # type: ignore[method-assign]

    def io(data: bytes, offset: int = 0) -> storage_pb2.UpdateIO:
        u = storage_pb2.UpdateIO(
            chain_id=1,
            chain_version=1,
            type=storage_pb2.UPDATE_WRITE,
            offset=offset,
            length=len(data),
            chunk_size=cs,
            checksum=crc32c(data),
        )
        u.chunk.inode, u.chunk.index = 5, 0
        u.data.inline = data
        return u

    def tag(seq: int) -> storage_pb2.UpdateTag:
        return storage_pb2.UpdateTag(client_id="c", channel_id=1, seqnum=seq)

    a, b, c, d = b"A" * 100, b"B" * 100, b"C" * 100, b"D" * 10

    async def main() -> None:
        with ThreadPoolExecutor(4) as pool:
            rep = Replicator(tmap, StorageSection(), InlinePayloadIO(), None, pool, lambda: None)  # type: ignore[arg-type]
            await rep.client_update(io(a), tag(1))
            first = asyncio.ensure_future(rep.client_update(io(b), tag(2)))
            await asyncio.to_thread(entered.wait, 10)
            first.cancel()  # the RPC deadline
            for _ in range(20):
                await asyncio.sleep(0)
            if not first.done():
                gate.set()  # it waits for its stage: let the stage finish
            with pytest.raises(asyncio.CancelledError):
                await first
            await rep.client_update(io(b), tag(2))  # the client's retry
            await rep.client_update(io(c), tag(3))  # its next write, acknowledged
            gate.set()
            assert await asyncio.to_thread(staged.wait, 10)  # an orphaned stage (if any) ends
            await rep.client_update(io(d, 1000), tag(4))  # re-drives whatever was left pending
            _meta, data = eng.read(ChunkKey(5, 0), 0, 100)
            assert data == c, "bytes older than an acknowledged write came back"

    asyncio.run(main())
