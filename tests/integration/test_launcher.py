"""The local cluster launcher (`fs3 cluster ...`) and the ProcessCluster harness, with real processes.

Scenarios: a full up/status/kill/restart/down cycle through the CLI; the error
cases that must leave nothing half-started (twice on one DIR, ports in use, a
crashing process, bad options, missing FUSE pieces, a stale mount); the
importable harness; and the end-to-end run with a FUSE mount.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fs3 import launcher
from fs3.launcher import LauncherError, LocalCluster, is_alive, mount_fstype, mount_state, supervise
from fs3.launcher import cluster as launcher_cluster
from fs3.testing.cluster import ProcessCluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: float = 150.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fs3.cli.main", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def recorded(d: Path) -> list[launcher.ProcRecord]:
    st = LocalCluster(d).load_state()
    return st.processes if st else []


def assert_nothing_running(d: Path) -> None:
    alive = [f"{r.name} pid {r.pid}" for r in recorded(d) if is_alive(r)]
    assert not alive, f"left running: {alive}"


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    """A cluster directory that is always torn down, whatever the test did."""
    d = tmp_path / "cluster"
    yield d
    with contextlib.suppress(LauncherError):
        LocalCluster(d, out=lambda s: None, grace_s=3).down()
    assert_nothing_running(d)


def _status(d: Path) -> dict[str, Any]:
    r = run_cli("status", "--dir", str(d), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def _wait_status(d: Path, cond: Any, timeout: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        s = LocalCluster(d).status()
        if cond(s):
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {json.dumps(s)[:3000]}")
        time.sleep(0.2)


# --------------------------------------------------------------------------- the full cycle


@pytest.mark.timeout(240)
def test_cli_up_status_kill_restart_down_cycle(cluster_dir: Path) -> None:
    d = cluster_dir
    # up: default shape (2 mgmtd, 2 meta, 3 storage x 2 targets, 3 replicas)
    r = run_cli("up", "--dir", str(d))
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(d / "fs3.cluster") in r.stdout and "is up" in r.stdout
    cf = (d / "fs3.cluster").read_text().strip()
    cid, _, addrs = cf.partition("@")
    assert cid.startswith("local-") and len(addrs.split(",")) == 2

    s = _status(d)
    assert s["leader"] in {"mgmtd-1", "mgmtd-2"}
    assert s["cluster_file"] == str(d / "fs3.cluster") and s["mount"] is None
    names = [p["name"] for p in s["processes"]]
    assert names == [
        "mgmtd-1",
        "mgmtd-2",
        "meta-1",
        "meta-2",
        "storage-1",
        "storage-2",
        "storage-3",
    ]
    assert all(p["alive"] and p["pid"] > 0 for p in s["processes"])
    assert sorted(t["id"] for t in s["targets"]) == [101, 102, 201, 202, 301, 302]
    assert all(
        t["state"] == "serving" and t["node"] == f"storage-{t['id'] // 100}" for t in s["targets"]
    )
    assert len(s["chains"]) == 2 and all(len(c["targets"]) == 3 for c in s["chains"])
    for c in s["chains"]:  # a chain never holds two targets of one node
        assert len({t // 100 for t in c["targets"]}) == 3
    table = run_cli("status", "--dir", str(d))
    assert table.returncode == 0 and "storage-3" in table.stdout and "serving" in table.stdout

    # up twice on the same DIR: refused, nothing changed
    pids = {p["name"]: p["pid"] for p in s["processes"]}
    again = run_cli("up", "--dir", str(d))
    assert again.returncode == 1 and "already running" in again.stderr
    assert {p["name"]: p["pid"] for p in _status(d)["processes"]} == pids

    # kill one storage node like a crash: its targets leave service, the rest stays up
    k = run_cli("kill", "--dir", str(d), "storage-2")
    assert k.returncode == 0, k.stderr
    s = _wait_status(
        d,
        lambda s: all(t["state"] != "serving" for t in s["targets"] if t["node"] == "storage-2"),
        30,
        "storage-2's targets to leave service",
    )
    assert [p["alive"] for p in s["processes"] if p["name"] == "storage-2"] == [False]
    assert not os.path.exists(f"/proc/{pids['storage-2']}") or not is_alive(
        next(r for r in recorded(d) if r.name == "storage-2")
    )
    dead = run_cli("kill", "--dir", str(d), "storage-2")
    assert dead.returncode == 1 and "not running" in dead.stderr
    unknown = run_cli("kill", "--dir", str(d), "storage-9")
    assert unknown.returncode == 1 and "no process named" in unknown.stderr

    # restart: same config, back to serving after resync
    rs = run_cli("restart", "--dir", str(d), "storage-2")
    assert rs.returncode == 0, rs.stderr
    _wait_status(
        d,
        lambda s: all(t["state"] == "serving" for t in s["targets"]),
        60,
        "every target serving again",
    )

    # down stops exactly the recorded processes; a second down is a no-op
    all_pids = [r.pid for r in recorded(d)]
    dn = run_cli("down", "--dir", str(d))
    assert dn.returncode == 0, dn.stderr
    assert_nothing_running(d)
    assert not any(is_alive(r) for r in recorded(d))
    assert all(
        supervise._proc_stat(p) is None or supervise._proc_stat(p)[0] == "Z" for p in all_pids
    )  # type: ignore[index]
    dn2 = run_cli("down", "--dir", str(d))
    assert dn2.returncode == 0 and "no process of the cluster was running" in dn2.stdout
    stopped = _status(d)  # status of a stopped cluster still answers, and says why it knows little
    assert not any(p["alive"] for p in stopped["processes"]) and stopped["leader"] is None
    assert stopped["errors"] == ["no mgmtd process is running"]

    # up again on the same DIR restarts from its data; --wipe removes it all
    up2 = run_cli("up", "--dir", str(d))
    assert up2.returncode == 0, up2.stdout + up2.stderr
    assert (
        "restarting the existing cluster" in up2.stdout
        and (d / "fs3.cluster").read_text().strip() == cf
    )
    wipe = run_cli("down", "--dir", str(d), "--wipe")
    assert wipe.returncode == 0, wipe.stderr
    assert_nothing_running(d)
    assert not d.exists(), "--wipe removes everything the launcher created"


@pytest.mark.timeout(330)
def test_a_shape_with_a_spare_target_comes_up_and_restarts_a_node_on_its_port(
    cluster_dir: Path,
) -> None:
    """Regressions, on the smallest shape that shows them.

    3 storage nodes x 1 target with 2 replicas make one chain and leave one
    target in no chain; ``up`` waited for that one to serve too, until it timed
    out. And the launcher picked its ports from the kernel's ephemeral range, so
    a client reconnecting to a killed process could self-connect from its port.
    """
    d = cluster_dir
    shape = ["--storage-nodes", "3", "--targets-per-node", "1", "--replicas", "2"]
    small = ["--meta", "1", "--mgmtd", "1", "--timeout", "150"]
    r = run_cli("up", "--dir", str(d), *shape, *small, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    s = _status(d)
    [chain] = s["chains"]
    assert len(chain["targets"]) == 2 and chain["states"] == ["serving", "serving"]
    [spare] = s["spare_targets"]
    assert spare in {101, 201, 301} - set(chain["targets"])
    assert [t["chain"] for t in s["targets"] if t["id"] == spare] == [0]
    assert f"every chained target is serving; 1 target is spare (in no chain: {spare})" in r.stdout
    why = "3 storage nodes x 1 targets = 3, not a multiple of 2 replicas"
    assert f"spare        : 1 target is spare (in no chain: {spare}): {why}" in r.stdout
    table = run_cli("status", "--dir", str(d))
    assert f"spare targets (in no chain, hold no data): {spare}" in table.stdout, table.stdout

    # every service port is one the kernel never gives a client socket
    lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [p for rec in recorded(d) for p in rec.ports]
    assert ports and not [p for p in ports if lo <= p <= hi], (ports, lo, hi)

    # a chained node killed while its peers reconnect restarts on the same port
    name = f"storage-{chain['targets'][0] // 100}"
    before = next(rec for rec in recorded(d) if rec.name == name)
    assert run_cli("kill", "--dir", str(d), name).returncode == 0
    rs = run_cli("restart", "--dir", str(d), name, "--timeout", "90", timeout=150)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    after = next(rec for rec in recorded(d) if rec.name == name)
    assert after.ports == before.ports and after.pid != before.pid
    _wait_status(
        d,
        lambda s: [c["states"] for c in s["chains"]] == [["serving", "serving"]],
        90,
        f"{name}'s target serving again",
    )


# --------------------------------------------------------------------------- error cases


@pytest.mark.timeout(60)
def test_ports_in_use_are_refused_before_anything_starts(cluster_dir: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        # the blocked port is the metrics port of mgmtd-1 (BASE+1) when BASE = port - 1
        r = run_cli(
            "up",
            "--dir",
            str(cluster_dir),
            "--base-port",
            str(port - 1),
            "--meta",
            "1",
            "--storage-nodes",
            "1",
            "--replicas",
            "1",
            "--mgmtd",
            "1",
        )
    assert r.returncode == 1
    assert f"port 127.0.0.1:{port}" in r.stderr and "in use" in r.stderr and "mgmtd-1" in r.stderr
    assert all(rec.pid == 0 for rec in recorded(cluster_dir)), "nothing may have been started"
    assert_nothing_running(cluster_dir)


@pytest.mark.timeout(90)
def test_a_process_that_dies_at_start_is_named_with_its_log_and_everything_stops(
    cluster_dir: Path,
) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        # mgmtd-2 cannot serve its metrics on a taken port: fs3.service exits with status 2
        r = run_cli(
            "up",
            "--dir",
            str(cluster_dir),
            "--meta",
            "1",
            "--storage-nodes",
            "1",
            "--replicas",
            "1",
            "--set",
            f"mgmtd.metrics.port={port}",
            "--timeout",
            "60",
        )
    assert r.returncode == 1, r.stdout
    assert "mgmtd-" in r.stderr and "exited with exit code 2" in r.stderr
    assert "last lines of the log" in r.stderr and f"port {port}" in r.stderr
    assert "stopped everything that was started" in r.stdout
    assert_nothing_running(cluster_dir)
    assert any(rec.pid for rec in recorded(cluster_dir)), (
        "processes had been started (and were stopped)"
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas", "4"], "--replicas must be 1..3"),
        (["--set", "storage.storage.no_such_key=1"], "has no key 'no_such_key'"),
        (["--set", "mgmtd.mgmtd.lease_length_s=-1"], "lease_length_s must be > 0"),
        (["--set", "oops"], "expected ROLE.SECTION.KEY=VALUE"),
    ],
)
def test_bad_options_fail_before_anything_starts(
    cluster_dir: Path, args: list[str], message: str
) -> None:
    r = run_cli("up", "--dir", str(cluster_dir), *args)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert all(rec.pid == 0 for rec in recorded(cluster_dir))


@pytest.mark.timeout(30)
def test_missing_fuse_device_or_fusermount_is_refused(
    cluster_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lc = LocalCluster(cluster_dir, out=lambda s: None)
    monkeypatch.setattr(
        launcher_cluster, "FUSE_DEVICE", str(cluster_dir.parent / "no-such-fuse-device")
    )
    with pytest.raises(LauncherError, match="--mount needs .*no-such-fuse-device"):
        lc.up(launcher.ClusterSpec(), mount=str(cluster_dir.parent / "mnt"))
    monkeypatch.setattr(launcher_cluster, "FUSE_DEVICE", "/dev/fuse")
    monkeypatch.setattr(launcher_cluster, "FUSERMOUNT", "fusermount3-is-not-installed")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing on this machine")
    with pytest.raises(LauncherError, match="apt-get install fuse3"):
        lc.up(launcher.ClusterSpec(), mount=str(cluster_dir.parent / "mnt"))
    assert_nothing_running(cluster_dir)
    assert lc.load_state() is None, "nothing was laid out"


STALE_FUSE = r"""
import sys, trio, pyfuse3
class Ops(pyfuse3.Operations):
    pass
