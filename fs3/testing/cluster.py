"""``ProcessCluster``: a real multi-process fs3 cluster for integration and fault tests.

A thin, importable wrapper around the launcher (:class:`fs3.launcher.LocalCluster`),
so tests exercise exactly what ``fs3 cluster up`` does for a user: real
``fs3 mgmtd|meta|storage`` processes (and optionally the FUSE daemon) on
127.0.0.1 with their own ports, configs and logs under one directory.

Typical use::

    with ProcessCluster(storage_nodes=3, replicas=3, mount=True) as c:
        c.kill("storage-2")
        c.wait_for(lambda s: c.target_states(s)[201] == "offline", 30, "storage-2 offline")
        c.restart("storage-2")
        c.wait_serving(60)

On leaving the ``with`` block every process is stopped and the mount removed.
If the block raised (a failed assertion included), the directory is kept and its
path printed with the tail of every log, so a failed run can be diagnosed; a
clean run removes a directory the cluster created itself.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from fs3 import config as fs3config
from fs3.launcher import (
    ClusterSpec,
    ClusterState,
    LauncherError,
    LocalCluster,
    ProcRecord,
    is_alive,
    log_tail,
    mount_state,
)

Condition = Callable[[dict[str, Any]], Any] | Callable[[], Any]


class ProcessCluster:
    """Start/stop a local cluster and poke at its processes (see the module docstring).

    ``dir``: cluster directory (kept); None: a fresh temp dir, removed after a clean run.
    ``mount``: True mounts at ``<dir>/mnt``; a string mounts there; False/None: no mount.
    ``overrides``: ``{role: {section: {key: value}}}`` config overrides (e.g. short timeouts,
    ``{"storage": {"storage": {"fsync": False}}}`` for speed).
    """

    def __init__(
        self,
        dir: str | Path | None = None,
        *,
        storage_nodes: int = 3,
        targets_per_node: int = 2,
        replicas: int = 3,
        meta: int = 2,
        mgmtd: int = 2,
        kv: str = "sqlite",
        transport: str = "grpc",
        rpc: str | None = None,
        mount: bool | str | None = None,
        tls: bool = False,
        overrides: dict[str, dict[str, dict[str, Any]]] | None = None,
        start_timeout_s: float = 120.0,
        grace_s: float = 5.0,
        verbose: bool = False,
    ) -> None:
        self._own_dir = dir is None
        self.dir = (
            Path(tempfile.mkdtemp(prefix="fs3-cluster-")) if dir is None else Path(dir).absolute()
        )
        self.spec = ClusterSpec(
            storage_nodes=storage_nodes,
            targets_per_node=targets_per_node,
            replicas=replicas,
            meta=meta,
            mgmtd=mgmtd,
            kv=kv,
            transport=transport,
            # the RPC transport of the tier: FS3_RPC_TRANSPORT (as every process reads it), default native
            rpc=rpc or fs3config.load(fs3config.ClientConfig, None).rpc.transport,
            overrides=overrides or {},
            tls=tls,
        )
        if mount is True:
            self.mountpoint: str | None = str(self.dir / "mnt")
        elif mount:
            self.mountpoint = str(mount)
        else:
            self.mountpoint = None
        self.start_timeout_s = start_timeout_s
        self.output: list[str] = []  # everything the launcher said
        self._verbose = verbose
        self.launcher = LocalCluster(self.dir, out=self._out, grace_s=grace_s)
        self.state: ClusterState | None = None

    # ------------------------------------------------------------------ lifecycle

    def _out(self, line: str) -> None:
        self.output.append(line)
        if self._verbose:
            print(line, file=sys.stderr, flush=True)

    def start(self, timeout_s: float | None = None) -> ProcessCluster:
        """Bring the cluster up (or back up from its data); raises LauncherError if unusable."""
        existing = self.launcher.load_state()
        spec = None if existing is not None else self.spec
        self.state = self.launcher.up(
            spec, mount=self.mountpoint, timeout_s=timeout_s or self.start_timeout_s
        )
        return self

    def stop(self, *, wipe: bool = False) -> None:
        """Unmount and stop every process; idempotent."""
        self.launcher.down(wipe=wipe)
        self.state = self.launcher.load_state()

    def close(self, failed: bool = False) -> None:
        """Stop everything; keep the directory (and say where) if ``failed``, else clean up our temp dir."""
        try:
            self.stop()
        finally:
            if failed:
                print(self.failure_report(), file=sys.stderr, flush=True)
            elif self._own_dir:
                shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ProcessCluster:
        try:
            return self.start()
        except BaseException:
            self.close(failed=True)
            raise

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(failed=et is not None)

    def failure_report(self, lines: int = 30) -> str:
        """Where the logs are kept plus the tail of each, for a failed test's output."""
        out = [f"fs3 ProcessCluster: logs kept in {self.dir / 'logs'}"]
        out += ["launcher said:"] + [f"  {x}" for x in self.output[-40:]]
        for log in sorted((self.dir / "logs").glob("*.log")):
            out.append(f"--- {log.name} (last {lines} lines) ---")
            out.append(log_tail(log, lines))
        return "\n".join(out)

    # ------------------------------------------------------------------ processes

    def _state(self) -> ClusterState:
        st = self.launcher.load_state()
        if st is None:
            raise LauncherError(f"no cluster in {self.dir}")
        self.state = st
        return st

    def process(self, name: str) -> ProcRecord:
        return self._state().proc(name)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self._state().processes]

    def pid(self, name: str) -> int:
        return self.process(name).pid

    def alive(self, name: str) -> bool:
        return is_alive(self.process(name))

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` (like a crash)."""
        self.launcher.kill(name)

    def kill_all(self) -> list[str]:
        """SIGKILL every running process (a whole-host crash); returns their names."""
        names = [p.name for p in self._state().processes if is_alive(p)]
        for name in names:
            self.launcher.kill(name)
        return names

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        """Start ``name`` again with the same config (stopping it first if running; fuse: remount)."""
        self.launcher.restart(name, timeout_s=timeout_s)

    def status(self) -> dict[str, Any]:
        """The ``fs3 cluster status --json`` object."""
        return self.launcher.status()

    # ------------------------------------------------------------------ paths

    @property
    def cluster_file(self) -> str:
        return str(self.dir / "fs3.cluster")

    def log_path(self, name: str) -> Path:
        return self.dir / "logs" / f"{name}.log"

    @property
    def logs(self) -> dict[str, Path]:
        return {p.name: Path(p.log) for p in self._state().processes}

    def config_path(self, name: str) -> Path:
        return self.dir / "conf" / f"{name}.toml"

    def data_dir(self, name: str) -> Path:
        return self.dir / "data" / name

    # ------------------------------------------------------------------ waiting

    def wait_for(
        self, condition: Condition, timeout: float, what: str = "condition", interval: float = 0.1
    ) -> Any:
        """Poll ``condition`` until truthy; it gets the status dict if it takes one argument.

        Raises TimeoutError naming ``what`` and the last status seen (never a silent pass).
        """
        import inspect

        wants_status = len(inspect.signature(condition).parameters) >= 1
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            if wants_status:
                last = self.status()
                result = condition(last)  # type: ignore[call-arg]
            else:
                result = condition()  # type: ignore[call-arg]
            if result:
                return result
            if time.monotonic() >= deadline:
                detail = f"; last status: {last}" if last is not None else ""
                raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}{detail}")
            time.sleep(interval)

    @staticmethod
    def target_states(status: dict[str, Any]) -> dict[int, str]:
        return {t["id"]: t["state"] for t in status["targets"]}

    def wait_serving(self, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until every target of every chain is serving (e.g. after a restart and resync)."""

        def ok(s: dict[str, Any]) -> bool:
            return bool(s["chains"]) and all(
                st == "serving" for c in s["chains"] for st in c["states"]
            )

        return self.wait_for(ok, timeout, "every target serving")  # type: ignore[no-any-return]

    def mount_state(self) -> str | None:
        return mount_state(self.mountpoint) if self.mountpoint else None

    # ------------------------------------------------------------------ clients

    def connect(self, **kwargs: Any) -> Any:
        """A Python API client (``fs3.connect``) for this cluster."""
        import fs3

        return fs3.connect(self.cluster_file, **kwargs)


def failover_client_config() -> Any:
    """A client config for tests that kill servers: short RPC timeouts, fast routing refresh.

    The retry deadline stays long (45 s) so an operation rides out a node's
    removal from its chain; each attempt gives up after 3 s so a dead node is
    noticed quickly.
    """

    cfg = fs3config.load(fs3config.ClientConfig, None, env={})
    cfg.rpc = fs3config.load(fs3config.ClientConfig, None).rpc  # the tier's RPC transport
    cfg.client.retry_deadline_s = 45.0
    cfg.client.rpc_timeout_s = 3.0
    cfg.client.routing_refresh_s = 0.5
    return cfg
