""":class:`LocalCluster`: orchestration of ``up``, ``status``, ``down``, ``kill`` and ``restart``."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fs3 import config as fs3config
from fs3.durable import makedirs_durably, write_durably
from fs3.errors import FsError
from fs3.launcher.configs import _merge, render_config
from fs3.launcher.layout import (
    DEFAULT_TABLE,
    FUSE_DEVICE,
    FUSERMOUNT,
    LOCAL_SETTINGS,
    LOCAL_STATE_NAMES,
    NODE_ID_BASE,
    PUBLIC_STATE_NAMES,
    ClusterSpec,
    ClusterState,
    LauncherError,
    Out,
    Paths,
    ProcRecord,
    pick_free_ports,
    port_is_free,
)
from fs3.launcher.probes import MgmtdProbe, create_chain_table
from fs3.launcher.status import _enum_name, _latest_table, _name_of, _spare_note, _spec_diff
from fs3.launcher.supervise import (
    _CHILDREN,
    _EXIT_CODES,
    _child_env,
    _cmdline,
    _find_process,
    _proc_stat,
    _reap,
    _signal,
    _wait_dead,
    fuse_unmount,
    is_alive,
    log_tail,
    mount_command,
    port_accepts,
    service_command,
    stop_processes,
)
from fs3.mounts import mount_fstype, mount_state
from fs3.security import provision

# --------------------------------------------------------------------------- the launcher


class LocalCluster:
    """Start, inspect and stop the local cluster kept in one directory.

    Every public method is safe to call on a half-dead cluster; the CLI
    (:func:`fs3.cli.cluster.main`) and :class:`fs3.testing.cluster.ProcessCluster` are thin
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
        self.save_state(st)
        running = [r.name for r in st.processes if r.pid]
        self.out(
            f"fs3 cluster: {damage}; rebuilt it from the configs in {self.paths.conf} "
            f"(damaged file kept as {kept.name}"
            + (f"; still running: {', '.join(running)}" if running else "")
            + ")"
        )
        return st

    def save_state(self, st: ClusterState) -> None:
        """Write ``state.json`` durably: the record ``down``/``kill`` trust to find the processes.

        Public so a test harness that edits a recorded command (running a process in
        a network namespace, say) can persist the edit before ``up`` starts it.
        """
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

    def create(self, spec: ClusterSpec) -> ClusterState:
        """Lay out a new cluster: configs, cluster file and state, each durable before the next.

        Starts nothing; ``up`` calls it for a new DIR, and a test harness may call it
        to adjust the recorded commands (then :meth:`save_state`) before ``up``.
        """
        cid = f"local-{secrets.token_hex(4)}"
        st, cf = self.layout(spec, cid)
        self._check_ports(st)
        self.write_configs(st)
        write_durably(self.paths.cluster_file, cf.render())
        self.save_state(st)
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

    def layout(
        self, spec: ClusterSpec, cluster_id: str
    ) -> tuple[ClusterState, fs3config.ClusterFile]:
        """Names, node ids, ports, configs and commands of every process (nothing started, nothing written).

        Returns the state ``up`` would record and the cluster file it would write.
        """
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

    def write_configs(self, st: ClusterState) -> None:
        """Write ``conf/<name>.toml`` for every process in ``st`` (every key, so each is self-describing)."""
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
                st = self.create(spec)
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
        self.save_state(st)
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
        self.save_state(st)
        leader = self._wait("an mgmtd leader", probe.leader, mgmtds, left())
        self._say(f"mgmtd leader: {_name_of(st, leader[0])} ({leader[1]})")
        for r in metas + storages:
            self._start(r)
            self._say(f"started {r.name} (pid {r.pid}, {r.address})")
        self.save_state(st)
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
            self.save_state(st)
            self._say(f"started fuse (pid {fuse.pid}), mounting {mount}")
            self._wait(
                f"the mount at {mount}",
                lambda: mount_state(mount) == "mounted",
                [fuse],
                min(60.0, left()),
            )
            self._check_mount(mount)
        self._check_alive(st.processes)  # a process that died after its own wait was over
        self.save_state(st)

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
                self.save_state(st)
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
            self.save_state(st)
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
