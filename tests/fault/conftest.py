"""Fault tier: every test must leave no network namespace or NAT rule of its own behind.

(Mounts are removed by the launcher's ``down`` in :func:`fs3.testing.invariants.fault_cluster`;
other suites may create ``fs3-cluster-*`` mounts concurrently, so they are not compared here.)
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from fs3.testing.faults import leftover_netns


def _fault_nat_rules() -> set[str]:
    try:
        r = subprocess.run(
            ["iptables", "-t", "nat", "-S"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line for line in r.stdout.splitlines() if "fs3-fault-" in line}


@pytest.fixture(autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    before = (set(leftover_netns()), _fault_nat_rules())
    yield
    after = (set(leftover_netns()), _fault_nat_rules())
    left = [sorted(a - b) for a, b in zip(after, before, strict=True)]
    assert not any(left), f"left behind: namespaces {left[0]}, NAT rules {left[1]}"
