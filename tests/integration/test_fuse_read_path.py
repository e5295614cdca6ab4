"""The FUSE read handler against a real cluster: where its bytes land and what it gives back.

``Fs3Operations.read`` runs for real on a real ``FuseClient`` (storage and meta
are real processes on this host, transport ``auto``); only the kernel is left
out, so the test calls the handler as pyfuse3 does and takes what it returns as
pyfuse3 would (a buffer it writes to /dev/fuse in the same loop step).

* A read lands in a staging slot of the transport (shared memory the nodes map):
  once the arena is registered on a node the node writes the bytes into it
  itself (the transport's one-sided count rises) and the bytes are right.
* Each slot is given back after the step the handler returned in: many reads in
  a row hold no more memory than one batch of concurrent reads did, and the
  arenas end empty. A slot given back too early would be overwritten by the next
  read while the first answer is still being returned: the concurrent reads
  below check every answer's bytes against the file.
* Without staging memory (a transport that has none) the handler reads into a
  buffer of its own and answers the same bytes.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fs3 import config as fs3config
from fs3.client.core import ROOT_INODE, Caller
from fs3.fuse.ops import Fs3Operations, FuseClient
from fs3.testing.cluster import ProcessCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CHUNK = 1 << 20
SIZE = 3 * CHUNK + 12345  # crosses chunk boundaries, ends inside a chunk


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    d: Path = tmp_path_factory.mktemp("fuse-read")
    with ProcessCluster(
        d / "c",
        storage_nodes=3,
        targets_per_node=1,
        replicas=3,
        meta=1,
        mgmtd=1,
        transport="auto",
        overrides={
            "storage": {"storage": {"fsync": False}},
            "meta": {"meta": {"default_chunk_size": CHUNK}},
        },
    ) as c:
        yield c


async def _setup(
    cluster: ProcessCluster, name: bytes
) -> tuple[FuseClient, Fs3Operations, Any, bytes]:
    client = await FuseClient.connect(cluster.cluster_file, transport="auto")
    ops = Fs3Operations(client, fs3config.FuseSection())  # type: ignore[arg-type]
    caller = Caller.current()
    data = random.Random(7).randbytes(SIZE)
    h, _ = await client.create(caller, ROOT_INODE, name, 0o644, os.O_RDWR | os.O_CREAT)
    await client.write(h, 0, data)
    await client.flush(h)
    await client.release(h)
    r = await client.open(caller, h.inode, os.O_RDONLY)
    of = ops._register(r, False)  # what ops.open does once meta answered (no kernel here)
    return client, ops, of, data


async def _read(ops: Fs3Operations, fh: int, off: int, size: int) -> bytes:
    """What pyfuse3 does with a read handler's answer: copy it out in the same step."""
    buf = await ops.read(fh, off, size)
    return bytes(buf)


def _staged_bytes(client: FuseClient) -> int:
    return sum(a.used for a in client.transport._staging.arenas)  # type: ignore[attr-defined]


def test_reads_land_in_staging_memory_and_give_it_back(cluster: ProcessCluster) -> None:
    async def main() -> None:
        client, ops, of, data = await _setup(cluster, b"staged")
        try:
            rng = random.Random(11)
            before = dict(client.transport.stats)  # type: ignore[attr-defined]
            for _ in range(3):  # the arena's registration on each node completes meanwhile
                for off, size in [(0, CHUNK), (CHUNK - 100, 4096), (SIZE - 5000, 8192)]:
                    assert await _read(ops, of.h.fh, off, size) == data[off : off + size]
                await asyncio.sleep(0.2)
            # many reads at once, small and large, every answer checked
            for _ in range(5):
                reads = [
                    (o, s)
                    for o, s in (
                        (rng.randrange(0, SIZE), rng.choice([4096, 65536, CHUNK]))
                        for _ in range(24)
                    )
                ]
                got = await asyncio.gather(*(_read(ops, of.h.fh, o, s) for o, s in reads))
                for (o, s), g in zip(reads, got, strict=True):
                    assert g == data[o : o + s], (o, s)
            assert ops.stats.staged_reads == ops.stats.reads
            after = client.transport.stats  # type: ignore[attr-defined]
            assert after["one_sided"] - before.get("one_sided", 0) >= ops.stats.reads // 2
            await asyncio.sleep(0)  # the last step's slots go back after it
            assert _staged_bytes(client) == 0
            # reads past the end: nothing, and nothing held
            assert await _read(ops, of.h.fh, SIZE, 4096) == b""
            await asyncio.sleep(0)
            assert _staged_bytes(client) == 0
        finally:
            await client.close()

    asyncio.run(main())


def test_reads_without_staging_memory_answer_the_same(cluster: ProcessCluster) -> None:
    async def main() -> None:
        client, ops, of, data = await _setup(cluster, b"plain")
        try:
            client.transport.staging_buffer = lambda size: None  # type: ignore[method-assign]
            for off, size in [(0, CHUNK), (CHUNK - 100, 4096), (SIZE - 5000, 8192)]:
                assert await _read(ops, of.h.fh, off, size) == data[off : off + size]
            assert ops.stats.staged_reads == 0 and ops.stats.reads == 3
        finally:
            await client.close()

    asyncio.run(main())


def test_a_buffer_whose_read_saw_a_failure_waits_before_reuse(cluster: ProcessCluster) -> None:
    """A node that timed out may still write into a buffer it was given (one-sided): a read
    buffer whose read needed another attempt goes back only after the quarantine, not
    after the reply, while a clean read's goes back at once. Runs last: it kills a node."""

    async def main() -> None:
        client, ops, of, data = await _setup(cluster, b"quarantine")
        try:
            for off in (0, CHUNK, 2 * CHUNK):  # every node's read stream is open
                await _read(ops, of.h.fh, off, 4096)
            await asyncio.sleep(0)
            assert _staged_bytes(client) == 0
            ops._quarantine_s = 1.0
            cluster.kill("storage-2")
            retries = client.storage.stats["read_retries"]
            for i in range(30):
                off = (i * 7919 * 4096) % (SIZE - 4096)
                assert await _read(ops, of.h.fh, off, 4096) == data[off : off + 4096]
            assert client.storage.stats["read_retries"] > retries  # the dead node was asked
            await asyncio.sleep(0)
            assert _staged_bytes(client) > 0  # held: those reads' buffers wait
            for _ in range(100):
                await asyncio.sleep(0.05)
                if _staged_bytes(client) == 0:
                    break
            assert _staged_bytes(client) == 0  # and go back after the quarantine
        finally:
            await client.close()

    try:
        asyncio.run(main())
    finally:
        cluster.restart("storage-2")
