"""Inode allocation and chain placement (fs3.meta.alloc, fs3.meta.layout)."""

from __future__ import annotations

import errno
import threading

import pytest

from fs3.errors import Code, FsError
from fs3.kv import open_database
from fs3.meta.alloc import InodeAllocator
from fs3.meta.layout import (
    ChainAllocator,
    NoChainTable,
    NoChainTables,
    StaticChainTables,
    merge_layout,
    validate_layout,
)
from fs3.proto import meta_pb2

pytestmark = pytest.mark.timeout(20)


def test_allocators_sharing_a_db_never_collide() -> None:
    db = open_database("memory://")
    allocs = [InodeAllocator(db, batch=7) for _ in range(3)]
    got: list[int] = []
    lock = threading.Lock()

    def run(a: InodeAllocator) -> None:
        mine = [a.allocate() for _ in range(200)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=run, args=(a,)) for a in allocs for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 1200 and len(set(got)) == 1200
    assert min(got) > 1  # the root's number is never handed out


def test_batch_of_one_and_give_back() -> None:
    db = open_database("memory://")
    a = InodeAllocator(db, batch=1)
    first = a.allocate()
    assert first == 2
    a.give_back(first)
    assert a.allocate() == first
    assert a.allocate() == 3
    assert a.reservations == 2


def test_round_robin_placement() -> None:
    src = StaticChainTables({1: [10, 20, 30, 40, 50]}, version=4)
    alloc = ChainAllocator(src, seed=1)
    d = meta_pb2.Layout(chunk_size=1 << 20, stripe=2, table_id=1)
    placed = [alloc.place(d) for _ in range(5)]
    for p in placed:
        assert p.table_version == 4 and p.stripe == 2 and len(set(p.chain_ids)) == 2
    counts = {c: sum(list(p.chain_ids).count(c) for p in placed) for c in (10, 20, 30, 40, 50)}
    assert set(counts.values()) == {2}  # 5 files x 2 chains spread evenly over 5 chains
    wide = alloc.place(meta_pb2.Layout(chunk_size=1 << 20, stripe=9, table_id=1))
    assert wide.stripe == 5 and sorted(wide.chain_ids) == [10, 20, 30, 40, 50]


def test_placement_never_returns_a_layout_without_chains() -> None:
    d = meta_pb2.Layout(chunk_size=1 << 20, stripe=4, table_id=1)
    with pytest.raises(NoChainTable) as ei:  # no routing at all: a permanent error
        ChainAllocator(NoChainTables()).place(d)
    err = ei.value.error()
    assert err.code == Code.UNKNOWN_CHAIN_TABLE and not err.retryable
    src = StaticChainTables({2: [7]})
    alloc = ChainAllocator(src)
    for tables in ({2: [7]}, {1: [], 2: [7]}):  # table 1 not in routing yet, or empty
        src.tables = tables
        with pytest.raises(NoChainTable) as ei:
            alloc.place(d)
        err = ei.value.error()
        assert err.code == Code.UNKNOWN_CHAIN_TABLE and err.retryable and "table 1" in err.message
    src.tables = {1: [3, 4]}
    assert sorted(alloc.place(d).chain_ids) == [3, 4]


def test_validate_and_merge() -> None:
    validate_layout(meta_pb2.Layout(chunk_size=1 << 20, stripe=1, table_id=1), partial=False)
    validate_layout(meta_pb2.Layout(), partial=True)
    for bad in (
        meta_pb2.Layout(chunk_size=3000),
        meta_pb2.Layout(chunk_size=1 << 31),
        meta_pb2.Layout(stripe=100_000),
    ):
        with pytest.raises(FsError) as ei:
            validate_layout(bad, partial=True)
        assert ei.value.errno == errno.EINVAL
    with pytest.raises(FsError):
        validate_layout(meta_pb2.Layout(chunk_size=4096, stripe=1), partial=False)  # table 0
    m = merge_layout(
        meta_pb2.Layout(chunk_size=4096, stripe=2, table_id=1, chain_ids=[5]),
        meta_pb2.Layout(stripe=8),
    )
    assert (m.chunk_size, m.stripe, m.table_id, list(m.chain_ids)) == (4096, 8, 1, [])


def test_fast_keys_match_tuple_layer() -> None:
    import random

    from fs3.kv import keys as K
    from fs3.meta import schema as S

    rng = random.Random(5)
    for _ in range(500):
        ino = rng.choice(
            [0, 1, 255, 256, 1 << 20, (1 << 64) - 1, 1 << 64, -1, -256, rng.randrange(1 << 40)]
        )
        name = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 20))) + rng.choice(
            [b"", b"\x00", b"\xff"]
        )
        assert S.inode_key(ino) == K.pack("in", ino)
        assert S.dentry_key(ino, name) == K.pack("de", ino, name)
        assert S.xattr_key(ino, name) == K.pack("in", ino, "x", name)
        assert S.encode_dentry(ino, 0o100000) == K.pack(ino, 0o100000)
        assert K.unpack(S.dentry_key(ino, name)) == ("de", ino, name)
        text = name.decode("latin-1") + "é"
        assert S.session_key(ino, text) == K.pack("se", ino, text)
        assert S.idem_key(text) == K.pack("rq", text)
    for n in range(10):  # every byte-count boundary of the integer encoding
        for v in ((1 << 8 * n) - 2, (1 << 8 * n) - 1, 1 << 8 * n):
            assert S.inode_key(v) == K.pack("in", v)


def test_try_allocate_never_waits_for_a_reservation_in_progress() -> None:
    """The meta server's event loop takes numbers with try_allocate and gives them
    back with give_back; a reservation (a KV commit, on a worker thread) in progress
    must not block either."""
    db = open_database("memory://")
    a = InodeAllocator(db, batch=4)
    first = a.allocate()  # numbers reserved
    inside, release = threading.Event(), threading.Event()
    reserve = a._reserve

    def slow_reserve() -> list[int]:
        inside.set()
        assert release.wait(10)
        return reserve()

    a._reserve = slow_reserve  # type: ignore[method-assign]
    while a.try_allocate() is not None:
        pass
    t = threading.Thread(target=a.allocate)
    t.start()
    try:
        assert inside.wait(10)
        got: list[object] = []
        probe = threading.Thread(target=lambda: got.extend([a.try_allocate(), a.give_back(first)]))
        probe.start()
        probe.join(2)
        assert not probe.is_alive(), "try_allocate/give_back waited for the reservation"
        assert got == [None, None]
    finally:
        release.set()
        t.join(10)
