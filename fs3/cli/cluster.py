"""``fs3 cluster up|status|down|kill|restart``: a real multi-process cluster on one host.

The launcher is the main job of fs3 in one command and the harness every
integration and fault test uses (through :class:`fs3.testing.cluster.ProcessCluster`),
so it starts *real* processes, each exactly as an operator would
(``python -m fs3.cli.main <service> --config FILE``), and keeps everything it
needs to find them again in one directory::

    DIR/fs3.cluster              the cluster file (<cluster_id>@127.0.0.1:p1,127.0.0.1:p2)
    DIR/conf/<name>.toml         one config per process (every key, so it is self-describing)
    DIR/kv/kv.db                 the embedded SQLite KV shared by mgmtd and meta
    DIR/data/storage-i/tJ        storage targets (target id i*100+J)
    DIR/logs/<name>.log          stdout+stderr of each process (appended across restarts)
    DIR/state.json               name, role, pid, start time and command of every process

Why record pid *and* command *and* kernel start time: ``down`` and ``kill`` must
stop exactly the processes this launcher started and never an unrelated process
that happens to reuse a pid, so a pid is only signalled when ``/proc/<pid>/cmdline``
is the recorded command and ``/proc/<pid>/stat`` has the recorded start time.

Node ids are fixed by name (mgmtd-i -> i, meta-i -> 100+i, storage-i -> 10000+i)
so routing info, logs and ``status`` agree on names without asking anyone.
The local cluster uses short failure-detection timings (a few seconds instead
of 3FS's minute) because it exists for demos and tests; every key can be changed
with ``--set role.section.key=value``.

``up`` is all-or-nothing: if any step fails it prints which process failed with
the tail of its log, stops everything it started and exits non-zero.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fs3 import config as fs3config
from fs3.durable import makedirs_durably, write_durably
from fs3.errors import Code, FsError
from fs3.mounts import mount_fstype, mount_state
from fs3.security import provision

DEFAULT_DIR = "/var/lib/fs3-local"
FUSE_DEVICE = "/dev/fuse"
FUSERMOUNT = "fusermount3"
STATE_VERSION = 1
ROLES = ("mgmtd", "meta", "storage", "fuse")
ROLE_CONFIGS: dict[str, type] = {
    "mgmtd": fs3config.MgmtdConfig,
    "meta": fs3config.MetaConfig,
    "storage": fs3config.StorageConfig,
    "fuse": fs3config.ClientConfig,
}
NODE_ID_BASE = {"mgmtd": 0, "meta": 100, "storage": 10000}
# The chain table ``up`` creates and meta puts new files in ([meta] default_chain_table).
DEFAULT_TABLE = 1

PUBLIC_STATE_NAMES = {
    0: "unknown",
    1: "serving",
    2: "last-serving",
    4: "syncing",
    8: "waiting",
    16: "offline",
}
LOCAL_STATE_NAMES = {0: "unknown", 1: "up-to-date", 2: "online", 4: "offline"}

# Timings for a local cluster: failures are detected in seconds, not minutes, so
# `fs3 cluster kill storage-2` visibly changes the chains during a demo and
# fault tests finish quickly. Keys missing from a config class are skipped so
# the launcher keeps working while services add or drop keys.
LOCAL_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "mgmtd": {
        "mgmtd": {
            "lease_length_s": 6.0,
            "lease_renew_interval_s": 1.0,
            "lease_safety_margin_s": 2.0,
            "heartbeat_interval_s": 1.0,
            "heartbeat_timeout_s": 5.0,
            "check_interval_s": 0.5,
        },
    },
    "meta": {
        "meta": {"routing_refresh_s": 1.0, "heartbeat_interval_s": 1.0},
        "client": {"routing_refresh_s": 1.0, "retry_deadline_s": 30.0},
    },
    "storage": {
        "storage": {
            "heartbeat_interval_s": 1.0,
            "routing_refresh_s": 1.0,
            "forward_timeout_s": 3.0,
        },
        "client": {"routing_refresh_s": 1.0},
    },
    "fuse": {"client": {"routing_refresh_s": 1.0, "retry_deadline_s": 30.0}},
}

Out = Callable[[str], None]


class LauncherError(FsError):
    """A launcher step failed; ``process`` names the culprit when there is one."""

    def __init__(self, message: str, *, process: str = "", log_tail: str = "") -> None:
        super().__init__(Code.UNAVAILABLE, message, retryable=False)
        self.process = process
        self.log_tail = log_tail

    def render(self) -> str:
        text = f"fs3 cluster: {self.message}"
        if self.log_tail:
            text += (
                f"\n--- last lines of the log of {self.process} ---\n{self.log_tail.rstrip()}\n---"
            )
        return text


# --------------------------------------------------------------------------- spec and state


@dataclass
class ClusterSpec:
    """Shape of a local cluster; recorded in state.json so `up` on the same DIR reuses it."""

    storage_nodes: int = 3
    targets_per_node: int = 2
    replicas: int = 3
    meta: int = 2
    mgmtd: int = 2
    kv: str = "sqlite"
    transport: str = "auto"
    rpc: str = "native"  # [rpc] transport of every process: native | grpc
    fdb_cluster_file: str = "/etc/foundationdb/fdb.cluster"
    base_port: int = 0  # 0: free ports outside the kernel's ephemeral range
    tls: bool = False  # TLS on every TCP connection (fs3/security/provision.py)
    # role -> section -> key -> value, applied after the local defaults
    overrides: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def validate(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise LauncherError(msg)

        need(1 <= self.mgmtd <= 9, "--mgmtd must be 1..9")
        need(1 <= self.meta <= 99, "--meta must be 1..99")
        need(1 <= self.storage_nodes <= 99, "--storage-nodes must be 1..99")
        need(1 <= self.targets_per_node <= 99, "--targets-per-node must be 1..99")
        need(
            1 <= self.replicas <= self.storage_nodes,
            f"--replicas must be 1..{self.storage_nodes} (a chain never holds two targets of one node, "
            "so there cannot be more replicas than storage nodes)",
        )
        need(self.kv in {"sqlite", "fdb"}, "--kv must be sqlite or fdb")
        need(
            self.transport in {"auto", "grpc", "tcp", "shm"},
            "--transport must be auto, grpc, tcp or shm",
        )
        need(self.rpc in {"native", "grpc"}, "--rpc must be native or grpc")
        need(
            self.base_port == 0 or 1024 <= self.base_port <= 65000,
            "--base-port must be 0 or 1024..65000",
        )
        for role, sections in self.overrides.items():
            need(
                role in ROLE_CONFIGS,
                f"--set: unknown role {role!r} (known: {', '.join(ROLE_CONFIGS)})",
            )
            hints = _section_names(ROLE_CONFIGS[role])
            for sec, keys in sections.items():
                need(
                    sec in hints,
                    f"--set: {role} has no section [{sec}] (known: {', '.join(hints)})",
                )
                known = _key_names(ROLE_CONFIGS[role], sec)
                for key in keys:
                    need(
                        key in known,
                        f"--set: [{sec}] of {role} has no key {key!r} (known: {', '.join(known)})",
                    )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class ProcRecord:
    """One process of the cluster, as recorded in state.json."""

    name: str
    role: str
    command: list[str]
    log: str
    config: str = ""
    address: str = ""  # gRPC host:port ("" for the FUSE daemon)
    ports: list[int] = field(default_factory=list)  # every port the process listens on
    node_id: int = 0
    env: dict[str, str] = field(default_factory=dict)  # extra environment (FS3_* overrides)
    pid: int = 0
    start_ticks: int = 0  # /proc/<pid>/stat field 22: tells a reused pid apart
    started_at: float = 0.0


@dataclass
class ClusterState:
    cluster_id: str
    spec: ClusterSpec
    processes: list[ProcRecord]
    cluster_file: str
    mountpoint: str = ""
    created_at: float = 0.0
    # targets in no chain after the last `up` (learned from mgmtd, not saved: status asks mgmtd)
    spare_targets: list[int] = field(default_factory=list)

    def proc(self, name: str) -> ProcRecord:
        for p in self.processes:
            if p.name == name:
                return p
        names = ", ".join(p.name for p in self.processes) or "none"
        raise LauncherError(f"no process named {name!r} in this cluster (processes: {names})")

    def by_role(self, role: str) -> list[ProcRecord]:
        return [p for p in self.processes if p.role == role]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "cluster_id": self.cluster_id,
            "spec": self.spec.to_json(),
            "processes": [dataclasses.asdict(p) for p in self.processes],
            "cluster_file": self.cluster_file,
            "mountpoint": self.mountpoint,
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterState:
        known = {f.name for f in dataclasses.fields(ProcRecord)}
        return cls(
            cluster_id=data["cluster_id"],
            spec=ClusterSpec.from_json(data.get("spec", {})),
            processes=[
                ProcRecord(**{k: v for k, v in p.items() if k in known}) for p in data["processes"]
            ],
            cluster_file=data["cluster_file"],
            mountpoint=data.get("mountpoint", "") or "",
            created_at=float(data.get("created_at", 0.0)),
        )


class Paths:
    """Where everything of a local cluster lives under its directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))
        self.conf = self.root / "conf"
        self.logs = self.root / "logs"
        self.data = self.root / "data"
        self.kv = self.root / "kv"
        self.state = self.root / "state.json"
        self.cluster_file = self.root / "fs3.cluster"
        self.lock = self.root / ".lock"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def config(self, name: str) -> Path:
        return self.conf / f"{name}.toml"


