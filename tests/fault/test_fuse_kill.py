"""Scenario 5: kill -9 the FUSE daemon.

Story: files are written through the mount and fsync'd, the workload runs through
the mount and the Python API. The FUSE daemon is SIGKILLed: every access to the
mount must fail promptly with ENOTCONN (a hang would be a failure: each call runs
in a thread with a deadline). ``fs3 mount`` is then run on the same mount point:
it clears the stale mount and mounts again. Everything fsync'd before the kill is
intact, read through the new mount; the workload's invariants hold.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fs3.launcher import fuse_unmount, mount_state
from fs3.testing.invariants import fault_cluster

pytestmark = [pytest.mark.fault, pytest.mark.integration]


def _errno_within(fn, timeout_s: float) -> int | None:  # type: ignore[no-untyped-def]
    """Run fn in a thread; return the errno it raised (None: no error). AssertionError if it hangs."""
    out: list[int | None] = []

    def run() -> None:
        try:
            fn()
            out.append(None)
        except OSError as e:
            out.append(e.errno)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"call on the dead mount hung for more than {timeout_s}s"
    return out[0]


@pytest.mark.timeout(200)
def test_kill_fuse_daemon_then_fs3_mount_recovers() -> None:
    with fault_cluster("kill-fuse", seed=5) as sc:
        mnt = sc.pc.mountpoint
        assert mnt
        wl = sc.start_workload(api_writers=1, fuse_writers=2, api_readers=1, fuse_readers=1)
        synced: dict[str, bytes] = {}
        for i in range(5):
            p = os.path.join(mnt, f"synced-{i}")
            data = os.urandom(300_000 + i * 77_777)
            with open(p, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            synced[p] = data
        sc.progress(20, 30, "baseline (fsync'd 5 files through the mount)")
        sc.say("kill -9 the FUSE daemon")
        sc.pc.kill("fuse")
        t = time.monotonic()
        for name, fn in (
            ("listdir", lambda: os.listdir(mnt)),
            ("open", lambda: open(os.path.join(mnt, "synced-0"), "rb").close()),
            ("stat", lambda: os.stat(os.path.join(mnt, "synced-1"))),
        ):
            # each call must return promptly; a cached attribute (attr_timeout 1 s) may still
            # answer a stat for a moment, so poll until the kernel reports the lost connection
            deadline = time.monotonic() + 5.0
            while (e := _errno_within(fn, 5.0)) != errno.ENOTCONN and time.monotonic() < deadline:
                time.sleep(0.2)
            assert e == errno.ENOTCONN, f"{name} on the dead mount: errno {e}, want ENOTCONN"
        sc.say(
            f"the mount answers ENOTCONN (listdir, open, stat) within {time.monotonic() - t:.2f}s"
        )
        sc.pc.wait_for(
            lambda: mount_state(mnt) == "stale", 5, "the mount to show as stale"
        )  # root attr cache
        sc.progress(10, 30, "Python API writers unaffected while the mount is dead")
        cfg = Path(sc.pc.process("fuse").config)
        sc.say(f"run `fs3 mount --cluster {sc.pc.cluster_file} {mnt}` on the stale mount point")
        log = open(sc.pc.dir / "logs" / "fuse-remount.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fs3.cli.main",
                "mount",
                "--cluster",
                sc.pc.cluster_file,
                "--config",
                str(cfg),
                mnt,
                "--foreground",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        try:
            t = time.monotonic()
            sc.pc.wait_for(
                lambda: mount_state(mnt) == "mounted" or proc.poll() is not None, 60, "remount"
            )
            assert proc.poll() is None, f"fs3 mount exited with {proc.returncode}"
            sc.say(
                f"`fs3 mount` cleared the stale mount and mounted again in {time.monotonic() - t:.1f}s"
            )
            for p, data in synced.items():
                with open(p, "rb") as f:
                    assert f.read() == data, f"{p}: fsync'd content changed"
            sc.say("all 5 files fsync'd before the kill are intact")
            t_remount = time.monotonic()
            sc.progress(10, 30, "workload after the remount")
            sc.pc.wait_for(
                lambda: wl.model.acked_since(t_remount, "fuse") >= 3,
                30,
                "FUSE writers acknowledged again through the new mount",
            )
            sc.say(
                f"FUSE writers: {wl.model.acked_since(t_remount, 'fuse')} writes acknowledged after the remount"
            )
            problems = sc.final_checks()
            assert not problems, "\n".join(problems)
            assert wl.model.counts.get("op_errors", 0) > 0, (
                "the FUSE writers should have seen the dead mount"
            )
        finally:
            sc.close()
            fuse_unmount(mnt, sc.say)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
