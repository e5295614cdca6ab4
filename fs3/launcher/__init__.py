"""The local cluster launcher: a real multi-process fs3 cluster on one host.

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

Modules: :mod:`.layout` (spec, recorded state, directory layout, port picking),
:mod:`.configs` (per-process config rendering, ``--set`` overrides),
:mod:`.supervise` (start/stop/identify processes, FUSE unmount, child commands),
:mod:`.probes` (mgmtd leader/routing questions, chain table creation, health
probes), :mod:`.status` (rendering ``status`` and the ``up`` summary) and
:mod:`.cluster` (:class:`LocalCluster`, the orchestration). The CLI
(:mod:`fs3.cli.cluster`) is argparse over this package; the names below are the
API it, :mod:`fs3.testing` and the tests use.
"""

from fs3.launcher.cluster import LocalCluster
from fs3.launcher.configs import parse_set, render_config
from fs3.launcher.layout import (
    DEFAULT_DIR,
    DEFAULT_TABLE,
    ClusterSpec,
    ClusterState,
    LauncherError,
    Paths,
    ProcRecord,
    pick_free_ports,
    port_is_free,
)
from fs3.launcher.probes import MgmtdProbe, create_chain_table, probe
from fs3.launcher.status import render_status, render_up_summary
from fs3.launcher.supervise import (
    fuse_unmount,
    is_alive,
    is_gone,
    log_tail,
    port_accepts,
    stop_processes,
)
from fs3.mounts import mount_fstype, mount_state

__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_TABLE",
    "ClusterSpec",
    "ClusterState",
    "LauncherError",
    "LocalCluster",
    "MgmtdProbe",
    "Paths",
    "ProcRecord",
    "create_chain_table",
    "fuse_unmount",
    "is_alive",
    "is_gone",
    "log_tail",
    "mount_fstype",
    "mount_state",
    "parse_set",
    "pick_free_ports",
    "port_accepts",
    "port_is_free",
    "probe",
    "render_config",
    "render_status",
    "render_up_summary",
    "stop_processes",
]
