"""The recovery scenario with real processes: ``fs3 mgmtd`` + three ``fs3 storage``.

Write continuously, kill -9 one storage process, keep writing, restart it,
wait until mgmtd shows every target SERVING again (the returning target went
OFFLINE → SYNCING → SERVING through a resync), then compare every chunk's
version, length and checksum, and the bytes, across the replicas.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fs3.client.chunk_client import ChunkClient
from fs3.client.mgmtd_client import MgmtdClient
from fs3.errors import FsError
from fs3.routing import SERVING, Routing
from fs3.testing import procs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CS = 64 << 10


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[procs.MiniCluster]:
    with procs.MiniCluster(tmp_path, nodes=3, transport="tcp", fsync=True) as c:
        yield c


async def _wait(admin: MgmtdClient, pred, timeout_s: float, what: str) -> Routing:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            info = await admin.get_routing(0)
        except FsError as e:  # e.g. mgmtd still electing itself leader
            info, last = None, e
        else:
            last = None
        r = Routing(info) if info is not None else Routing.empty()
        if pred(r):
            return r
        assert time.monotonic() < deadline, f"timeout: {what}: {r.chains()} {last}"
        await asyncio.sleep(0.1)


def _all_serving(r: Routing) -> bool:
    chains = r.chains()
    return bool(chains) and all(
        len(c.targets) == 3 and all(t.public_state == SERVING for t in c.targets) for c in chains
    )


def test_kill9_storage_process_then_resync(cluster: procs.MiniCluster) -> None:
    t0 = time.monotonic()

    def mark(what: str) -> None:  # shown when the test fails
        print(f"{time.monotonic() - t0:7.2f}s {what}", flush=True)

    async def main() -> None:
        admin = MgmtdClient.from_cluster_file(
            str(cluster.cluster_file), timeout_s=2.0, retry_deadline_s=20.0
        )
        cl = ChunkClient(admin, "tcp", retry_deadline_s=30.0)
        try:
            await _wait(
                admin, lambda r: all(r.target_alive(t) for t in (101, 201, 301)), 20, "registration"
            )
            mark("registered")
            await admin.create_chain_table(1, 3)
            r = await _wait(admin, _all_serving, 20, "all serving")
            chain = r.chains()[0].chain_id
            await cl.refresh()
            rng = random.Random(3)
            stop = asyncio.Event()
            progress = asyncio.Event()
            writes = 0
            written: set[int] = set()

            async def writer() -> None:
                nonlocal writes
                while not stop.is_set():
                    idx = rng.randrange(16)
                    off = rng.randrange(0, CS - 8192)
                    await cl.write(
                        chain, 77, idx, off, rng.randbytes(rng.randrange(1, 8192)), chunk_size=CS
                    )
                    written.add(idx)
                    writes += 1
                    progress.set()

            async def until(n: int) -> None:
                while writes < n:
                    assert not w.done(), w.exception()
                    progress.clear()
                    await asyncio.wait_for(progress.wait(), 30)

            w = asyncio.create_task(writer())
            await until(30)
            mark(f"{writes} writes")
            victim = r.chain_targets(chain)[1]
            cluster.kill(f"storage-{victim // 100}")
            mark("killed")
            await _wait(
                admin, lambda r: r.target_state(chain, victim) != SERVING, 20, "victim offline"
            )
            mark("victim offline")
            await until(writes + 30)
            mark(f"{writes} writes")
            cluster.start_storage(victim // 100 - 1)
            mark("restarted")
            await _wait(admin, _all_serving, 60, "all serving after restart")
            mark("all serving")
            await until(writes + 10)
            stop.set()
            await w
            mark(f"{writes} writes; comparing")
            r = await cl.refresh()
            metas = {}
            for tid in r.chain_targets(chain):
                ms = await cl.list_chunks(tid)
                metas[tid] = [(m.chunk.index, m.commit_ver, m.length, m.checksum) for m in ms]
            vals = list(metas.values())
            assert [m[0] for m in vals[0]] == sorted(written) and all(v == vals[0] for v in vals), (
                metas
            )
            for idx, *_ in vals[0]:
                blobs = {
                    bytes((await cl.read(chain, 77, idx, 0, CS, target_id=t))[0]) for t in metas
                }
                assert len(blobs) == 1
        finally:
            await cl.close()
            await admin.close()

    try:
        asyncio.run(main())
    except BaseException:
        for name, p in cluster.running.items():  # diagnostics for a failed run
            print(f"----- {name} (pid {p.pid}) -----\n{p.log_tail(60)}")
        raise
