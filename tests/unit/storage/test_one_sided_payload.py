"""A one-sided (shm) write payload: the bytes stored are exactly the bytes verified.

The storage node fetches a same-host client's payload from the client's shared
memory by reference. The client reuses that memory once its attempt times out,
possibly while the node is still staging the update, so the checksum check and
the stage must read one private copy (``ServerTransport.fetch``), not the
client's memory twice. These tests overwrite the client's buffer between the
check and the stage (a hook on the engine's ``stage_write``) on a head and on a
tail, with a real shm region registered by descriptor with a real server
transport.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from fs3.config import StorageSection
from fs3.errors import Code, FsError
from fs3.proto import mgmtd_pb2, storage_pb2, transport_pb2
from fs3.routing import SERVING, Routing
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine, crc32c
from fs3.storage.craq import Replicator
from fs3.storage.target import StorageTarget, TargetMap
from fs3.transport.region import ShmRegion
from fs3.transport.server import ServerTransport

pytestmark = pytest.mark.timeout(30)

CS = 1 << 20
KEY = ChunkKey(7, 0)


def _routing(states: dict[int, int]) -> Routing:
    info = mgmtd_pb2.RoutingInfo(version=2)
    ch = info.chains.add(chain_id=1, version=1)
    for tid, st in states.items():
        ch.targets.add(target_id=tid, public_state=st)  # type: ignore[arg-type]
    return Routing(info)


def _register(st: ServerTransport, region: ShmRegion) -> None:
    req = transport_pb2.RegisterRegionRequest(client_id="c", region=region.id, size=region.size)
    st.regions.register_handle(req, os.dup(region.fd), os.getpid(), os.getuid())


@dataclass
class Node:
    eng: FileChunkEngine
    tmap: TargetMap
    st: ServerTransport
    region: ShmRegion  # the client's registered write-behind memory

    def route(self, states: dict[int, int]) -> None:
        self.tmap.apply_routing(_routing({}))
        self.tmap.apply_routing(_routing(states))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    eng = FileChunkEngine(tmp_path / "t", fsync=False, block_size=64 << 10)
    n = Node(
        eng,
        TargetMap([StorageTarget(101, str(tmp_path), eng)]),
        ServerTransport(copy_thread_threshold=256 << 10),
        ShmRegion.create(CS, prefix="fs3-test-onesided"),
    )
    try:
        _register(n.st, n.region)
        yield n
    finally:
        eng.close()
        n.st.regions.unregister("c", n.region.id)
        n.region.close()


def _io(data: bytes, region: ShmRegion, update_ver: int = 0) -> storage_pb2.UpdateIO:
    region.buf[: len(data)] = data  # the client's write-behind buffer
    u = storage_pb2.UpdateIO(
        chain_id=1,
        chain_version=1,
        type=storage_pb2.UPDATE_WRITE,
        offset=0,
        length=len(data),
        chunk_size=CS,
        checksum=crc32c(data),
        update_ver=update_ver,
    )
    u.chunk.inode, u.chunk.index = KEY.inode, KEY.index
    u.data.shm.region, u.data.shm.offset, u.data.shm.length = region.id, 0, len(data)
    return u


@pytest.mark.parametrize("role", ["head", "tail"])
@pytest.mark.parametrize("size", [5000, 64 << 10, 512 << 10])  # inline copy and threaded copy
def test_buffer_reused_before_the_stage_changes_nothing_stored(
    node: Node, role: str, size: int
) -> None:
    """The client's buffer is overwritten after the checksum check, before the stage.

    Before, the stage copied the client's new bytes under the old checksum: a
    tail committed them, a head (after its retry) would have re-driven them.
    Now the node stages its verified private copy: the chunk holds the bytes
    whose checksum was checked, and every checksum of the version matches them.
    """
    node.route({201: SERVING, 101: SERVING} if role == "tail" else {101: SERVING})
    eng, tmap, st, region = node.eng, node.tmap, node.st, node.region
    old, new, other = b"o" * size, os.urandom(size), b"X" * size
    real_stage = eng.stage_write
    overwritten = 0

    def stage_write(*a: object, **kw: object) -> object:
        nonlocal overwritten
        overwritten += 1
        region.buf[:size] = other  # the client reused its buffer (attempt timed out)
        return real_stage(*a, **kw)  # type: ignore[arg-type]

    async def update(rep: Replicator, data: bytes, uv: int) -> storage_pb2.IOResult:
        if role == "head":
            tag = storage_pb2.UpdateTag(client_id="c", channel_id=1, seqnum=uv)
            return await rep.client_update(_io(data, region), tag)
        req = storage_pb2.UpdateRequest(
            io=_io(data, region, uv), from_target_id=201, to_target_id=101
        )
        return await rep.successor_update(req)

    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            rep = Replicator(tmap, StorageSection(), st, None, pool, lambda: None)  # type: ignore[arg-type]
            await update(rep, old, 1)  # the normal path commits
            assert eng.read(KEY, 0, CS)[1] == old
            eng.stage_write = stage_write  # type: ignore[method-assign]
            res = await update(rep, new, 2)
            assert overwritten == 1
            assert res.commit_ver == 2 and res.checksum == crc32c(new)
            meta, got = eng.read(KEY, 0, CS)  # verifies every block checksum
            assert got == new, "bytes the client wrote after the check were stored"
            assert meta.checksum == crc32c(new) and meta.commit_ver == 2

    asyncio.run(main())


def test_bad_payload_length_is_refused_before_any_copy(node: Node) -> None:
    """A ref longer than the update's length is refused up front (no copy of it)."""
    node.route({101: SERVING})
    eng, tmap, st, region = node.eng, node.tmap, node.st, node.region

    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            rep = Replicator(tmap, StorageSection(), st, None, pool, lambda: None)  # type: ignore[arg-type]
            io = _io(b"z" * 100, region)
            io.data.shm.length = CS
            with pytest.raises(FsError) as ei:
                await rep.client_update(io, storage_pb2.UpdateTag())
            assert ei.value.code == Code.INVALID_ARGUMENT
            assert eng.get(KEY) is None

    asyncio.run(main())
