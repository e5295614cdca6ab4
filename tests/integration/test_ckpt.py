"""fs3.ckpt against a real cluster: through the client API (no mount) and on the FUSE mount with USRBIO."""

from __future__ import annotations

import errno
import gc
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fs3.testing.cluster import ProcessCluster

pytest.register_assert_rewrite("fuse_helpers")  # shared helpers + the fuse_cluster plugin
from fuse_helpers import fresh_dir, needs_fuse  # noqa: E402 - after register_assert_rewrite

import fs3.ckpt as ckpt  # noqa: E402
from fs3.ckpt import layout  # noqa: E402
from fs3.ckpt.store import (  # noqa: E402
    IO_BYTES,
    POOL_IDLE_S,
    ClientStore,
    LoadPool,
    PosixStore,
    Segment,
    load_pool,
)

torch = pytest.importorskip("torch")

pytest_plugins = ["fuse_helpers"]  # the shared cluster fixture ``fuse_cluster``
pytestmark = [pytest.mark.integration, pytest.mark.fuse, needs_fuse, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def client(fuse_cluster: ProcessCluster) -> Iterator[Any]:
    c = fuse_cluster.connect()
    yield c
    ckpt.close_all()
    c.close()


def _state(seed: int, n: int = 40) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, Any] = {"layers": {}}
    for i in range(n):  # mixed sizes: a few large, many small, across chunk boundaries
        shape = (int(torch.randint(1, 600, (1,), generator=g)), 513) if i % 7 == 0 else (i + 1, 3)
        sd["layers"][str(i)] = torch.randn(shape, generator=g)
    sd["bf"] = torch.randn(1000, generator=g).to(torch.bfloat16)
    sd["np"] = np.arange(3000, dtype=np.int32)
    sd["meta"] = {"step": seed, "name": "run"}
    return sd


def _empty_like(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _empty_like(v) for k, v in x.items()}
    if isinstance(x, torch.Tensor):
        return torch.empty_like(x)
    if isinstance(x, np.ndarray):
        return np.empty_like(x)
    return x


def _same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b)
    else:
        assert a == b


def test_client_api_round_trip_and_increments(client: Any) -> None:
    root = f"/ckpt-{uuid.uuid4().hex[:8]}"
    c = ckpt.Checkpointer(root, client=client, policy=ckpt.Incremental(baseline_every=5))
    assert c.store.kind == "client"
    sd = _state(1)
    full = c.save(sd, step=10).wait()
    sd["layers"]["3"] += 1
    inc = c.save(sd, step=11).wait()
    assert inc["kind"] == "incr" and inc["bytes"] < full["bytes"] / 10
    _same(sd, c.load())
    assert ckpt.latest(root, client=client) == 11
    _same(sd, ckpt.load(root, client=client))
    st = ClientStore(client, root, create=False)
    assert layout.verify(st, 11) == [] and layout.verify(st, 10) == []
    c.close()


def test_consolidated_two_ranks_reshard_via_client(client: Any) -> None:
    root = f"/ckpt-{uuid.uuid4().hex[:8]}"
    w = torch.randn(1000, 64)
    errs: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            c = ckpt.Checkpointer(root, client=client, rank=r, world_size=2, mode="consolidated")
            c.save(
                {"w": ckpt.Shard(w[r * 500 : (r + 1) * 500], (1000, 64), r * 500)}, step=1
            ).wait()
            c.close()
        except BaseException as e:  # noqa: BLE001 - asserted below
            errs.append(e)

    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errs, errs
    assert torch.equal(ckpt.load(root, client=client)["w"], w)
    parts = [ckpt.load(root, client=client, rank=r, world_size=3)["w"] for r in range(3)]
    assert torch.equal(torch.cat(parts), w) and [p.shape[0] for p in parts] == [334, 333, 333]


def test_mount_uses_usrbio(fuse_cluster: ProcessCluster, client: Any) -> None:
    d = fresh_dir(fuse_cluster)
    c = ckpt.Checkpointer(str(d))
    assert c.store.kind == "usrbio"
    sd = _state(2)
    c.save(sd, step=1).wait()
    _same(sd, c.load())  # one transfer into registered shared memory, no copy
    into = _empty_like(sd)
    out = c.load(into=into)
    _same(sd, out)
    assert out["layers"]["0"] is into["layers"]["0"]
    # the same checkpoint through the client API (no mount)
    rel = "/" + str(d.relative_to(fuse_cluster.mountpoint or "/"))
    _same(sd, ckpt.load(rel, client=client))
    # plain POSIX on the mount reads the same bytes
    plain = PosixStore(str(d), usrbio=False)
    assert plain.kind == "posix" and layout.verify(plain, 1) == []
    _same(sd, ckpt.load(plain))
    plain.close()
    c.close()


