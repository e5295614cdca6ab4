"""``fs3 admin``: inspect and administer a cluster through its mgmtd leader.

    fs3 admin --cluster FILE [--json] nodes | targets | chains | chain-tables | status
    fs3 admin --cluster FILE create-chain-table --table-id N --replicas K [--nodes 10001,10002] [--desc D]
    fs3 admin --cluster FILE target-offline TARGET_ID | target-online TARGET_ID
    fs3 admin --cluster FILE user add NAME --uid U --gid G [--groups 1,2] [--admin] | list
                                 | token NAME [--rotate] | remove NAME   (fs3/cli/users.py)
    fs3 admin fsck --kv URL [--json]

Tables by default, ``--json`` for scripts. The cluster file comes from
``--cluster`` or ``FS3_CLUSTER_FILE``. Every command goes through
:class:`~fs3.client.mgmtd_client.MgmtdClient`, so it finds the leader itself and
rides through a failover. ``fsck`` instead reads the namespace straight from the
meta servers' KV (:mod:`fs3.meta.fsck`, one snapshot transaction, nothing
changed), so it also works while mgmtd is down; it exits 1 if an invariant is
broken.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict

from fs3.cli import users
from fs3.client.mgmtd_client import MgmtdClient
from fs3.errors import FsError
from fs3.proto import mgmtd_pb2
from fs3.routing import (
    LOCAL_STATE_NAMES,
    NODE_STATUS_NAMES,
    NODE_TYPE_NAMES,
    PUBLIC_STATE_NAMES,
    SERVING,
    Routing,
)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f}G" if n else "0"


def nodes_view(r: Routing) -> list[dict[str, Any]]:
    return [
        {
            "id": n.node_id,
            "name": n.name,
            "type": NODE_TYPE_NAMES.get(n.type, str(n.type)),
            "status": NODE_STATUS_NAMES.get(n.status, str(n.status)),
            "address": n.address,
            "data_address": n.data_address,
            "last_heartbeat": n.last_heartbeat,
            "leader": n.node_id == r.info.leader_node_id,
        }
        for n in r.nodes()
    ]


def targets_view(r: Routing) -> list[dict[str, Any]]:
    out = []
    for t in r.targets():
        node: mgmtd_pb2.NodeInfo | None
        try:
            node = r.node(t.node_id)
        except FsError:
            node = None
        out.append(
            {
                "id": t.target_id,
                "node_id": t.node_id,
                "node": node.name if node is not None else "",
                "chain": t.chain_id,
                "state": PUBLIC_STATE_NAMES.get(t.public_state, str(t.public_state)),
                "local_state": LOCAL_STATE_NAMES.get(t.local_state, str(t.local_state)),
                "admin_offline": t.admin_offline,
                "used_bytes": t.used_bytes,
                "free_bytes": t.free_bytes,
                "errors": t.error_count,
            }
        )
    return out


def chains_view(r: Routing) -> list[dict[str, Any]]:
    return [
        {
            "id": c.chain_id,
            "version": c.version,
            "targets": [t.target_id for t in c.targets],
            "states": [PUBLIC_STATE_NAMES.get(t.public_state, "?") for t in c.targets],
        }
        for c in r.chains()
    ]


def tables_view(r: Routing) -> list[dict[str, Any]]:
    out = []
    for t in sorted(r.info.chain_tables, key=lambda t: (t.table_id, t.version)):
        out.append(
            {"id": t.table_id, "version": t.version, "chains": list(t.chain_ids), "desc": t.desc}
        )
    return out


def status_view(r: Routing, leader: mgmtd_pb2.GetLeaderResponse) -> dict[str, Any]:
    by_status: dict[str, int] = {}
    for n in r.nodes():
        key = f"{NODE_TYPE_NAMES.get(n.type, '?')}:{NODE_STATUS_NAMES.get(n.status, '?')}"
        by_status[key] = by_status.get(key, 0) + 1
    by_state: dict[str, int] = {}
    for c in r.chains():
        for t in c.targets:
            s = PUBLIC_STATE_NAMES.get(t.public_state, "?")
            by_state[s] = by_state.get(s, 0) + 1
    healthy = sum(1 for c in r.chains() if all(t.public_state == SERVING for t in c.targets))
    unavailable = sum(
        1 for c in r.chains() if not any(t.public_state == SERVING for t in c.targets)
    )
    leader_name = ""
    try:
        leader_name = r.node(leader.node_id).name
    except FsError:
        pass
    return {
        "leader": leader_name or f"mgmtd-{leader.node_id}",
        "leader_address": leader.address,
        "routing_version": r.version,
        "bootstrapping": r.bootstrapping,
        "nodes": by_status,
        "targets": by_state,
        "chains": len(r.chains()),
        "chains_healthy": healthy,
        "chains_degraded": len(r.chains()) - healthy - unavailable,
        "chains_unavailable": unavailable,
        "chain_tables": len(r.tables()),
    }


async def _run(args: argparse.Namespace) -> int:
    client = MgmtdClient.from_cluster_file(
        args.cluster, timeout_s=args.timeout, retry_deadline_s=args.timeout * 3
    )
    try:
        return await _dispatch(client, args)
    finally:
        await client.close()


async def _routing(client: MgmtdClient) -> Routing:
    info = await client.get_routing(0)
    return Routing(info if info is not None else mgmtd_pb2.RoutingInfo())


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(text)


async def _dispatch(client: MgmtdClient, args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "user":
        return await users.dispatch(client, args)
    if cmd == "nodes":
        rows = nodes_view(await _routing(client))
        _emit(
            args,
            rows,
            _table(
                ["ID", "NAME", "TYPE", "STATUS", "ADDRESS", "DATA", "LEADER"],
                [
                    [
                        n["id"],
                        n["name"],
                        n["type"],
                        n["status"],
                        n["address"],
                        n["data_address"] or "-",
                        "*" if n["leader"] else "",
                    ]
                    for n in rows
                ],
            ),
        )
    elif cmd == "targets":
        rows = targets_view(await _routing(client))
        _emit(
            args,
            rows,
            _table(
                ["ID", "NODE", "CHAIN", "STATE", "LOCAL", "ADMIN", "USED", "FREE", "ERRORS"],
                [
                    [
                        t["id"],
                        t["node"] or t["node_id"],
                        t["chain"] or "-",
                        t["state"],
                        t["local_state"],
                        "offline" if t["admin_offline"] else "",
                        _gib(t["used_bytes"]),
                        _gib(t["free_bytes"]),
                        t["errors"],
                    ]
                    for t in rows
                ],
            ),
        )
    elif cmd == "chains":
        rows = chains_view(await _routing(client))
        _emit(
            args,
            rows,
            _table(
                ["ID", "VERSION", "TARGETS (head first)"],
                [
                    [
                        c["id"],
                        c["version"],
                        " ".join(
                            f"{t}({s})" for t, s in zip(c["targets"], c["states"], strict=True)
                        ),
                    ]
                    for c in rows
                ],
            ),
        )
    elif cmd == "chain-tables":
        rows = tables_view(await _routing(client))
        _emit(
            args,
            rows,
            _table(
                ["ID", "VERSION", "CHAINS", "DESC"],
                [[t["id"], t["version"], _compact(t["chains"]), t["desc"]] for t in rows],
            ),
        )
    elif cmd == "create-chain-table":
        nodes = [int(x) for x in args.nodes.split(",") if x.strip()] if args.nodes else []
        resp = await client.create_chain_table(args.table_id, args.replicas, nodes, args.desc)
        data: dict[str, Any] = {
            "table": MessageToDict(resp.table, preserving_proto_field_name=True),
            "chains": [
                {
                    "id": c.chain_id,
                    "version": c.version,
                    "targets": [t.target_id for t in c.targets],
                }
                for c in resp.chains
            ],
            "balance": MessageToDict(
                resp.balance,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            ),
        }
        b = resp.balance
        text = (
            f"chain table {resp.table.table_id} version {resp.table.version}: "
            f"{len(resp.table.chain_ids)} chains ({len(resp.chains)} in this answer)\n"
            + _table(
                ["CHAIN", "TARGETS (head first)"],
                [[c.chain_id, " ".join(str(t.target_id) for t in c.targets)] for c in resp.chains],
            )
            + f"\nbalance: node pairs share max {b.max_pair} / min {b.min_pair} chains "
            f"(mean {b.mean_pair:.2f}); chains per node max {b.max_chains_per_node} / "
            f"min {b.min_chains_per_node}; unused free targets {b.unused_targets}"
        )
        _emit(args, data, text)
    elif cmd in ("target-offline", "target-online"):
        chain = await client.set_target_state(args.target_id, offline=cmd == "target-offline")
        ids = [t.target_id for t in chain.targets]
        states = [PUBLIC_STATE_NAMES.get(t.public_state, "?") for t in chain.targets]
        data = {
            "target": args.target_id,
            "offline": cmd == "target-offline",
            "chain": {
                "id": chain.chain_id,
                "version": chain.version,
                "targets": ids,
                "states": states,
            },
        }
        text = f"target {args.target_id} marked {'offline' if data['offline'] else 'online'}"
        if chain.chain_id:
            text += f"; chain {chain.chain_id} v{chain.version}: " + " ".join(
                f"{t}({s})" for t, s in zip(ids, states, strict=True)
            )
        _emit(args, data, text)
    elif cmd == "status":
        leader = await client.get_leader()
        data = status_view(await _routing(client), leader)
        lines = [f"{k}: {v}" for k, v in data.items()]
        _emit(args, data, "\n".join(lines))
    else:  # pragma: no cover - argparse restricts the choices
        raise SystemExit(f"unknown command {cmd}")
    return 0


def _compact(ids: Sequence[int]) -> str:
    """1,2,3,4,7 -> 1-4,7."""
    out: list[str] = []
    start = prev = None
    for i in sorted(ids):
        if start is None:
            start = prev = i
        elif prev is not None and i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)


def fsck(args: argparse.Namespace) -> int:
    """Check the namespace invariants in the KV at ``args.kv``; 0 clean, 1 broken."""
    from dataclasses import asdict

    from fs3.meta.fsck import check_kv

    url = args.kv
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://").split("?", 1)[0]
        if not os.path.isfile(path):  # opening would create an empty KV and call it clean
            print(f"fs3 admin fsck: no SQLite KV at {path}", file=sys.stderr)
            return 2
    rep = check_kv(url)
    data = {**asdict(rep), "ok": rep.ok}
    verdict = "clean" if rep.ok else f"{len(rep.problems)} broken invariants"
    _emit(args, data, f"fsck of {url}: {verdict}\n{rep}")
    return 0 if rep.ok else 1


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="JSON output"
    )
    common.add_argument(
        "--cluster", default=argparse.SUPPRESS, help="cluster file (or FS3_CLUSTER_FILE)"
    )
    common.add_argument(
        "--timeout", type=float, default=argparse.SUPPRESS, help="seconds per RPC attempt"
    )
    p = argparse.ArgumentParser(
        prog="fs3 admin", description="administer an fs3 cluster", parents=[common]
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in [
        ("nodes", "list nodes"),
        ("targets", "list targets and their states"),
        ("chains", "list chains (head first)"),
        ("chain-tables", "list chain tables (every version)"),
        ("status", "cluster summary"),
    ]:
        sub.add_parser(name, help=help_, parents=[common])
    c = sub.add_parser(
        "create-chain-table", help="create or extend a chain table", parents=[common]
    )
    c.add_argument("--table-id", type=int, required=True)
    c.add_argument("--replicas", type=int, required=True)
    c.add_argument(
        "--nodes", default="", help="comma-separated storage node ids (default: all online)"
    )
    c.add_argument("--desc", default="")
    for name in ("target-offline", "target-online"):
        t = sub.add_parser(name, help=f"mark a target {name.split('-')[1]}", parents=[common])
        t.add_argument("target_id", type=int)
    users.add_parser(sub, common)
    f = sub.add_parser(
        "fsck",
        help="check the namespace invariants in the meta KV (read-only; exit 1 if broken)",
        parents=[common],
    )
    f.add_argument(
        "--kv",
        default=os.environ.get("FS3_KV_URL", ""),
        help="the meta servers' KV URL, e.g. sqlite:///var/lib/fs3/kv/kv.db (or FS3_KV_URL)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    args.json = getattr(args, "json", False)
    args.timeout = getattr(args, "timeout", 5.0)
    args.cluster = getattr(args, "cluster", None) or os.environ.get("FS3_CLUSTER_FILE", "")
    if args.command == "fsck":
        if not args.kv:
            print("fs3 admin fsck: --kv URL (or FS3_KV_URL) is required", file=sys.stderr)
            return 2
        try:
            return fsck(args)
        except FsError as e:
            print(f"fs3 admin fsck: {e.code.name}: {e.message}", file=sys.stderr)
            return 2
    if not args.cluster:
        print("fs3 admin: --cluster FILE (or FS3_CLUSTER_FILE) is required", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args))
    except FsError as e:
        print(f"fs3 admin: {e.code.name}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into head & co.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
