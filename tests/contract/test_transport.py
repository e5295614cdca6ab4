"""Contract suite for fs3.transport: every kind behaves the same through the seam.

A tiny "echo storage" gRPC service (test-only, below) uses the real
ServerTransport exactly as the storage server does: Put fetches the payload
and writes it to a file (the chunk file), Get sends the file back with
``deliver_file`` (or ``deliver_bytes``). Every check runs for grpc and shm.

Run as a script for the throughput figures:
    /work/venv/bin/python tests/contract/test_transport.py bench
(and ``serve KIND`` starts an echo server in a separate process, used by the
kill tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from fs3.errors import Code, FsError
from fs3.proto import transport_pb2, transport_pb2_grpc
from fs3.rpc.channel import ChannelPool, call
from fs3.rpc.server import add_servicer, bind, create_server, guard_servicer
from fs3.transport import (
    ClientTransport,
    ServerTransport,
    ShmRegion,
    client_transport,
    is_inline,
    ref_length,
)
from fs3.transport.shm import ShmClientTransport, region_socket_path, send_region

# grpc and shm: "tcp" is an alias of grpc since the tcp data transport folded into the
# native RPC (its frame payloads are tested in tests/unit/rpc/test_native_bulk.py)
KINDS = ["grpc", "shm"]
HERE = os.path.abspath(__file__)
DataRef = transport_pb2.DataRef


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def _renamed(region: ShmRegion, rid: str) -> ShmRegion:
    region.id = rid
    return region


# --------------------------------------------------------------------------- the echo storage service


def _md(context: Any) -> dict[str, str]:
    return {m.key: m.value for m in context.invocation_metadata()}


class EchoStorage:
    """Test-only storage: one file per key; payloads move through ServerTransport."""

    def __init__(self, st: ServerTransport, root: str) -> None:
        self.st = st
        self.root = root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key.replace("/", "_"))

    async def Put(self, request: transport_pb2.DataRef, context: Any) -> transport_pb2.DataRef:
        md = _md(context)
        data = await self.st.fetch(request)
        fd = os.open(self._path(md["key"]), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, data, 0)  # the chunk engine's write
            os.ftruncate(fd, len(data))  # (not O_TRUNC: ext4 flushes truncated files on close)
        finally:
            os.close(fd)
        return DataRef(inline=b"")

    async def Get(self, request: transport_pb2.DataRef, context: Any) -> transport_pb2.DataRef:
        md = _md(context)
        delay = float(md.get("delay", "0"))
        if delay:
            await asyncio.sleep(delay)
        fd = os.open(self._path(md["key"]), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if is_inline(request):
                return DataRef(inline=os.pread(fd, size, 0))
            if md.get("mode") == "bytes":
                n = await self.st.deliver_bytes(request, os.pread(fd, size, 0))
            else:
                n = await self.st.deliver_file(request, fd, 0, size)
        finally:
            os.close(fd)
        return DataRef(shm=transport_pb2.ShmRef(length=n))  # carries n back


def _serializers() -> dict[str, Any]:
    return {
        "request_deserializer": DataRef.FromString,
        "response_serializer": DataRef.SerializeToString,
    }


class EchoNode:
    """An in-process echo storage node on 127.0.0.1."""

    def __init__(self, **st_kwargs: Any) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="fs3-echo-")
        self.st = ServerTransport(**st_kwargs)
        self.server = create_server()
        self.echo = guard_servicer(EchoStorage(self.st, self.tmp.name))
        self.address = ""

    async def start(self) -> None:
        add_servicer(
            self.server, transport_pb2_grpc.add_TransportServiceServicer_to_server, self.st.servicer
        )
        handlers = {
            "Put": grpc.unary_unary_rpc_method_handler(self.echo.Put, **_serializers()),
            "Get": grpc.unary_unary_rpc_method_handler(self.echo.Get, **_serializers()),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("fs3test.Echo", handlers),)
        )
        port = bind(self.server, "127.0.0.1", 0)
        await self.server.start()
        self.address = f"127.0.0.1:{port}"
        await self.st.start("127.0.0.1", address=self.address)  # + its region socket

    async def stop(self) -> None:
        await self.server.stop(0)
        await self.st.stop()
        self.tmp.cleanup()

    @property
    def data_address(self) -> str:
        return self.st.data_address


class EchoClient:
    """Client side of the echo protocol over a ClientTransport."""

    def __init__(self, ct: ClientTransport, address: str, data_address: str) -> None:
        self.ct = ct
        self.address = address
        self.data_address = data_address
        self.pool = ChannelPool("grpc")  # the echo double is a gRPC-only service

    def _mc(self, name: str, **md: str) -> Callable[..., Any]:
        mc = self.pool.get(self.address).unary_unary(
            f"/fs3test.Echo/{name}",
            request_serializer=DataRef.SerializeToString,
            response_deserializer=DataRef.FromString,
        )
        return functools.partial(mc, metadata=tuple(md.items()))

    async def put(self, key: str, payload: memoryview | bytes | bytearray) -> None:
        ref, sent = await self.ct.write_ref(self.address, self.data_address, memoryview(payload))
        try:
            await call(self._mc("Put", key=key), ref, timeout=20)
        finally:
            await sent

    async def get(self, key: str, dest: memoryview, **md: str) -> int:
        ref, complete = await self.ct.read_ref(self.address, self.data_address, dest)
        resp = await call(self._mc("Get", key=key, **md), ref, timeout=20)
        if is_inline(ref):
            dest[: len(resp.inline)] = resp.inline
            return len(resp.inline)
        n = ref_length(resp)
        await complete(n)
        return n

    async def close(self) -> None:
        await self.pool.close()


def _shm_files() -> set[str]:
    return set(glob.glob(f"/dev/shm/fs3-*-{os.getpid()}-*"))


@asynccontextmanager
async def echo_pair(
    kind: str, *, node_kwargs: dict[str, Any] | None = None, **ct_kwargs: Any
) -> AsyncIterator[tuple[EchoNode, EchoClient]]:
    before = _shm_files()
    node = EchoNode(**(node_kwargs or {}))
    await node.start()
    ct = client_transport(kind, f"test-{kind}", **ct_kwargs)
    client = EchoClient(ct, node.address, node.data_address)
    try:
        yield node, client
    finally:
        await ct.close()
        await client.close()
        await node.stop()
    leaked = _shm_files() - before
    assert not leaked, f"shared-memory files left behind: {leaked}"


def _payload(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


# --------------------------------------------------------------------------- round trips


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_sizes(kind: str) -> None:
    async def main() -> None:
        rng = random.Random(1)
        async with echo_pair(kind) as (_node, c):
            for size in (0, 1, 4096, 1 << 20, 8 << 20):
                data = _payload(rng, size)
                await c.put(f"k{size}", data)
                for mode in ("file", "bytes"):
                    dest = bytearray(size + 17)  # larger than needed: n tells how much
                    n = await c.get(f"k{size}", memoryview(dest), mode=mode)
                    assert n == size
                    assert dest[:n] == data, (kind, size, mode)

    run(main())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_many_concurrent_transfers(kind: str) -> None:
    async def main() -> None:
        rng = random.Random(2)
        async with echo_pair(kind) as (node, c):
            blobs = {
                f"c{i}": _payload(rng, rng.choice([1, 100, 4096, 65536, 300_000]))
                for i in range(64)
            }
            await asyncio.gather(*(c.put(k, v) for k, v in blobs.items()))
            dests = {k: bytearray(len(v)) for k, v in blobs.items()}
            ns = await asyncio.gather(*(c.get(k, memoryview(dests[k])) for k in blobs))
            for (k, v), n in zip(blobs.items(), ns, strict=True):
                assert n == len(v) and dests[k] == v
            if kind == "shm":
                assert len(node.st.regions) >= 1

    run(main())


@pytest.mark.timeout(30)
def test_shm_registered_region_is_used_in_place() -> None:
    """A buffer inside a registered region travels with no staging copy."""

    async def main() -> None:
        async with echo_pair("shm") as (node, c):
            region = ShmRegion.create(1 << 20, prefix="fs3-test")
            try:
                await c.ct.register_region(region)
                region.buf[4096:8192] = b"z" * 4096
                ref, _ = await c.ct.write_ref(c.address, "", region.buf[4096:8192])
                assert (
                    ref.shm.region == region.id
                    and ref.shm.offset == 4096
                    and ref.shm.length == 4096
                )
                await c.put("r", region.buf[4096:8192])
                n = await c.get("r", region.buf[0:4096])
                assert n == 4096 and bytes(region.buf[0:4096]) == b"z" * 4096
                assert node.st.regions.has(region.id)
                await c.ct.unregister_region(region)
                assert not node.st.regions.has(region.id)
            finally:
                region.close()

    run(main())


# --------------------------------------------------------------------------- refusals


@pytest.mark.timeout(30)
def test_shm_bounds_and_unknown_region_refused() -> None:
    async def main() -> None:
        async with echo_pair("shm") as (node, c):
            await c.put("a", b"x" * 100)  # registers the staging arena
            st = node.st
            rid = next(r.id for r in c.ct.regions)  # type: ignore[attr-defined]
            size = next(r.size for r in c.ct.regions)  # type: ignore[attr-defined]
            for off, length in ((size, 1), (size - 10, 11), (2**63, 1)):
                bad = DataRef(shm=transport_pb2.ShmRef(region=rid, offset=off, length=length))
                with pytest.raises(FsError) as ei:
                    await st.fetch(bad)
                assert ei.value.code == Code.INVALID_ARGUMENT
                with pytest.raises(FsError) as ei:
                    await call(c._mc("Put", key="b"), bad, timeout=5)  # over the wire too
                assert ei.value.code == Code.INVALID_ARGUMENT
            unknown = DataRef(shm=transport_pb2.ShmRef(region="nope", offset=0, length=1))
            with pytest.raises(FsError) as ei:
                await call(c._mc("Put", key="b"), unknown, timeout=5)
            assert (
                ei.value.code == Code.INVALID_ARGUMENT and "unknown shm region" in ei.value.message
            )
            # a registration by path (any file, even one under /dev/shm) is refused
            stub = transport_pb2_grpc.TransportServiceStub(c.pool.get(c.address))
            region = next(iter(c.ct.regions))  # type: ignore[attr-defined]
            for path in ("/etc/passwd", "/dev/shm/../../etc/passwd", region.path):
                req = transport_pb2.RegisterRegionRequest(
                    client_id="x", region="evil", path=path, size=10, pid=os.getpid()
                )
                with pytest.raises(FsError) as ei:
                    await call(stub.RegisterRegion, req, timeout=5)
                assert ei.value.code == Code.PERMISSION_DENIED
            # someone else's region id cannot be taken over, even with a descriptor
            other = ShmRegion.create(4096)
            try:
                with pytest.raises(FsError) as ei:
                    await asyncio.to_thread(
                        send_region, region_socket_path(c.address), "other", _renamed(other, rid)
                    )
                assert ei.value.code == Code.PERMISSION_DENIED
            finally:
                other.close()
            # delivering more than the destination holds is refused
            small = DataRef(shm=transport_pb2.ShmRef(region=rid, offset=0, length=10))
            with pytest.raises(FsError) as ei:
                await st.deliver_bytes(small, b"y" * 11)
            assert ei.value.code == Code.INVALID_ARGUMENT

    run(main())


@pytest.mark.timeout(10)
def test_inline_refs_are_not_delivered_and_kinds() -> None:
    async def main() -> None:
        st = ServerTransport()
        await st.start("127.0.0.1")
        try:
            assert st.data_address == ""
            assert bytes(await st.fetch(DataRef(inline=b"abc"))) == b"abc"
            with pytest.raises(FsError) as ei:
                await st.deliver_bytes(DataRef(inline=b""), b"x")
            assert ei.value.code == Code.INVALID_ARGUMENT
            with pytest.raises(FsError) as ei:
                await st.fetch(
                    DataRef(tcp=transport_pb2.TcpRef(conn_id=1, transfer_id=1, length=1))
                )
            assert ei.value.code == Code.INVALID_ARGUMENT
            with pytest.raises(FsError) as ei:  # the storage service serves frame refs itself
                await st.fetch(DataRef(frame=transport_pb2.FrameRef(offset=0, length=1)))
            assert ei.value.code == Code.INVALID_ARGUMENT
        finally:
            await st.stop()

    run(main())
    with pytest.raises(FsError) as ei:
        client_transport("rdma", "c")
    assert ei.value.code == Code.NOT_IMPLEMENTED
    with pytest.raises(FsError) as ei:
        client_transport("carrier-pigeon", "c")
    assert ei.value.code == Code.INVALID_ARGUMENT


# --------------------------------------------------------------------------- vanished peers

_CHILD_SHM = """
import asyncio, sys
from fs3.transport import ShmRegion, client_transport
async def main():
    ct = client_transport("shm", "child")
    region = ShmRegion.create(1 << 20, prefix="fs3-child")
    await ct.register_region(region)
    await ct.write_ref(sys.argv[1], "", region.buf[0:10])
    print(region.id, region.path, flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


@pytest.fixture
def children() -> Any:
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for p in procs:
            _reap(p)


# Each child's TMPDIR, made by the parent: a child killed with SIGKILL cannot
# remove its own temporary directories (e.g. EchoNode's), the parent does.
_CHILD_TMP: dict[int, str] = {}


def _spawn(children: list[subprocess.Popen[str]], args: list[str]) -> subprocess.Popen[str]:
    tmp = tempfile.mkdtemp(prefix="fs3-test-child-")
    p = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": tmp},
    )
    children.append(p)
    _CHILD_TMP[p.pid] = tmp
    return p


