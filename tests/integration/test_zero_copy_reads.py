"""Reads land in the caller's shared-memory buffer without a copy through Python bytes.

With the shipped defaults (``[transport] kind = "auto"``, the native RPC) a read
into a buffer inside a registered region (a USRBIO Iov) from a storage node on
the same host is one-sided: the node ``preadv``s the chunk into the region
itself. From a node on another host (simulated here: the transport is told no
node is local) the bytes are the native frame's payload, received by the
buffered protocol straight into the same buffer. Either way no payload-sized
object is allocated per read in this process: tracemalloc's peak stays far
below one read's size, while a read that does copy (into a fresh buffer)
raises it by at least that much, so the check can fail.

The storage nodes are real processes, so every allocation tracemalloc sees is
the client's.
"""

from __future__ import annotations

import asyncio
import os
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest

from fs3.client.chunk_client import ChunkClient
from fs3.client.mgmtd_client import MgmtdClient
from fs3.config import TransportSection
from fs3.errors import Code, FsError
from fs3.launcher import ClusterSpec
from fs3.routing import SERVING, Routing
from fs3.testing import procs
from fs3.transport import ShmRegion
from fs3.transport.auto import AutoClientTransport

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MiB = 1 << 20
CHUNKS = 4
INODE = 0x0100_0000_0000_0007
DEFAULT_KIND = TransportSection().kind


def test_the_shipped_default_is_auto() -> None:
    # fs3 cluster up (and scripts/up.sh, which runs it), the deploy templates
    # (tests/unit/test_deploy_configs.py keeps them equal to fs3/config.py) and
    # docker-compose (its configs are those templates) all use this default
    assert DEFAULT_KIND == "auto"
    assert ClusterSpec().transport == "auto"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[procs.MiniCluster]:
    with procs.MiniCluster(tmp_path, nodes=3, transport=DEFAULT_KIND, fsync=False) as c:
        yield c


async def _serving(admin: MgmtdClient, timeout_s: float = 30.0) -> Routing:
    deadline = time.monotonic() + timeout_s
    created = False
    while True:
        try:
            info = await admin.get_routing(0)
        except FsError:
            info = None
        r = Routing(info) if info is not None else Routing.empty()
        if not created and all(r.target_alive(t) for t in (101, 201, 301)):
            try:
                await admin.create_chain_table(1, 3)
                created = True
            except FsError as e:  # registered, first heartbeat not seen yet
                if e.code != Code.CANNOT_SATISFY:
                    raise
        chains = r.chains()
        if created and chains and all(t.public_state == SERVING for t in chains[0].targets):
            return r
        assert time.monotonic() < deadline, f"cluster not serving: {chains}"
        await asyncio.sleep(0.1)


async def _reads_peak(cl: ChunkClient, chain: int, dests: list[memoryview]) -> int:
    """Peak traced bytes above the start while reading every chunk into ``dests``."""
    for tid in (await cl.refresh()).chain_targets(
        chain
    ):  # connections, read streams, registrations
        await cl.read(chain, INODE, 0, 0, MiB, into=dests[0], target_id=tid)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for rnd in range(2):
            for i in range(CHUNKS):
                await cl.read(chain, INODE, i, 0, MiB, into=dests[(i + rnd) % len(dests)])
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_reads_into_a_region_copy_nothing(cluster: procs.MiniCluster) -> None:
    async def main() -> None:
        admin = MgmtdClient.from_cluster_file(
            str(cluster.cluster_file), timeout_s=2.0, retry_deadline_s=20.0
        )
        region = ShmRegion.create(CHUNKS * MiB, prefix="fs3-test-iov")
        local = ChunkClient(admin, DEFAULT_KIND)
        remote_tr = AutoClientTransport("zero-copy-remote", is_local=lambda _addr: False)
        remote = ChunkClient(admin, remote_tr)
        try:
            r = await _serving(admin)
            chain = r.chains()[0].chain_id
            data = [os.urandom(MiB) for _ in range(CHUNKS)]
            for i, d in enumerate(data):
                await local.write(chain, INODE, i, 0, d, chunk_size=MiB)
            dests = [region.buf[i * MiB : (i + 1) * MiB] for i in range(CHUNKS)]

            # same host: one-sided shm into the region
            assert isinstance(local.transport, AutoClientTransport)
            await local.transport.register_region(region)
            peak = await _reads_peak(local, chain, dests)
            assert local.transport.stats["one_sided"] >= 2 * CHUNKS
            assert peak < MiB // 4, f"same-host read allocated {peak} bytes"
            for i in range(CHUNKS):  # the last round put chunk i in dests[(i + 1) % CHUNKS]
                got = dests[(i + 1) % CHUNKS]
                assert crc32c.crc32c(got) == crc32c.crc32c(data[i])

            # another host: the native frame's payload, received straight into the region
            await remote_tr.register_region(region)
            region.buf[:] = bytes(len(region.buf))
            peak = await _reads_peak(remote, chain, dests)
            assert remote_tr.stats["one_sided"] == 0
            assert peak < MiB // 4, f"cross-host read allocated {peak} bytes"
            for i in range(CHUNKS):
                assert crc32c.crc32c(dests[(i + 1) % CHUNKS]) == crc32c.crc32c(data[i])

            # the detector sees a copy: a read into a fresh buffer allocates the payload
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                got_bytes, _ = await remote.read(chain, INODE, 0, 0, MiB)
                copied = tracemalloc.get_traced_memory()[1] - base
            finally:
                tracemalloc.stop()
            assert bytes(got_bytes) == data[0]
            assert copied >= MiB
        finally:
            await local.close()
            await remote.close()
            await remote_tr.close()
            await admin.close()
            region.close()

    asyncio.run(main())
