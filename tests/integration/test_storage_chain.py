"""CRAQ chains on an in-process cluster: real mgmtd + real storage nodes over loopback gRPC.

Covers 1/2/3 replicas on every transport, concurrent writers, stale versions and
bad input, committed reads during writes, exactly-once retries, removal/truncate,
checksum repair, writes with replicas dying, and the recovery (resync) scenario.
Real OS processes are covered by test_storage_procs.py.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from fs3.client.chunk_client import ChunkClient
from fs3.errors import Code, FsError
from fs3.proto import storage_pb2
from fs3.routing import SERVING
from fs3.rpc.channel import call
from fs3.storage.chunk_engine import ChunkKey, crc32c
from fs3.testing.storage_cluster import InProcessCluster

CS = 64 << 10  # small chunks keep the tests fast


def run(
    tmp_path: Path,
    body: Callable[[InProcessCluster, ChunkClient], Awaitable[None]],
    *,
    nodes: int = 3,
    replicas: int = 3,
    transport: str = "grpc",
    forward_retry_s: float = 20.0,
) -> None:
    async def main() -> None:
        c = InProcessCluster(
            tmp_path,
            nodes=nodes,
            replicas=replicas,
            transport=transport,
            forward_retry_s=forward_retry_s,
        )
        cl: ChunkClient | None = None
        try:
            await c.start()
            cl = ChunkClient(c.admin, transport, retry_deadline_s=20.0)
            await cl.refresh()
            await body(c, cl)
        finally:
            if cl is not None:
                await cl.close()
            await c.stop()

    asyncio.run(main())


def corrupt(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff\x00\xff")


async def replica_metas(c: InProcessCluster, cl: ChunkClient, chain: int) -> dict[int, list[tuple]]:
    r = await cl.refresh()
    out = {}
    for tid in r.chain_targets(chain):
        metas = await cl.list_chunks(tid)
        out[tid] = [
            (m.chunk.inode, m.chunk.index, m.commit_ver, m.length, m.checksum) for m in metas
        ]
    return out


async def assert_replicas_equal(c: InProcessCluster, cl: ChunkClient, chain: int) -> list[tuple]:
    metas = await replica_metas(c, cl, chain)
    vals = list(metas.values())
    assert all(v == vals[0] for v in vals), metas
    return vals[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["auto", "grpc", "tcp", "shm"])
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_write_read_every_replica(tmp_path: Path, replicas: int, transport: str) -> None:
    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        chain = cl.routing.chains()[0].chain_id
        rng = random.Random(replicas)
        model: dict[int, bytearray] = {}
        for _ in range(30):
            idx = rng.randrange(4)
            off = rng.randrange(0, CS - 1)
            data = rng.randbytes(rng.randrange(1, CS - off + 1))
            res = await cl.write(chain, 42, idx, off, data, chunk_size=CS)
            buf = model.setdefault(idx, bytearray())
            if off > len(buf):
                buf.extend(bytes(off - len(buf)))
            buf[off : off + len(data)] = data
            assert res.length == len(data) and res.chunk_length == len(buf)
            assert res.checksum == crc32c(bytes(buf))
        for tid in cl.routing.chain_targets(chain):
            for idx, buf in model.items():
                data, rr = await cl.read(chain, 42, idx, 0, CS, target_id=tid)
                assert bytes(data) == bytes(buf) and rr.chunk_checksum == crc32c(bytes(buf))
                part, _ = await cl.read(chain, 42, idx, 100, 5000, target_id=tid)
                assert bytes(part) == bytes(buf[100:5100])
        metas = await assert_replicas_equal(c, cl, chain)
        assert len(metas) == len(model)
        # a chunk never written: CHUNK_NOT_FOUND (distinguishable from a short read)
        with pytest.raises(FsError) as ei:
            await cl.read(chain, 42, 99, 0, 10)
        assert ei.value.code == Code.CHUNK_NOT_FOUND

    run(tmp_path, body, nodes=max(replicas, 1), replicas=replicas, transport=transport)


@pytest.mark.timeout(60)
def test_concurrent_writers_one_chunk(tmp_path: Path) -> None:
    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        chain = cl.routing.chains()[0].chain_id
        piece = CS // 16

        async def writer(w: int) -> None:
            for rnd in range(4):
                await cl.write(chain, 5, 0, w * piece, bytes([w * 16 + rnd]) * piece, chunk_size=CS)

        await asyncio.gather(*(writer(w) for w in range(16)))
        data, rr = await cl.read(chain, 5, 0, 0, CS)
        assert bytes(data) == b"".join(bytes([w * 16 + 3]) * piece for w in range(16))
        assert rr.commit_ver == 64  # every write got its own version, none lost
        await assert_replicas_equal(c, cl, chain)

    run(tmp_path, body)


@pytest.mark.timeout(60)
def test_refusals_change_nothing(tmp_path: Path) -> None:
    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        r = cl.routing
        chain = r.chains()[0].chain_id
        head, second = r.chain_targets(chain)[:2]
        await cl.write(chain, 9, 0, 0, b"original", chunk_size=CS)

        async def send(io: storage_pb2.UpdateIO, target: int = 0) -> FsError:
            node = r.node_of_target(target or head)
            with pytest.raises(FsError) as ei:
                await call(cl.stub(node.address).Write, storage_pb2.WriteRequest(io=io), timeout=5)
            return ei.value

        def io(**kw: object) -> storage_pb2.UpdateIO:
            payload = kw.pop("payload", b"evil!")
            x = storage_pb2.UpdateIO(
                chain_id=chain,
                chain_version=r.chain_version(chain),
                type=storage_pb2.UPDATE_WRITE,
                offset=0,
                length=len(payload),
                chunk_size=CS,
                checksum=crc32c(payload),  # type: ignore[arg-type]
            )
            x.chunk.inode, x.chunk.index = 9, 0
            x.data.inline = payload  # type: ignore[assignment]
            for k, v in kw.items():
                setattr(x, k, v)
            return x

        cases = [
            (io(chain_version=r.chain_version(chain) + 5), Code.CHAIN_VERSION_MISMATCH, head),
            (io(), Code.NOT_HEAD, second),
            (io(offset=CS - 2), Code.INVALID_ARGUMENT, head),
            (io(chunk_size=0), Code.INVALID_ARGUMENT, head),
            (io(checksum=12345), Code.CHECKSUM_MISMATCH, head),
            (io(length=3), Code.INVALID_ARGUMENT, head),  # truncated / oversized payload
            (io(length=50), Code.INVALID_ARGUMENT, head),
            (io(chain_id=777), Code.UNKNOWN_CHAIN, head),
        ]
        for req, code, target in cases:
            err = await send(req, target)
            assert err.code == code, (req, err)
        assert (await send(io(chain_version=r.chain_version(chain) - 1))).retryable
        data, rr = await cl.read(chain, 9, 0, 0, 100)
        assert bytes(data) == b"original" and rr.commit_ver == 1
        await assert_replicas_equal(c, cl, chain)

    run(tmp_path, body)


@pytest.mark.timeout(60)
def test_reads_during_writes_see_committed_versions(tmp_path: Path) -> None:
    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        chain = cl.routing.chains()[0].chain_id
        await cl.write(chain, 3, 0, 0, bytes([0]) * CS, chunk_size=CS)
        done = asyncio.Event()

        async def writer() -> None:
            for v in range(1, 40):
                # alternate full and partial overwrites; content of version v is uniform
                if v % 2:
                    await cl.write(chain, 3, 0, 0, bytes([v]) * CS, chunk_size=CS)
                else:
                    await cl.write(chain, 3, 0, 0, bytes([v]) * (CS // 2), chunk_size=CS)
                    await cl.write(chain, 3, 0, CS // 2, bytes([v]) * (CS // 2), chunk_size=CS)
            done.set()

        async def reader(tid: int) -> int:
            n = 0
            last = 0
            while not done.is_set():
                data, rr = await cl.read(chain, 3, 0, 0, CS, target_id=tid)
                b = bytes(data)
                assert crc32c(b) == rr.chunk_checksum
                assert rr.commit_ver >= last
                last = rr.commit_ver
                halves = {b[: CS // 2].count(b[0]) == CS // 2, b[CS // 2 :].count(b[-1]) == CS // 2}
                assert halves == {True}, "a read saw a torn chunk"
                n += 1
            return n

        tids = cl.routing.chain_targets(chain)
        counts = await asyncio.gather(writer(), *(reader(t) for t in tids))
        assert all(n > 0 for n in counts[1:])

    run(tmp_path, body)


@pytest.mark.timeout(60)
def test_retry_with_same_tag_applies_once(tmp_path: Path) -> None:
    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        r = cl.routing
        chain = r.chains()[0].chain_id
        head = r.head(chain)
        assert head is not None
        node = r.node_of_target(head)
        payload = b"once"
        io = storage_pb2.UpdateIO(
            chain_id=chain,
            chain_version=r.chain_version(chain),
            type=storage_pb2.UPDATE_WRITE,
            offset=0,
            length=4,
            chunk_size=CS,
            checksum=crc32c(payload),
        )
        io.chunk.inode, io.chunk.index = 11, 0
        io.data.inline = payload
        tag = storage_pb2.UpdateTag(client_id="retrier", request_id=1, channel_id=7, seqnum=100)
        req = storage_pb2.WriteRequest(io=io, tag=tag)
        a, b = await asyncio.gather(
            call(cl.stub(node.address).Write, req, timeout=5),
            call(cl.stub(node.address).Write, req, timeout=5),
        )
        again = await call(cl.stub(node.address).Write, req, timeout=5)
        assert a.result.commit_ver == b.result.commit_ver == again.result.commit_ver == 1
        tag.seqnum = 99  # older than the cached one
        with pytest.raises(FsError) as ei:
            await call(
                cl.stub(node.address).Write, storage_pb2.WriteRequest(io=io, tag=tag), timeout=5
            )
        assert ei.value.code == Code.STALE_UPDATE
        assert (await cl.read(chain, 11, 0, 0, 10))[1].commit_ver == 1

    run(tmp_path, body)


@pytest.mark.timeout(60)
def test_truncate_remove_and_query_last_chunk(tmp_path: Path) -> None:
    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        chain = cl.routing.chains()[0].chain_id
        for i in range(6):
            await cl.write(chain, 21, i, 0, b"z" * (1000 + i), chunk_size=CS)
        q = await cl.query_last_chunk(chain, 21)
        assert (q.found, q.last_index, q.last_length, q.total_chunks) == (True, 5, 1005, 6)
        await cl.update(chain, 21, 2, type=storage_pb2.UPDATE_TRUNCATE, length=10, chunk_size=CS)
        await cl.update(chain, 21, 1, type=storage_pb2.UPDATE_EXTEND, length=5000, chunk_size=CS)
        await cl.update(
            chain, 21, 1, type=storage_pb2.UPDATE_EXTEND, length=10, chunk_size=CS
        )  # never shrinks
        data, _ = await cl.read(chain, 21, 1, 0, CS)
        assert bytes(data) == b"z" * 1001 + bytes(3999)
        assert len((await cl.read(chain, 21, 2, 0, CS))[0]) == 10
        removed = await cl.remove_chunks(chain, 21, 3)
        assert removed == 3
        q = await cl.query_last_chunk(chain, 21)
        assert (q.last_index, q.last_length, q.total_chunks) == (2, 10, 3)
        metas = await assert_replicas_equal(c, cl, chain)
        assert [m[1] for m in metas] == [0, 1, 2]
        # the batch TruncateChunks RPC (what meta uses for truncate) on the head
        r = cl.routing
        head_node = r.node_of_target(r.chain_targets(chain)[0])
        op = storage_pb2.TruncateChunkOp(
            chain_id=chain, chain_version=r.chain_version(chain), length=7, chunk_size=CS
        )
        op.chunk.inode, op.chunk.index = 21, 0
        bad = storage_pb2.TruncateChunkOp(
            chain_id=chain, chain_version=r.chain_version(chain), length=CS + 1, chunk_size=CS
        )
        bad.chunk.inode, bad.chunk.index = 21, 1
        tr = await call(
            cl.stub(head_node.address).TruncateChunks,
            storage_pb2.TruncateChunksRequest(ops=[op, bad]),
            timeout=5,
        )
        assert tr.results[0].error.code == 0 and tr.results[0].result.chunk_length == 7
        assert tr.results[1].error.code == Code.INVALID_ARGUMENT
        sp = await call(
            cl.stub(head_node.address).SpaceInfo, storage_pb2.SpaceInfoRequest(), timeout=5
        )
        assert sp.targets[0].chunk_count == 3 and sp.targets[0].used_bytes == 7 + 5000 + 10
        assert sp.targets[0].capacity_bytes >= sp.targets[0].free_bytes > 0
        assert await cl.remove_chunks(chain, 21) == 3
        assert not (await cl.query_last_chunk(chain, 21)).found
        assert await assert_replicas_equal(c, cl, chain) == []

    run(tmp_path, body)


@pytest.mark.timeout(60)
def test_corrupt_replica_is_reported_and_repaired(tmp_path: Path) -> None:
    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        chain = cl.routing.chains()[0].chain_id
        good = os.urandom(CS)
        await cl.write(chain, 31, 0, 0, good, chunk_size=CS)
        victim = cl.routing.chain_targets(chain)[1]
        eng = c.nodes[c.node_of_target(victim)].targets.by_id(victim).engine
        meta = eng.get(ChunkKey(31, 0))
        assert meta is not None
        corrupt(eng.data_dir / meta.file, 1000)
        with pytest.raises(FsError) as ei:
            await cl.read(chain, 31, 0, 0, CS, target_id=victim)
        assert ei.value.code == Code.CHECKSUM_MISMATCH
        for _ in range(200):  # repaired in the background from another replica
            try:
                data, _ = await cl.read(chain, 31, 0, 0, CS, target_id=victim)
                break
            except FsError:
                await asyncio.sleep(0.05)
        assert bytes(data) == good
        await assert_replicas_equal(c, cl, chain)

    run(tmp_path, body)


@pytest.mark.timeout(90)
def test_writes_continue_with_replicas_down(tmp_path: Path) -> None:
    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        chain = cl.routing.chains()[0].chain_id
        await cl.write(chain, 50, 0, 0, b"a" * 100, chunk_size=CS)
        order = cl.routing.chain_targets(chain)
        # kill the middle replica, then the tail: writes block until mgmtd moves them out, then complete
        for k, victim in enumerate([order[1], order[2]]):
            await c.kill_node(c.node_of_target(victim))
            res = await cl.write(chain, 50, 0, 0, bytes([65 + k + 1]) * 100, chunk_size=CS)
            assert res.commit_ver == k + 2
            r = await cl.refresh()
            assert [t for t in r.serving_targets(chain)] == [
                x for x in order if x not in order[1 : k + 2]
            ]
        data, rr = await cl.read(chain, 50, 0, 0, CS)
        assert bytes(data) == b"C" * 100 and rr.commit_ver == 3

    run(tmp_path, body)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["auto", "grpc", "tcp", "shm"])
def test_recovery_resyncs_a_returning_replica(tmp_path: Path, transport: str) -> None:
    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        chain = cl.routing.chains()[0].chain_id
        rng = random.Random(5)
        stop = asyncio.Event()
        progress = asyncio.Event()
        writes = 0

        async def writer() -> None:
            nonlocal writes
            while not stop.is_set():
                idx = rng.randrange(24)
                off = rng.randrange(0, CS - 4096)
                await cl.write(
                    chain, 60, idx, off, rng.randbytes(rng.randrange(1, 4096)), chunk_size=CS
                )
                writes += 1
                progress.set()
                if rng.random() < 0.05:
                    await cl.remove_chunks(chain, 60, idx, idx + 1)

        async def until(n: int) -> None:
            while writes < n:
                assert not w.done(), w
                progress.clear()
                await asyncio.wait_for(progress.wait(), 30)

        w = asyncio.create_task(writer())
        await until(30)
        victim_tid = cl.routing.chain_targets(chain)[1]
        victim = c.node_of_target(victim_tid)
        await c.kill_node(victim)
        await c.wait(lambda r: r.target_state(chain, victim_tid) != SERVING, what="victim out")
        await until(writes + 30)
        await c.restart_node(victim)
        await c.wait_all_serving(timeout_s=40)
        await until(writes + 10)  # writes keep flowing to the recovered replica
        stop.set()
        await w
        metas = await assert_replicas_equal(c, cl, chain)
        assert len(metas) > 5
        # and byte-identical content on every replica
        for m in metas:
            blobs = {
                bytes((await cl.read(chain, 60, m[1], 0, CS, target_id=t))[0])
                for t in cl.routing.chain_targets(chain)
            }
            assert len(blobs) == 1

    run(tmp_path, body, transport=transport)


@pytest.mark.timeout(60)
def test_unfinished_write_is_redriven_once(tmp_path: Path) -> None:
    """The head gives up forwarding (short retry window) while the tail is dead; the
    client's retry (same tag) re-drives the staged version instead of applying twice."""

    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        chain = cl.routing.chains()[0].chain_id
        await cl.write(chain, 70, 0, 0, b"a" * 1000, chunk_size=CS)
        order = cl.routing.chain_targets(chain)
        await c.kill_node(c.node_of_target(order[2]))
        head = c.nodes[c.node_of_target(order[0])].targets.by_id(order[0])
        res = await cl.write(chain, 70, 0, 500, b"b" * 1000, chunk_size=CS)
        assert res.commit_ver == 2 and res.chunk_length == 1500
        assert cl.retries > 0  # the first attempts failed while the tail was still in the chain
        assert head.engine.pending(ChunkKey(70, 0)) is None
        res = await cl.write(chain, 70, 0, 1500, b"c" * 10, chunk_size=CS)
        assert res.commit_ver == 3
        data, _ = await cl.read(chain, 70, 0, 0, CS)
        assert bytes(data) == b"a" * 500 + b"b" * 1000 + b"c" * 10
        await c.wait(lambda r: r.target_state(chain, order[2]) != SERVING, what="tail out")
        a, b = [await cl.list_chunks(t) for t in order[:2]]
        assert a == b and a[0].commit_ver == 3

    run(tmp_path, body, forward_retry_s=0.3)