# --------------------------------------------------------------------------- process helpers

_CHILDREN: dict[
    int, subprocess.Popen[bytes]
] = {}  # processes this Python process started (to reap)


_EXIT_CODES: dict[int, int] = {}  # pid -> exit status of children reaped by _reap


def _reap(pid: int) -> None:
    """Collect a child of ours that exited, so it does not linger as a zombie."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)
        _EXIT_CODES[pid] = child.returncode


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start ticks) of a pid, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = raw[raw.rfind(")") + 2 :].split()
    # after "pid (comm) " fields start at field 3 (state); starttime is field 22
    return rest[0], int(rest[19])


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return [p.decode(errors="surrogateescape") for p in parts]


def _find_process(command: list[str]) -> tuple[int, int]:
    """(pid, start ticks) of a running process with exactly this command line, or (0, 0)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if _cmdline(pid) == command:
            st = _proc_stat(pid)
            if st is not None and st[0] not in ("Z", "X", "x"):
                return pid, st[1]
    return 0, 0


def is_alive(rec: ProcRecord) -> bool:
    """True when the recorded pid is running and still is the process we started."""
    if rec.pid <= 0:
        return False
    _reap(rec.pid)
    st = _proc_stat(rec.pid)
    if st is None or st[0] in ("Z", "X", "x"):
        return False
    if rec.start_ticks and st[1] != rec.start_ticks:
        return False
    return _cmdline(rec.pid) == rec.command


def _exiting(pid: int) -> bool:
    """True while a killed process is half gone: its main thread a zombie, others still exiting.

    /proc shows the main thread as a zombie (no command line) as soon as it
    exits, but the process's open files, its listening sockets among them, are
    only released when its last thread is gone; a thread stuck in a file system
    call (a FUSE request, say) can take a moment. Until then its ports are taken.
    """
    st = _proc_stat(pid)
    if st is None or st[0] != "Z":
        return False
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def is_gone(rec: ProcRecord) -> bool:
    """True when the recorded process is not running and none of its threads is left."""
    return not is_alive(rec) and not (rec.pid > 0 and _exiting(rec.pid))


def _signal(rec: ProcRecord, sig: int) -> bool:
    """Send ``sig`` to the recorded process if it is still ours; True if sent."""
    if not is_alive(rec):
        return False
    try:
        os.kill(rec.pid, sig)
    except ProcessLookupError:
        return False
    return True


def _wait_dead(recs: Sequence[ProcRecord], timeout_s: float) -> list[ProcRecord]:
    """Poll until every one of ``recs`` is gone or the deadline passes; returns the survivors."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [r for r in recs if not is_gone(r)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def stop_processes(recs: Sequence[ProcRecord], grace_s: float) -> list[str]:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL; returns names that needed SIGKILL."""
    for r in recs:
        _signal(r, signal.SIGTERM)
    survivors = _wait_dead(recs, grace_s)
    for r in survivors:
        _signal(r, signal.SIGKILL)
    still = _wait_dead(survivors, 5.0)
    if still:
        raise LauncherError(
            "could not stop "
            + ", ".join(f"{r.name} (pid {r.pid})" for r in still)
            + " even with SIGKILL"
        )
    return [r.name for r in survivors]


