"""Scenario 1: kill -9 the head, a middle and the tail storage node of a chain during writes.

Story: a verifying workload writes through the Python API and the FUSE mount.
Chain 1's head node is SIGKILLed; mgmtd must take its targets out of the chains
(within the heartbeat timeout), writes must keep being acknowledged on the
remaining replicas, and after ``restart`` the node resyncs and serves again.
The same for the chain's middle node, then its tail node. Afterwards nothing
acknowledged is lost, nothing read was stale, torn or never written, all
replicas are byte-identical and the namespace is consistent.
"""

from __future__ import annotations

import pytest

from fs3.testing.cluster import ProcessCluster
from fs3.testing.faults import target_node
from fs3.testing.invariants import fault_cluster

pytestmark = [pytest.mark.fault, pytest.mark.integration]

DETECT_BOUND_S = 15.0  # heartbeat timeout 2.5 s + check interval + routing refresh, generously
RESUME_BOUND_S = 20.0
RECOVER_BOUND_S = 60.0


@pytest.mark.timeout(240)
def test_kill_head_middle_tail_storage_during_writes() -> None:
    with fault_cluster("kill-storage", seed=1) as sc:
        wl = sc.start_workload()
        sc.progress(20, 30, "baseline")
        for role, pos in (("head", 0), ("middle", 1), ("tail", -1)):
            chain = next(c for c in sc.pc.status()["chains"] if c["id"] == 1)
            victim_target = chain["targets"][pos]
            victim = target_node(victim_target)
            sc.say(
                f"chain 1 is {chain['targets']}; kill -9 its {role} {victim} (target {victim_target})"
            )
            sc.pc.kill(victim)
            sc.wait(
                lambda s, t=victim_target: (
                    ProcessCluster.target_states(s).get(t) not in ("serving", None)
                ),
                DETECT_BOUND_S,
                f"mgmtd took target {victim_target} out of service",
            )
            sc.measure_resume(RESUME_BOUND_S, f"writes resumed after killing the {role}")
            sc.progress(10, RESUME_BOUND_S, f"workload while {victim} is down")
            sc.say(f"restart {victim}")
            sc.pc.restart(victim)
            sc.wait_all_serving(RECOVER_BOUND_S, f"{victim} resynced, every target serving")
            sc.progress(5, RESUME_BOUND_S, f"workload after {victim} came back")
        summary = sc.stop_workload()
        assert summary["acked_writes"] > 50
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)
        assert not wl.model.violations