@pytest.mark.timeout(60)
def test_read_many_matches_single_reads_and_fails_over(tmp_path: Path) -> None:
    """StorageClient.read_many (USRBIO ring batches): holes, EOF, reads across chunks,
    and a corrupt replica answered by another one, as :meth:`StorageClient.read` does."""

    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        chain = cl.routing.chains()[0].chain_id
        rng = random.Random(11)
        inode, chains = 80, [chain]
        data = bytearray(rng.randbytes(4 * CS))
        data[2 * CS : 3 * CS] = bytes(CS)  # chunk 2 never written: a hole
        for idx in (0, 1, 3):
            await cl.write(chain, inode, idx, 0, data[idx * CS : (idx + 1) * CS], chunk_size=CS)
        length = 3 * CS + 5000
        model = bytes(data[:length])
        spans = [(4096, 4096), (CS - 100, 300), (2 * CS + 7, 9000), (3 * CS + 4000, 8192)]
        spans += [(length + 1, 10), (0, 0)] + [(rng.randrange(length), 4096) for _ in range(40)]
        bufs = [bytearray(n) for _, n in spans]
        reqs = [
            (inode, chains, CS, off, b, length) for (off, _), b in zip(spans, bufs, strict=True)
        ]
        reported: list[tuple[int, int | BaseException]] = []
        got = await cl.storage.read_many(reqs, reported.extend)
        for (off, n), b, r in zip(spans, bufs, got, strict=True):
            want = model[off : off + n]
            assert r == len(want) and bytes(b[: len(want)]) == want, (off, n, r)
        # every read reported once, as it finished, with its result
        assert sorted(i for i, _ in reported) == list(range(len(reqs)))
        assert all(got[i] == r for i, r in reported)

        # one replica of chunk 1 goes bad: every read of it still returns the right bytes
        victim = cl.routing.chain_targets(chain)[0]
        eng = c.nodes[c.node_of_target(victim)].targets.by_id(victim).engine
        meta = eng.get(ChunkKey(inode, 1))
        assert meta is not None
        corrupt(eng.data_dir / meta.file, 100)
        bufs = [bytearray(4096) for _ in range(12)]
        reported = []
        got = await cl.storage.read_many(
            [(inode, chains, CS, CS, b, length) for b in bufs], reported.extend
        )
        assert got == [4096] * 12 and sorted(reported) == [(i, 4096) for i in range(12)]
        assert all(bytes(b) == model[CS : CS + 4096] for b in bufs)

    run(tmp_path, body)


