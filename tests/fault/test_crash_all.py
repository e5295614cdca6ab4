"""Scenario 10: crash consistency of the whole node.

Story: mid-workload, every process of the cluster — both mgmtds, both metas, the
three storage nodes and the FUSE daemon — is SIGKILLed at once (a host crash
as far as processes can tell; the kernel's page cache survives, so this is not a
power-loss test). The cluster is restarted from its data directories with
``fs3 cluster up`` (the launcher's ``up`` on the same directory, which clears
the stale mount and mounts again). Every write acknowledged before the crash
must be there, the replicas identical and the namespace consistent.
"""

from __future__ import annotations

import time

import pytest

from fs3.testing.invariants import fault_cluster

pytestmark = [pytest.mark.fault, pytest.mark.integration]


@pytest.mark.timeout(240)
def test_kill_every_process_and_restart_from_data() -> None:
    with fault_cluster("crash-all", seed=11) as sc:
        wl = sc.start_workload()
        sc.progress(40, 40, "baseline")
        names = sc.pc.kill_all()
        acked = wl.acked()
        sc.say(f"kill -9 of every process: {names}; {acked} writes acknowledged before the crash")
        # the kernel may answer stat() of the mount root from its attribute cache for ~1 s after
        # the daemon died; `up` refuses a mount point that still looks mounted, so wait for it
        sc.pc.wait_for(
            lambda: sc.pc.mount_state() == "stale", 10, "the dead mount to show as stale"
        )
        t = time.monotonic()
        sc.pc.start()
        sc.say(f"cluster restarted from its data directories in {time.monotonic() - t:.1f}s")
        sc.measure_resume(30, "service resumed after the whole-cluster crash")
        sc.progress(15, 60, "workload after the restart")
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)
