"""Layout math: offsets → chunks → chains, splitting, the portable shuffle."""

from __future__ import annotations

import errno
import random

import pytest

from fs3.client import layout as L
from fs3.errors import FsError

pytestmark = pytest.mark.timeout(10)


def test_splitmix64_known_vector() -> None:
    # Reference values of splitmix64 seeded with 0 (first three outputs).
    state, out = L.splitmix64(0)
    assert out == 0xE220A8397B1DCDAF
    state, out = L.splitmix64(state)
    assert out == 0x6E789E6AA1B965F4
    state, out = L.splitmix64(state)
    assert out == 0x06C45D188009454F


def test_shuffle_is_deterministic_permutation() -> None:
    items = list(range(1, 201))
    a = L.portable_shuffle(items, 12345)
    b = L.portable_shuffle(items, 12345)
    c = L.portable_shuffle(items, 54321)
    assert a == b
    assert a != c
    assert sorted(a) == items
    assert L.portable_shuffle(items, 0) == items


def test_chain_window_wraps_and_is_one_based() -> None:
    table = [11, 12, 13, 14, 15]
    assert L.chain_window(table, 1, 3) == [11, 12, 13]
    assert L.chain_window(table, 4, 3) == [14, 15, 11]
    assert L.chain_window(table, 5, 7) == [15, 11, 12, 13, 14, 15, 11]
    shuffled = L.chain_window(table, 2, 5, seed=7)
    assert sorted(shuffled) == sorted(table)
    with pytest.raises(FsError):
        L.chain_window([], 1, 1)
    with pytest.raises(FsError):
        L.chain_window(table, 0, 1)


def test_layout_validate() -> None:
    L.Layout(chunk_size=1 << 20, stripe=2, chain_ids=(1, 2)).validate()
    for bad in (
        L.Layout(chunk_size=1000),
        L.Layout(chunk_size=1 << 31),
        L.Layout(stripe=0),
        L.Layout(stripe=2, chain_ids=(1,)),
        L.Layout(stripe=1, chain_ids=(0,)),
    ):
        with pytest.raises(FsError) as ei:
            bad.validate()
        assert ei.value.errno == errno.EINVAL


def test_layout_chains_explicit_or_from_table() -> None:
    assert L.Layout(stripe=2, chain_ids=(7, 9)).chains() == [7, 9]
    lay = L.Layout(stripe=3, base_index=2)
    assert lay.chains([1, 2, 3, 4]) == [2, 3, 4]
    with pytest.raises(FsError):
        lay.chains()


def test_split_examples() -> None:
    cs = 4096
    chains = [5, 6, 7]
    assert L.split(0, 0, cs, chains) == []
    p = L.split(100, 10, cs, chains)
    assert p == [L.ChunkPiece(0, 5, 100, 10, 0, 100)]
    p = L.split(4000, 5000, cs, chains)
    assert [(x.index, x.chain_id, x.offset, x.length, x.buf_offset) for x in p] == [
        (0, 5, 4000, 96, 0),
        (1, 6, 0, 4096, 96),
        (2, 7, 0, 808, 4192),
    ]
    p = L.split(3 * cs, cs, cs, chains)
    assert [(x.index, x.chain_id) for x in p] == [(3, 5)]


def test_split_random_covers_exactly() -> None:
    rng = random.Random(42)
    for _ in range(2000):
        cs = 1 << rng.randint(12, 16)
        chains = [rng.randint(1, 100) for _ in range(rng.randint(1, 8))]
        off = rng.randint(0, 10 * cs)
        n = rng.randint(0, 5 * cs)
        pieces = L.split(off, n, cs, chains)
        assert sum(p.length for p in pieces) == n
        pos = off
        for p in pieces:
            assert p.file_offset == pos
            assert p.buf_offset == pos - off
            assert p.index == pos // cs and p.offset == pos % cs
            assert 0 < p.length <= cs - p.offset
            assert p.chain_id == chains[p.index % len(chains)]
            pos += p.length


def test_split_errors() -> None:
    with pytest.raises(FsError):
        L.split(0, -1, 4096, [1])
    with pytest.raises(FsError):
        L.split(0, 1, 4096, [])
    with pytest.raises(FsError) as ei:
        L.split(4096 << 32, 1, 4096, [1])
    assert ei.value.errno == errno.EFBIG
    # The last addressable byte is fine.
    assert L.split((4096 << 32) - 1, 1, 4096, [1])[0].index == (1 << 32) - 1


def test_chunks_from() -> None:
    assert L.chunks_from(0, 4096) == 0
    assert L.chunks_from(1, 4096) == 1
    assert L.chunks_from(4096, 4096) == 1
    assert L.chunks_from(4097, 4096) == 2
