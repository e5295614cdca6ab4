"""Crash at every phase of a checkpoint save (kill -9 of the writer): never a half checkpoint.

A writer process saves step 1 (committed), then step 2, and stops at one phase
of step 2 (before the data file, before the index, before the manifest, before
the success marker, after it; or in the middle of the data file). The test
kills it with SIGKILL there and checks, from another process, that
``latest()`` is step 1 (step 2 only once its marker was written), that the
state loads with every CRC intact, that ``fs3 ckpt ls`` reports step 2 as
invalid, and that garbage collection removes it once a newer save commits.
Both data paths run: the client API (no mount) and USRBIO on the FUSE mount.
A two-rank save whose rank 1 dies leaves no marker either.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fs3.ckpt as ckpt
from fs3.ckpt import layout
from fs3.ckpt.store import open_store
from fs3.testing.cluster import ProcessCluster

pytestmark = [
    pytest.mark.fault,
    pytest.mark.integration,
    pytest.mark.fuse,
    pytest.mark.skipif(
        not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None or os.geteuid() != 0,
        reason="needs /dev/fuse, fusermount3 and root",
    ),
    pytest.mark.timeout(240),
]

WRITER = r"""
import sys, time
import numpy as np
import fs3, fs3.ckpt as ck
how, root, cf, phase, rank, world = sys.argv[1:7]
rank, world = int(rank), int(world)
client = fs3.connect(cf) if how == "client" else None
c = ck.Checkpointer(root, client=client, rank=rank, world_size=world, barrier_timeout_s=20)

def state(step):
    rng = np.random.default_rng(step * 10 + rank)
    return {"big": rng.standard_normal(6 << 20 >> 3).astype(np.float64),
            "small": [np.full(100 + i, step, np.int32) for i in range(20)], "step": step}

def hook(name, step):
    if step == 2 and name == phase:
        print("AT", name, flush=True)
        time.sleep(600)  # killed here

c._phase_hook = hook
if world == 1:
    c.save(state(1), step=1).wait()
    print("SAVED 1", flush=True)
if phase == "mid-data" and how == "mount":
    print("AT mid-data", flush=True)  # the parent kills once the data file grows
