"""Failover during I/O: kill -9 a meta server or a storage node while a client works.

Operations must complete (within the client's retry deadline) and every byte
must read back exactly; retried meta mutations must be applied once (request
ids), retried chunk writes must not duplicate (update channels).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fs3.testing.cluster import ProcessCluster, failover_client_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProcessCluster]:
    with ProcessCluster(
        storage_nodes=3,
        targets_per_node=1,
        replicas=3,
        meta=2,
        mgmtd=1,
        transport="grpc",
        overrides={"storage": {"storage": {"fsync": False}}},
    ) as c:
        yield c


def _run_in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def main() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # reported by the test
            box["error"] = e

    th = threading.Thread(target=main, daemon=True)
    th.start()
    return th, box


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def test_meta_server_killed_during_namespace_ops(cluster: ProcessCluster) -> None:
    c = cluster.connect(config=failover_client_config())
    try:
        c.mkdir("/mf")
        used = c.core.meta._current
        victim = next(
            p.name for p in cluster._state().processes if p.role == "meta" and p.address == used
        )
        done = [0]
        payloads = {i: random.Random(i).randbytes(3000 + i) for i in range(40)}

        def work() -> None:
            for i, data in payloads.items():
                with c.open(f"/mf/f{i}", "xb") as f:  # O_EXCL: a double-applied create would fail
                    f.write(data)
                c.rename(f"/mf/f{i}", f"/mf/g{i}")  # a double-applied rename would ENOENT
                done[0] += 1

        th, box = _run_in_thread(work)
        _wait(lambda: done[0] >= 10, 30, "10 files before the kill")
        cluster.kill(victim)
        th.join(60)
        assert not th.is_alive(), "client operations hung after the meta server died"
        assert "error" not in box, f"operation failed across meta failover: {box.get('error')!r}"
        assert c.core.meta.failovers >= 1
        assert c.core.meta._current != used
        assert sorted(c.listdir("/mf")) == sorted(f"g{i}" for i in payloads)
        for i, data in payloads.items():
            with c.open(f"/mf/g{i}", "rb") as f:
                assert f.read() == data
    finally:
        c.close()


def test_storage_node_killed_during_writes_and_reads(cluster: ProcessCluster) -> None:
    cfg = failover_client_config()
    c = cluster.connect(config=cfg)
    try:
        rng = random.Random(99)
        piece = 256 * 1024
        data = rng.randbytes(48 * piece)  # 12 MiB over 12 chunks
        written = [0]

        def write() -> None:
            with c.open("/sf", "wb", buffering=0) as f:
                for off in range(0, len(data), piece):
                    f.write(data[off : off + piece])
                    written[0] += 1
                f.fsync()

        th, box = _run_in_thread(write)
        _wait(lambda: written[0] >= 8, 30, "8 pieces before the kill")
        cluster.kill("storage-2")
        th.join(90)
        assert not th.is_alive(), "writes hung after a storage node died"
        assert "error" not in box, f"write failed across storage failover: {box.get('error')!r}"

        # Reads while another replica dies: the client moves to a surviving replica.
        reads = [0]

        def read() -> bytes:
            out = bytearray()
            with c.open("/sf", "rb", buffering=0) as f:
                while True:
                    b = f.read(piece)
                    if not b:
                        return bytes(out)
                    out += b
                    reads[0] += 1

        th, box = _run_in_thread(read)
        _wait(lambda: reads[0] >= 4, 30, "4 reads before the kill")
        cluster.kill("storage-3")
        th.join(90)
        assert not th.is_alive(), "reads hung after a storage node died"
        assert "error" not in box, f"read failed across storage failover: {box.get('error')!r}"
        assert box["result"] == data
        # A fresh client (fresh routing) reads everything from the last replica.
        other = cluster.connect(config=cfg)
        try:
            with other.open("/sf", "rb") as f:
                assert f.read() == data
        finally:
            other.close()
    finally:
        c.close()
