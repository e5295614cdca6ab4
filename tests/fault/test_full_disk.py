"""Scenario 8: a full disk on one target.

Story: target 301 (storage-3, chain 1) lives on a 48 MiB tmpfs. The workload
runs; then the tmpfs is filled with ballast until ~1 MiB is left. A large write
that needs space on that target must fail cleanly with ENOSPC (an error, within a
bound — not a hang, not a crash), while the other chain keeps accepting writes,
already written data stays readable, and no process dies. The ballast is then
deleted ("space freed"): the same large write succeeds, every target serves and
the replicas are identical.
"""

from __future__ import annotations

import errno
import os
import time

import pytest

from fs3.testing.invariants import fault_cluster
from fs3.testing.workload import WorkloadConfig

pytestmark = [pytest.mark.fault, pytest.mark.integration]

ENOSPC_BOUND_S = 45.0


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a size-limited tmpfs needs root")
@pytest.mark.timeout(240)
def test_full_disk_on_one_target() -> None:
    with fault_cluster("full-disk", small_targets={301: 48}, seed=9) as sc:
        fs = sc.small_fs[0]
        wl = sc.start_workload(config=WorkloadConfig(max_blocks=8, files_per_writer=2))
        sc.progress(15, 30, "baseline")
        api = sc.api("big")
        big = os.urandom(
            8 << 20
        )  # 8 chunks: striped over both chains, so it needs room on target 301
        ballast = fs.fill(leave_bytes=1 << 20)
        sc.say(
            f"target 301's tmpfs filled with {ballast.stat().st_size >> 20} MiB of ballast; "
            f"{fs.free_bytes() >> 10} KiB free"
        )
        t = time.monotonic()
        with pytest.raises(OSError) as ei:
            api.write("/big-file", 0, big)
        took = time.monotonic() - t
        sc.say(
            f"large write failed with errno {ei.value.errno} ({os.strerror(ei.value.errno or 0)}) after {took:.1f}s"
        )
        assert ei.value.errno == errno.ENOSPC, f"want ENOSPC, got {ei.value!r}"
        assert took < ENOSPC_BOUND_S
        s = sc.pc.status()
        assert all(p["alive"] for p in s["processes"] if p["role"] != "fuse" or sc.pc.mountpoint), (
            s["processes"]
        )
        # other chain and existing data keep working
        other_ok = 0
        for i in range(12):
            try:
                api.write(f"/small-{i}", 0, os.urandom(4096))
                other_ok += 1
            except OSError as e:
                assert e.errno == errno.ENOSPC, f"small write failed with {e!r}"
        sc.say(f"while full: {other_ok}/12 one-chunk files written (those on chain 2 must succeed)")
        assert other_ok > 0, "no write succeeded anywhere while one target was full"
        for i in range(12):
            if api.client.exists(f"/small-{i}"):
                assert len(api.read(f"/small-{i}", 0, 8192)) == 4096
        checked = wl.model.verify_all(api, "read-while-full")
        assert not checked, [str(v) for v in checked]
        states = {t["id"]: t["state"] for t in sc.pc.status()["targets"]}
        sc.say(
            f"while full: every acknowledged block still reads back correctly; target states {states}"
        )
        assert all(v == "serving" for v in states.values()), (
            f"a full target broke its chain: {states}"
        )
        sc.say(
            f"while full: workload has {wl.acked()} acknowledged writes, errors {wl.model.counts.get('op_errors', 0)}"
        )
        sc.say("free the space (delete the ballast)")
        ballast.unlink()
        t = time.monotonic()
        deadline = t + 60
        while True:
            try:
                api.write("/big-file", 0, big)
                break
            except OSError as e:
                assert time.monotonic() < deadline, (
                    f"target did not recover after space was freed: {e!r}"
                )
                time.sleep(1)
        sc.say(f"the large write succeeded {time.monotonic() - t:.1f}s after the space was freed")
        assert api.read("/big-file", 0, len(big)) == big
        sc.wait_all_serving(90)
        sc.progress(10, 30, "workload after recovery")
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)
