"""``docker-compose up`` for real: the whole cluster in containers, driven by docker-compose.

No Docker engine and no registry exist on fs3's machines, so the test uses what
does: Debian's podman serves a Docker-compatible API (``podman system service``)
that Debian's docker-compose 1.29 drives through ``DOCKER_HOST``, and the image is
built by ``scripts/build-image.sh`` on a debootstrap'ed Debian base (both cached
in podman's storage between runs). The stack is ``docker-compose.yml`` with
``deploy/compose.local.yml`` on top: the production topology (2 mgmtd, 2 meta,
3 storage with their own volumes, the FUSE client, health checks, start order)
on the embedded SQLite KV and the host network on 127.0.0.1 ports.

The story, timed phase by phase:

1. build the image (a no-op when the cached one matches the source);
2. ``up -d``, wait until every service is healthy and the one-shots exited 0;
3. write files through the FUSE client container and through the Python API from
   the host, and read each through the other path;
4. ``docker-compose kill`` one storage container while the host keeps reading:
   reads continue, ``fs3 admin`` (run inside the mgmtd container) shows the node
   offline; ``docker-compose start`` it and wait until its targets serve again;
5. check every byte of every file through both paths;
6. ``down -v``, and verify that no container, volume, network or mount of the
   project is left, then stop the podman service the test started (and its
   health-check runner: podman runs health checks from systemd timers, which a
   machine without systemd lacks; scripts/podman-healthchecks.py stands in).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.compose, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = ["-f", "docker-compose.yml", "-f", "deploy/compose.local.yml"]
CLUSTER_FILE = ROOT / "deploy" / "compose.local.cluster"
# Every 127.0.0.1 port deploy/compose.local.yml listens on (metrics use free ports).
PORTS = [17001, 17002, 17101, 17102, 17201, 17202, 17203, 17211, 17212, 17213]
LONG_RUNNING = ["mgmtd1", "mgmtd2", "meta1", "meta2", "storage1", "storage2", "storage3", "fuse"]
ONE_SHOT = ["fdb-init", "credentials", "chain-table"]
VICTIM = "storage1"
VICTIM_NODE = "storage-1"
SEED = 20
LOCK = "/tmp/fs3-compose-up-test.lock"


@dataclass
class Stack:
    """The podman service, its environment and the compose project of one test run."""

    tmp: Path
    env: dict[str, str]
    project: str
    service: subprocess.Popen[bytes]
    healthchecks: subprocess.Popen[bytes]
    socket: Path
    timings: dict[str, float] = field(default_factory=dict)

    def run(
        self, argv: list[str], *, timeout: float = 120, input: bytes | None = None, check=True
    ) -> subprocess.CompletedProcess[bytes]:
        r = subprocess.run(
            argv, env=self.env, cwd=ROOT, capture_output=True, timeout=timeout, input=input
        )
        if check and r.returncode != 0:
            raise AssertionError(
                f"`{' '.join(argv)}` exited {r.returncode}:\n"
                f"{r.stdout.decode(errors='replace')[-3000:]}\n{r.stderr.decode(errors='replace')[-3000:]}"
            )
        return r

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        r = self.run(["docker-compose", *COMPOSE_FILES, *args], timeout=timeout, check=check)
        return r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")

    def containers(self) -> dict[str, dict[str, Any]]:
        """{compose service: podman's inspect of its container} of this project."""
        ids = (
            self.run(
                [
                    "podman",
                    "ps",
                    "-a",
                    "-q",
                    "--no-trunc",
                    "--filter",
                    f"label=com.docker.compose.project={self.project}",
                ]
            )
            .stdout.decode()
            .split()
        )
        if not ids:
            return {}
        r = self.run(["podman", "inspect", "--type", "container", *ids], check=False)
        out = {}
        for info in json.loads(r.stdout or b"[]"):
            out[info["Config"]["Labels"]["com.docker.compose.service"]] = info
        return out

    def container(self, service: str) -> str:
        return str(self.containers()[service]["Name"])

    def exec(
        self, service: str, cmd: str, *, input: bytes | None = None, timeout: float = 120
    ) -> bytes:
        """Run ``sh -c cmd`` in the service's container (podman exec); its stdout."""
        return self.run(
            ["podman", "exec", "-i", self.container(service), "sh", "-c", cmd],
            input=input,
            timeout=timeout,
        ).stdout

    def admin(self, *args: str) -> Any:
        """``fs3 admin --json ...`` inside the mgmtd1 container (the image's own CLI)."""
        return json.loads(self.exec("mgmtd1", "fs3 admin --json " + " ".join(args)))

    def logs(self) -> str:
        out = []
        for svc, info in sorted(self.containers().items()):
            r = self.run(["podman", "logs", "--tail", "25", info["Id"]], check=False)
            state = info["State"]
            out.append(
                f"--- {svc} ({state.get('Status')}, exit {state.get('ExitCode')}, "
                f"health {(state.get('Health') or {}).get('Status')}):\n"
                + (r.stdout + r.stderr).decode(errors="replace")
            )
        return "\n".join(out)


def wait_for(what: str, cond: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = cond()
        except (AssertionError, OSError, ValueError, subprocess.TimeoutExpired) as e:
            last = e
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})"
            )
        time.sleep(interval)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _try_lock(f: Any) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _stop(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    if os.geteuid() != 0:
        pytest.skip("running containers with /dev/fuse needs root")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse does not exist (modprobe fuse)")
    missing = [t for t in ("podman", "docker-compose", "debootstrap") if shutil.which(t) is None]
    assert not missing, f"{missing} not installed: run `bash scripts/install.sh` (as root)"
    # The stack's ports are fixed: a second run of this test on the machine waits its turn.
    lock = open(LOCK, "w")  # noqa: SIM115 - held until the fixture ends
    wait_for(f"{LOCK} (another run of this test)", lambda: _try_lock(lock), 900, interval=2)
    busy = [p for p in PORTS if not _port_free(p)]
    assert not busy, f"127.0.0.1 ports {busy} of deploy/compose.local.yml are in use"

    conf = tmp_path / "containers.conf"
    # podman sets nofile/nproc rlimits by default, which this sandbox forbids.
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    sock = tmp_path / "podman.sock"
    (tmp_path / "mnt" / "fs3").mkdir(parents=True)
    project = f"fs3up{os.getpid()}"
    env = dict(os.environ)
    env.update(
        CONTAINERS_CONF=str(conf),
        DOCKER_HOST=f"unix://{sock}",
        COMPOSE_PROJECT_NAME=project,
        FS3_COMPOSE_MNT=str(tmp_path / "mnt"),
    )
    env.pop("FS3_CLUSTER_FILE", None)
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{sock}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "podman-service.log", "wb"),  # noqa: SIM115 - closed with the process
        start_new_session=True,
    )
    healthchecks = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts" / "podman-healthchecks.py"),
            "--until-pid",
            str(service.pid),
        ],
        env=env,
        start_new_session=True,
    )
    st = Stack(tmp_path, env, project, service, healthchecks, sock)
    try:
        wait_for(
            "podman's API socket",
            lambda: sock.exists() and st.run(["docker-compose", "version"], check=False),
            30,
        )
        yield st
    finally:
        # Safety net for a failed run (the test itself does all of this and checks it).
        if service.poll() is None and st.containers():
            print(st.logs(), file=sys.stderr)
            st.compose("down", "-v", "--timeout", "5", check=False)
        _stop(healthchecks)
        _stop(service)
        lock.close()


