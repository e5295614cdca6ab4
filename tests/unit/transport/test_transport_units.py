"""Pure pieces of fs3.transport: buffer addresses, shm regions, the staging allocator, refs."""

from __future__ import annotations

import mmap
import os
import random
import resource

import numpy as np
import pytest

from fs3.errors import Code, FsError
from fs3.proto import transport_pb2
from fs3.transport import inline_read_ref, is_inline, ref_kind, ref_length
from fs3.transport.region import ShmRegion, buffer_address, process_start_time
from fs3.transport.shm import _Arena


@pytest.mark.timeout(10)
def test_buffer_address_of_views_and_readonly_buffers() -> None:
    ba = bytearray(100)
    base, n = buffer_address(ba)
    assert n == 100
    assert buffer_address(memoryview(ba)[10:20]) == (base + 10, 10)
    ro = memoryview(ba).toreadonly()[5:]
    assert buffer_address(ro) == (base + 5, 95)
    b = b"immutable"
    assert buffer_address(b)[1] == len(b)
    with pytest.raises(TypeError):
        buffer_address(12345)
    # writable buffers take the one-call path: same answers, lengths in bytes, no export kept
    assert buffer_address(memoryview(ba)[8:24].cast("i")) == (base + 8, 16)
    assert buffer_address(bytearray())[1] == 0
    fresh = bytearray(10)
    buffer_address(fresh)
    fresh.extend(b"x")  # would raise BufferError if a view of it were still exported


@pytest.mark.timeout(10)
def test_region_create_open_contains_and_close() -> None:
    r = ShmRegion.create(1 << 16, prefix="fs3-unit")
    try:
        assert os.path.exists(r.path) and r.path.startswith("/dev/shm/fs3-unit-")
        other = ShmRegion.open(r.path)
        try:
            r.buf[100:105] = b"hello"
            assert bytes(other.buf[100:105]) == b"hello"  # same memory, no copy
        finally:
            assert other.close()
        assert os.path.exists(r.path)  # open() never unlinks
        assert r.offset_of(r.buf[4096:8192]) == 4096
        assert r.offset_of(memoryview(bytearray(10))) is None
        view = r.buf[0:10]
        assert r.close() is False  # a live view keeps the mapping
        assert r.closed and not os.path.exists(r.path)
        assert r.offset_of(view) is None
        view.release()
        assert r.close() is True
    finally:
        r.close()


@pytest.mark.timeout(10)
def test_region_open_refuses_files_outside_dev_shm(tmp_path: object) -> None:
    for path in ("/etc/passwd", "/dev/shm/../etc/passwd", "/dev/shm/no-such-region"):
        with pytest.raises(FsError) as ei:
            ShmRegion.open(path, 10)
        assert ei.value.code == Code.INVALID_ARGUMENT
    link = f"/dev/shm/fs3-unit-link-{os.getpid()}"
    os.symlink("/etc/passwd", link)
    try:
        with pytest.raises(FsError):
            ShmRegion.open(link, 10)  # a symlink out of /dev/shm
    finally:
        os.unlink(link)
    r = ShmRegion.create(4096, prefix="fs3-unit")
    try:
        with pytest.raises(FsError):
            ShmRegion.open(r.path, 8192)  # larger than the file
    finally:
        r.close()
    with pytest.raises(FsError):
        ShmRegion.create(0)


@pytest.mark.timeout(10)
def test_process_start_time() -> None:
    assert process_start_time(os.getpid())
    assert process_start_time(2**22 + 12345) is None


