"""Scenario 2: two of three replicas' nodes killed; writes continue on the last one; return in 3FS order.

Story: storage-2 and then storage-3 are SIGKILLed (one after the other, each
detected before the next), so every chain is down to the targets of storage-1 —
the workload must keep getting writes acknowledged there. Then storage-1 dies
too: its targets become LASTSRV (they hold the newest data). The other two
nodes are restarted *first*: 3FS must not let them serve (they missed writes),
so their targets stay out of service. Only when the last-serving node returns do
the chains serve again, and the others resync from it. Nothing acknowledged —
in particular nothing acknowledged while only storage-1 was serving — is lost.
"""

from __future__ import annotations

import time

import pytest

from fs3.testing.cluster import ProcessCluster
from fs3.testing.invariants import fault_cluster

pytestmark = [pytest.mark.fault, pytest.mark.integration]


def _node_targets(s: dict, node: str) -> list[int]:  # type: ignore[type-arg]
    return [t["id"] for t in s["targets"] if t["node"] == node]


@pytest.mark.timeout(240)
def test_two_of_three_down_then_return_in_order() -> None:
    with fault_cluster("two-down", seed=2) as sc:
        wl = sc.start_workload(fuse_writers=1, fuse_readers=0, api_readers=1)
        sc.progress(15, 30, "baseline")
        s = sc.pc.status()
        t1, t2, t3 = (_node_targets(s, f"storage-{i}") for i in (1, 2, 3))
        for node, targets in (("storage-2", t2), ("storage-3", t3)):
            sc.say(f"kill -9 {node} (targets {targets})")
            sc.pc.kill(node)
            sc.wait(
                lambda s, ts=targets: all(
                    ProcessCluster.target_states(s)[t] != "serving" for t in ts
                ),
                15,
                f"{node}'s targets out of service",
            )
        sc.measure_resume(20, "writes resumed on the last serving replicas")
        sc.progress(15, 30, "writes acknowledged by storage-1 alone")
        states = ProcessCluster.target_states(sc.pc.status())
        assert all(states[t] == "serving" for t in t1), states
        acked_alone = wl.acked()
        sc.say(
            f"kill -9 storage-1 too (the last serving replicas, targets {t1}); {acked_alone} writes acknowledged"
        )
        sc.pc.kill("storage-1")
        sc.wait(
            lambda s: all(ProcessCluster.target_states(s)[t] == "last-serving" for t in t1),
            15,
            "storage-1's targets published as last-serving",
        )
        for node in ("storage-2", "storage-3"):
            sc.say(f"restart {node} before the last-serving node (3FS must not let it serve)")
            sc.pc.restart(node)
        # they are back and report in, but must not serve (they missed the writes of storage-1 alone)
        sc.wait(
            lambda s: all(
                n["status"] == "online"
                for n in s["nodes"]
                if n["name"] in ("storage-2", "storage-3")
            ),
            20,
            "storage-2 and storage-3 heartbeat again",
        )
        deadline_states = []
        for _ in range(10):
            st = ProcessCluster.target_states(sc.pc.status())
            deadline_states.append(st)
            assert all(st[t] != "serving" for t in t2 + t3), f"a stale replica serves: {st}"
            time.sleep(0.3)
        sc.say(
            f"while the last-serving node is down, the returned targets stay out: {deadline_states[-1]}"
        )
        sc.say("restart storage-1 (the last-serving node)")
        sc.pc.restart("storage-1")
        sc.wait_all_serving(90, "chains serving again, storage-2/3 resynced from storage-1")
        sc.measure_resume(20, "service resumed after the last-serving node returned")
        sc.progress(10, 30, "workload after recovery")
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)