def log_tail(path: str | os.PathLike[str], lines: int = 25) -> str:
    """The last ``lines`` lines of a log written since the process's last start."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return "(no log file)"
    marker = text.rfind("\n=== fs3 cluster: starting ")
    if marker >= 0:
        text = text[marker + 1 :]
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# Where service ports come from (see :func:`pick_free_ports`).
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LINUX_DEFAULT_EPHEMERAL = (32768, 60999)
SERVICE_PORT_FLOOR = 20000


def ephemeral_port_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last): where it takes client ports from."""
    try:
        lo, hi = (int(x) for x in Path(path).read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT_EPHEMERAL
    return lo, hi


def service_port_candidates(ephemeral: tuple[int, int] | None = None) -> list[int]:
    """Ports a service may listen on that the kernel never hands to a client socket.

    Below the ephemeral range from ``SERVICE_PORT_FLOOR`` (from 1024 when the
    range starts lower than that), then above it up to 65535.
    """
    lo, hi = ephemeral or ephemeral_port_range()
    floor = SERVICE_PORT_FLOOR if lo > SERVICE_PORT_FLOOR else 1024
    return list(range(floor, max(floor, lo))) + list(range(max(hi + 1, 1024), 65536))


def pick_free_ports(
    n: int, host: str = "127.0.0.1", *, ephemeral: tuple[int, int] | None = None
) -> list[int]:
    """``n`` distinct bindable ports outside the kernel's ephemeral range.

    Why not the kernel's free ports (``bind(0)``): those come from the ephemeral
    range, the one the kernel also assigns to outgoing connections. When a
    process dies, its clients keep reconnecting to its port, and a connect whose
    kernel-chosen local port equals that port connects to itself (TCP
    simultaneous open) and holds the port, so the process could not be
    restarted on it. A port outside the range is never a client's local port.

    The walk starts at a random candidate (so launchers running at the same
    time rarely collide) and takes consecutive bindable ports from there; all
    of them are held bound until ``n`` are found, then released.
    """
    cands = service_port_candidates(ephemeral)
    if len(cands) < n:
        lo, hi = ephemeral or ephemeral_port_range()
        raise LauncherError(
            f"the kernel's ephemeral port range {lo}-{hi} ({EPHEMERAL_RANGE_FILE}) leaves fewer "
            f"than {n} ports for services; narrow it or choose ports with --base-port"
        )
    start = secrets.randbelow(len(cands))
    socks: list[socket.socket] = []
    try:
        for i in range(len(cands)):
            port = cands[(start + i) % len(cands)]
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            if len(socks) == n:
                return [s.getsockname()[1] for s in socks]
        raise LauncherError(f"fewer than {n} free ports outside the ephemeral range on {host}")
    finally:
        for s in socks:
            s.close()


def port_accepts(address: str, timeout_s: float = 0.5) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- mounts


def fuse_unmount(path: str, out: Out) -> bool:
    """Unmount a FUSE mount: ``fusermount3 -u``, lazily (``-z``) if it is busy. True if gone."""
    exe = shutil.which(FUSERMOUNT)
    if mount_fstype(path) is None:
        return True
    if exe is None:
        out(f"cannot unmount {path}: {FUSERMOUNT} not found (apt-get install fuse3)")
        return False
    r = subprocess.run([exe, "-u", path], capture_output=True, text=True, timeout=30, check=False)
    if r.returncode != 0:
        r2 = subprocess.run(
            [exe, "-u", "-z", path], capture_output=True, text=True, timeout=30, check=False
        )
        if r2.returncode != 0:
            out(f"cannot unmount {path}: {r.stderr.strip()} / {r2.stderr.strip()}")
            return False
        out(f"unmounted {path} lazily ({FUSERMOUNT} -u -z): it was busy ({r.stderr.strip()})")
    return mount_fstype(path) is None


# --------------------------------------------------------------------------- mgmtd probing


class MgmtdProbe:
    """Read-only questions to mgmtd over blocking gRPC with short timeouts.

    Deliberately not the retrying :class:`fs3.client.mgmtd_client.MgmtdClient`:
    ``status`` must answer quickly on a half-dead cluster, and the waits in ``up``
    already poll with their own deadline.
    """

    def __init__(self, addresses: Sequence[str], timeout_s: float = 2.0) -> None:
        self.addresses = list(addresses)
        self.timeout_s = timeout_s

    def _stub(self, address: str) -> tuple[Any, Any]:
        from fs3.proto import mgmtd_pb2_grpc
        from fs3.rpc.channel import sync_channel

        ch = sync_channel(address)
        return ch, mgmtd_pb2_grpc.MgmtdServiceStub(ch)

    def leader(self) -> tuple[int, str] | None:
        """(node id, address) of the mgmtd that says it is the leader, or None."""
        from fs3.proto import mgmtd_pb2
        from fs3.rpc.channel import call_sync

        for addr in self.addresses:
            ch, stub = self._stub(addr)
            try:
                r = call_sync(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=self.timeout_s)
                if r.is_leader:
                    return int(r.node_id), addr
            except FsError:
                continue
            finally:
                ch.close()
        return None

    def routing(self, leader_address: str | None = None) -> Any | None:
        """The leader's RoutingInfo (asked of ``leader_address`` if known), or None."""
        from fs3.proto import mgmtd_pb2
        from fs3.rpc.channel import call_sync

        if leader_address is None:
            lead = self.leader()
            if lead is None:
                return None
            leader_address = lead[1]
        ch, stub = self._stub(leader_address)
        try:
            r = call_sync(
                stub.GetRoutingInfo,
                mgmtd_pb2.GetRoutingInfoRequest(known_version=0),
                timeout=self.timeout_s,
            )
            return r.routing if r.has_routing else None
        except FsError:
            return None
        finally:
            ch.close()


def create_chain_table(cluster_file: str, table_id: int, replicas: int, timeout_s: float) -> Any:
    """Create chain table ``table_id`` through mgmtd's client (leader discovery and retries)."""
    import asyncio

    from fs3.client.mgmtd_client import MgmtdClient

    async def run() -> Any:
        client = MgmtdClient.from_cluster_file(cluster_file)
        try:
            return await asyncio.wait_for(
                client.create_chain_table(
                    table_id=table_id, replicas=replicas, desc="fs3 cluster up"
                ),
                timeout_s,
            )
        finally:
            await client.close()

    return asyncio.run(run())


# --------------------------------------------------------------------------- config rendering


def _section_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _key_names(cls: type, section: str) -> list[str]:
    sec_cls = next(f for f in dataclasses.fields(cls) if f.name == section)
    return [f.name for f in dataclasses.fields(sec_cls.default_factory())]  # type: ignore[misc,operator]


def render_config(
    role: str, settings: dict[str, dict[str, Any]], optional: dict[str, dict[str, Any]], source: str
) -> str:
    """TOML for one process: every key at its default, then ``settings`` (must exist), then
    ``optional`` (applied only where the config class has that key).

    The text is loaded back through :func:`fs3.config.from_dict` so a bad value fails here,
    with the file name, and not later inside a child process.
    """
    cls = ROLE_CONFIGS[role]
    cfg = cls()
    for sec, keys in optional.items():
        obj = getattr(cfg, sec, None)
        for key, value in keys.items():
            if obj is not None and hasattr(obj, key):
                setattr(obj, key, value)
    for sec, keys in settings.items():
        obj = getattr(cfg, sec, None)
        for key, value in keys.items():
            if obj is None or not hasattr(obj, key):
                raise LauncherError(f"{source}: {role} config has no key [{sec}] {key}")
            setattr(obj, key, value)
    text = (
        f"# {role} config written by `fs3 cluster up`; every key is listed.\n"
        + fs3config.to_toml(cfg)
    )
    try:
        fs3config.from_dict(cls, tomllib.loads(text), source=source, env={})
    except FsError as e:
        raise LauncherError(e.message) from None
    return text


def _merge(*layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for sec, keys in layer.items():
            out.setdefault(sec, {}).update(keys)
    return out


def parse_set(items: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """``role.section.key=value`` (value parsed as TOML, else taken as a string)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for item in items:
        lhs, sep, rhs = item.partition("=")
        parts = lhs.strip().split(".")
        if not sep or len(parts) != 3 or not all(parts):
            raise LauncherError(
                f"--set {item!r}: expected ROLE.SECTION.KEY=VALUE, e.g. storage.storage.fsync=false"
            )
        try:
            value = tomllib.loads(f"v = {rhs.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = rhs.strip()
        out.setdefault(parts[0], {}).setdefault(parts[1], {})[parts[2]] = value
    return out


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    """The launcher's environment without FS3_* overrides (the config files are the truth), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FS3_")}
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def service_command(role: str, config_path: str) -> list[str]:
    return [sys.executable, "-m", "fs3.cli.main", role, "--config", config_path]


def mount_command(cluster_file: str, config_path: str, mountpoint: str) -> list[str]:
    """The FUSE daemon in the foreground (so its pid is the one recorded); mountpoint is argv[-2]."""
    return [
        sys.executable,
        "-m",
        "fs3.cli.main",
        "mount",
        "--cluster",
        cluster_file,
        "--config",
        config_path,
        mountpoint,
        "--foreground",
    ]


# --------------------------------------------------------------------------- the launcher


class LocalCluster:
    """Start, inspect and stop the local cluster kept in one directory.

    Every public method is safe to call on a half-dead cluster; the CLI
    (:func:`main`) and :class:`fs3.testing.cluster.ProcessCluster` are thin
    wrappers around it.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, out: Out | None = None, grace_s: float = 10.0
    ) -> None:
        self.paths = Paths(root)
        self.out: Out = out or (lambda s: print(s, flush=True))
        self.grace_s = grace_s
        self._t0 = time.monotonic()

    # ----------------------------------------------------------------- state

    def load_state(self) -> ClusterState | None:
        """The recorded state; a damaged ``state.json`` is rebuilt from ``conf/`` (see
        :meth:`_recover_state`) and the damaged file kept beside it."""
        try:
            data = json.loads(self.paths.state.read_text())
            return ClusterState.from_json(data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            damage = f"{self.paths.state} is damaged ({e})"
        try:
            st = self._recover_state()
        except LauncherError as e:
            raise LauncherError(
                f"{damage}, and the cluster cannot be rebuilt from {self.paths.conf}: {e.message}. "
                f"Stop whatever still runs from it and remove it with "
                f"`fs3 cluster down --dir {self.paths.root} --wipe` (data included), or use another --dir"
            ) from None
        kept = self.paths.state.with_name(f"state.json.damaged-{int(time.time())}")
        with contextlib.suppress(OSError):
            os.replace(self.paths.state, kept)
        self._save_state(st)
        running = [r.name for r in st.processes if r.pid]
        self.out(
            f"fs3 cluster: {damage}; rebuilt it from the configs in {self.paths.conf} "
            f"(damaged file kept as {kept.name}"
            + (f"; still running: {', '.join(running)}" if running else "")
            + ")"
        )
        return st

    def _save_state(self, st: ClusterState) -> None:
        write_durably(self.paths.state, json.dumps(st.to_json(), indent=2) + "\n")

    def _recover_state(self) -> ClusterState:
        """The cluster's state rebuilt from ``conf/<name>.toml`` (written once, at creation).

        Every static field of a process (command, ports, node id, paths) is in its
        config; the pid of a process still running is found by its exact command
        line. The spec's ``replicas`` is only used to create the first chain
        table, which a cluster with data already has.
        """
        p = self.paths
        order = {role: i for i, role in enumerate(NODE_ID_BASE)}
        confs: list[tuple[int, int, str, str, dict[str, Any]]] = []
        for path in sorted(p.conf.glob("*.toml")) if p.conf.is_dir() else []:
            role, _, idx = path.stem.partition("-")
            if role not in NODE_ID_BASE or not idx.isdigit():
                continue
            try:
                confs.append(
                    (order[role], int(idx), path.stem, role, tomllib.loads(path.read_text()))
                )
            except (OSError, ValueError) as e:
                raise LauncherError(f"{path} is unreadable ({e})") from None
        confs.sort()
        counts = {role: sum(1 for c in confs if c[3] == role) for role in NODE_ID_BASE}
        if not counts["mgmtd"] or not counts["storage"]:
            raise LauncherError(f"no mgmtd or storage config in {p.conf}")
        recs: list[ProcRecord] = []
        try:
            cluster_id = str(confs[0][4]["cluster"]["id"])
            for _, _, name, role, cfg in confs:
                ports = [int(cfg["node"]["port"]), int(cfg["metrics"]["port"])]
                rec = self._record(name, role, ports, int(cfg["node"]["id"]))
                rec.pid, rec.start_ticks = _find_process(rec.command)
                recs.append(rec)
            storage_cfg = next(c[4] for c in confs if c[3] == "storage")
            kv_url = str(next(c[4] for c in confs if c[3] == "mgmtd")["kv"]["url"])
        except (KeyError, TypeError, ValueError) as e:
            raise LauncherError(
                f"a config in {p.conf} lacks a key the launcher writes ({e})"
            ) from None
        spec = ClusterSpec(
            storage_nodes=counts["storage"],
            targets_per_node=len(storage_cfg["storage"]["targets"]),
            replicas=min(ClusterSpec.replicas, counts["storage"]),
            meta=counts["meta"],
            mgmtd=counts["mgmtd"],
            kv="fdb" if kv_url.startswith("fdb://") else "sqlite",
            transport=str(storage_cfg["transport"]["kind"]),
        )
        if spec.kv == "fdb":
            spec.fdb_cluster_file = kv_url.removeprefix("fdb://")
        fuse_conf = p.config("fuse")
        if fuse_conf.is_file():
            with contextlib.suppress(OSError, ValueError):
                fuse = tomllib.loads(fuse_conf.read_text())
                spec.overrides["fuse"] = {k: v for k, v in fuse.items() if k != "cluster"}
        return ClusterState(
            cluster_id=cluster_id,
            spec=spec,
            processes=recs,
            cluster_file=str(p.cluster_file),
            created_at=p.conf.stat().st_mtime,
        )

    def _repair_cluster_file(self, st: ClusterState) -> None:
        """Rewrite the cluster file from the state if it is missing or damaged."""
        try:
            fs3config.read_cluster_file(st.cluster_file)
            return
        except (OSError, FsError, ValueError) as e:
            damage = str(e)
        addrs = tuple(r.address for r in st.by_role("mgmtd"))
        write_durably(st.cluster_file, fs3config.ClusterFile(st.cluster_id, addrs).render())
        self._say(f"rewrote the damaged cluster file {st.cluster_file} ({damage})")

    def _create(self, spec: ClusterSpec) -> ClusterState:
        """Lay out a new cluster: configs, cluster file and state, each durable before the next."""
        cid = f"local-{secrets.token_hex(4)}"
        st, cf = self._layout(spec, cid)
        self._check_ports(st)
        self._write_configs(st)
        write_durably(self.paths.cluster_file, cf.render())
        self._save_state(st)
        return st

    @contextlib.contextmanager
    def _locked(self, create: bool = False) -> Iterator[None]:
        """One mutating command per DIR at a time (up while down is running would be chaos)."""
        if create:
            makedirs_durably(self.paths.root)
        elif not self.paths.root.is_dir():
            raise LauncherError(f"no cluster in {self.paths.root} (the directory does not exist)")
        fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LauncherError(
                    f"another `fs3 cluster` command is working on {self.paths.root}; wait for it to finish"
                ) from None
            yield
        finally:
            os.close(fd)

    def _say(self, msg: str) -> None:
        self.out(f"[{time.monotonic() - self._t0:6.1f}s] {msg}")

    # ----------------------------------------------------------------- layout

    def _layout(
        self, spec: ClusterSpec, cluster_id: str
    ) -> tuple[ClusterState, fs3config.ClusterFile]:
        """Names, node ids, ports, configs and commands of every process (nothing started)."""
        p = self.paths
        names: list[tuple[str, str, int]] = []
        for role, count in (
            ("mgmtd", spec.mgmtd),
            ("meta", spec.meta),
            ("storage", spec.storage_nodes),
        ):
            names += [(f"{role}-{i}", role, i) for i in range(1, count + 1)]
        # each process: its RPC port (native and gRPC) + metrics port
        need = 2 * len(names)
        if spec.base_port:
            ports = list(range(spec.base_port, spec.base_port + need))
        else:
            ports = pick_free_ports(need)
        it = iter(ports)
        mgmtd_ports: dict[str, int] = {}
        recs: list[ProcRecord] = []
        for name, role, i in names:
            own = [next(it), next(it)]  # RPC, metrics
            rec = self._record(name, role, own, NODE_ID_BASE[role] + i)
            if role == "mgmtd":
                mgmtd_ports[name] = own[0]
            recs.append(rec)
        cluster_file = fs3config.ClusterFile(
            cluster_id, tuple(f"127.0.0.1:{mgmtd_ports[n]}" for n in mgmtd_ports)
        )
        return ClusterState(
            cluster_id=cluster_id,
            spec=spec,
            processes=recs,
            cluster_file=str(p.cluster_file),
            created_at=time.time(),
        ), cluster_file

    def _record(self, name: str, role: str, ports: list[int], node_id: int) -> ProcRecord:
        """A process's record: its command, log and config paths follow from its name."""
        return ProcRecord(
            name=name,
            role=role,
            command=service_command(role, str(self.paths.config(name))),
            log=str(self.paths.log(name)),
            config=str(self.paths.config(name)),
            address=f"127.0.0.1:{ports[0]}",
            ports=ports,
            node_id=node_id,
        )

    def _write_configs(self, st: ClusterState) -> None:
        spec, p = st.spec, self.paths
        kv_url = (
            f"sqlite://{p.kv / 'kv.db'}"
            if spec.kv == "sqlite"
            else f"fdb://{os.path.abspath(spec.fdb_cluster_file)}"
        )
        for d in (p.conf, p.logs, p.data, p.kv):
            makedirs_durably(d)
        for rec in st.processes:
            settings: dict[str, dict[str, Any]] = {
                "node": {"id": rec.node_id, "host": "127.0.0.1", "port": rec.ports[0]},
                "cluster": {"id": st.cluster_id, "cluster_file": st.cluster_file},
                "log": {"file": ""},
                "metrics": {"port": rec.ports[1]},
                "rpc": {
                    "transport": spec.rpc,
                    **provision.service_settings(p.root, rec.name, tls=spec.tls),
                },
            }
            if rec.role in ("mgmtd", "meta"):
                settings["kv"] = {"url": kv_url}
            if rec.role in ("meta", "storage"):
                settings["transport"] = {"kind": spec.transport}
            if rec.role == "storage":
                i = rec.node_id - NODE_ID_BASE["storage"]
                node_dir = p.data / rec.name
                targets = [str(node_dir / f"t{j}") for j in range(1, spec.targets_per_node + 1)]
                for t in targets:
                    makedirs_durably(t)
                settings["node"]["data_dir"] = str(node_dir)
                settings["storage"] = {
                    "targets": targets,
                    "target_ids": [i * 100 + j for j in range(1, spec.targets_per_node + 1)],
                }
            optional = _merge(LOCAL_SETTINGS.get(rec.role, {}), {"node": {"name": rec.name}})
            final = _merge(settings, spec.overrides.get(rec.role, {}))
            text = render_config(rec.role, final, optional, rec.config)
            write_durably(rec.config, text)

    def _fuse_record(self, st: ClusterState, mountpoint: str) -> ProcRecord:
        """The FUSE daemon's record and config (a client config: cluster, transport, timings)."""
        path = str(self.paths.config("fuse"))
        settings = _merge(
            {
                "cluster": {"id": st.cluster_id, "cluster_file": st.cluster_file},
                "transport": {"kind": st.spec.transport},
                "rpc": {
                    "transport": st.spec.rpc,
                    **provision.mount_settings(self.paths.root, tls=st.spec.tls),
                },
                "log": {"file": ""},
            },
            st.spec.overrides.get("fuse", {}),
        )
        write_durably(path, render_config("fuse", settings, LOCAL_SETTINGS["fuse"], path))
        return ProcRecord(
            name="fuse",
            role="fuse",
            command=mount_command(st.cluster_file, path, mountpoint),
            log=str(self.paths.log("fuse")),
            config=path,
        )

    # ----------------------------------------------------------------- starting

    def _start(self, rec: ProcRecord) -> None:
        """Start one process detached from our session, output appended to its log."""
        Path(rec.log).parent.mkdir(parents=True, exist_ok=True)
        with open(rec.log, "ab") as logf:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            logf.write(
                f"\n=== fs3 cluster: starting {rec.name} at {stamp}: {' '.join(rec.command)}\n".encode()
            )
            logf.flush()
            child = subprocess.Popen(
                rec.command,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=str(self.paths.root),
                env=_child_env(rec.env),
                start_new_session=True,  # Ctrl-C on the launcher's terminal must not hit the services
                close_fds=True,
            )
        _CHILDREN[child.pid] = child
        rec.pid = child.pid
        rec.started_at = time.time()
        st = _proc_stat(child.pid)
        rec.start_ticks = st[1] if st else 0
        # the recorded command must match /proc/<pid>/cmdline, which only holds after exec
        deadline = time.monotonic() + 5.0
        while (
            time.monotonic() < deadline
            and child.poll() is None
            and _cmdline(child.pid) != rec.command
        ):
            time.sleep(0.005)

    def _check_alive(self, recs: Sequence[ProcRecord]) -> None:
        for r in recs:
            if not is_alive(r):
                child = _CHILDREN.get(r.pid)
                if (
                    child is not None
                ):  # it may have died between poll() and /proc: collect its status
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.wait(timeout=2.0)
                    _reap(r.pid)
                rc = _EXIT_CODES.get(r.pid)
                code = (
                    ""
                    if rc is None
                    else (f" with exit code {rc}" if rc >= 0 else f" killed by signal {-rc}")
                )
                raise LauncherError(
                    f"{r.name} exited{code} (log: {r.log})",
                    process=r.name,
                    log_tail=log_tail(r.log),
                )

    def _wait(
        self, what: str, cond: Callable[[], Any], watch: Sequence[ProcRecord], timeout_s: float
    ) -> Any:
        """Poll ``cond`` until it returns a truthy value; fail fast if a watched process dies."""
        deadline = time.monotonic() + timeout_s
        next_note = time.monotonic() + 10.0
        while True:
            self._check_alive(watch)
            result = cond()
            if result:
                return result
            now = time.monotonic()
            if now >= deadline:
                culprit = next((r for r in watch if r.role != "mgmtd"), watch[0]) if watch else None
                raise LauncherError(
                    f"timed out after {timeout_s:.0f}s waiting for {what}",
                    process=culprit.name if culprit else "",
                    log_tail=log_tail(culprit.log) if culprit else "",
                )
            if now >= next_note:
                self._say(f"still waiting for {what} ...")
                next_note = now + 10.0
            time.sleep(0.1)

    def _preflight_mount(self, mountpoint: str) -> None:
        if not os.path.exists(FUSE_DEVICE) or not stat.S_ISCHR(os.stat(FUSE_DEVICE).st_mode):
            raise LauncherError(
                f"--mount needs {FUSE_DEVICE}, which does not exist: load the fuse module (modprobe fuse), "
                "or in a container run with --device /dev/fuse --cap-add SYS_ADMIN; or start without --mount"
            )
        if shutil.which(FUSERMOUNT) is None:
            raise LauncherError(
                f"--mount needs {FUSERMOUNT}, which is not on PATH: install it (apt-get install fuse3), "
                "or start without --mount"
            )
        state = mount_state(mountpoint)
        if state == "stale":
            self._say(
                f"{mountpoint} is a stale FUSE mount (ENOTCONN: its daemon is gone); clearing it with {FUSERMOUNT} -u -z"
            )
            exe = shutil.which(FUSERMOUNT) or FUSERMOUNT
            r = subprocess.run(
                [exe, "-u", "-z", mountpoint],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            if r.returncode != 0 or mount_state(mountpoint) == "stale":
                raise LauncherError(
                    f"{mountpoint} is a stale FUSE mount and `{FUSERMOUNT} -u -z {mountpoint}` failed "
                    f"({r.stderr.strip()}); clear it by hand (umount -l {mountpoint}) and retry"
                )
        elif state in ("mounted", "other"):
            raise LauncherError(
                f"{mountpoint} is already a mount point ({mount_fstype(mountpoint)}); unmount it first "
                f"({FUSERMOUNT} -u {mountpoint} or umount {mountpoint}) or choose another --mount"
            )
        if os.path.exists(mountpoint) and not os.path.isdir(mountpoint):
            raise LauncherError(f"--mount {mountpoint} exists and is not a directory")
        os.makedirs(mountpoint, exist_ok=True)

    def _check_ports(self, st: ClusterState) -> None:
        for rec in st.processes:
            for port in rec.ports:
                if not port_is_free(port):
                    raise LauncherError(
                        f"port 127.0.0.1:{port} (needed by {rec.name}) is in use by another program; "
                        f"find it with `ss -ltnp 'sport = :{port}'`"
                        + (" or choose another --base-port" if st.spec.base_port else "")
                    )

    def up(
        self, spec: ClusterSpec | None = None, *, mount: str | None = None, timeout_s: float = 120.0
    ) -> ClusterState:
        """Start the cluster in DIR (reusing its data if it has any) and return its state.

        ``spec`` None means: the spec recorded in DIR (or the defaults for a new DIR).
        On failure everything this call started is stopped and LauncherError raised.
        """
        self._t0 = time.monotonic()
        with self._locked(create=True):
            old = self.load_state()
            if old is not None:
                alive = [r for r in old.processes if is_alive(r)]
                if alive:
                    raise LauncherError(
                        f"a cluster is already running in {self.paths.root} ("
                        + ", ".join(f"{r.name} pid {r.pid}" for r in alive)
                        + f"); use it, or stop it first with `fs3 cluster down --dir {self.paths.root}`"
                    )
                if spec is not None:
                    diff = _spec_diff(old.spec, spec)
                    if diff:
                        raise LauncherError(
                            f"{self.paths.root} holds a cluster created with different options ({diff}); "
                            f"start it without those options, or wipe it first with "
                            f"`fs3 cluster down --dir {self.paths.root} --wipe`"
                        )
            spec = old.spec if old is not None else (spec or ClusterSpec())
            spec.validate()
            if spec.kv == "fdb" and not os.path.exists(spec.fdb_cluster_file):
                raise LauncherError(
                    f"--kv fdb: FoundationDB cluster file {spec.fdb_cluster_file} does not exist"
                )
            if mount:
                mount = os.path.abspath(mount)
                self._preflight_mount(mount)
            if old is not None:
                st = old
                st.mountpoint = ""
                st.processes = [r for r in st.processes if r.role != "fuse"]
                _wait_dead(st.processes, 10.0)  # ports of a just-killed process free up with it
                self._check_ports(st)
                self._repair_cluster_file(st)
                self._say(f"restarting the existing cluster {st.cluster_id} from {self.paths.root}")
            else:
                st = self._create(spec)
                self._say(
                    f"new cluster {st.cluster_id} in {self.paths.root} (configs in {self.paths.conf})"
                )
            provision.use_local_credential(st.cluster_file)
            try:
                self._bring_up(st, mount, timeout_s)
            except BaseException as e:
                if isinstance(e, KeyboardInterrupt):
                    self.out("interrupted: stopping what was started")
                self._abort(st)
                raise
            return st

    def _abort(self, st: ClusterState) -> None:
        if st.mountpoint:
            fuse_unmount(st.mountpoint, self.out)
        started = [r for r in st.processes if r.pid]
        with contextlib.suppress(LauncherError):
            stop_processes([r for r in started if r.role != "mgmtd"], self.grace_s)
            stop_processes([r for r in started if r.role == "mgmtd"], self.grace_s)
        self._save_state(st)
        self.out(f"fs3 cluster: stopped everything that was started; logs are in {self.paths.logs}")

    def _bring_up(self, st: ClusterState, mount: str | None, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        spec = st.spec
        mgmtds, metas, storages = st.by_role("mgmtd"), st.by_role("meta"), st.by_role("storage")
        probe = MgmtdProbe([r.address for r in mgmtds], timeout_s=1.0)
        for r in mgmtds:
            self._start(r)
            self._say(f"started {r.name} (pid {r.pid}, {r.address})")
        self._save_state(st)
        leader = self._wait("an mgmtd leader", probe.leader, mgmtds, left())
        self._say(f"mgmtd leader: {_name_of(st, leader[0])} ({leader[1]})")
        for r in metas + storages:
            self._start(r)
            self._say(f"started {r.name} (pid {r.pid}, {r.address})")
        self._save_state(st)
        expected_targets = {
            (r.node_id - NODE_ID_BASE["storage"]) * 100 + j
            for r in storages
            for j in range(1, spec.targets_per_node + 1)
        }

        started = time.time() - 1.0

        def registered() -> Any:
            rt = probe.routing()
            if rt is None:
                return None
            # a heartbeat since this start, not a node record left over from a previous run
            online = {n.node_id for n in rt.nodes if n.status == 1 and n.last_heartbeat >= started}
            want = {r.node_id for r in metas + storages}
            # reported alive (up-to-date or online): mgmtd builds chains only from those,
            # and a storage node reports its targets offline for a moment after start
            targets = {t.target_id for t in rt.targets if t.local_state in (1, 2)}
            return rt if want <= online and expected_targets <= targets else None

        self._wait(
            f"{len(storages)} storage and {len(metas)} meta nodes to register with mgmtd",
            registered,
            st.processes,
            left(),
        )
        self._say(f"all nodes registered ({len(expected_targets)} targets)")
        rt = probe.routing()
        if rt is not None and any(t.table_id == 1 for t in rt.chain_tables):
            self._say("chain table 1 exists already")
        else:
            try:
                create_chain_table(st.cluster_file, 1, spec.replicas, min(30.0, left()))
            except FsError as e:
                raise LauncherError(
                    f"creating chain table 1 ({spec.replicas} replicas) failed: {e.message}"
                ) from None
            self._say(f"created chain table 1 with {spec.replicas} replicas")

        def serving() -> set[int] | None:
            """The targets in chain table 1 once every one of them serves, else None.

            Only chained targets are waited for: every target belongs to at most
            one chain of ``replicas`` targets on distinct nodes, so some shapes
            (3 nodes x 1 target, 2 replicas) leave targets that no chain can
            take (docs/operations.md); they stay free, and waiting for them
            would never end.
            """
            rt = probe.routing()
            if rt is None:
                return None
            table = _latest_table(rt, 1)
            if table is None:
                return None
            chains = {c.chain_id: c for c in rt.chains}
            # serving = published SERVING by mgmtd *and* the storage node reports the
            # target up-to-date (only then does it accept writes)
            uptodate = {t.target_id for t in rt.targets if t.local_state == 1}
            in_chains: set[int] = set()
            for cid in table.chain_ids:
                c = chains.get(cid)
                if c is None or any(
                    t.public_state != 1 or t.target_id not in uptodate for t in c.targets
                ):
                    return None
                in_chains |= {t.target_id for t in c.targets}
            return in_chains or None

        chained = self._wait("every chained target to be serving", serving, st.processes, left())
        st.spare_targets = sorted(expected_targets - chained)
        if st.spare_targets:
            self._say(f"every chained target is serving; {_spare_note(st)}")
        else:
            self._say("every target is serving")
        self._check_python_api(st)
        if mount:
            fuse = self._fuse_record(st, mount)
            st.processes.append(fuse)
            st.mountpoint = mount
            self._start(fuse)
            self._save_state(st)
            self._say(f"started fuse (pid {fuse.pid}), mounting {mount}")
            self._wait(
                f"the mount at {mount}",
                lambda: mount_state(mount) == "mounted",
                [fuse],
                min(60.0, left()),
            )
            self._check_mount(mount)
        self._check_alive(st.processes)  # a process that died after its own wait was over
        self._save_state(st)

    def _check_python_api(self, st: ClusterState) -> None:
        """Write and read back a file through ``fs3.connect`` (proves meta + storage + client work)."""
        import fs3

        data = secrets.token_bytes((1 << 20) + 4099)  # crosses a chunk boundary
        path = f"/.fs3-cluster-up-check-{os.getpid()}"
        client = fs3.connect(st.cluster_file, transport=st.spec.transport)
        try:
            with client.open(path, "wb") as f:
                f.write(data)
            with client.open(path, "rb") as f:
                back = f.read()
            client.unlink(path)
        except (OSError, FsError) as e:
            raise LauncherError(f"test write/read through the Python API failed: {e}") from None
        finally:
            close = getattr(client, "close", None)
            if close is not None:
                close()
        if back != data:
            raise LauncherError(
                f"test write/read through the Python API returned different bytes ({len(back)} of {len(data)})"
            )
        self._say(f"test write/read of {len(data)} bytes through the Python API: ok")

    def _check_mount(self, mount: str) -> None:
        data = secrets.token_bytes(65536 + 17)
        path = os.path.join(mount, f".fs3-cluster-up-check-{os.getpid()}")
        try:
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            with open(path, "rb") as f:
                back = f.read()
            os.unlink(path)
        except OSError as e:
            raise LauncherError(
                f"test write/read through the mount {mount} failed: {e}",
                process="fuse",
                log_tail=log_tail(self.paths.log("fuse")),
            ) from None
        if back != data:
            raise LauncherError(
                f"test write/read through the mount {mount} returned different bytes"
            )
        self._say(f"test write/read through the mount {mount}: ok")

    # ----------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        """The status object (fields explained in docs/operations.md#reading-fs3-cluster-status)."""
        st = self.load_state()
        if st is None:
            raise LauncherError(
                f"no cluster in {self.paths.root} (start one with `fs3 cluster up --dir {self.paths.root}`)"
            )
        provision.use_local_credential(st.cluster_file)
        procs = []
        for r in st.processes:
            procs.append(
                {
                    "name": r.name,
                    "role": r.role,
                    "pid": r.pid or None,
                    "alive": is_alive(r),
                    "address": r.address or None,
                    "node_id": r.node_id or None,
                    "log": r.log,
                }
            )
        result: dict[str, Any] = {
            "cluster_id": st.cluster_id,
            "dir": str(self.paths.root),
            "cluster_file": st.cluster_file,
            "leader": None,
            "routing_version": None,
            "processes": procs,
            "nodes": [],
            "targets": [],
            "spare_targets": [],
            "chains": [],
            "chain_tables": [],
            "capacity": None,
            "mount": None,
            "mount_state": None,
            "errors": [],
        }
        if st.mountpoint:
            ms = mount_state(st.mountpoint)
            result["mount_state"] = ms
            result["mount"] = st.mountpoint if ms == "mounted" else None
        mgmtds = [r for r in st.by_role("mgmtd") if is_alive(r)]
        if not mgmtds:
            result["errors"].append("no mgmtd process is running")
            return result
        probe = MgmtdProbe([r.address for r in mgmtds], timeout_s=2.0)
        lead = probe.leader()
        if lead is None:
            result["errors"].append("no mgmtd answers as leader")
            return result
        result["leader"] = _name_of(st, lead[0])
        rt = probe.routing(lead[1])
        if rt is None:
            result["errors"].append("the leader did not return routing info")
            return result
        result["routing_version"] = int(rt.version)
        node_name = {n.node_id: (n.name or _name_of(st, n.node_id)) for n in rt.nodes}
        for n in rt.nodes:
            result["nodes"].append(
                {
                    "id": int(n.node_id),
                    "name": node_name[n.node_id],
                    "type": _enum_name(n.type, "NODE_TYPE_"),
                    "status": _enum_name(n.status, "NODE_STATUS_"),
                    "address": n.address,
                }
            )
        for t in sorted(rt.targets, key=lambda t: t.target_id):
            result["targets"].append(
                {
                    "id": int(t.target_id),
                    "node": node_name.get(t.node_id, _name_of(st, t.node_id)),
                    "state": PUBLIC_STATE_NAMES.get(int(t.public_state), str(t.public_state)),
                    "local_state": LOCAL_STATE_NAMES.get(int(t.local_state), str(t.local_state)),
                    "chain": int(t.chain_id),
                    "used_bytes": int(t.used_bytes),
                    "free_bytes": int(t.free_bytes),
                    "capacity_bytes": int(t.capacity_bytes),
                    "fs_id": t.fs_id,
                }
            )
        result["spare_targets"] = [t["id"] for t in result["targets"] if not t["chain"]]
        from fs3.routing import Routing

        space = Routing(rt).space(DEFAULT_TABLE)
        if space is not None:
            result["capacity"] = {
                "chain_table": DEFAULT_TABLE,
                "replicas": space.replicas,
                "capacity_bytes": space.capacity_bytes,
                "free_bytes": space.free_bytes,
                "used_bytes": space.used_bytes,
                "raw_capacity_bytes": space.raw_capacity_bytes,
                "raw_free_bytes": space.raw_free_bytes,
                "raw_used_bytes": space.raw_used_bytes,
                "filesystems": space.filesystems,
                "targets": space.targets,
            }
        for c in sorted(rt.chains, key=lambda c: c.chain_id):
            result["chains"].append(
                {
                    "id": int(c.chain_id),
                    "version": int(c.version),
                    "targets": [int(t.target_id) for t in c.targets],
                    "states": [
                        PUBLIC_STATE_NAMES.get(int(t.public_state), str(t.public_state))
                        for t in c.targets
                    ],
                }
            )
        for tb in rt.chain_tables:
            result["chain_tables"].append(
                {"id": int(tb.table_id), "version": int(tb.version), "chains": list(tb.chain_ids)}
            )
        return result

    # ----------------------------------------------------------------- stopping

    def down(self, *, wipe: bool = False) -> None:
        """Unmount, stop every recorded process (TERM, then KILL after the grace period); idempotent."""
        self._t0 = time.monotonic()
        if not self.paths.root.is_dir():
            self._say(f"no cluster in {self.paths.root}; nothing to stop")
            return
        with self._locked():
            try:
                st = self.load_state()
            except LauncherError:
                if not wipe:
                    raise
                st = None
                self._stop_unrecorded()
            if st is None:
                self._say(f"no cluster recorded in {self.paths.root}; nothing to stop")
            else:
                if st.mountpoint and mount_fstype(st.mountpoint) is not None:
                    if fuse_unmount(st.mountpoint, self.out):
                        self._say(f"unmounted {st.mountpoint}")
                alive = [r for r in st.processes if is_alive(r)]
                for group in (
                    [r for r in alive if r.role == "fuse"],
                    [r for r in alive if r.role in ("meta", "storage")],
                    [
                        r for r in alive if r.role == "mgmtd"
                    ],  # last: storage says goodbye to mgmtd on SIGTERM
                ):
                    if group:
                        killed = stop_processes(group, self.grace_s)
                        self._say(
                            "stopped "
                            + ", ".join(r.name for r in group)
                            + (
                                f" (SIGKILL after {self.grace_s:.0f}s: {', '.join(killed)})"
                                if killed
                                else ""
                            )
                        )
                if not alive:
                    self._say("no process of the cluster was running")
                st.mountpoint = ""
                self._save_state(st)
            if wipe:
                self._wipe()
        if wipe:  # the lock file goes last, and DIR with it if nothing else is in it
            with contextlib.suppress(FileNotFoundError):
                self.paths.lock.unlink()
            with contextlib.suppress(OSError):
                self.paths.root.rmdir()

    def _stop_unrecorded(self) -> None:
        """Stop every process started from a config under ``conf/`` (state unusable: no pids)."""
        prefix = str(self.paths.conf) + os.sep
        recs: list[ProcRecord] = []
        for entry in Path("/proc").iterdir():
            cmd = _cmdline(int(entry.name)) if entry.name.isdigit() else None
            if cmd and any(a.startswith(prefix) for a in cmd):
                st = _proc_stat(int(entry.name))
                if st is not None:
                    recs.append(
                        ProcRecord(entry.name, "", cmd, "", pid=int(entry.name), start_ticks=st[1])
                    )
        if recs:
            stop_processes(recs, self.grace_s)
            self._say(f"stopped {len(recs)} processes started from {self.paths.conf}")

    def _wipe(self) -> None:
        p = self.paths
        for d in (p.data, p.kv, p.conf, p.logs):
            shutil.rmtree(d, ignore_errors=True)
        leftovers = [*p.root.glob("state.json.damaged-*"), *p.root.glob(".*.tmp")]
        for f in (p.state, p.cluster_file, *leftovers):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        provision.remove_all(p.root)
        self._say(f"wiped {p.root}")

    def kill(self, name: str) -> ProcRecord:
        """SIGKILL one process (like a crash); its mount, if any, is left stale on purpose."""
        with self._locked():
            st = self._need_state()
            rec = st.proc(name)
            if not _signal(rec, signal.SIGKILL):
                raise LauncherError(f"{name} is not running")
            if _wait_dead([rec], 10.0):
                raise LauncherError(f"{name} (pid {rec.pid}) survived SIGKILL")
            self._say(f"killed {name} (pid {rec.pid}) with SIGKILL")
            return rec

    def restart(self, name: str, *, timeout_s: float = 60.0) -> ProcRecord:
        """Stop one process if running (TERM, then KILL) and start it again with the same config."""
        self._t0 = time.monotonic()
        with self._locked():
            st = self._need_state()
            rec = st.proc(name)
            if is_alive(rec):
                stop_processes([rec], self.grace_s)
                self._say(f"stopped {name} (pid {rec.pid})")
            elif _wait_dead([rec], 10.0):  # killed just before: its last threads still exiting
                raise LauncherError(f"cannot restart {name}: pid {rec.pid} is still exiting")
            if rec.role == "fuse":
                mp = rec.command[-2]
                if mount_fstype(mp) is not None:
                    fuse_unmount(mp, self.out)
                self._preflight_mount(mp)
                st.mountpoint = mp
            else:
                for port in rec.ports:
                    if not port_is_free(port):
                        raise LauncherError(
                            f"cannot restart {name}: its port 127.0.0.1:{port} is in use by another program"
                        )
            self._start(rec)
            self._save_state(st)
            if rec.role == "fuse":
                mp = rec.command[-2]
                self._wait(
                    f"the mount at {mp}", lambda: mount_state(mp) == "mounted", [rec], timeout_s
                )
            else:
                self._wait(
                    f"{name} to listen on {rec.address}",
                    lambda: port_accepts(rec.address),
                    [rec],
                    timeout_s,
                )
            self._say(f"restarted {name} (pid {rec.pid})")
            return rec

    def _need_state(self) -> ClusterState:
        st = self.load_state()
        if st is None:
            raise LauncherError(f"no cluster in {self.paths.root}")
        return st


def _latest_table(rt: Any, table_id: int) -> Any | None:
    tables = [t for t in rt.chain_tables if t.table_id == table_id]
    return max(tables, key=lambda t: t.version) if tables else None


def _name_of(st: ClusterState, node_id: int) -> str:
    for r in st.processes:
        if r.node_id == node_id and r.role != "fuse":
            return r.name
    return f"node-{node_id}"


def _enum_name(value: int, prefix: str) -> str:
    from fs3.proto import mgmtd_pb2

    enum = mgmtd_pb2.NodeType if prefix == "NODE_TYPE_" else mgmtd_pb2.NodeStatus
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def _spec_diff(old: ClusterSpec, new: ClusterSpec) -> str:
    a, b = old.to_json(), new.to_json()
    return ", ".join(f"{k}: {a[k]!r} there, {b[k]!r} asked" for k in a if a[k] != b.get(k))


# --------------------------------------------------------------------------- CLI


def _fmt_bytes(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def render_status(s: dict[str, Any]) -> str:
    out = [f"cluster {s['cluster_id']}  dir {s['dir']}  cluster file {s['cluster_file']}"]
    out.append(f"leader: {s['leader'] or '-'}   routing version: {s['routing_version'] or '-'}")
    if s["mount_state"]:
        out.append(f"mount: {s['mount'] or '-'} ({s['mount_state']})")
    out.append("")
    rows = [["PROCESS", "ROLE", "PID", "ALIVE", "ADDRESS", "NODE", "STATE"]]
    node_status = {n["name"]: n["status"] for n in s["nodes"]}
    for p in s["processes"]:
        rows.append(
            [
                p["name"],
                p["role"],
                str(p["pid"] or "-"),
                "yes" if p["alive"] else "NO",
                p["address"] or "-",
                str(p["node_id"] or "-"),
                node_status.get(p["name"], "-"),
            ]
        )
    out.append(_table(rows))
    if s["targets"]:
        out.append("")
        rows = [["TARGET", "NODE", "STATE", "LOCAL", "CHAIN", "USED", "FREE"]]
        for t in s["targets"]:
            rows.append(
                [
                    str(t["id"]),
                    t["node"],
                    t["state"],
                    t["local_state"],
                    str(t["chain"] or "-"),
                    _fmt_bytes(t["used_bytes"]),
                    _fmt_bytes(t["free_bytes"]),
                ]
            )
        out.append(_table(rows))
        if s.get("spare_targets"):
            out.append(
                "spare targets (in no chain, hold no data): "
                + ", ".join(map(str, s["spare_targets"]))
            )
        cap = s.get("capacity")
        if cap:
            fs = cap["filesystems"]
            out.append(
                f"capacity: {_fmt_bytes(cap['free_bytes'])} free of {_fmt_bytes(cap['capacity_bytes'])}"
                f" (raw / {cap['replicas']} replicas of chain table {cap['chain_table']});"
                f" data {_fmt_bytes(cap['used_bytes'])}"
            )
            out.append(
                f"raw: {_fmt_bytes(cap['raw_free_bytes'])} free of"
                f" {_fmt_bytes(cap['raw_capacity_bytes'])} on {fs} file system{'s' if fs != 1 else ''}"
                f" ({cap['targets']} targets; shared disks counted once);"
                f" chunks {_fmt_bytes(cap['raw_used_bytes'])}"
            )
    if s["chains"]:
        out.append("")
        rows = [["CHAIN", "VERSION", "TARGETS (head -> tail)"]]
        for c in s["chains"]:
            rows.append(
                [
                    str(c["id"]),
                    str(c["version"]),
                    " -> ".join(
                        f"{t}({st})" for t, st in zip(c["targets"], c["states"], strict=True)
                    ),
                ]
            )
        out.append(_table(rows))
    for e in s["errors"]:
        out.append(f"! {e}")
    return "\n".join(out)


def _spare_note(st: ClusterState) -> str:
    """Which targets are in no chain and, when the shape explains it, why.

    Chain table 1 gets ``floor(total / replicas)`` chains (fs3/mgmtd/placement.py:
    each node has the same number of targets and there are at least as many
    nodes as replicas), so ``total % replicas`` targets are left over by design.
    """
    spec, n = st.spec, len(st.spare_targets)
    total = spec.storage_nodes * spec.targets_per_node
    note = (
        f"{n} target{'s are' if n != 1 else ' is'} spare (in no chain: "
        f"{', '.join(map(str, st.spare_targets))})"
    )
    if n == total % spec.replicas:
        note += (
            f": {spec.storage_nodes} storage nodes x {spec.targets_per_node} targets = {total}, "
            f"not a multiple of {spec.replicas} replicas"
        )
    return note


def render_up_summary(st: ClusterState, took_s: float) -> str:
    lines = [f"fs3 local cluster {st.cluster_id} is up ({took_s:.1f}s)"]
    lines.append(f"  cluster file : {st.cluster_file}")
    for role in ("mgmtd", "meta", "storage"):
        procs = st.by_role(role)
        lines.append(f"  {role:<13}: " + ", ".join(f"{r.name} {r.address}" for r in procs))
    spec = st.spec
    lines.append(
        f"  layout       : {spec.storage_nodes} storage nodes x {spec.targets_per_node} targets, "
        f"{spec.replicas} replicas, kv {spec.kv}, transport {spec.transport}"
    )
    if st.spare_targets:
        lines.append(f"  spare        : {_spare_note(st)}")
    lines.append(f"  mount point  : {st.mountpoint or '(not mounted; use --mount DIR)'}")
    lines.append(f"  logs         : {Path(st.cluster_file).parent / 'logs'}/<name>.log")
    root = Path(st.cluster_file).parent
    lines.append(f"  status       : fs3 cluster status --dir {root}")
    lines.append(f"  stop         : fs3 cluster down --dir {root}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fs3 cluster", description="start, inspect and stop a local fs3 cluster"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    def add_dir(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--dir", default=DEFAULT_DIR, help=f"cluster directory (default {DEFAULT_DIR})"
        )

    up = sub.add_parser("up", help="start a local cluster (or restart the one in --dir)")
    add_dir(up)
    up.add_argument("--storage-nodes", type=int)
    up.add_argument("--targets-per-node", type=int)
    up.add_argument("--replicas", type=int)
    up.add_argument("--meta", type=int)
    up.add_argument("--mgmtd", type=int)
    up.add_argument("--kv", choices=["sqlite", "fdb"])
    up.add_argument("--fdb-cluster-file", help="FoundationDB cluster file for --kv fdb")
    up.add_argument("--transport", choices=["auto", "grpc", "tcp", "shm"])
    up.add_argument(
        "--rpc", choices=["native", "grpc"], help="RPC transport of every process (default native)"
    )
    up.add_argument(
        "--base-port", type=int, help="use ports BASE, BASE+1, ... instead of free ports"
    )
    up.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="ROLE.SECTION.KEY=VALUE",
        help="override a config key of every process of ROLE (repeatable)",
    )
    up.add_argument(
        "--tls",
        action="store_true",
        default=None,
        help="TLS on every TCP connection (a CA and per-service certificates in DIR/tls)",
    )
    up.add_argument("--mount", metavar="MOUNTPOINT", help="mount the file system there with FUSE")
    up.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for the cluster to be usable"
    )

    st = sub.add_parser(
        "status",
        help="processes, leader, nodes, targets, chains, capacity",
        description=(
            "Processes, mgmtd leader, nodes, targets, chains and capacity. Capacity is what a "
            "user can store: the free space of the disks holding the targets, each file system "
            "counted once however many targets it holds, divided by the replication factor of "
            f"chain table {DEFAULT_TABLE} (where new files go); --json also has the raw figures."
        ),
    )
    add_dir(st)
    st.add_argument("--json", action="store_true", help="print one JSON object")

    cr = sub.add_parser(
        "credentials",
        help="create a deployment's cluster secret, mount token and TLS certificates in DIR",
    )
    cr.add_argument("--dir", required=True, help="where (e.g. a volume every service mounts)")
    cr.add_argument("--tls", action="store_true", help="also a CA and one certificate per service")
    cr.add_argument(
        "--service",
        action="append",
        default=[],
        metavar="NAME[=HOST,...]",
        help="a service to issue a certificate for, and the hosts it is valid for (repeatable)",
    )

    dn = sub.add_parser("down", help="unmount and stop the processes the launcher started")
    add_dir(dn)
    dn.add_argument("--wipe", action="store_true", help="also remove data, KV, configs and logs")
    dn.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")

    k = sub.add_parser("kill", help="SIGKILL one process (mgmtd-1, meta-2, storage-3, fuse ...)")
    add_dir(k)
    k.add_argument("name")

    rs = sub.add_parser("restart", help="restart one process with the same config (fuse: remount)")
    add_dir(rs)
    rs.add_argument("name")
    rs.add_argument("--timeout", type=float, default=60.0)

    pr = sub.add_parser("probe", help="health check for one service (docker-compose healthchecks)")
    g = pr.add_mutually_exclusive_group(required=True)
    g.add_argument("--mgmtd", metavar="HOST:PORT", help="healthy when this mgmtd answers GetLeader")
    g.add_argument(
        "--leader", metavar="CLUSTER_FILE", help="healthy when some mgmtd of the cluster file leads"
    )
    g.add_argument("--tcp", metavar="HOST:PORT", help="healthy when the port accepts connections")
    g.add_argument(
        "--mount", metavar="MOUNTPOINT", help="healthy when an fs3 FUSE mount answers there"
    )
    return parser


def probe(args: argparse.Namespace) -> tuple[bool, str]:
    """One health check, for docker-compose (exit 0 = healthy); never waits long."""
    if args.mgmtd:
        from fs3.proto import mgmtd_pb2, mgmtd_pb2_grpc
        from fs3.rpc.channel import call_sync, sync_channel

        ch = sync_channel(args.mgmtd)
        try:
            r = call_sync(
                mgmtd_pb2_grpc.MgmtdServiceStub(ch).GetLeader,
                mgmtd_pb2.GetLeaderRequest(),
                timeout=3.0,
            )
            return True, f"mgmtd {args.mgmtd} answers (leader: {r.address or 'none yet'})"
        except FsError as e:
            return False, f"mgmtd {args.mgmtd} does not answer: {e.message}"
        finally:
            ch.close()
    if args.leader:
        cf = fs3config.read_cluster_file(args.leader)
        lead = MgmtdProbe(cf.mgmtd_addresses, timeout_s=2.0).leader()
        return (
            (True, f"leader is node {lead[0]} at {lead[1]}") if lead else (False, "no mgmtd leads")
        )
    if args.tcp:
        ok = port_accepts(args.tcp, 3.0)
        return ok, f"{args.tcp} {'accepts' if ok else 'refuses'} connections"
    state = mount_state(args.mount)
    return state == "mounted", f"{args.mount}: {state}"


SPEC_OPTIONS = (
    "storage_nodes",
    "targets_per_node",
    "replicas",
    "meta",
    "mgmtd",
    "kv",
    "fdb_cluster_file",
    "transport",
    "rpc",
    "base_port",
    "tls",
)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "probe":
        try:
            ok, msg = probe(args)
        except FsError as e:
            ok, msg = False, e.message
        print(msg, file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 1
    if args.cmd == "credentials":
        for line in provision.create_all(args.dir, tls=args.tls, services=args.service):
            print(line)
        return 0
    lc = LocalCluster(args.dir, grace_s=getattr(args, "grace", 10.0))
    try:
        if args.cmd == "up":
            given = {k: getattr(args, k) for k in SPEC_OPTIONS if getattr(args, k) is not None}
            overrides = parse_set(args.set)
            spec: ClusterSpec | None = None
            if given or overrides or lc.load_state() is None:
                existing = lc.load_state()
                base = dataclasses.replace(existing.spec) if existing else ClusterSpec()
                spec = dataclasses.replace(base, **given)
                if overrides:
                    spec.overrides = overrides
            t0 = time.monotonic()
            state = lc.up(spec, mount=args.mount, timeout_s=args.timeout)
            print(render_up_summary(state, time.monotonic() - t0), flush=True)
        elif args.cmd == "status":
            s = lc.status()
            print(json.dumps(s, indent=2) if args.json else render_status(s))
        elif args.cmd == "down":
            lc.down(wipe=args.wipe)
        elif args.cmd == "kill":
            lc.kill(args.name)
        elif args.cmd == "restart":
            lc.restart(args.name, timeout_s=args.timeout)
    except LauncherError as e:
        print(e.render(), file=sys.stderr, flush=True)
        return 1
    except FsError as e:
        print(f"fs3 cluster: {e.message}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `fs3 cluster status --json | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep the interpreter from complaining at exit
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
