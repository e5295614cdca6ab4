"""``fs3 cluster up|status|down|kill|restart|probe|credentials``: argparse over :mod:`fs3.launcher`.

The launcher itself (layout, configs, process supervision, status) lives in
:mod:`fs3.launcher`; this module only parses arguments and prints results.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time

from fs3.errors import FsError
from fs3.launcher.cluster import LocalCluster
from fs3.launcher.configs import parse_set
from fs3.launcher.layout import DEFAULT_DIR, DEFAULT_TABLE, ClusterSpec, LauncherError
from fs3.launcher.probes import probe
from fs3.launcher.status import render_status, render_up_summary
from fs3.security import provision


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
