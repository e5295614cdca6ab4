"""The ``auto`` transport's choice per I/O (fs3/transport/auto.py), without a server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from fs3.errors import Code, FsError
from fs3.transport import ShmRegion, client_transport, is_inline, ref_kind
from fs3.transport.auto import AutoClientTransport
from fs3.transport.shm import ShmClientTransport, _NodeState

pytestmark = pytest.mark.timeout(20)

LOCAL, REMOTE = "127.0.0.1:1", "10.9.9.9:1"


@contextlib.asynccontextmanager
async def staged(t: AutoClientTransport, size: int) -> AsyncIterator[memoryview]:
    """A staging buffer of ``t`` (as the write-behind engine takes one); closes ``t`` after."""
    got = t.staging_buffer(size)
    assert got is not None
    buf, release = got
    try:
        yield buf
    finally:
        release()
        t._last = None
        await t.close()


def test_one_sided_only_for_registered_regions_on_local_nodes() -> None:
    async def main() -> None:
        t = client_transport("auto", "c1")
        assert isinstance(t, AutoClientTransport) and t.kind == "auto"
        t._is_local = lambda addr: addr == LOCAL  # type: ignore[method-assign]
        region = ShmRegion.create(1 << 20, prefix="fs3-test-auto")
        plain = memoryview(bytearray(4096))
        try:
            inside = region.buf[8192 : 8192 + 4096]
            assert not t.one_sided(LOCAL, inside)  # not registered yet
            await t.register_region(region)
            assert t.one_sided(LOCAL, inside)
            assert not t.one_sided(REMOTE, inside)  # another host cannot map it
            assert not t.one_sided(LOCAL, plain)  # never staged: the frame is cheaper
            # refs (gRPC RPCs): inline unless one-sided; nothing registered remotely
            ref, _ = await t.read_ref(REMOTE, "", inside)
            assert is_inline(ref)
            ref, _ = await t.write_ref(LOCAL, "", plain)
            assert is_inline(ref) and ref.inline == bytes(4096)
            assert t.stats["one_sided"] == 1
            del inside
        finally:
            await t.close()
            region.close()

    asyncio.run(main())


def test_staging_buffers_are_one_sided_on_local_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The write-behind buffer is written in a staging arena: a same-host node reads it
    there (no socket copy) once the arena is registered on it; until then, and for another
    host, it goes as the frame's payload. A write never waits for the registration."""
    import fs3.transport.shm as shm_mod

    sent: list[str] = []
    monkeypatch.setattr(shm_mod, "send_region", lambda path, cid, region, timeout: sent.append(cid))

    async def main() -> None:
        t = AutoClientTransport("c3", is_local=lambda addr: addr == LOCAL)
        async with staged(t, 1 << 20) as buf:
            buf[:5] = b"hello"
            assert not t.one_sided(LOCAL, buf)  # not registered there yet: started, frame now
            assert not t.one_sided(LOCAL, buf)  # still under way: no second registration
            await asyncio.gather(*list(t._bg))
            assert sent == ["c3"]
            assert t.one_sided(LOCAL, buf)
            assert not t.one_sided(REMOTE, buf)
            assert not t.one_sided(LOCAL, memoryview(bytearray(4096)))  # still never staged
            assert t.one_sided(LOCAL, buf)
            ref, _ = await t.write_ref(LOCAL, "", buf)
            assert ref_kind(ref) == "shm" and ref.shm.length == 1 << 20
            assert sent == ["c3"]  # registered once
            ref, _ = await t.write_ref(REMOTE, "", buf)
            # gRPC RPCs only; over native RPC the storage client sends a frame
            assert is_inline(ref)
            assert t.stats["one_sided"] == 2

    asyncio.run(main())


def test_forwarding_stages_for_same_host_successors_only() -> None:
    """A storage node forwards a payload it holds through shm to a same-host successor
    (one copy into a staging arena) and as the frame's payload (None) to another host."""

    async def main() -> None:
        t = AutoClientTransport("c4", is_local=lambda addr: addr == LOCAL)
        registered: list[str] = []

        async def fake_register(node: str, region: ShmRegion) -> None:
            registered.append(node)

        t._ensure_registered = fake_register  # type: ignore[method-assign]
        payload = memoryview(bytes(range(256)) * 64)
        try:
            assert await t.forward_ref(REMOTE, "", payload) is None
            got = await t.forward_ref(LOCAL, "", payload)
            assert got is not None
            ref, sent = got
            assert ref_kind(ref) == "shm" and ref.shm.length == len(payload)
            (arena,) = t._staging.arenas
            assert (
                bytes(arena.region.buf[ref.shm.offset : ref.shm.offset + len(payload)]) == payload
            )
            assert registered == [LOCAL]
            await sent
            del got, sent  # the caller is done with the RPC: the staged copy is freed
            assert arena.used == 0
        finally:
            await t.close()

    asyncio.run(main())