def _mapping_of(addr: int) -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line
    raise AssertionError(f"{addr:#x} is not mapped")


def test_usrbio_load_is_zero_copy_and_failures_drain(
    fuse_cluster: ProcessCluster, client: Any
) -> None:
    d = fresh_dir(fuse_cluster)
    c = ckpt.Checkpointer(str(d))
    assert c.store.kind == "usrbio"
    sd = _state(3, n=60)
    c.save(sd, step=1).wait()
    out = c.load(1)
    _same(sd, out)
    # the agent read into a registered Iov of the store's load pool: the tensors live
    # in its shared memory, lent to them while they live
    m = _mapping_of(out["layers"]["0"].data_ptr())
    assert "/dev/shm/" in m, m
    pool = c.store._loads
    # lent: the load's Iov and the checkpointer's snapshot buffer (the pool serves both)
    assert pool is not None and len(pool.sizes()[0]) == 2
    assert c._snap is not None and pool.find(c._snap.base, len(c._snap.mem)) is not None
    out["layers"]["0"].add_(1)  # ordinary writable memory
    # a read past the end fails on one ring while the other has I/Os in flight: both drain
    # (the staging Iov is reused by the next call) and the error is the short read
    rel = f"{layout.step_dir(1)}/{layout.data_name(0)}"
    size = c.store.size(rel)
    buf = memoryview(bytearray(size + 3 * IO_BYTES))
    with pytest.raises(OSError) as ei:
        c.store.read_segments(rel, [Segment(0, buf)])
    assert ei.value.errno == errno.EIO
    _same(sd, c.load(1, into=_empty_like(sd)))  # staged through the same staging Iov
    # a flipped bit on storage is caught on the USRBIO path, naming the tensor
    with open(d / rel, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x10]))
        f.flush()
        os.fsync(f.fileno())
    with pytest.raises(ckpt.CorruptCheckpoint, match="CRC32C mismatch"):
        c.load(1)


def _region_of(t: Any) -> tuple[int, int]:
    lo, hi = (int(x, 16) for x in _mapping_of(t.data_ptr()).split()[0].split("-"))
    return lo, hi


def test_usrbio_load_pool_reuses_memory_only_once_released(fuse_cluster: ProcessCluster) -> None:
    d = fresh_dir(fuse_cluster)
    w = ckpt.Checkpointer(str(d))
    sd1, sd2 = _state(5, n=60), _state(6, n=60)
    w.save(sd1, step=1).wait()
    w.save(sd2, step=2).wait()
    w.close()  # its snapshot buffers go back to the pool (expired below with the others)
    c = ckpt.Checkpointer(str(d))
    a = c.load(1)
    pool = c.store._loads
    assert pool is not None and pool is load_pool(c.store.mount)  # the process's, per mount
    gc.collect()  # earlier tests' loads held only by garbage cycles: given back now, not mid-test
    lent_before = len(pool.sizes()[0]) - 1  # other tests' loads still alive, if any
    pool.idle_s = 0.0
    pool.expire()  # other tests' idle Iovs: this test counts its own
    pool.idle_s = POOL_IDLE_S
    ra = _region_of(a["layers"]["0"])
    # while ``a`` lives its memory is never lent again: a second load gets other memory
    b = c.load(2)
    rb = _region_of(b["layers"]["0"])
    assert ra != rb and len(pool.sizes()[0]) == lent_before + 2
    _same(sd1, a)
    _same(sd2, b)
    # one tensor alone keeps its load's memory lent (the views share one owner)
    keep = a["layers"]["3"]
    del a
    assert len(pool.sizes()[0]) == lent_before + 2
    del keep, b  # the last views: both Iovs go back to the pool, idle (no gc pass needed)
    lent, idle = pool.sizes()
    assert len(lent) == lent_before and len(idle) == 2
    # the next load reads into one of them: no new mapping, and the data is the new one
    again = c.load(2)
    assert _region_of(again["layers"]["0"]) in (ra, rb)
    _same(sd2, again)
    assert len(pool.sizes()[1]) == 1
    # a load through a store of its own (module-level load) uses the same pool
    del again
    once = ckpt.load(str(d), 1)
    assert _region_of(once["layers"]["0"]) in (ra, rb)
    _same(sd1, once)
    del once
    again = c.load(2)
    # idle Iovs are unmapped once idle for idle_s
    pool.idle_s = 0.0
    assert pool.expire() == 1 and len(pool.sizes()[0]) == lent_before + 1
    assert pool.sizes()[1] == []
    pool.idle_s = POOL_IDLE_S
    # ... by the pool's own timer, when no load comes
    p2 = LoadPool(c.store.mount, idle_s=0.2)
    buf = p2.take(3 << 20)
    buf[:4] = b"abcd"
    assert p2.sizes() == ([4 << 20], [])
    del buf
    assert p2.sizes() == ([], [4 << 20])
    deadline = time.monotonic() + 10
    while p2.sizes()[1] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert p2.sizes() == ([], [])
    p2.close()
    # ... and at once past idle_bytes
    p3 = LoadPool(c.store.mount, idle_bytes=3 << 20)
    small, big = p3.take(1 << 20), p3.take(3 << 20)
    del small
    assert p3.sizes() == ([4 << 20], [2 << 20])
    del big  # 4 MiB idle alone is past the cap: unmapped
    assert p3.sizes() == ([], [2 << 20])
    p3.close()
    # the pool outlives the store; closing it deregisters the lent Iov, the tensors keep their memory
    c.close()
    assert len(pool.sizes()[0]) == lent_before + 1
    pool.close()
    assert pool.sizes() == ([], [])
    _same(sd2, again)
    again["layers"]["0"].add_(1)
    # the next store gets a new pool for the mount
    c = ckpt.Checkpointer(str(d))
    _same(sd1, c.load(1))
    assert c.store._loads is not pool and c.store._loads is load_pool(c.store.mount)
    c.close()


