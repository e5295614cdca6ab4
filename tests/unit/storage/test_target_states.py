"""Storage-side local-state rules, fed routing by hand.

See docs/chain-states.md#local-states-on-the-storage-node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fs3.errors import Code, FsError
from fs3.mgmtd import chains as sm
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
    assert not t.serving and t.local_state != L_UPTODATE
    if published == WAITING:
        # mgmtd still counts it in a resync's queue: fenced, reported OFFLINE, no rejoin yet
        assert t.fenced and t.local_state == L_OFFLINE
        assert tmap.reports()[0].local_state == L_OFFLINE
        assert not tmap.apply_routing(routing(4, 2, {101: WAITING}))
        assert t.fenced and t.local_state == L_OFFLINE
    else:
        # mgmtd already shows it out: it rejoins at once, as ONLINE (the start-up rule)
        assert not t.fenced and t.local_state == L_ONLINE
        assert tmap.reports()[0].local_state == L_ONLINE
        assert tmap.reports()[0].chain_version == 2  # based on the chain that fenced it


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


def _chain(tm: TargetMap, version: int, chain_version: int, states: dict[int, int]) -> bool:
    return tm.apply_routing(routing(version, chain_version, states))


@pytest.fixture
def three(tmp_path: Path) -> list[TargetMap]:
    """Three nodes with one target each (101, 201, 301) on chain 1, all serving."""
    maps = []
    for tid in (101, 201, 301):
        d = tmp_path / str(tid)
        d.mkdir()
        maps.append(TargetMap([StorageTarget(tid, str(d), FileChunkEngine(d, fsync=False))]))
    for tm in maps:
        _chain(tm, 1, 0, {})
        _chain(tm, 2, 1, {101: SERVING, 201: SERVING, 301: SERVING})
        assert next(iter(tm.targets.values())).serving
    return maps


def _local(tm: TargetMap) -> int:
    return int(tm.reports()[0].local_state)


def test_fenced_lastsrv_rejoins_serving_and_the_others_resync_from_it(
    three: list[TargetMap],
) -> None:
    """The CI failure: mgmtd (stalled) declared every node down; the nodes were alive.

    Chain 1 became ``101:lastsrv,201:offline,301:offline``; every target fenced itself and,
    before the rejoin rule, stayed OFFLINE until its process restarted, so the chain never
    served again. Now each one rejoins the way a starting node does; fed through mgmtd's
    state machine (fs3.mgmtd.chains.next_chain), 101 serves again at once and 201, 301
    resync from it one at a time.
    """
    a, b, c = three
    order = [(101, SERVING), (201, SERVING), (301, SERVING)]
    version, cver = 2, 1

    def publish() -> None:
        nonlocal version
        version += 1
        states = dict(order)
        for tm in three:
            _chain(tm, version, cver, states)

    def mgmtd_round(local: dict[int, int]) -> None:
        nonlocal order, cver
        before = [sm.ChainTarget(tid, ps, local[tid]) for tid, ps in order]
        after = sm.next_chain(before)
        if sm.chain_changed(before, after):
            order = [(t.target_id, t.public) for t in after]
            cver += 1
            publish()

    # mgmtd declared all three nodes down in one round
    mgmtd_round({101: sm.LOCAL_OFFLINE, 201: sm.LOCAL_OFFLINE, 301: sm.LOCAL_OFFLINE})
    assert order == [(101, LASTSRV), (201, OFFLINE), (301, OFFLINE)]
    for tm in three:  # nobody serves: the fenced ones never serve stale data
        t = next(iter(tm.targets.values()))
        assert not t.serving
        assert _local(tm) == L_ONLINE  # rejoined: mgmtd shows each of them out
    # the nodes' next heartbeats (ONLINE, based on the current chain version) reach mgmtd
    mgmtd_round({101: L_ONLINE, 201: L_ONLINE, 301: L_ONLINE})
    assert order[0] == (101, SERVING)  # the LASTSRV target serves again, directly
    assert sorted(ps for _, ps in order[1:]) == [SYNCING, WAITING]  # one resync at a time
    assert a.targets[101].serving and a.reports()[0].local_state == L_UPTODATE
    # the routing names 101 as the predecessor of the SYNCING one: it sends the resync
    syncing = next(tid for tid, ps in order if ps == SYNCING)
    assert a.routing.predecessor(1, syncing) == 101
    first = b if syncing == 201 else c
    assert first.sync_done(first.targets[syncing])
    mgmtd_round({101: _local(a), 201: _local(b), 301: _local(c)})
    assert dict(order)[syncing] == SERVING
    other = 301 if syncing == 201 else 201
    assert dict(order)[other] == SYNCING
    second = c if other == 301 else b
    assert second.sync_done(second.targets[other])
    mgmtd_round({101: _local(a), 201: _local(b), 301: _local(c)})
    assert order == [(101, SERVING), (syncing, SERVING), (other, SERVING)]
    assert all(next(iter(tm.targets.values())).serving for tm in three)


def test_a_rejoining_target_takes_no_update_of_the_old_chain(three: list[TargetMap]) -> None:
    """Fenced and rejoined: it neither serves nor counts as on the write path, and its chain
    version is the one that fenced it, so a request of the old chain is refused."""
    _, b, _ = three
    t = b.targets[201]
    _chain(b, 3, 2, {101: SERVING, 301: SERVING, 201: OFFLINE})
    assert t.local_state == L_ONLINE and not t.serving and t.chain_version == 2
    assert t.public_state == OFFLINE  # craq refuses updates unless SERVING/SYNCING
    # only a resync makes it up to date: ONLINE + SYNCING stays ONLINE
    assert not _chain(b, 4, 3, {101: SERVING, 301: SERVING, 201: SYNCING})
    assert t.local_state == L_ONLINE and not t.serving


def test_a_disk_error_still_fences_until_restart(tmap: TargetMap) -> None:
    tmap.apply_routing(routing(1, 0, {}))
    tmap.apply_routing(routing(2, 1, {101: SERVING}))
    t = tmap.targets[101]
    assert tmap.disk_error(t, "EIO")
    tmap.apply_routing(routing(3, 2, {101: OFFLINE}))
    tmap.apply_routing(routing(4, 3, {101: LASTSRV}))
    assert t.fenced and t.local_state == L_OFFLINE and tmap.reports()[0].local_state == L_OFFLINE
