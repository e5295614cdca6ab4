"""Scenario: frozen processes (SIGSTOP) longer than the heartbeat timeout, then resumed.

Seen in CI (test_partition_storage_node): the mgmtd leader declared every node down in
the same millisecond while all of them were alive; every target fenced itself (the
LASTSRV one included) and, as fencing lasted until a process restart, no chain served
again. Two properties are checked here with real processes and a running workload:

* a leader that hears nobody (every other process frozen, or itself frozen) does not
  declare the cluster down: it can only count silence it could have observed
  (``MgmtdOperator.check_heartbeats``);
* when every storage node really was silent past the timeout (all frozen at once), the
  chains go LASTSRV/OFFLINE and, once the nodes run again, come back without a restart:
  the LASTSRV target serves again directly and the others resync from it
  (``TargetMap.apply_routing``), with no acknowledged write lost.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from fs3.testing.cluster import ProcessCluster
from fs3.testing.faults import pause, resume
from fs3.testing.invariants import fault_cluster

pytestmark = [pytest.mark.fault, pytest.mark.integration]

STORAGE = ("storage-1", "storage-2", "storage-3")


def _chain_versions(s: dict[str, Any]) -> dict[int, int]:
    return {int(c["id"]): int(c["version"]) for c in s["chains"]}


def _frozen(sc: Any, names: list[str], seconds: float) -> None:
    """SIGSTOP ``names`` for ``seconds`` (the fault's length, not a wait), then SIGCONT."""
    sc.say(f"SIGSTOP {', '.join(names)} for {seconds:.1f}s")
    try:
        for n in names:
            pause(sc.pc, n)
        time.sleep(seconds)
    finally:
        for n in names:
            resume(sc.pc, n)
    sc.say(f"SIGCONT {', '.join(names)}")


@pytest.mark.timeout(300)
def test_a_leader_that_hears_nobody_declares_nobody_down() -> None:
    # A 10 s lease keeps the frozen leader the leader across a 4 s pause (the default 3 s
    # lease would hand over to the standby, which presumes everyone alive anyway). A 2 s
    # heartbeat timeout: the 3.2 s freeze below is well past it (a late tick of a loaded
    # leader must not hide the silence) and below two timeouts (a total outage).
    timings = {"mgmtd": {"mgmtd": {"lease_length_s": 10.0, "heartbeat_timeout_s": 2.0}}}
    with fault_cluster("stall-leader", overrides=timings, seed=21) as sc:
        sc.start_workload()
        sc.progress(15, 60, "baseline")
        s = sc.pc.status()
        leader, before = s["leader"], _chain_versions(s)
        assert leader, "no leader"
        # 1. every other server process frozen: the leader hears nobody for 3.2 s while its
        #    own loop runs on time
        others = [
            p
            for p in sc.pc.names
            if p != leader and p.split("-")[0] in ("mgmtd", "meta", "storage")
        ]
        _frozen(sc, others, 3.2)
        sc.wait(lambda s: all(n["status"] == "online" for n in s["nodes"]), 20, "every node online")
        s = sc.pc.status()
        assert s["leader"] == leader
        assert _chain_versions(s) == before, (
            f"the leader changed chains while it heard nobody: {before} -> {_chain_versions(s)}"
        )
        assert all(v == "serving" for v in ProcessCluster.target_states(s).values())
        sc.measure_resume(20, "service after the other processes were frozen")
        # 2. the leader itself frozen past the heartbeat timeout (not past its lease)
        _frozen(sc, [leader], 4.0)
        sc.measure_resume(20, "service after the leader was frozen")
        s = sc.pc.status()
        assert s["leader"] == leader, f"{s['leader']} leads after the pause (lease 10 s)"
        assert _chain_versions(s) == before, (
            f"the stalled leader declared live nodes down: {before} -> {_chain_versions(s)}"
        )
        sc.progress(10, 60, "workload after the pauses")
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)


@pytest.mark.timeout(300)
def test_all_storage_nodes_frozen_come_back_without_a_restart() -> None:
    with fault_cluster("stall-storage", seed=22) as sc:
        sc.start_workload()
        sc.progress(15, 60, "baseline")
        pids = {n: sc.pc.pid(n) for n in STORAGE}
        # long enough for the leader (which still hears meta and the standby mgmtd) to
        # declare all three down: every chain goes LASTSRV + OFFLINE
        names = list(STORAGE)
        sc.say(f"SIGSTOP {', '.join(names)} until mgmtd declared them down")
        try:
            for n in names:
                pause(sc.pc, n)
            sc.wait(
                lambda s: all(n["status"] != "online" for n in s["nodes"] if n["name"] in STORAGE),
                30,
                "every storage node declared down",
            )
            s = sc.pc.status()
            states = [st for c in s["chains"] for st in c["states"]]
            assert "serving" not in states and "last-serving" in states, s["chains"]
        finally:
            for n in names:
                resume(sc.pc, n)
        sc.say("SIGCONT every storage node (no restart)")
        took = sc.wait_all_serving(60, "every chain serving again, no process restarted")
        assert {n: sc.pc.pid(n) for n in STORAGE} == pids, "a storage process was restarted"
        sc.measure_resume(20, "writes and reads after the storage nodes resumed")
        sc.say(f"recovered in {took:.1f}s")
        sc.progress(10, 60, "workload after the recovery")
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)
