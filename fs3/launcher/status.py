"""Rendering of ``fs3 cluster status`` and the ``up`` summary from :meth:`LocalCluster.status`'s dict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fs3.launcher.layout import ClusterSpec, ClusterState


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