h = c.save(state(2), step=2)
h.wait()
print("SAVED 2", flush=True)
time.sleep(600)
"""


def state(step: int, rank: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(step * 10 + rank)
    return {
        "big": rng.standard_normal(6 << 20 >> 3).astype(np.float64),
        "small": [np.full(100 + i, step, np.int32) for i in range(20)],
        "step": step,
    }


def same(a: Any, b: Any) -> None:
    assert a["step"] == b["step"]
    assert np.array_equal(a["big"], b["big"])
    for x, y in zip(a["small"], b["small"], strict=True):
        assert np.array_equal(x, y)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProcessCluster]:
    base = Path(tempfile.mkdtemp(prefix="fs3-ckpt-crash-"))
    c = ProcessCluster(
        base / "cluster",
        storage_nodes=3,
        targets_per_node=1,
        replicas=3,
        meta=1,
        mgmtd=1,
        mount=str(base / "mnt"),
        overrides={"storage": {"storage": {"fsync": False}}},
    )
    ok = False
    try:
        c.start()
        yield c
        ok = True
    finally:
        c.close(failed=not ok)
        if ok:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def client(cluster: ProcessCluster) -> Iterator[Any]:
    c = cluster.connect()
    yield c
    c.close()


class Writer:
    def __init__(self, how: str, root: str, cf: str, phase: str, rank: int = 0, world: int = 1):
        self.p = subprocess.Popen(
            [sys.executable, "-c", WRITER, how, root, cf, phase, str(rank), str(world)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def expect(self, line: str, timeout: float = 120) -> None:
        """Wait for one line of output (a process stuck elsewhere fails the test's timeout)."""
        assert self.p.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.p.stdout.readline()
            if not got:
                err = self.p.stderr.read() if self.p.stderr else ""
                raise AssertionError(f"writer exited before {line!r}: {err[-2000:]}")
            if got.strip() == line:
                return
        raise AssertionError(f"writer did not print {line!r}")

    def kill9(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(30)
        assert self.p.returncode == -signal.SIGKILL
        for f in (self.p.stdout, self.p.stderr):
            if f is not None:
                f.close()
        # shared memory the killed writer created (USRBIO Iovs, transport staging): a
        # mount's agent reclaims its Iovs, but the cluster may stop before it does
        for leftover in glob.glob(f"/dev/shm/fs3-*-{self.p.pid}-*"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _root(cluster: ProcessCluster, how: str) -> tuple[str, str, Any]:
    name = f"ck-{uuid.uuid4().hex[:8]}"
    if how == "client":
        return f"/{name}", name, None
    assert cluster.mountpoint
    return os.path.join(cluster.mountpoint, name), name, None


def _store(how: str, root: str, client: Any) -> Any:
    return open_store(root, client=client if how == "client" else None, create=False)


PHASES = ["data", "mid-data", "index", "manifest", "marker", "committed"]


CASES = [(h, p) for h in ("client", "mount") for p in PHASES if (h, p) != ("client", "mid-data")]


@pytest.mark.parametrize(("how", "phase"), CASES)
def test_kill_writer_at_every_phase(
    cluster: ProcessCluster, client: Any, how: str, phase: str
) -> None:
    """(mid-data is observed through the mount: the file grows there while USRBIO writes.)"""
    root, name, _ = _root(cluster, how)
    w = Writer(how, root, cluster.cluster_file, phase)
    try:
        w.expect("SAVED 1")
        w.expect(f"AT {phase}")
        if phase == "mid-data":
            data = Path(root) / layout.step_dir(2) / layout.data_name(0)
            deadline = time.monotonic() + 60
            while not (data.exists() and data.stat().st_size > 0):
                assert time.monotonic() < deadline, "the data file never grew"
                time.sleep(0.002)  # polling the condition (file grows), not guessing a time
        w.kill9()
    finally:
        if w.p.poll() is None:
            w.kill9()
    store = _store(how, root, client)
    try:
        infos = {i.step: i for i in layout.list_checkpoints(store)}
        want = 2 if phase == "committed" else 1
        assert layout.latest(store) == want
        same(state(want), ckpt.load(store))
        assert layout.verify(store, 1) == []
        if phase != "committed":
            if 2 in infos:  # the directory exists from "data" on
                assert not infos[2].valid, infos[2]
            with pytest.raises((ckpt.CorruptCheckpoint, FileNotFoundError)):
                ckpt.load(store, 2)
            # a later save commits and garbage collection removes the half one
            c = ckpt.Checkpointer(store)
            c.save(state(3), step=3).wait()
            assert layout.gc(store) == ([2] if 2 in infos else [])
            assert layout.steps(store) == [1, 3]
            same(state(3), ckpt.load(store))
            c.close()
    finally:
        store.close()


def test_kill_one_rank_of_two(cluster: ProcessCluster, client: Any) -> None:
    """Rank 1 dies before its index: rank 0 never writes the marker (its barrier times out)."""
    root, _, _ = _root(cluster, "client")
    w1 = Writer("client", root, cluster.cluster_file, "index", rank=1, world=2)
    w0 = Writer("client", root, cluster.cluster_file, "none", rank=0, world=2)
    try:
        w1.expect("AT index")
        w1.kill9()
        assert w0.p.wait(120) != 0  # rank 0's save raised (barrier timeout)
        err = w0.p.stderr.read() if w0.p.stderr else ""
        assert "rank 1 did not publish" in err, err[-2000:]
    finally:
        for w in (w0, w1):
            if w.p.poll() is None:
                w.kill9()
    store = _store("client", root, client)
    try:
        infos = {i.step: i for i in layout.list_checkpoints(store)}
        assert infos[2].valid is False and "incomplete" in infos[2].reason
        assert layout.latest(store) is None
    finally:
        store.close()