@pytest.mark.timeout(10)
def test_arena_allocator_first_fit_and_coalescing() -> None:
    class FakeRegion:
        size = 1 << 20

    arena = _Arena(FakeRegion(), dedicated=False)  # type: ignore[arg-type]
    rng = random.Random(3)
    live: list[tuple[int, int]] = []
    for _ in range(2000):
        if live and rng.random() < 0.5:
            off, n = live.pop(rng.randrange(len(live)))
            arena.release(off, n)
        else:
            n = rng.choice([1, 4096, 5000, 65536])
            got = arena.alloc(n)
            if got is None:
                continue
            off = got
            rounded = max(4096, (n + 4095) // 4096 * 4096)
            for o, m in live:  # no overlap with anything live
                mr = max(4096, (m + 4095) // 4096 * 4096)
                assert off + rounded <= o or o + mr <= off
            assert off + rounded <= FakeRegion.size
            live.append((off, n))
    for off, n in live:
        arena.release(off, n)
    assert arena.used == 0 and arena.free == [(0, 1 << 20)]
    assert arena.alloc(2 << 20) is None


def test_ref_helpers() -> None:
    assert is_inline(transport_pb2.DataRef())
    r = inline_read_ref()
    assert r.WhichOneof("kind") == "inline" and is_inline(r)
    r2 = transport_pb2.DataRef.FromString(r.SerializeToString())
    assert is_inline(r2) and r2.WhichOneof("kind") == "inline"  # survives the wire
    shm = transport_pb2.DataRef(shm=transport_pb2.ShmRef(region="a", offset=1, length=7))
    assert ref_kind(shm) == "shm" and ref_length(shm) == 7 and not is_inline(shm)
    tcp = transport_pb2.DataRef(tcp=transport_pb2.TcpRef(conn_id=1, transfer_id=2, length=9))
    assert ref_kind(tcp) == "tcp" and ref_length(tcp) == 9
    assert ref_length(transport_pb2.DataRef(inline=b"abc")) == 3


def test_anonymous_mmap_is_not_a_region() -> None:
    mm = mmap.mmap(-1, 4096)
    r = ShmRegion.create(4096, prefix="fs3-unit")
    try:
        assert r.offset_of(memoryview(mm)) is None
    finally:
        r.close()
        mm.close()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("size", [0, 100, 8192, 1 << 20])
def test_shm_fetch_returns_a_private_aligned_copy(size: int) -> None:
    """A one-sided write payload is copied once: later writes by the sender do not reach it.

    ``ServerTransport.fetch`` of a shm ref is what the storage node checksums, stages
    and forwards; it must be the node's own memory (the sender reuses its buffer once
    it gives up) and stay page aligned so an O_DIRECT write can still DMA from it.
    """
    import asyncio

    from fs3.storage.chunk_data import page_aligned
    from fs3.transport.server import ServerTransport

    r = ShmRegion.create(1 << 20, prefix="fs3-unit")
    st = ServerTransport(copy_thread_threshold=256 << 10)  # 1 MiB: the threaded copy
    try:
        req = transport_pb2.RegisterRegionRequest(client_id="c", region=r.id, size=r.size)
        st.regions.register_handle(req, os.dup(r.fd), os.getpid(), os.getuid())
        data = random.Random(size).randbytes(size)
        r.buf[:size] = data
        ref = transport_pb2.DataRef(shm=transport_pb2.ShmRef(region=r.id, offset=0, length=size))
        got = asyncio.run(st.fetch(ref))
        r.buf[:size] = b"\xff" * size  # the sender reuses its buffer
        assert bytes(got) == data
        assert r.offset_of(got) is None  # not a view of the region
        if size % mmap.PAGESIZE == 0 and size:
            assert page_aligned(got)
        got.release()
    finally:
        st.regions.unregister("c", r.id)
        r.close()


@pytest.mark.timeout(10)
def test_private_copies_reuse_a_mapping_only_once_no_view_is_left() -> None:
    """Pooled copy buffers: no release call, so reuse must follow the views' lifetime."""
    from fs3.transport.region import PrivateCopies

    pc = PrivateCopies(cache_bytes=256 << 10)
    src = memoryview(bytearray(b"a" * 100_000))
    a = pc.copy(src)
    a_sub = a[10:20]  # a slice keeps the mapping busy too
    a_addr = buffer_address(a)[0]
    del a
    b = pc.copy(memoryview(b"b" * 100_000))
    assert buffer_address(b)[0] != a_addr, "a mapping with a live view was handed out again"
    assert bytes(a_sub) == b"a" * 10 and bytes(b[:3]) == b"bbb"
    del a_sub
    c = pc.copy(memoryview(b"c" * 70_000))  # same size class: the first mapping is free again
    assert buffer_address(c)[0] == a_addr and bytes(c) == b"c" * 70_000
    assert pc.cached_bytes == 256 << 10  # two 128 KiB mappings: the cap
    d = pc.copy(memoryview(b"d" * 100_000))  # both busy, pool full: a mapping of its own
    assert pc.cached_bytes == 256 << 10 and bytes(d[-3:]) == b"ddd"
    assert buffer_address(d)[0] % mmap.PAGESIZE == 0


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _touch_pages(buf: memoryview) -> None:
    """Write a zero to the last byte of every page of ``buf`` (the tests keep zeros there).

    Writes only: a read first would map neighbouring pages too (fault-around).
    """
    np.frombuffer(buf, dtype=np.uint8)[mmap.PAGESIZE - 1 :: mmap.PAGESIZE] = 0


@pytest.mark.timeout(30)
def test_populate_allocated_maps_the_owners_pages_only() -> None:
    """A region mapped by a second process (here a second mapping) gets its allocated pages at
    once, bytes unchanged; holes stay holes, so a sparse region never becomes memory."""
    size = 8 << 20
    owner = ShmRegion.create(size, prefix="fs3-unit")
    try:
        owner.buf[:5] = b"hello"
        owner.buf[3 << 20 : (3 << 20) + 5] = b"world"  # two written pages, the rest holes
        other = ShmRegion.from_fd(os.dup(owner.fd), size, owner.id)
        try:
            assert other.populate_allocated() == 2 * mmap.PAGESIZE
            assert os.fstat(owner.fd).st_blocks * 512 == 2 * mmap.PAGESIZE  # nothing allocated
        finally:
            other.close()
        os.posix_fallocate(owner.fd, 0, size)  # the owner allocates everything
        other = ShmRegion.from_fd(os.dup(owner.fd), size, owner.id)
        try:
            assert other.populate_allocated(step=1 << 20) == size
            f0 = _minflt()
            _touch_pages(other.buf)
            assert _minflt() - f0 < 64  # 2048 pages, already mapped
            assert bytes(other.buf[:5]) == b"hello"
            assert bytes(other.buf[3 << 20 : (3 << 20) + 5]) == b"world"
            assert not any(other.buf[1 << 20 : 2 << 20])
        finally:
            other.close()
        # without the call the same writes fault page by page (what the call saves)
        other = ShmRegion.from_fd(os.dup(owner.fd), size, owner.id)
        try:
            f0 = _minflt()
            _touch_pages(other.buf)
            assert _minflt() - f0 >= size // mmap.PAGESIZE // 2
        finally:
            other.close()
        closed = ShmRegion.from_fd(os.dup(owner.fd), size, owner.id)
        closed.close()
        assert closed.populate_allocated() == 0  # a closed region: nothing
    finally:
        owner.close()


@pytest.mark.timeout(30)
def test_registry_maps_a_registered_regions_pages_in_the_background() -> None:
    from fs3.transport.server import ServerTransport

    size = 4 << 20
    r = ShmRegion.create(size, prefix="fs3-unit")
    os.posix_fallocate(r.fd, 0, size)
    st = ServerTransport()
    try:
        req = transport_pb2.RegisterRegionRequest(client_id="c", region=r.id, size=r.size)
        st.regions.register_handle(req, os.dup(r.fd), os.getpid(), os.getuid())
        populator = st.regions._populator
        assert populator is not None
        populator.submit(lambda: None).result(timeout=20)  # one worker: the populate is done
        view = st.regions.view(transport_pb2.ShmRef(region=r.id, offset=0, length=size))
        f0 = _minflt()
        _touch_pages(view)
        assert _minflt() - f0 < 32  # a server writing a read into it faults nothing
        view.release()
    finally:
        st.regions.unregister("c", r.id)
        r.close()
