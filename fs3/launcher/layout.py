"""Spec, state and on-disk layout of a local cluster, and the port picking ``up`` relies on.

What a cluster *is* (:class:`ClusterSpec`), what the launcher recorded about it
(:class:`ClusterState`, :class:`ProcRecord`) and where its files live
(:class:`Paths`); the directory layout and the node-id scheme are described in
:mod:`fs3.launcher`.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fs3 import config as fs3config
from fs3.errors import Code, FsError

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


def _section_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _key_names(cls: type, section: str) -> list[str]:
    sec_cls = next(f for f in dataclasses.fields(cls) if f.name == section)
    return [f.name for f in dataclasses.fields(sec_cls.default_factory())]  # type: ignore[misc,operator]


# --------------------------------------------------------------------------- ports


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