@dataclass
class Reader:
    """Reads every file through the Python API in a loop, checking each byte."""

    files: dict[str, bytes]
    ok: list[float] = field(default_factory=list)  # completion time of each verified read
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        import fs3
        from fs3.testing.cluster import failover_client_config

        try:
            with fs3.connect(str(CLUSTER_FILE), config=failover_client_config()) as c:
                while not self.stop.is_set():
                    for path, want in self.files.items():
                        with c.open(path, "rb") as f:
                            got = f.read()
                        if got != want:
                            self.errors.append(f"{path}: read {len(got)} bytes that differ")
                        self.ok.append(time.monotonic())
        except Exception as e:  # noqa: BLE001 - every failure is a test failure, reported below
            self.errors.append(f"{type(e).__name__}: {e}")


def _healthy(st: Stack) -> bool:
    cs = st.containers()
    for svc in LONG_RUNNING:
        info = cs.get(svc)
        if info is None or (info["State"].get("Health") or {}).get("Status") != "healthy":
            return False
    for svc in ONE_SHOT:
        info = cs.get(svc)
        if info is None or info["State"]["Status"] != "exited":
            return False
        assert info["State"]["ExitCode"] == 0, f"{svc} exited {info['State']['ExitCode']}"
    return True


def _conmons_of(container_ids: list[str]) -> list[int]:
    """Pids of podman's conmon monitors still running for any of these containers."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"conmon")
            and "-c" in (a.decode(errors="replace") for a in argv)
        ):
            cid = argv[argv.index(b"-c") + 1].decode(errors="replace")
            if cid in container_ids:
                pids.append(int(d.name))
    return pids


def _mount_lines() -> list[str]:
    return Path("/proc/self/mounts").read_text().splitlines()


@pytest.mark.timeout(1200)
def test_compose_up_kill_storage_restart_down(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    st = stack
    rng = random.Random(SEED)
    t_all = time.monotonic()
    try:
        # 1. the image (scripts/build-image.sh reuses the cached base and image when current)
        t0 = time.monotonic()
        st.run(["bash", "scripts/build-image.sh"], timeout=900)
        st.timings["build_s"] = time.monotonic() - t0

        # 2. cold up: new containers and volumes, until every service is healthy
        t0 = time.monotonic()
        st.compose("up", "-d", timeout=300)
        wait_for("every service healthy", lambda: _healthy(st), 300)
        st.timings["up_to_healthy_s"] = time.monotonic() - t0
        cs = st.containers()
        assert set(cs) == set(LONG_RUNNING) | set(ONE_SHOT), "fdb is left out, everything else runs"
        ids = [info["Id"] for info in cs.values()]
        rootfs = [
            info["GraphDriver"]["Data"]["MergedDir"]
            for svc, info in cs.items()
            if svc not in ONE_SHOT
        ]
        assert all(info["HostConfig"]["NetworkMode"] == "host" for info in cs.values())

        # the host's client: a user token (acting as root) made with the admin credential
        # inside the mgmtd container, and the cluster CA (every TCP connection is TLS)
        token = (
            st.exec(
                "mgmtd1", "fs3 admin --cluster /etc/fs3/fs3.cluster user add host --uid 0 --gid 0"
            )
            .decode()
            .strip()
        )
        ca = st.tmp / "ca.pem"
        ca.write_bytes(st.exec("mgmtd1", "cat /etc/fs3/security/tls/ca.pem"))
        monkeypatch.setenv("FS3_TOKEN", token)
        monkeypatch.setenv("FS3_RPC_TLS_CA", str(ca))

        # 3. files through the FUSE container and through the Python API from the host
        files: dict[str, bytes] = {}
        st.exec("fuse", "mkdir -p /mnt/fs3/compose")
        for i, size in enumerate([5 * 1024 * 1024 + 4321, 70_000, 1]):
            path = f"/compose/fuse-{i}.bin"
            files[path] = rng.randbytes(size)
            st.exec("fuse", f"cat > /mnt/fs3{path}", input=files[path])
        import fs3
        from fs3.testing.cluster import failover_client_config

        with fs3.connect(str(CLUSTER_FILE), config=failover_client_config()) as c:
            for i, size in enumerate([3 * 1024 * 1024 + 17, 4096]):
                path = f"/compose/api-{i}.bin"
                files[path] = rng.randbytes(size)
                with c.open(path, "wb") as f:
                    f.write(files[path])
            for path, want in files.items():  # FUSE-written files read back by the API
                with c.open(path, "rb") as f:
                    assert f.read() == want, path
        # API-written files read back through the FUSE mount, here with docker-compose exec
        sums = st.compose("exec", "-T", "fuse", "sh", "-c", "cd /mnt/fs3/compose && sha256sum *")
        for path, want in files.items():
            assert f"{hashlib.sha256(want).hexdigest()}  {path.rsplit('/', 1)[1]}" in sums, (
                path,
                sums,
            )

        # 4. kill a storage container while the host reads; status shows it offline
        reader = Reader(files)
        rt = threading.Thread(target=reader.run, name="compose-reader", daemon=True)
        rt.start()
        wait_for("reads before the kill", lambda: len(reader.ok) >= 5, 60)
        t_kill = time.monotonic()
        st.compose("kill", VICTIM)
        assert st.containers()[VICTIM]["State"]["Status"] == "exited"

        def victim_offline() -> bool:
            nodes = {n["name"]: n["status"] for n in st.admin("nodes")}
            return nodes[VICTIM_NODE] == "offline"

        wait_for(f"fs3 admin shows {VICTIM_NODE} offline", victim_offline, 120)
        st.timings["offline_after_kill_s"] = time.monotonic() - t_kill
        targets = {t["id"]: t["state"] for t in st.admin("targets")}
        assert targets[101] == "offline" and targets[102] == "offline", targets
        n_at_offline = len(reader.ok)
        wait_for("reads while the node is down", lambda: len(reader.ok) >= n_at_offline + 5, 90)
        # ... and through the FUSE container too
        assert st.exec("fuse", "cat /mnt/fs3/compose/api-0.bin") == files["/compose/api-0.bin"]
        assert not reader.errors, reader.errors

        # start it again; wait until it serves (resynced, every target serving)
        t0 = time.monotonic()
        st.compose("start", VICTIM)

        def all_serving() -> bool:
            ts = st.admin("targets")
            return len(ts) == 6 and all(t["state"] == "serving" for t in ts)

        wait_for(f"{VICTIM} back and every target serving", all_serving, 180)
        wait_for(
            f"{VICTIM} healthy",
            lambda: (
                (st.containers()[VICTIM]["State"].get("Health") or {}).get("Status") == "healthy"
            ),
            60,
        )
        st.timings["restart_to_serving_s"] = time.monotonic() - t0
        n_after = len(reader.ok)
        wait_for("reads after the restart", lambda: len(reader.ok) >= n_after + 3, 60)
        reader.stop.set()
        rt.join(120)
        assert not rt.is_alive() and not reader.errors, reader.errors
        ok_during = [t for t in reader.ok if t_kill <= t]
        gaps = [b - a for a, b in zip([t_kill, *ok_during], ok_during, strict=False)]
        st.timings["longest_read_stall_s"] = max(gaps)
        st.timings["verified_reads"] = len(reader.ok)

        # 5. every byte, through both paths, after the restart
        for path, want in files.items():
            assert st.exec("fuse", f"cat /mnt/fs3{path}") == want, f"FUSE {path}"
        with fs3.connect(str(CLUSTER_FILE), config=failover_client_config()) as c:
            for path, want in files.items():
                with c.open(path, "rb") as f:
                    assert f.read() == want, f"API {path}"
            assert sorted(c.listdir("/compose")) == sorted(p.rsplit("/", 1)[1] for p in files)
    except BaseException:
        print(st.logs(), file=sys.stderr)
        raise

    # 6. down -v: nothing of the project is left
    t0 = time.monotonic()
    st.compose("down", "-v", timeout=300)
    st.timings["down_s"] = time.monotonic() - t0
    assert st.containers() == {}
    label = f"label=com.docker.compose.project={st.project}"
    vols = st.run(["podman", "volume", "ls", "-q", "--filter", label]).stdout.split()
    assert vols == [], f"volumes left: {vols}"
    nets = st.run(["podman", "network", "ls", "--format", "{{.Name}}"]).stdout.decode().split()
    assert not [n for n in nets if n.startswith(st.project)], f"networks left: {nets}"
    mounts = _mount_lines()
    left = [m for m in mounts if "fs3:fs3-compose" in m or str(st.tmp) in m]
    left += [m for m in mounts if any(i in m for i in ids) or any(r in m for r in rootfs)]
    assert not left, f"mounts left: {left}"
    # conmon keeps the monitor of a finished `podman exec` for up to 5 minutes (its
    # --exit-delay, for an exit code nobody will ask for once the container is gone):
    # end those of this project's containers instead of leaving them to the machine.
    monitors = _conmons_of(ids)
    for pid in monitors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    st.timings["exec_monitors_ended"] = len(monitors)
    wait_for("no process of the project's containers", lambda: not _conmons_of(ids), 30)

    # ... and the podman service this test started stops (with its health-check runner)
    st.service.send_signal(signal.SIGTERM)
    st.service.wait(timeout=30)
    st.healthchecks.wait(timeout=30)
    assert not st.socket.exists(), "podman service left its socket"
    st.timings["total_s"] = time.monotonic() - t_all

    with capsys.disabled():
        print(
            "\ncompose up timings: "
            + ", ".join(
                f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                for k, v in st.timings.items()
            ),
            flush=True,
        )
    with contextlib.suppress(OSError):
        (st.tmp / "timings.json").write_text(json.dumps(st.timings))