def _reap(p: subprocess.Popen[str]) -> None:
    """Kill (if still running) and wait for a child, then remove its TMPDIR."""
    if p.poll() is None:
        p.kill()
    p.wait(10)
    if p.stdout is not None:
        p.stdout.close()
    tmp = _CHILD_TMP.pop(p.pid, None)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


async def _readline(p: subprocess.Popen[str], limit_s: float = 20) -> str:
    assert p.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(p.stdout.readline), limit_s)
    assert line, "child exited early"
    return line.strip()


async def _until(cond: Callable[[], bool], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.mark.timeout(40)
def test_shm_vanished_client_region_dropped(children: list[subprocess.Popen[str]]) -> None:
    async def main() -> None:
        node = EchoNode(region_check_interval_s=0.1)
        await node.start()
        path = ""
        try:
            p = _spawn(children, ["-c", _CHILD_SHM, node.address])
            rid, path = (await _readline(p)).split()
            assert node.st.regions.has(rid)
            view = await node.st.fetch(
                DataRef(shm=transport_pb2.ShmRef(region=rid, offset=0, length=10))
            )
            p.send_signal(signal.SIGKILL)
            await asyncio.to_thread(p.wait, 10)
            await _until(lambda: not node.st.regions.has(rid), 5)
            with pytest.raises(FsError):
                await node.st.fetch(
                    DataRef(shm=transport_pb2.ShmRef(region=rid, offset=0, length=10))
                )
            assert len(view) == 10  # a view handed out earlier stays valid (mapping closed later)
            view.release()
            node.st.regions.sweep()
            assert not node.st.regions._graveyard
        finally:
            await node.stop()
            if path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # the killed child could not clean up

    run(main())


@pytest.mark.timeout(30)
def test_shm_staging_is_bounded_and_reused() -> None:
    """Staging slots are recycled: many transfers through a small arena do not grow it."""

    async def main() -> None:
        rng = random.Random(5)
        async with echo_pair("shm", staging_arena_bytes=1 << 20, staging_max_bytes=2 << 20) as (
            _node,
            c,
        ):
            blobs = [_payload(rng, 256 << 10) for _ in range(32)]
            await asyncio.gather(*(c.put(f"s{i}", b) for i, b in enumerate(blobs)))
            outs = [bytearray(256 << 10) for _ in blobs]
            await asyncio.gather(*(c.get(f"s{i}", memoryview(o)) for i, o in enumerate(outs)))
            assert outs == blobs
            ct = c.ct
            assert isinstance(ct, ShmClientTransport)
            assert ct._staging.total() <= 2 << 20
            assert all(a.used == 0 for a in ct._staging.arenas)

    run(main())


# --------------------------------------------------------------------------- throughput


@asynccontextmanager
async def remote_pair(kind: str) -> AsyncIterator[tuple[None, EchoClient]]:
    """An echo server in its own process (its own core), a client here."""
    procs: list[subprocess.Popen[str]] = []
    p = _spawn(procs, [HERE, "serve"])
    try:
        address, data_address = (await _readline(p)).split()
        ct = client_transport(kind, f"bench-{kind}")
        c = EchoClient(ct, address, data_address)
        try:
            yield None, c
        finally:
            await ct.close()
            await c.close()
    finally:
        _reap(p)


async def measure(
    kind: str,
    total_bytes: int = 256 << 20,
    size: int = 1 << 20,
    depth: int = 4,
    *,
    remote: bool = False,
    in_region: bool = False,
) -> tuple[float, float]:
    """(write MB/s, read MB/s) of ``size``-byte payloads over loopback, ``depth`` in flight.

    ``in_region`` (shm): the buffers lie in a registered region, so nothing is
    staged (the USRBIO case); otherwise shm copies through its staging arena.
    """
    rng = random.Random(9)
    count = total_bytes // size
    pair = remote_pair(kind) if remote else echo_pair(kind)
    region: ShmRegion | None = None
    async with pair as (_node, c):
        if in_region:
            region = ShmRegion.create(size * (depth + 1), prefix="fs3-bench")
            await c.ct.register_region(region)
            payload: memoryview = region.buf[:size]
            payload[:] = _payload(rng, size)
            outs = [region.buf[size * (i + 1) : size * (i + 2)] for i in range(depth)]
        else:
            payload = memoryview(_payload(rng, size))
            outs = [memoryview(bytearray(size)) for _ in range(depth)]
        try:
            await c.put("w0", payload)
            sem = asyncio.Semaphore(depth)

            async def one_put(i: int) -> None:
                async with sem:
                    await c.put(f"w{i % depth}", payload)

            t0 = time.perf_counter()
            await asyncio.gather(*(one_put(i) for i in range(count)))
            w = total_bytes / (time.perf_counter() - t0) / 1e6
            free = list(range(depth))

            async def one_get(i: int) -> None:
                async with sem:
                    slot = free.pop()
                    try:
                        assert await c.get(f"w{i % depth}", outs[slot]) == size
                    finally:
                        free.append(slot)

            t0 = time.perf_counter()
            await asyncio.gather(*(one_get(i) for i in range(count)))
            r = total_bytes / (time.perf_counter() - t0) / 1e6
            assert outs[0] == payload
        finally:
            if region is not None:
                payload.release()
                for o in outs:
                    o.release()
                await c.ct.unregister_region(region)
                region.close()
    return w, r


@pytest.mark.timeout(60)
def test_throughput_1mib(capsys: pytest.CaptureFixture[str]) -> None:
    """Smoke-measure each kind (small volume; the script mode measures more)."""
    results = {k: run(measure(k, total_bytes=32 << 20)) for k in KINDS}
    with capsys.disabled():
        for k, (w, r) in results.items():
            print(
                f"\ntransport {k}: write {w:.0f} MB/s, read {r:.0f} MB/s (1 MiB payloads, loopback)"
            )
    for w, r in results.values():
        assert w > 0 and r > 0


# --------------------------------------------------------------------------- script mode


async def _serve_forever() -> None:
    node = EchoNode()
    await node.start()
    print(node.address, node.data_address, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        asyncio.run(_serve_forever())
    elif sys.argv[1:2] == ["bench"]:
        print("1 MiB payloads, 4 in flight, 256 MiB each way, echo server in its own process")
        for k, in_region in (("grpc", False), ("shm", False), ("shm", True)):
            w, r = asyncio.run(measure(k, remote=True, in_region=in_region))
            label = k + (" (registered buffers)" if in_region else "")
            print(f"{label:28s} write {w:6.0f} MB/s   read {r:6.0f} MB/s")
    else:
        sys.exit("usage: test_transport.py serve|bench")
