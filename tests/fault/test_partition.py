"""Scenario 6: network partitions with ip netns + veth.

6a. storage-3 runs inside its own network namespace from the start (its
    ``127.0.0.1:<port>`` addresses are NATed over a veth, see fs3.testing.faults).
    The veth is cut (silent DROP both ways): the process is alive but unreachable
    and cannot heartbeat. mgmtd must take its targets out of the chains; writes
    continue on the other replicas. After the heal the node learns it was declared
    offline and fences its targets (it missed writes; 3FS never lets such a target
    serve directly); still running, it rejoins as a restarted node would (offline,
    then online) and its targets resync before they serve again.

6b. The mgmtd leader runs in its own namespace. With the SQLite KV every mgmtd
    reads the KV file directly, so a network cut alone cannot separate the leader
    from the KV. What is simulated: the leader loses the network (veth cut: nodes
    and clients cannot reach it) *and* the KV side (SIGSTOP: it can renew nothing).
    The standby must take over after the 3 s lease; while the old leader is still
    cut off it is resumed (SIGCONT) and must not act as leader (it must see its
    lease lost); then the network heals and exactly one mgmtd leads.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fs3.testing.cluster import ProcessCluster
from fs3.testing.faults import netns_unavailable, pause, resume
from fs3.testing.invariants import fault_cluster

pytestmark = [pytest.mark.fault, pytest.mark.integration]

_why = netns_unavailable()
needs_netns = pytest.mark.skipif(_why is not None, reason=f"network namespaces unavailable: {_why}")


@needs_netns
@pytest.mark.timeout(240)
def test_partition_storage_node() -> None:
    with fault_cluster("partition-storage", netns={"storage-3": 11}, seed=6) as sc:
        link = sc.links[0]
        sc.start_workload()
        sc.progress(15, 30, "baseline (storage-3 serving from inside its namespace)")
        targets = [t["id"] for t in sc.pc.status()["targets"] if t["node"] == "storage-3"]
        sc.say(f"cut the veth of storage-3 (targets {targets})")
        link.partition()
        sc.wait(
            # a status taken during a leader change lists no targets: not an answer yet
            lambda s: all(
                ProcessCluster.target_states(s).get(t, "serving") != "serving" for t in targets
            ),
            20,
            "storage-3's targets removed from the chains",
        )
        assert sc.pc.alive("storage-3"), "the partitioned node must be alive (cut off, not killed)"
        sc.measure_resume(25, "writes resumed without storage-3")
        sc.progress(15, 30, "writes while storage-3 is cut off")
        sc.say("heal the partition")
        link.heal()
        t0 = time.monotonic()
        sc.wait(
            lambda s: all(n["status"] == "online" for n in s["nodes"] if n["name"] == "storage-3"),
            20,
            "storage-3 heartbeats again",
        )
        sc.say(
            "after the heal storage-3's targets fence themselves (they missed writes) and "
            "rejoin without a restart: reported offline, then online, then resynced"
        )
        sc.wait_all_serving(90, "storage-3 resynced and serving")
        # never served directly: every way back to serving went through a resync
        for t in targets:
            came_back = _transitions(sc, t, new="serving")
            assert came_back and set(came_back) == {"syncing"}, (
                f"target {t} of the partitioned node became serving from {came_back}"
            )
        sc.say(f"partition healed -> serving again in {time.monotonic() - t0:.1f}s")
        sc.progress(10, 30, "workload after the heal")
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)


def _transitions(sc: Any, target: int, *, new: str) -> list[str]:
    """The ``old`` states of every mgmtd ``target state`` event of ``target`` to ``new``."""
    pat = re.compile(
        rf"target state chain=\d+ chain_version=\d+ target={target} old=(\w+) new={new}\b"
    )
    found: list[str] = []
    for name, path in sc.pc.logs.items():
        if name.startswith("mgmtd"):
            found += pat.findall(Path(path).read_text(errors="replace"))
    return found


def _is_leader_inside(ns: str, address: str) -> bool | None:
    """Ask the mgmtd at ``address`` from inside namespace ``ns`` whether it leads (None: no answer)."""
    code = (
        "import sys\n"
        "from fs3.proto import mgmtd_pb2, mgmtd_pb2_grpc\n"
        "from fs3.rpc.channel import call_sync, sync_channel\n"
        f"ch = sync_channel({address!r})\n"
        "try:\n"
        "    r = call_sync(mgmtd_pb2_grpc.MgmtdServiceStub(ch).GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=3)\n"
        "    print('LEADER' if r.is_leader else 'STANDBY')\n"
        "except Exception as e:\n"
        "    print('ERROR', e)\n"
    )
    r = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = r.stdout.strip()
    return True if out == "LEADER" else False if out == "STANDBY" else None


@needs_netns
@pytest.mark.timeout(240)
def test_partition_mgmtd_leader_from_kv_side() -> None:
    # A black-holed leader makes every node's heartbeat RPC to it hang for the mgmtd
    # client's per-attempt timeout (5 s, fixed in fs3/storage/server.py) before it tries
    # the next mgmtd; with the tier's usual 2.5 s heartbeat timeout the new leader would
    # declare healthy nodes dead. So this scenario uses 8 s (> 5 s attempt + interval).
    slow_hb = {"mgmtd": {"mgmtd": {"heartbeat_timeout_s": 8.0}}}
    with fault_cluster("partition-mgmtd", netns={"mgmtd-1": 12}, overrides=slow_hb, seed=7) as sc:
        link = sc.links[0]
        s = sc.pc.status()
        if s["leader"] != "mgmtd-1":
            sc.say(f"{s['leader']} leads; kill -9 it so that mgmtd-1 (in the namespace) takes over")
            other = s["leader"]
            sc.pc.kill(other)
            sc.wait(lambda s: s["leader"] == "mgmtd-1", 20, "mgmtd-1 leads")
            sc.pc.restart(other)
        sc.start_workload()
        sc.progress(15, 30, "baseline with the leader mgmtd-1 in its namespace")
        addr = sc.pc.process("mgmtd-1").address
        sc.say(
            "isolate mgmtd-1: cut its veth (nodes/clients) and SIGSTOP it (no KV access: no lease renewal)"
        )
        link.partition()
        pause(sc.pc, "mgmtd-1")
        try:
            sc.wait(lambda s: s["leader"] == "mgmtd-2", 40, "mgmtd-2 took the lease and leads")
            sc.progress(10, 30, "writes under mgmtd-2")
            states = ProcessCluster.target_states(sc.pc.status())
            assert all(v == "serving" for v in states.values()), (
                f"healthy targets lost during the failover: {states}"
            )
            sc.say("kill -9 storage-3 while mgmtd-1 is isolated: the new leader must handle it")
            sc.pc.kill("storage-3")
            sc.wait(
                lambda s: all(ProcessCluster.target_states(s)[t] != "serving" for t in (301, 302)),
                20,
                "mgmtd-2 took storage-3's targets out",
            )
            sc.say("SIGCONT mgmtd-1 while it is still cut off")
        finally:
            resume(sc.pc, "mgmtd-1")
        deadline = time.monotonic() + 15
        answer = _is_leader_inside(link.ns, addr)
        while answer is not False and time.monotonic() < deadline:
            time.sleep(0.5)
            answer = _is_leader_inside(link.ns, addr)
        assert answer is False, f"the isolated old leader still claims leadership (answer {answer})"
        sc.say("the resumed, still isolated mgmtd-1 knows it is not the leader")
        link.heal()
        sc.say("healed the partition; restart storage-3")
        sc.pc.restart("storage-3")
        sc.wait_all_serving(90)
        s = sc.pc.status()
        from fs3.launcher import MgmtdProbe

        leaders = [
            p["name"]
            for p in s["processes"]
            if p["role"] == "mgmtd" and MgmtdProbe([p["address"]], timeout_s=2).leader() is not None
        ]
        sc.say(f"after the heal: leaders {leaders}")
        assert leaders == ["mgmtd-2"], leaders
        sc.progress(10, 30, "workload after the heal")
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)
