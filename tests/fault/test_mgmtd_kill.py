"""Scenario 3: kill -9 the mgmtd leader during writes, and again during a storage node failure.

Story: the leader mgmtd is SIGKILLed while the workload writes; the standby must
take the lease (lease 3 s) and lead; the workload keeps going. The old leader is
restarted as a standby. Then a storage node is killed and, before the failure is
handled, the (new) leader is killed as well: the next leader must still detect
the dead node and take its targets out of the chains; the node is restarted and
resyncs. Routing stays consistent throughout: chain versions never go backwards,
chains keep their member sets, and exactly one mgmtd leads at the end.
"""

from __future__ import annotations

import time

import pytest

from fs3.testing.cluster import ProcessCluster
from fs3.testing.invariants import fault_cluster

pytestmark = [pytest.mark.fault, pytest.mark.integration]

LEAD_BOUND_S = 15.0  # lease 3 s + renew interval + start-up slack


class RoutingWatch:
    """Records every status seen; chain versions must be monotonic and member sets stable."""

    def __init__(self) -> None:
        self.versions: dict[int, int] = {}
        self.members: dict[int, set[int]] = {}
        self.problems: list[str] = []

    def see(self, s: dict) -> None:  # type: ignore[type-arg]
        for c in s["chains"]:
            cid = c["id"]
            if c["version"] < self.versions.get(cid, 0):
                self.problems.append(
                    f"chain {cid} version went back {self.versions[cid]} -> {c['version']}"
                )
            self.versions[cid] = max(self.versions.get(cid, 0), c["version"])
            m = set(c["targets"])
            if self.members.setdefault(cid, m) != m:
                self.problems.append(f"chain {cid} members changed {self.members[cid]} -> {m}")


@pytest.mark.timeout(240)
def test_kill_mgmtd_leader_during_writes_and_node_failure() -> None:
    with fault_cluster("kill-mgmtd", seed=3) as sc:
        watch = RoutingWatch()

        def leader_is_not(old: str):  # type: ignore[no-untyped-def]
            def f(s: dict) -> bool:  # type: ignore[type-arg]
                watch.see(s)
                return s["leader"] not in (None, old)

            return f

        sc.start_workload()
        sc.progress(15, 30, "baseline")
        s = sc.pc.status()
        watch.see(s)
        old = s["leader"]
        sc.say(f"kill -9 the mgmtd leader {old} during writes")
        sc.pc.kill(old)
        sc.wait(leader_is_not(old), LEAD_BOUND_S, "a standby mgmtd leads")
        sc.progress(10, 30, "writes under the new leader")
        sc.say(f"restart {old} (standby now)")
        sc.pc.restart(old)
        s = sc.pc.status()
        leader2 = s["leader"]
        sc.say(f"leader is {leader2}; kill -9 storage-2 and then, at once, the leader {leader2}")
        sc.pc.kill("storage-2")
        sc.pc.kill(leader2)
        t = time.monotonic()
        sc.wait(leader_is_not(leader2), LEAD_BOUND_S, "the other mgmtd leads")
        sc.wait(
            lambda s: (
                watch.see(s),
                all(ProcessCluster.target_states(s)[x] != "serving" for x in (201, 202)),
            )[1],
            20,
            "the new leader took storage-2's targets out of service",
        )
        sc.say(f"node failure handled {time.monotonic() - t:.1f}s after both kills")
        sc.progress(10, 30, "writes with storage-2 down under the third leadership")
        sc.pc.restart(leader2)
        sc.pc.restart("storage-2")
        sc.wait_all_serving(90)
        final = sc.pc.status()
        watch.see(final)
        leaders = []
        from fs3.launcher import MgmtdProbe

        for p in final["processes"]:
            if p["role"] == "mgmtd":
                probe = MgmtdProbe([p["address"]], timeout_s=2.0)
                if probe.leader() is not None:
                    leaders.append(p["name"])
        sc.say(f"mgmtds claiming leadership: {leaders}; chain versions {watch.versions}")
        assert len(leaders) == 1, leaders
        assert not watch.problems, watch.problems
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)
