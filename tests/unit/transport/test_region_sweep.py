"""Shared-memory files of dead processes are removed; live owners' files are kept."""

from __future__ import annotations

import os

import pytest

from fs3.transport.region import SHM_DIR, sweep_dead_regions


def _dead_pid() -> int:
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


@pytest.mark.timeout(10)
def test_files_of_dead_pids_are_swept_and_live_ones_kept() -> None:
    prefix = f"fs3-sweeptest{os.getpid()}"
    dead = os.path.join(SHM_DIR, f"{prefix}-{_dead_pid()}-x")
    live = os.path.join(SHM_DIR, f"{prefix}-{os.getpid()}-y")
    other = os.path.join(SHM_DIR, f"{prefix}x-{_dead_pid()}-z")  # another prefix: untouched
    for p in (dead, live, other):
        with open(p, "wb") as f:
            f.write(b"x")
    try:
        assert sweep_dead_regions(prefix) == 1
        assert not os.path.exists(dead) and os.path.exists(live) and os.path.exists(other)
    finally:
        for p in (dead, live, other):
            if os.path.exists(p):
                os.unlink(p)
