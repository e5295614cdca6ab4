"""Minimal helpers to run real ``fs3 <service>`` processes in tests.

Start a service from a config object, wait until it prints its bound address
(``fs3-<service> listening on HOST:PORT``), kill it (SIGKILL) or stop it
(SIGTERM). Output goes to a log file next to the config. The full launcher
(``fs3 cluster``, :mod:`fs3.testing.cluster`) builds on the CLI instead; these
helpers are for tests that need direct control of single processes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fs3.config import to_toml

_LISTEN = re.compile(r"fs3-(\w+) listening on (\S+)")


@dataclass
class Proc:
    """A running service process."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    config_path: Path
    log_path: Path
    address: str = ""
    start_offset: int = 0  # where this incarnation's output starts in the (appended) log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def spawn(
    role: str, cfg: Any, workdir: Path, name: str, *, env: dict[str, str] | None = None
) -> Proc:
    """Write ``cfg`` as TOML under ``workdir`` and start ``fs3 <role> --config`` on it (no waiting)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / f"{name}.toml"
    cfg_path.write_text(to_toml(cfg))
    log_path = workdir / f"{name}.log"
    log = open(log_path, "ab")  # noqa: SIM115 - the child keeps its own descriptor
    cmd = [
        sys.executable,
        "-c",
        "import sys; from fs3.cli.main import main; sys.exit(main())",
        role,
        "--config",
        str(cfg_path),
    ]
    popen = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    log.close()
    return Proc(name, role, popen, cfg_path, log_path, start_offset=log_path.stat().st_size)


def wait_ready(proc: Proc, timeout_s: float = 30.0) -> Proc:
    """Wait until ``proc`` printed its address (this incarnation); kill it on failure."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(proc.log_path, "rb") as f:
            f.seek(proc.start_offset)
            m = _LISTEN.search(f.read().decode(errors="replace"))
        if m:
            proc.address = m.group(2)
            return proc
        if not proc.alive():
            raise RuntimeError(
                f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}"
            )
        time.sleep(0.02)
    kill(proc)
    raise RuntimeError(
        f"{proc.name} did not report its address within {timeout_s}s:\n{proc.log_tail()}"
    )


def start(
    role: str,
    cfg: Any,
    workdir: Path,
    name: str,
    *,
    timeout_s: float = 30.0,
    env: dict[str, str] | None = None,
) -> Proc:
    """:func:`spawn` then :func:`wait_ready`."""
    return wait_ready(spawn(role, cfg, workdir, name, env=env), timeout_s)


def kill(proc: Proc) -> None:
    """SIGKILL the process (a crash: no clean-up, no last heartbeat) and reap it."""
    if proc.alive():
        os.kill(proc.pid, signal.SIGKILL)
    proc.popen.wait(timeout=10)


def stop(proc: Proc, timeout_s: float = 10.0) -> int:
    """SIGTERM and wait (SIGKILL after ``timeout_s``); returns the exit status."""
    if proc.alive():
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill(proc)
    return int(proc.popen.returncode)


class MiniCluster:
    """One ``fs3 mgmtd`` and ``nodes`` ``fs3 storage`` processes on 127.0.0.1 (one target each).

    Short timers (heartbeat 0.2 s, failure detection 1.5 s) so failures settle in
    seconds. Storage process ``i`` (0-based) is named ``storage-{i+1}``, has node id
    ``10001+i`` and target id ``(i+1)*100+1``. No chain table is created: call
    ``MgmtdClient.create_chain_table`` once the targets registered.
    """

    def __init__(
        self, root: Path, *, nodes: int = 3, transport: str = "grpc", fsync: bool = True
    ) -> None:
        from fs3.testing.storage_cluster import free_port

        self.root = root
        self.nodes = nodes
        self.transport = transport
        self.fsync = fsync
        self.cluster_file = root / "cluster"
        self.mgmtd_port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        self.cluster_file.write_text(f"fs3@127.0.0.1:{self.mgmtd_port}\n")
        self.running: dict[str, Proc] = {}

    def mgmtd_config(self) -> Any:
        from fs3.config import ClusterSection, KvSection, MgmtdConfig, MgmtdSection, NodeSection

        return MgmtdConfig(
            node=NodeSection(id=1, port=self.mgmtd_port),
            cluster=ClusterSection(cluster_file=str(self.cluster_file)),
            kv=KvSection(url=f"sqlite:///{self.root}/kv.db"),
            mgmtd=MgmtdSection(
                lease_length_s=10.0,
                lease_renew_interval_s=1.0,
                lease_safety_margin_s=2.0,
                heartbeat_interval_s=0.2,
                heartbeat_timeout_s=1.5,
                check_interval_s=0.1,
            ),
        )

    def storage_config(self, i: int) -> Any:
        from fs3.config import (
            ClusterSection,
            NodeSection,
            StorageConfig,
            StorageSection,
            TransportSection,
        )

        return StorageConfig(
            node=NodeSection(
                id=10001 + i, data_dir=str(self.root / f"storage-{i + 1}"), name=f"storage-{i + 1}"
            ),
            cluster=ClusterSection(cluster_file=str(self.cluster_file)),
            storage=StorageSection(
                target_ids=[(i + 1) * 100 + 1],
                fsync=self.fsync,
                forward_timeout_s=5.0,
                forward_retry_s=30.0,
                heartbeat_interval_s=0.2,
                routing_refresh_s=0.2,
            ),
            transport=TransportSection(kind=self.transport),
        )

    def start(self) -> MiniCluster:
        """Start every process at once (storage retries registering until mgmtd is up)."""
        self.running["mgmtd-1"] = spawn("mgmtd", self.mgmtd_config(), self.root, "mgmtd-1")
        for i in range(self.nodes):
            self.running[f"storage-{i + 1}"] = spawn(
                "storage", self.storage_config(i), self.root, f"storage-{i + 1}"
            )
        for p in list(self.running.values()):
            wait_ready(p)
        return self

    def start_storage(self, i: int) -> Proc:
        name = f"storage-{i + 1}"
        p = self.running[name] = start("storage", self.storage_config(i), self.root, name)
        return p

    def kill(self, name: str) -> None:
        kill(self.running.pop(name))

    def close(self) -> None:
        for name in [n for n in self.running if n != "mgmtd-1"] + ["mgmtd-1"]:
            p = self.running.pop(name, None)
            if p is not None:
                stop(p)

    def __enter__(self) -> MiniCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
