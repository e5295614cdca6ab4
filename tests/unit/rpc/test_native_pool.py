"""fs3.rpc.native.pool: a buffer is lent again only once no view of it is left."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from fs3.rpc.native.pool import MIN_CLASS, BufferPool, anonymous_mapping

pytestmark = pytest.mark.timeout(30)

MAKERS = pytest.mark.parametrize("make", [anonymous_mapping, bytearray], ids=["mmap", "bytearray"])


@MAKERS
def test_buffer_is_reused_only_when_no_view_is_left(make: Any) -> None:
    pool = BufferPool(cache_bytes=4 * MIN_CLASS, make=make)
    a = pool.take(1000)
    assert len(a) == 1000 and not a.readonly
    a[:3] = b"abc"
    b = pool.take(1000)  # a is alive: another mapping
    b[:3] = b"xyz"
    assert bytes(a[:3]) == b"abc"
    part = a[1:2]  # a slice holds the mapping too
    del a
    c = pool.take(1000)
    c[:3] = b"123"
    assert bytes(part) == b"b"
    assert pool.cached_bytes == 3 * MIN_CLASS
    del part, c
    d = pool.take(MIN_CLASS)  # the first mapping again: nothing new
    assert bytes(d[:3]) == b"abc" and pool.cached_bytes == 3 * MIN_CLASS


@MAKERS
def test_sizes_round_up_to_a_class_and_the_cap_holds(make: Any) -> None:
    pool = BufferPool(cache_bytes=3 * MIN_CLASS, make=make)
    big = pool.take(MIN_CLASS + 1)  # a 2 * MIN_CLASS mapping
    small = [pool.take(10) for _ in range(3)]  # one pooled, two beyond the cap
    assert pool.cached_bytes == 3 * MIN_CLASS
    assert len(big) == MIN_CLASS + 1 and all(len(s) == 10 for s in small)
    for s in small:
        s[:] = b"0123456789"  # every buffer is usable, pooled or not
    del big, small
    assert pool.cached_bytes == 3 * MIN_CLASS


@MAKERS
def test_views_dropped_on_other_threads_free_the_buffer(make: Any) -> None:
    pool = BufferPool(cache_bytes=MIN_CLASS, make=make)
    box = [pool.take(100)]
    t = threading.Thread(target=box.clear)
    t.start()
    t.join()
    pool.take(100)
    assert pool.cached_bytes == MIN_CLASS