@pytest.mark.timeout(90)
def test_file_reads_ask_a_dead_replica_at_most_once(tmp_path: Path) -> None:
    """StorageClient.read: a one-chunk read's first try (no retry machinery) that meets a
    dead replica is answered by another one, and the full path it falls back to never
    asks the dead replica again for that read; reads across chunks too."""

    async def body(c: InProcessCluster, cl: ChunkClient) -> None:
        chain = cl.routing.chains()[0].chain_id
        cl.storage._rng = random.Random(5)  # which replica each read asks first
        inode, chains = 81, [chain]
        data = random.Random(12).randbytes(3 * CS)
        for idx in range(3):
            await cl.write(chain, inode, idx, 0, data[idx * CS : (idx + 1) * CS], chunk_size=CS)
        buf = bytearray(4096)  # every replica's read stream is open before the kill
        for _ in range(6):
            await cl.storage.read(inode, chains, CS, CS, buf, len(data))
        victim = cl.routing.chain_targets(chain)[1]
        await c.kill_node(c.node_of_target(victim))
        stats = cl.storage.stats
        tries = []
        for off, n in [(CS + 50, 4096)] * 40 + [(CS - 1000, CS + 2000)] * 10:
            before = stats["read_retries"]
            buf = bytearray(n)
            assert await cl.storage.read(inode, chains, CS, off, buf, len(data)) == n
            assert bytes(buf) == data[off : off + n]
            tries.append(stats["read_retries"] - before)
        assert max(tries) == 1  # met the dead replica, and only once per read

    run(tmp_path, body)
