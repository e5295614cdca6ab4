"""Power loss: SIGKILL plus the loss of everything that was not fsync'd, directory entries included.

Story: the launcher's directory, the SQLite KV and every storage node's data
live on lossy disks (fs3.testing.lossyfs via fs3.testing.powerloss). A workload
writes through the Python API and the FUSE mount (every acknowledged write
recorded by the verifying model) while a namespace storm creates, renames and
unlinks (every acknowledged outcome recorded). At a seeded moment the power
goes: every process on the affected disks is SIGKILLed and each disk drops its
unsynced data and directory entries at once. Then the cluster comes back the
ordinary way (`fs3 cluster up` on the same directory, or the launcher's restart
of the one node) and every acknowledged write must read back byte-exact, every
acknowledged create/rename/unlink be visible, nothing torn or never-written
appear, the replicas agree after resync, and fsck be clean.

Scenarios: the whole cluster (several cuts per cluster, one unsynced write torn
per disk); one storage node alone while the others keep serving; the KV alone
(mgmtd and meta lose power, storage keeps running); and right after
`fs3 cluster up` returns.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable

import pytest

from fs3.testing.invariants import Scenario
from fs3.testing.lossyfs import skip_reason
from fs3.testing.powerloss import LossyDisks, cluster_up, power_cut, power_loss_cluster
from fs3.testing.workload import NamespaceStorm, Violation, Workload, WorkloadConfig

pytestmark = [
    pytest.mark.fault,
    pytest.mark.integration,
    pytest.mark.power_loss,
    pytest.mark.fuse,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
]

# small clusters: one mgmtd, one meta, three single-target storage nodes (3 replicas)
SHAPE = {"storage_nodes": 3, "targets_per_node": 1, "replicas": 3, "meta": 1, "mgmtd": 1}
SMALL_WORKLOAD = {"files_per_writer": 2, "max_blocks": 20}  # 20 x 64 KiB crosses a 1 MiB chunk


class Round:
    """One workload + namespace storm, started before a cut and checked after it."""

    def __init__(self, sc: Scenario, k: int) -> None:
        self.sc = sc
        self.k = k
        writers = [sc.api(f"api{k}"), sc.fuse(f"fuse{k}")]
        self.wl = Workload(
            writers,
            [sc.api(f"apir{k}")],
            config=WorkloadConfig(root=f"/wl{k}", **SMALL_WORKLOAD),  # type: ignore[arg-type]
            seed=sc.seed * 100 + k,
            log=sc.say,
        ).start()
        self.storm = NamespaceStorm(
            [sc.api(f"ns-api{k}"), sc.fuse(f"ns-fuse{k}")], root=f"/ns{k}", seed=sc.seed * 100 + k
        ).start()

    def wait(self, writes: int, ns_ops: int, timeout_s: float = 60.0) -> None:
        target_w = self.wl.acked() + writes
        target_ns = self.storm.ops + ns_ops
        self.sc.pc.wait_for(
            lambda: self.wl.acked() >= target_w and self.storm.ops >= target_ns,
            timeout_s,
            f"{writes} acknowledged writes and {ns_ops} namespace operations",
            interval=0.02,
        )

    def stop(self) -> None:
        self.wl.stop(60)
        self.storm.stop(60)

    def verify(self) -> list[Violation]:
        """Every acknowledged write and namespace outcome, through the API and the mount."""
        api = self.sc.api(f"check{self.k}")
        v = self.wl.model.verify_all(api, f"round{self.k}-api")
        v += self.wl.model.verify_all(self.sc.fuse(f"checkf{self.k}"), f"round{self.k}-fuse")
        v += self.storm.verify(api)
        v += [x for x in self.wl.model.violations if x not in v]
        v += [x for x in self.storm.violations if x not in v]
        self.sc.say(
            f"round {self.k}: {self.wl.model.summary().get('acked_writes', 0)} acknowledged writes, "
            f"{self.storm.ops} namespace ops re-checked: {len(v)} violations"
        )
        return v


def _checks(sc: Scenario, rounds: list[Round]) -> list[str]:
    problems = [str(v) for r in rounds for v in r.verify()]
    problems += sc.final_checks(workload=False, replica_timeout_s=90)
    # and the operator's way: `fs3 admin fsck` on the KV that went through the cuts
    fsck = subprocess.run(
        [
            sys.executable,
            "-m",
            "fs3.cli.main",
            "admin",
            "fsck",
            "--kv",
            f"sqlite://{sc.pc.dir}/kv/kv.db",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if fsck.returncode != 0:
        problems.append(f"fs3 admin fsck exited {fsck.returncode}: {fsck.stdout}{fsck.stderr}")
    return problems


def _report(sc: Scenario, disks: LossyDisks) -> None:
    sc.say(f"{disks.cuts} power cuts; lost in total: {disks.lost}")


def _cut_everything(sc: Scenario, disks: LossyDisks, tear: int, what: str) -> None:
    """Cut the power of every disk and process, then the ordinary `fs3 cluster up`."""
    power_cut(sc, disks, tear=tear)
    sc.pc.wait_for(lambda: sc.pc.mount_state() != "mounted", 10, "the dead mount to go")
    cluster_up(sc, disks)
    sc.measure_resume(60, f"service after {what}")


def _cuts_under_one_workload(
    name: str,
    seed: int,
    cuts: int,
    cut: Callable[[Scenario, LossyDisks, Round, random.Random, int], None],
) -> None:
    """One workload running through ``cuts`` partial power cuts; everything checked at the end."""
    rng = random.Random(seed)
    with power_loss_cluster(name, seed=seed, **SHAPE) as (sc, disks):
        r = Round(sc, 0)
        for k in range(cuts):
            r.wait(rng.randint(3, 15), rng.randint(3, 15))
            cut(sc, disks, r, rng, k)
        r.wait(5, 5, timeout_s=90)  # the workload carries on
        r.stop()
        problems = _checks(sc, [r])
        _report(sc, disks)
        assert not problems, "\n".join(problems[:40])


@pytest.mark.timeout(360)
@pytest.mark.parametrize("seed", [1, 2])
def test_power_cut_of_the_whole_cluster(seed: int) -> None:
    """Three cuts of everything in one cluster; each round's data re-checked after every later cut."""
    rng = random.Random(seed)
    with power_loss_cluster(f"power-all-{seed}", seed=seed, **SHAPE) as (sc, disks):
        rounds: list[Round] = []
        for k in range(3):
            r = Round(sc, k)
            rounds.append(r)
            r.wait(rng.randint(5, 25), rng.randint(5, 30))
            _cut_everything(sc, disks, seed * 1000 + k * 10, f"power cut {k + 1}")
            r.wait(3, 3)  # the workload carries on on the restarted cluster
            r.stop()
            problems = _checks(sc, rounds)
            assert not problems, "\n".join(problems[:40])
        _report(sc, disks)


