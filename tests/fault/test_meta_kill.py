"""Scenario 4: kill -9 a meta server during a create/rename/unlink storm from several clients.

Story: three Python API clients and the FUSE mount each create, rename and
unlink files in their own directory as fast as they can. meta-1 is SIGKILLed
mid-storm; the clients must fail over to meta-2 and keep going; meta-1 returns,
then meta-2 is killed the same way. Every outcome a client was told is checked
against the final namespace (outcomes of calls that failed are accepted either
way), and fsck must find every namespace invariant intact.
"""

from __future__ import annotations

import time

import pytest

from fs3.testing.invariants import fault_cluster
from fs3.testing.workload import FileOps, NamespaceStorm

pytestmark = [pytest.mark.fault, pytest.mark.integration]


def _wait_ops(sc, storm: NamespaceStorm, n: int, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    start = storm.ops
    t = time.monotonic()
    while storm.ops < start + n:
        assert time.monotonic() - t < timeout_s, (
            f"{what}: only {storm.ops - start} ops in {timeout_s}s"
        )
        time.sleep(0.05)
    sc.say(
        f"{what}: {n} more namespace ops in {time.monotonic() - t:.1f}s (total {storm.ops}, errors {storm.errors})"
    )


@pytest.mark.timeout(200)
def test_kill_meta_during_namespace_storm() -> None:
    with fault_cluster("kill-meta", seed=4) as sc:
        clients: list[FileOps] = [sc.api(f"api{i}") for i in range(3)] + [sc.fuse("fuse")]
        storm = NamespaceStorm(clients, seed=4).start()
        sc.say("namespace storm started: 3 API clients + the FUSE mount")
        _wait_ops(sc, storm, 60, 30, "baseline")
        for victim in ("meta-1", "meta-2"):
            sc.say(f"kill -9 {victim} mid-storm")
            sc.pc.kill(victim)
            _wait_ops(sc, storm, 40, 40, f"clients failed over while {victim} is down")
            sc.pc.restart(victim)
            sc.say(f"{victim} restarted")
            _wait_ops(sc, storm, 20, 30, f"after {victim} returned")
        assert storm.stop(60) == []
        sc.say(f"storm stopped: {storm.summary()}")
        if storm.anomalies:
            sc.say(
                "retry anomalies (call reported failure but took effect): "
                + "; ".join(storm.anomalies[:10])
            )
        bad = storm.verify(sc.api("final"))
        assert not bad, "\n".join(str(v) for v in bad)
        problems = sc.final_checks(replicas=False)
        assert not problems, "\n".join(problems)
