"""Scenario 7: a slow storage node (traffic shaping on its namespace's veth).

Story: storage-3 runs in its own network namespace. Under the workload its veth
is shaped both ways — netem delay when the kernel has it, otherwise (this
machine: no sch_netem) a tbf rate limit. Writes must keep completing, throughput
may drop but must not collapse, no target may be declared offline because of the
slowness (no timeout cascade) and no client operation may fail. Then the shaping
is removed and throughput recovers.
"""

from __future__ import annotations

import time

import pytest

from fs3.testing.faults import netns_unavailable, qdisc_kinds
from fs3.testing.invariants import fault_cluster

pytestmark = [pytest.mark.fault, pytest.mark.integration]

_why = netns_unavailable()
_kinds = qdisc_kinds() if _why is None else {}
_skip = _why or (
    None if any(_kinds.values()) else "neither netem nor tbf qdiscs are available (tc)"
)


def _rate(sc, seconds: float) -> float:  # type: ignore[no-untyped-def]
    a0, t0 = sc.workload.acked(), time.monotonic()
    time.sleep(seconds)
    return (sc.workload.acked() - a0) / (time.monotonic() - t0)


@pytest.mark.skipif(_skip is not None, reason=f"cannot shape a namespace link: {_skip}")
@pytest.mark.timeout(200)
def test_slow_storage_node() -> None:
    with fault_cluster("slow-node", netns={"storage-3": 13}, seed=8) as sc:
        link = sc.links[0]
        wl = sc.start_workload()
        sc.progress(15, 30, "baseline")
        before = _rate(sc, 6)
        errors_before = wl.model.counts.get("op_errors", 0)
        what = link.slow(delay_ms=50, rate_mbit=2)
        sc.say(f"storage-3's link shaped: {what}")
        states_seen: set[str] = set()
        t_end = time.monotonic() + 12
        a0, t0 = wl.acked(), time.monotonic()
        while time.monotonic() < t_end:
            s = sc.pc.status()
            states_seen |= {st for c in s["chains"] for st in c["states"]}
            time.sleep(0.5)
        during = (wl.acked() - a0) / (time.monotonic() - t0)
        errors_during = wl.model.counts.get("op_errors", 0) - errors_before
        link.unslow()
        sc.say("shaping removed")
        after = _rate(sc, 6)
        sc.figures.update(
            {"writes/s before": before, "writes/s slow": during, "writes/s after": after}
        )
        sc.say(
            f"acknowledged writes/s: before {before:.1f}, slow {during:.1f}, after {after:.1f}; "
            f"client errors while slow: {errors_during}; chain states seen while slow: {sorted(states_seen)}"
        )
        assert during > 0, "no write completed while the node was slow"
        assert states_seen == {"serving"}, (
            f"a slow node was taken out of service (timeouts cascaded): {states_seen}"
        )
        assert errors_during == 0, f"client operations failed while a node was slow: {wl.errors}"
        assert after > during * 0.8 or after > before * 0.5, (
            "throughput did not recover after the shaping"
        )
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)