def test_snapshot_memory_is_reused_by_a_load(
    fuse_cluster: ProcessCluster,
) -> None:
    d = fresh_dir(fuse_cluster)
    sd = {f"w{i}": torch.randn(257 * 1024 + i) for i in range(8)}  # ~8 MiB over chunks
    w = ckpt.Checkpointer(str(d))
    w.save(sd, step=1).wait()  # the writer sends straight from the snapshot's Iov
    pool = w.store._loads
    assert pool is not None and w._snap is not None
    snap = _region_of(torch.frombuffer(w._snap.mem, dtype=torch.uint8))
    w.close()  # the snapshot buffer goes back to the pool, idle
    c = ckpt.Checkpointer(str(d))
    made = pool.made
    out = c.load(1)
    # the first load of this checkpointer reads into the snapshot's memory: nothing fresh
    assert pool.made == made and _region_of(out["w0"]) == snap
    _same(sd, out)
    # its pages were allocated in full (fallocate) before the servers saw the region, so
    # each server maps them all when it is registered there (ShmRegion.populate_allocated)
    # (the Iov's /dev/shm file is unlinked once the agent mapped it: fstat its descriptor)
    hit = pool.find(out["w0"].data_ptr(), 1)
    assert hit is not None
    st = os.fstat(hit[0].fileno())
    assert st.st_blocks * 512 >= st.st_size
    del out
    again = c.load(1)  # and again, into the same memory
    assert pool.made == made and _region_of(again["w0"]) == snap
    _same(sd, again)
    c.close()


def test_cli_against_cluster(fuse_cluster: ProcessCluster, client: Any) -> None:
    root = f"/ckpt-{uuid.uuid4().hex[:8]}"
    c = ckpt.Checkpointer(root, client=client)
    c.save({"w": torch.ones(1000)}, step=1).wait()
    c.save({"w": torch.ones(1000)}, step=2).wait()
    c.close()
    fs3 = [sys.executable, "-m", "fs3.cli.main", "ckpt"]
    cf = ["--cluster", fuse_cluster.cluster_file]

    def run(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*fs3, *a], capture_output=True, text=True, timeout=60, check=False)

    r = run("ls", root, *cf, "--json")
    assert r.returncode == 0, r.stderr
    assert [(x["step"], x["valid"]) for x in json.loads(r.stdout)] == [(1, True), (2, True)]
    r = run("verify", root, *cf)
    assert r.returncode == 0 and "step 2: ok" in r.stdout, r.stdout + r.stderr
    r = run("rm", root, *cf, "--keep-last", "1")
    assert r.returncode == 0 and "removed: 1" in r.stdout, r.stdout + r.stderr
    assert client.listdir(root) == ["step-000000000002"]
    # the mount path works the same
    d = Path(fuse_cluster.mountpoint or "/") / root.lstrip("/")
    r = run("ls", str(d))
    assert r.returncode == 0 and "full" in r.stdout