def test_a_node_that_cannot_map_our_memory_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        t = AutoClientTransport("c2", is_local=lambda addr: True)
        region = ShmRegion.create(1 << 20, prefix="fs3-test-auto")
        calls = []

        async def refuse(node: str, reg: ShmRegion) -> None:
            calls.append(node)
            raise FsError(Code.INVALID_ARGUMENT, "RegisterRegion: owner pid 7 does not exist")

        try:
            await t.register_region(region)
            view = region.buf[:4096]
            assert t.one_sided(LOCAL, view)
            # what registering answers from a node in another PID namespace
            monkeypatch.setattr(
                ShmClientTransport, "_ensure_registered", lambda self, n, r: refuse(n, r)
            )
            with pytest.raises(FsError) as ei:
                await t.read_ref(LOCAL, "", view)
            assert ei.value.code == Code.TRANSPORT and ei.value.retryable
            assert calls == [LOCAL] and t.stats["fallback"] == 1
            assert not t.one_sided(LOCAL, view)  # remembered: frames from now on
            ref, _ = await t.read_ref(LOCAL, "", view)
            assert ref_kind(ref) == "inline"
            t.forget_node(LOCAL)  # e.g. the node restarted: ask again
            assert t.one_sided(LOCAL, view)
            del view
        finally:
            t._last = None
            await t.close()
            region.close()

    asyncio.run(main())


def test_a_restarted_node_that_forgot_our_regions_is_retried_after_registering_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that restarted answers "unknown shm region": the write's error becomes
    retryable and the node's registrations are forgotten, so the retry registers again."""
    import fs3.transport.shm as shm_mod
    from fs3.transport.shm import UNKNOWN_REGION, regions_lost

    monkeypatch.setattr(shm_mod, "send_region", lambda path, cid, region, timeout: None)

    async def main() -> None:
        t = AutoClientTransport("c5", is_local=lambda addr: addr == LOCAL)
        async with staged(t, 4096) as buf:
            assert not t.one_sided(LOCAL, buf)
            await asyncio.gather(*list(t._bg))
            assert t.one_sided(LOCAL, buf)
            other = FsError(Code.INVALID_ARGUMENT, "offset out of range")
            assert regions_lost(t, LOCAL, other) is other  # any other error: as it was
            assert t.one_sided(LOCAL, buf)
            e = regions_lost(t, LOCAL, FsError(Code.INVALID_ARGUMENT, f"{UNKNOWN_REGION} r1"))
            assert e.code == Code.TRANSPORT and e.retryable
            assert not t.one_sided(LOCAL, buf)  # registering again, a frame meanwhile
            await asyncio.gather(*list(t._bg))
            assert t.one_sided(LOCAL, buf)

    asyncio.run(main())


def test_read_ref_ready_only_once_the_node_mapped_the_region(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The per-I/O fast path: a ref without an await, only for a region the node has."""

    async def main() -> None:
        t = AutoClientTransport("c3", is_local=lambda addr: addr == LOCAL)
        region = ShmRegion.create(1 << 20, prefix="fs3-test-auto")
        sent: list[str] = []

        async def registered(self: ShmClientTransport, node: str, reg: ShmRegion) -> None:
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            self._nodes.setdefault(node, _NodeState()).registered[reg.id] = fut
            sent.append(node)

        monkeypatch.setattr(ShmClientTransport, "_ensure_registered", registered)
        plain = memoryview(bytearray(4096))
        try:
            inside = region.buf[8192 : 8192 + 4096]
            assert t.read_ref_ready(LOCAL, inside) is None  # not registered with us
            await t.register_region(region)
            assert t.read_ref_ready(LOCAL, inside) is None  # not yet mapped by the node
            ref, _ = await t.read_ref(LOCAL, "", inside)  # the first I/O registers it
            assert sent == [LOCAL] and ref_kind(ref) == "shm"
            ready = t.read_ref_ready(LOCAL, inside)
            assert ready is not None and ready == ref
            assert (ready.shm.region, ready.shm.offset, ready.shm.length) == (region.id, 8192, 4096)
            assert t.read_ref_ready(REMOTE, inside) is None  # that node never mapped it
            assert t.read_ref_ready(LOCAL, plain) is None  # outside every region
            assert t.read_ref_ready(LOCAL, inside.toreadonly()) is None  # not a destination
            t.forget_node(LOCAL)  # e.g. the node restarted: register again first
            assert t.read_ref_ready(LOCAL, inside) is None
            await t.read_ref(LOCAL, "", inside)
            assert t.read_ref_ready(LOCAL, inside) is not None
            await t.unregister_region(region)  # gone from the client: never named again
            assert t.read_ref_ready(LOCAL, inside) is None
            del inside
        finally:
            t._last = None
            await t.close()
            region.close()

    asyncio.run(main())


def _exists(path: str) -> bool:
    return os.path.exists(path)


def test_staging_arena_has_no_file_while_in_use() -> None:
    """Nodes get a staging arena by descriptor, never by name, so its /dev/shm file
    is removed when the arena is made: a process killed at any point (SIGKILL, a
    supervisor's SIGTERM while close still waits on nodes) leaves no file behind."""

    async def main() -> None:
        t = AutoClientTransport("c9", is_local=lambda addr: addr == LOCAL)
        async with staged(t, 4096) as buf:
            (arena,) = t._staging.arenas
            assert not _exists(arena.region.path)
            assert os.fstat(arena.region.fd).st_nlink == 0  # the memory lives on the descriptor
            buf[:5] = b"hello"
            assert bytes(arena.region.buf[:5]) == b"hello"

    asyncio.run(main())


def test_killed_process_leaves_no_staging_file() -> None:
    """A child that made staging memory and was killed with SIGKILL leaves nothing in /dev/shm."""
    code = (
        "import asyncio, os, sys\n"
        "from fs3.transport.auto import AutoClientTransport\n"
        "t = AutoClientTransport('c9', is_local=lambda a: False)\n"
        "got = t.staging_buffer(4096)\n"
        "assert got is not None\n"
        "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"fs3-staging-{child.pid}-")]
    finally:
        child.kill()
        child.wait(timeout=10)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"fs3-staging-{child.pid}-")]