@pytest.mark.timeout(300)
def test_power_cut_of_one_storage_node_while_the_others_run() -> None:
    def cut(sc: Scenario, disks: LossyDisks, r: Round, rng: random.Random, k: int) -> None:
        node = f"storage-{rng.randint(1, 3)}"
        power_cut(sc, disks, processes=[node], mounts=[node], tear=700 + k)
        r.wait(5, 3, timeout_s=90)  # the other two replicas keep serving
        sc.pc.restart(node)
        sc.wait_all_serving(90, f"{node} back and resynced")

    _cuts_under_one_workload("power-storage", 7, 6, cut)


@pytest.mark.timeout(300)
def test_power_cut_of_the_kv() -> None:
    """mgmtd and meta lose power with the KV's disk; the storage nodes keep running."""

    def cut(sc: Scenario, disks: LossyDisks, r: Round, rng: random.Random, k: int) -> None:
        power_cut(sc, disks, processes=["mgmtd-1", "meta-1"], mounts=["kv"], tear=800 + k)
        for name in ("mgmtd-1", "meta-1"):
            sc.pc.restart(name)
        sc.measure_resume(60, f"service after KV power cut {k + 1}")

    _cuts_under_one_workload("power-kv", 8, 6, cut)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [4, 5])
def test_power_cut_right_after_cluster_up(seed: int) -> None:
    """Regression: the launcher's files were not fsync'd; after this cut `up` refused the dir."""
    with power_loss_cluster(f"power-after-up-{seed}", seed=seed, **SHAPE) as (sc, disks):
        _cut_everything(sc, disks, seed, "the power cut")
        r = Round(sc, 0)
        r.wait(10, 10)
        r.stop()
        problems = _checks(sc, [r])
        _report(sc, disks)
        assert not problems, "\n".join(problems[:40])
