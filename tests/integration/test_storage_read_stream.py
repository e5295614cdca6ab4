"""The storage ReadStream (bidi streaming reads) against real storage processes.

* The client's reads travel on one long-lived stream per node.
* A bad request on a stream is answered with per-io errors and the stream lives on.
* A storage node killed mid-stream: pending reads fail over to another replica and
  succeed; after the node restarts, a new stream to it is opened and serves reads.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from fs3.errors import Code
from fs3.proto import storage_pb2, storage_pb2_grpc
from fs3.rpc.channel import BidiStream, insecure_channel
from fs3.storage.operator import MAX_READ_IOS
from fs3.testing.cluster import ProcessCluster, failover_client_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PIECE = 64 * 1024


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProcessCluster]:
    with ProcessCluster(
        storage_nodes=3,
        targets_per_node=1,
        replicas=3,
        meta=1,
        mgmtd=1,
        transport="grpc",
        overrides={"storage": {"storage": {"fsync": False}}},
    ) as c:
        yield c


def _storage_addresses(cluster: ProcessCluster) -> dict[str, str]:
    return {p.name: p.address for p in cluster._state().processes if p.role == "storage"}


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def test_bad_request_does_not_end_the_stream(cluster: ProcessCluster) -> None:
    c = cluster.connect(config=failover_client_config())
    try:
        data = random.Random(1).randbytes(3 * PIECE)
        with c.open("/rs-bad", "wb") as f:
            f.write(data)
        with c.open("/rs-bad", "rb") as f:
            assert f.read() == data
        st = c.core.storage
        assert st.stats["read_streams_opened"] >= 1, "reads did not use a ReadStream"
    finally:
        c.close()

    address = next(iter(_storage_addresses(cluster).values()))

    async def run() -> None:
        ch = insecure_channel(address)
        try:
            q: asyncio.Queue[storage_pb2.BatchReadRequest | None] = asyncio.Queue()

            async def reqs() -> AsyncIterator[storage_pb2.BatchReadRequest]:
                while (r := await q.get()) is not None:
                    yield r

            stub = storage_pb2_grpc.StorageServiceStub(ch)  # type: ignore[no-untyped-call]
            stream = BidiStream(stub.ReadStream, reqs(), what="test")
            answers = stream.responses()
            # 1: too many ios -> every result carries INVALID_ARGUMENT
            too_many = [storage_pb2.ReadIO(chain_id=1, length=1)] * (MAX_READ_IOS + 1)
            q.put_nowait(storage_pb2.BatchReadRequest(ios=too_many, request_id=7))
            r = await asyncio.wait_for(answers.__anext__(), 10)
            assert r.request_id == 7
            assert len(r.results) == MAX_READ_IOS + 1
            assert all(x.error.code == Code.INVALID_ARGUMENT for x in r.results)
            # 2: an io without a chunk id on the same stream -> its own error, stream alive
            q.put_nowait(
                storage_pb2.BatchReadRequest(ios=[storage_pb2.ReadIO(chain_id=1)], request_id=8)
            )
            r = await asyncio.wait_for(answers.__anext__(), 10)
            assert r.request_id == 8 and r.results[0].error.code != 0
            # 3: an unknown chain: answered with its error, still on the same stream
            q.put_nowait(
                storage_pb2.BatchReadRequest(
                    ios=[
                        storage_pb2.ReadIO(
                            chain_id=0,
                            chunk=storage_pb2.ChunkId(inode=999_999_999, index=0),
                            length=10,
                        )
                    ],
                    request_id=9,
                )
            )
            r = await asyncio.wait_for(answers.__anext__(), 10)
            assert r.request_id == 9 and len(r.results) == 1 and r.results[0].error.code != 0
            assert not stream.done()
            q.put_nowait(None)  # half-close: the server ends the stream cleanly
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(answers.__anext__(), 10)
        finally:
            await ch.close()

    asyncio.run(run())


def test_node_killed_mid_stream_then_restarted(cluster: ProcessCluster) -> None:
    cluster.wait_serving(60)
    c = cluster.connect(config=failover_client_config())
    try:
        data = random.Random(2).randbytes(40 * PIECE)
        with c.open("/rs-kill", "wb") as f:
            f.write(data)
        st = c.core.storage
        addrs = _storage_addresses(cluster)
        victim = "storage-1"
        vaddr = addrs[victim]

        reads = [0]
        stop = threading.Event()
        box: dict[str, Any] = {}

        def reader() -> None:
            try:
                with c.open("/rs-kill", "rb", buffering=0) as f:
                    while not stop.is_set():
                        f.seek(0)
                        for off in range(0, len(data), PIECE):
                            assert f.read(PIECE) == data[off : off + PIECE], f"bad bytes @{off}"
                            reads[0] += 1
            except BaseException as e:  # reported by the test
                box["error"] = e

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        # Reads are spread over replicas: wait until a stream to the victim is in use.
        _wait(lambda: vaddr in st._streams and reads[0] >= 20, 30, "a stream to the victim")
        opened = st.stats["read_streams_opened"]
        cluster.kill(victim)
        at_kill = reads[0]
        _wait(lambda: reads[0] >= at_kill + 60 or "error" in box, 60, "reads after the kill")
        assert "error" not in box, f"read failed across the kill: {box.get('error')!r}"
        _wait(lambda: vaddr not in st._streams, 30, "the broken stream to be dropped")

        cluster.restart(victim)
        cluster.wait_serving(90)
        # A new stream to the restarted node is opened and serves reads.
        _wait(
            lambda: (s := st._streams.get(vaddr)) is not None and not s.dead or "error" in box,
            60,
            "a new stream to the restarted node",
        )
        assert st.stats["read_streams_opened"] > opened
        at_restart = reads[0]
        _wait(lambda: reads[0] >= at_restart + 60 or "error" in box, 60, "reads after restart")
        stop.set()
        th.join(30)
        assert not th.is_alive(), "reader hung"
        assert "error" not in box, f"read failed after the restart: {box.get('error')!r}"
        s = st._streams.get(vaddr)
        assert s is not None and not s.dead
    finally:
        stop.set()
        c.close()
    # Closing the client closed its streams.
    assert not st._streams
