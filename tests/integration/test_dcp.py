"""PyTorch DCP on fs3 with several gloo ranks (real processes) against a real local cluster.

Each rank is a process running tests/integration/dcp_worker.py; the checkpoint
goes to an ``fs3://`` path through the client API (no mount). Covered: a
save/load round trip with DTensors sharded over 3 ranks, loading it with 2
ranks and in one process (resharding), and kill -9 of a rank of a 2-rank save
at every phase, over an earlier checkpoint in the same directory: the earlier
one stays loadable until the new ``.metadata`` is committed, and the next good
save removes what the killed ones left. (Torch takes seconds to import, so
the checks that need no second rank run in this process.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import dcp_worker  # noqa: E402 (tests/integration is on sys.path, as for fuse_helpers)

from fs3.ckpt.dcp import Fs3StorageReader, Fs3StorageWriter  # noqa: E402
from fs3.testing.cluster import ProcessCluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

WORKER = str(Path(__file__).with_name("dcp_worker.py"))
RANK_TIMEOUT_S = 120.0


FUSE_OK = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProcessCluster]:
    with ProcessCluster(
        storage_nodes=1,
        targets_per_node=1,
        replicas=1,
        meta=1,
        mgmtd=1,
        mount=FUSE_OK,  # the mount's USRBIO agent serves the local-path test
        overrides={"storage": {"storage": {"fsync": False}}},
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: ProcessCluster) -> Iterator[Any]:
    c = cluster.connect()
    yield c
    c.close()


def run_ranks(tmp: Path, world: int, kill_rank: int | None = None, **args: Any) -> dict[int, int]:
    """Run ``world`` worker processes; return each rank's exit code (negative: signal).

    Every rank must finish within RANK_TIMEOUT_S; once the rank chosen to be
    killed is dead, the others get 5 s more (they are stuck in a collective
    with the dead peer until gloo's timeout) and are then killed too: the
    whole job dies, as it does when a node fails.
    """
    rdv = tmp / f"rdv-{uuid.uuid4().hex[:8]}"
    procs = {}
    for r in range(world):
        a = dict(args, rank=r, world=world, rendezvous=str(rdv), kill_rank=kill_rank)
        procs[r] = subprocess.Popen(
            [sys.executable, WORKER, json.dumps(a)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    deadline = time.monotonic() + RANK_TIMEOUT_S
    try:
        for r, p in procs.items():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            if kill_rank is not None and r == kill_rank and p.returncode is not None:
                deadline = min(deadline, time.monotonic() + 5)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
    codes = {r: p.returncode for r, p in procs.items()}
    outs = {r: p.stdout.read() if p.stdout else "" for r, p in procs.items()}
    for p in procs.values():
        if p.stdout:
            p.stdout.close()
    if kill_rank is None and any(codes.values()):
        pytest.fail(
            f"ranks failed: {codes}\n"
            + "\n".join(f"--- rank {r}\n{o[-3000:]}" for r, o in outs.items())
        )
    return codes


def save_here(client: Any, path: str, seed: int) -> None:
    """Save the unsharded state of ``seed`` from this process (world size 1)."""
    full = dcp_worker.full_state(seed)
    sd = {
        "model": {n: full[n] for n in (*dcp_worker.SHAPES, "bias")},
        "train": {"step": full["step"], "hist": full["hist"]},
    }
    w = Fs3StorageWriter(path, client=client)
    try:
        dcp.save(sd, storage_writer=w, no_dist=True)
    finally:
        w.close()


def load_here(client: Any, path: str) -> dict[str, Any]:
    """Load the whole checkpoint into plain tensors in this process (world size 1)."""
    sd: dict[str, Any] = {
        "model": {n: torch.zeros(shape) for n, (shape, _) in dcp_worker.SHAPES.items()},
        "train": {"step": 0, "hist": []},
    }
    sd["model"]["bias"] = torch.zeros(16, dtype=torch.bfloat16)
    r = Fs3StorageReader(path, client=client)
    try:
        dcp.load(sd, storage_reader=r, no_dist=True)
    finally:
        r.close()
    return sd


def assert_holds(sd: dict[str, Any], seed: int) -> None:
    full = dcp_worker.full_state(seed)
    for n in dcp_worker.SHAPES:
        assert torch.equal(sd["model"][n], full[n]), n
    assert torch.equal(sd["model"]["bias"], full["bias"])
    assert sd["train"] == {"step": full["step"], "hist": full["hist"]}


def test_save_3_ranks_load_3_then_2_then_1(
    cluster: ProcessCluster, client: Any, tmp_path: Path
) -> None:
    path = f"fs3:///dcp-{uuid.uuid4().hex[:8]}/step-1"
    common = {"path": path, "cluster_file": cluster.cluster_file, "seed": 1}
    run_ranks(tmp_path, 3, op="save,load", **common)  # save, then load at the same world size
    names = client.listdir(path[len("fs3://") :])
    data = [n for n in names if n.endswith(".data")]
    assert ".metadata" in names and len(data) == 3  # one aggregated file per rank
    run_ranks(tmp_path, 2, op="load", **common)  # resharded: 37 rows over 2 ranks
    assert_holds(load_here(client, path), 1)  # and all of it in one process


@pytest.mark.fault
def test_kill9_at_every_phase_keeps_the_previous_checkpoint(
    cluster: ProcessCluster, client: Any, tmp_path: Path
) -> None:
    path = f"fs3:///dcp-{uuid.uuid4().hex[:8]}/latest"  # one directory, saved over and over
    common = {"path": path, "cluster_file": cluster.cluster_file}
    save_here(client, path, 1)  # the previous checkpoint (one process: plain tensors)
    assert_holds(load_here(client, path), 1)
    holds = 1
    # (phase, rank killed): a follower dies while or after writing its data file;
    # the coordinator dies before, or right after, publishing .metadata.
    for seed, (phase, victim) in enumerate(
        [("data", 1), ("data-durable", 1), ("metadata", 0), ("committed", 0)], start=2
    ):
        codes = run_ranks(
            tmp_path, 2, op="save", seed=seed, kill_phase=phase, kill_rank=victim, **common
        )
        assert codes[victim] == -signal.SIGKILL, (phase, codes)
        if phase == "committed":
            holds = seed  # .metadata was durable before the kill: the new one is the checkpoint
        assert_holds(load_here(client, path), holds)
    rel = path[len("fs3://") :]
    before = [n for n in client.listdir(rel) if n.endswith(".data")]
    assert len(before) > 2  # files the killed saves left behind
    save_here(client, path, 9)
    after = sorted(client.listdir(rel))
    assert len(after) == 2 and after[0] == ".metadata"  # the live files only
    assert_holds(load_here(client, path), 9)


def test_missing_checkpoint_on_fs3(client: Any) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    path = f"/dcp-none-{uuid.uuid4().hex[:8]}"
    with pytest.raises(CheckpointException, match="no checkpoint directory"):
        load_here(client, "fs3://" + path)
    assert not client.exists(path)  # a load creates nothing
    client.mkdir(path)
    with pytest.raises(CheckpointException, match="no committed DCP checkpoint"):
        load_here(client, "fs3://" + path)


@pytest.mark.fuse
@pytest.mark.skipif(not FUSE_OK, reason="needs /dev/fuse and fusermount3")
def test_usrbio_on_a_mount_and_read_back_through_the_client_api(
    cluster: ProcessCluster, client: Any
) -> None:
    """A local path on an fs3 mount takes USRBIO; the same checkpoint loads via fs3://."""
    assert cluster.mountpoint is not None
    name = f"dcp-mnt-{uuid.uuid4().hex[:8]}"
    local = os.path.join(cluster.mountpoint, name)
    w = Fs3StorageWriter(local)
    full = dcp_worker.full_state(5)
    sd = {
        "model": {n: full[n] for n in (*dcp_worker.SHAPES, "bias")},
        "train": {"step": full["step"], "hist": full["hist"]},
    }
    try:
        dcp.save(sd, storage_writer=w, no_dist=True)
        assert w.store.kind == "usrbio"
    finally:
        w.close()
    r = Fs3StorageReader(local)
    try:
        back = {
            "model": {n: torch.zeros_like(v) for n, v in sd["model"].items()},
            "train": {"step": 0, "hist": []},
        }
        dcp.load(back, storage_reader=r, no_dist=True)
        assert r.store.kind == "usrbio"
    finally:
        r.close()
    assert_holds(back, 5)
    assert_holds(load_here(client, f"fs3:///{name}"), 5)  # no mount: the client API path