opts = set(pyfuse3.default_options) | {"fsname=fs3-stale-test"}
pyfuse3.init(Ops(), sys.argv[1], opts)
print("mounted", flush=True)
trio.run(pyfuse3.main)
"""


@pytest.fixture
def stale_mount(tmp_path: Path) -> Iterator[str]:
    """A FUSE mount whose daemon was killed with SIGKILL: stat() on it fails with ENOTCONN."""
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("needs /dev/fuse and fusermount3")
    mnt = tmp_path / "stale"
    mnt.mkdir()
    p = subprocess.Popen(
        [sys.executable, "-c", STALE_FUSE, str(mnt)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "mounted"
        deadline = time.monotonic() + 10
        while mount_fstype(str(mnt)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert mount_state(str(mnt)) == "stale"
        yield str(mnt)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        if mount_fstype(str(mnt)) is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False, timeout=30)


@pytest.mark.fuse
@pytest.mark.timeout(60)
def test_a_stale_mount_is_detected_and_cleared(tmp_path: Path, stale_mount: str) -> None:
    said: list[str] = []
    lc = LocalCluster(tmp_path / "c", out=said.append)
    lc._preflight_mount(stale_mount)
    assert mount_state(stale_mount) == "absent"
    assert any("stale FUSE mount" in s and "fusermount3 -u -z" in s for s in said), said


@pytest.mark.fuse
@pytest.mark.timeout(60)
def test_down_clears_a_stale_mount_of_a_half_dead_cluster(tmp_path: Path, stale_mount: str) -> None:
    d = tmp_path / "c"
    d.mkdir()
    st = launcher.ClusterState(
        cluster_id="local-test",
        spec=launcher.ClusterSpec(),
        processes=[
            launcher.ProcRecord(
                name="fuse",
                role="fuse",
                command=["fs3-gone"],
                log=str(d / "fuse.log"),
                pid=2**22 + 7,
            ),
        ],
        cluster_file=str(d / "fs3.cluster"),
        mountpoint=stale_mount,
    )
    (d / "state.json").write_text(json.dumps(st.to_json()))
    r = run_cli("down", "--dir", str(d))
    assert r.returncode == 0, r.stderr
    assert mount_state(stale_mount) == "absent"
    assert "no process of the cluster was running" in r.stdout


@pytest.mark.timeout(30)
def test_a_reused_pid_is_never_signalled() -> None:
    """down/kill check /proc/<pid>/cmdline and start time: an unrelated process with the pid survives."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # until the child has exec'd, /proc/<pid>/cmdline is still the parent's (pytest's)
        deadline = time.monotonic() + 10
        while b"time.sleep(60)" not in Path(f"/proc/{p.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.01)
        fake = launcher.ProcRecord(
            name="storage-1",
            role="storage",
            command=[sys.executable, "-m", "fs3.cli.main", "storage"],
            log="/dev/null",
            pid=p.pid,
        )
        assert not is_alive(fake)
        launcher.stop_processes([fake], 0.5)
        assert p.poll() is None, "an unrelated process was killed"
        real = launcher.ProcRecord(
            name="x",
            role="storage",
            command=[sys.executable, "-c", "import time; time.sleep(60)"],
            log="/dev/null",
            pid=p.pid,
            start_ticks=supervise._proc_stat(p.pid)[1],
        )  # type: ignore[index]
        assert is_alive(real)
        real_wrong_start = launcher.ProcRecord(
            **{**real.__dict__, "start_ticks": real.start_ticks + 1}
        )
        assert not is_alive(real_wrong_start)
    finally:
        p.kill()
        p.wait(10)


# --------------------------------------------------------------------------- the harness


@pytest.mark.timeout(120)
def test_process_cluster_harness(tmp_path: Path) -> None:
    c = ProcessCluster(
        tmp_path / "pc",
        storage_nodes=2,
        targets_per_node=1,
        replicas=2,
        meta=1,
        mgmtd=1,
        start_timeout_s=60,
    )
    with c:
        assert c.names == ["mgmtd-1", "meta-1", "storage-1", "storage-2"]
        assert Path(c.cluster_file).read_text().startswith("local-")
        assert c.log_path("storage-1").exists() and c.config_path("storage-1").exists()
        assert (c.data_dir("storage-2") / "t1").is_dir()
        s = c.status()
        assert ProcessCluster.target_states(s) == {101: "serving", 201: "serving"}
        pid = c.pid("storage-2")
        c.kill("storage-2")
        assert not c.alive("storage-2")
        c.wait_for(
            lambda s: ProcessCluster.target_states(s)[201] != "serving", 30, "201 out of service"
        )
        c.restart("storage-2")
        assert c.alive("storage-2") and c.pid("storage-2") != pid
        c.wait_serving(60)
        with pytest.raises(TimeoutError, match="never"):
            c.wait_for(lambda: False, 0.3, "never")
    assert not any(is_alive(r) for r in recorded(tmp_path / "pc"))
    assert (tmp_path / "pc" / "logs").is_dir(), "a directory the caller gave is kept"


@pytest.mark.timeout(120)
def test_process_cluster_keeps_its_logs_when_the_test_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    c = ProcessCluster(
        storage_nodes=1, targets_per_node=1, replicas=1, meta=1, mgmtd=1, start_timeout_s=60
    )
    with pytest.raises(RuntimeError, match="boom"), c:
        raise RuntimeError("boom")
    try:
        assert (c.dir / "logs" / "mgmtd-1.log").exists(), "logs are kept after a failure"
        assert f"logs kept in {c.dir / 'logs'}" in capsys.readouterr().err
        assert not any(is_alive(r) for r in recorded(c.dir))
    finally:
        shutil.rmtree(c.dir, ignore_errors=True)
    ok = ProcessCluster(
        storage_nodes=1, targets_per_node=1, replicas=1, meta=1, mgmtd=1, start_timeout_s=60
    )
    with ok:
        pass
    assert not ok.dir.exists(), "a temp dir of a clean run is removed"


# --------------------------------------------------------------------------- end to end


@pytest.mark.fuse
@pytest.mark.timeout(240)
def test_end_to_end_mount_write_read_and_clean_down(cluster_dir: Path, tmp_path: Path) -> None:
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("needs /dev/fuse and fusermount3")
    import fs3

    mnt = tmp_path / "mnt"
    r = run_cli("up", "--dir", str(cluster_dir), "--mount", str(mnt), timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"mount point  : {mnt}" in r.stdout
    assert mount_state(str(mnt)) == "mounted"
    s = _status(cluster_dir)
    assert s["mount"] == str(mnt) and [
        p["alive"] for p in s["processes"] if p["name"] == "fuse"
    ] == [True]

    # capacity on a shared disk: the six targets share cluster_dir's file system, which
    # counts once; a user can store a third of it (3 replicas), and df on the mount agrees
    disk = os.statvfs(cluster_dir)
    raw = disk.f_blocks * disk.f_frsize
    cap = _wait_status(
        cluster_dir,
        lambda s: (s.get("capacity") or {}).get("filesystems") == 1,
        20,
        "every target to report its file system",
    )["capacity"]
    assert (cap["replicas"], cap["targets"], cap["chain_table"]) == (3, 6, 1)
    assert cap["raw_capacity_bytes"] == raw and cap["capacity_bytes"] == raw // 3
    assert cap["raw_free_bytes"] <= disk.f_bfree * disk.f_frsize
    assert cap["free_bytes"] == cap["raw_free_bytes"] // 3
    deadline = time.monotonic() + 20  # meta learns fs ids from its routing watcher
    while (m := os.statvfs(mnt)).f_blocks * m.f_frsize > raw // 3 + m.f_frsize:
        assert time.monotonic() < deadline, (m, raw)
        time.sleep(0.2)
    assert m.f_blocks * m.f_frsize >= raw // 3 - m.f_frsize
    assert m.f_bavail * m.f_frsize <= cap["raw_free_bytes"] // 3 + (64 << 20)
    table = run_cli("status", "--dir", str(cluster_dir)).stdout
    assert "raw / 3 replicas of chain table 1" in table and "on 1 file system" in table

    rng = random.Random(7)
    through_mount = rng.randbytes(3 * (1 << 20) + 123)
    through_api = rng.randbytes((1 << 20) + 4567)
    with open(mnt / "from-mount.bin", "wb") as f:
        f.write(through_mount)
        f.flush()
        os.fsync(f.fileno())
    client = fs3.connect(str(cluster_dir / "fs3.cluster"))
    try:
        with client.open("/from-mount.bin", "rb") as f:
            assert f.read() == through_mount
        with client.open("/from-api.bin", "wb") as f:
            f.write(through_api)
    finally:
        client.close()
    assert (mnt / "from-api.bin").read_bytes() == through_api
    assert sorted(os.listdir(mnt)) == ["from-api.bin", "from-mount.bin"]

    # the FUSE daemon crashes: the mount reports ENOTCONN; restart remounts it, data intact
    assert run_cli("kill", "--dir", str(cluster_dir), "fuse").returncode == 0
    assert mount_state(str(mnt)) == "stale"
    rs = run_cli("restart", "--dir", str(cluster_dir), "fuse")
    assert rs.returncode == 0, rs.stderr
    assert (mnt / "from-mount.bin").read_bytes() == through_mount

    dn = run_cli("down", "--dir", str(cluster_dir))
    assert dn.returncode == 0, dn.stderr
    assert mount_fstype(str(mnt)) is None, "no mount left behind"
    assert_nothing_running(cluster_dir)


@pytest.mark.fuse
@pytest.mark.timeout(300)
def test_up_sh_again_on_a_running_cluster_only_prints_its_status(
    cluster_dir: Path, tmp_path: Path
) -> None:
    """README command 1, twice: the second run neither installs nor restarts, and prints one status."""
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("needs /dev/fuse and fusermount3")
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("scripts/up.sh uses this checkout's .venv; these tests run elsewhere")
    mnt = tmp_path / "mnt"
    up = ["bash", str(ROOT / "scripts" / "up.sh"), "--dir", str(cluster_dir), "--mount", str(mnt)]
    first = subprocess.run(up, capture_output=True, text=True, timeout=200, check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    assert mount_state(str(mnt)) == "mounted"
    pids = {r.name: r.pid for r in recorded(cluster_dir)}
    t0 = time.monotonic()
    again = subprocess.run(up, capture_output=True, text=True, timeout=60, check=False)
    took = time.monotonic() - t0
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stderr == ""
    out = again.stdout
    assert out.startswith(f"fs3 is already running in {cluster_dir}\n"), out
    assert out.count("leader: ") == 1 and "installing" not in out
    assert "capacity: " in out and "raw: " in out
    assert {r.name: r.pid for r in recorded(cluster_dir)} == pids  # nothing restarted
    assert took < 20, took  # a status query; was a pip install + two status queries
