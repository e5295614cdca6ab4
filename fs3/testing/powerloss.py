"""Power-loss scenarios: a fault cluster whose disks are lossy mounts (fs3.testing.lossyfs).

Layout (one lossy mount per "disk", so one node can lose power alone)::

    ROOT/cluster            the launcher's directory (configs, state.json, logs): mount "launcher"
    ROOT/cluster/kv      -> ROOT/kv           the SQLite KV of mgmtd and meta:    mount "kv"
    ROOT/cluster/data/storage-i -> ROOT/storage-i  storage node i's targets:     mount "storage-i"
    ROOT/mnt                the fs3 FUSE mount (not on a lossy disk)
    ROOT/disk/<mount>       the backing directories ("the disks")

The per-node disks are reached through symlinks the launcher follows, not
nested mounts: a cut of the launcher's disk rebuilds its tree, and the kernel
would detach a mount sitting on a rebuilt directory.

:func:`power_cut` is the cut itself: SIGKILL the processes that lose power
(all at once, then wait until they are gone) and ``crash()`` every affected
disk at the same moment (one thread per disk).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fs3.durable import fsync_dir, makedirs_durably
from fs3.launcher import is_alive, is_gone
from fs3.testing.invariants import Scenario, fault_cluster
from fs3.testing.lossyfs import LossyMount


class LossyDisks:
    """The lossy mounts of one power-loss cluster (see the module docstring)."""

    def __init__(self, storage_nodes: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fs3-powerloss-"))
        self.dir = self.root / "cluster"
        self.mountpoint = str(self.root / "mnt")
        self.mounts: dict[str, LossyMount] = {}
        names = ["launcher", "kv"] + [f"storage-{i}" for i in range(1, storage_nodes + 1)]
        for name in names:
            at = self.dir if name == "launcher" else self.root / name
            disk = self.root / "disk"
            self.mounts[name] = LossyMount(
                disk / name, at, state=disk / f"{name}.lossy", log=self.root / f"lossy-{name}.log"
            )
        self.cuts = 0
        self.cluster_id = ""  # the cluster that must come back after every cut
        self.lost: dict[str, int] = {"files_rolled_back": 0, "dirs_reverted": 0, "torn": 0}

    def mount(self) -> LossyDisks:
        os.makedirs(self.mountpoint, exist_ok=True)
        for m in self.mounts.values():
            m.mount()
        # the links to the per-node disks, durable before the launcher ever looks
        makedirs_durably(self.dir / "data")
        for name in self.mounts:
            if name == "kv":
                os.symlink(self.root / "kv", self.dir / "kv")
            elif name.startswith("storage-"):
                os.symlink(self.root / name, self.dir / "data" / name)
        fsync_dir(self.dir / "data")
        fsync_dir(self.dir)
        return self

    def cut(self, names: Sequence[str] | None = None, *, tear: int | None = None) -> dict[str, Any]:
        """``crash()`` the named disks (default: all) at once; returns each one's report."""
        chosen = [self.mounts[n] for n in (names or list(self.mounts))]
        reports: dict[str, Any] = {}
        errors: list[BaseException] = []

        def one(i: int, m: LossyMount) -> None:
            try:
                reports[m.mountpoint.name] = m.crash(tear=None if tear is None else tear + i)
            except BaseException as e:  # re-raised below, in the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i, m)) for i, m in enumerate(chosen)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if errors:
            raise errors[0]
        self.cuts += 1
        for r in reports.values():
            self.lost["files_rolled_back"] += r["files_rolled_back"]
            self.lost["dirs_reverted"] += r["dirs_reverted"]
            self.lost["torn"] += 1 if r.get("torn") else 0
        return reports

    def unmount(self, keep: bool = False) -> None:
        for m in self.mounts.values():
            with contextlib.suppress(Exception):
                m.unmount()
        if keep:
            print(f"power-loss disks kept in {self.root / 'disk'}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def kill_processes(sc: Scenario, names: Sequence[str] | None = None) -> list[str]:
    """SIGKILL the named processes (default: every running one) at once; wait until gone."""
    st = sc.pc.launcher.load_state()
    assert st is not None
    recs = [r for r in st.processes if (names is None or r.name in names) and is_alive(r)]
    for r in recs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(r.pid, signal.SIGKILL)
    sc.pc.wait_for(lambda: all(is_gone(r) for r in recs), 30, "the killed processes to be gone")
    return [r.name for r in recs]


def power_cut(
    sc: Scenario,
    disks: LossyDisks,
    *,
    processes: Sequence[str] | None = None,
    mounts: Sequence[str] | None = None,
    tear: int | None = None,
) -> dict[str, Any]:
    """A power cut: the processes die (SIGKILL) and their disks lose what was not durable."""
    killed = kill_processes(sc, processes)
    reports = disks.cut(mounts, tear=tear)
    lost = {
        n: (r["files_rolled_back"], r["dirs_reverted"], bool(r.get("torn")))
        for n, r in reports.items()
    }
    sc.say(
        f"POWER CUT #{disks.cuts}: killed {', '.join(killed)}; disks lost (files rolled back, "
        f"directories reverted, write torn): {lost}"
    )
    return reports


def cluster_up(sc: Scenario, disks: LossyDisks, timeout_s: float = 120.0) -> float:
    """``fs3 cluster up`` on the same directory, as an operator would run it; returns seconds.

    The same cluster must come back: a launcher that lost its files would lay out
    a new one over the old data instead.
    """
    fs3 = shutil.which("fs3", path=os.path.dirname(sys.executable)) or "fs3"
    cmd = [fs3, "cluster", "up", "--dir", str(sc.pc.dir), "--timeout", str(timeout_s)]
    if sc.pc.mountpoint:
        cmd += ["--mount", sc.pc.mountpoint]
    t = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 60)
    took = time.monotonic() - t
    if r.returncode != 0:
        raise AssertionError(
            f"`fs3 cluster up` after the power cut failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        )
    st = sc.pc.launcher.load_state()
    if st is None or st.cluster_id != disks.cluster_id:
        raise AssertionError(
            f"`fs3 cluster up` did not restart cluster {disks.cluster_id} "
            f"(state now: {st.cluster_id if st else 'none'}):\n{r.stdout}\n{r.stderr}"
        )
    sc.say(f"`fs3 cluster up` brought cluster {st.cluster_id} back in {took:.1f}s")
    return took


@contextlib.contextmanager
def power_loss_cluster(
    name: str, *, seed: int, storage_nodes: int = 3, **kw: Any
) -> Iterator[tuple[Scenario, LossyDisks]]:
    """:func:`fs3.testing.invariants.fault_cluster` on lossy disks; all undone on exit."""
    disks = LossyDisks(storage_nodes).mount()
    failed = True
    try:
        with fault_cluster(
            name,
            seed=seed,
            storage_nodes=storage_nodes,
            dir=disks.dir,
            mountpoint=disks.mountpoint,
            **kw,
        ) as sc:
            st = sc.pc.launcher.load_state()
            assert st is not None
            disks.cluster_id = st.cluster_id
            yield sc, disks
        failed = False
    finally:
        disks.unmount(keep=failed)
