"""Persistence of mgmtd in the KV (3FS ``MgmtdStore``).

Keys (all in the ``mg`` subspace, see ``fs3/kv/keys.py``); values are protobuf
messages except the routing version (a packed tuple):

=====================================  ===========================================
("mg", "lease")                         MgmtdLease
("mg", "routing_version")               tuple (u64,)
("mg", "node", node_id)                 NodeInfo (persistent fields only)
("mg", "target", target_id)             TargetInfo (node, chain, admin mark)
("mg", "chain", chain_id)               ChainInfo (order, public states, version)
("mg", "table", table_id, version)      ChainTable (every version kept)
=====================================  ===========================================

Local target states, node statuses and heartbeat times live only in the
leader's memory (as in 3FS); the public chain states are persisted, so a new
leader starts from the chains as they were.

All functions take a :class:`~fs3.kv.Transaction`; they never commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fs3.kv import Transaction
from fs3.kv.keys import MGMTD, pack, prefix_range, unpack
from fs3.proto import mgmtd_pb2

LEASE_KEY = pack(MGMTD, "lease")
VERSION_KEY = pack(MGMTD, "routing_version")


def node_key(node_id: int) -> bytes:
    return pack(MGMTD, "node", node_id)


def target_key(target_id: int) -> bytes:
    return pack(MGMTD, "target", target_id)


def chain_key(chain_id: int) -> bytes:
    return pack(MGMTD, "chain", chain_id)


def table_key(table_id: int, version: int) -> bytes:
    return pack(MGMTD, "table", table_id, version)


# -- lease ---------------------------------------------------------------------------


def get_lease(tr: Transaction, *, snapshot: bool = False) -> mgmtd_pb2.MgmtdLease | None:
    raw = tr.get(LEASE_KEY, snapshot=snapshot)
    return mgmtd_pb2.MgmtdLease.FromString(raw) if raw is not None else None


def set_lease(tr: Transaction, lease: mgmtd_pb2.MgmtdLease) -> None:
    tr.set(LEASE_KEY, lease.SerializeToString())


# -- routing version -------------------------------------------------------------------


def get_version(tr: Transaction) -> int:
    raw = tr.get(VERSION_KEY)
    return int(unpack(raw)[0]) if raw is not None else 0


def bump_version(tr: Transaction) -> int:
    """Persist stored+1 and return it: versions stay monotonic across leaders."""
    v = get_version(tr) + 1
    tr.set(VERSION_KEY, pack(v))
    return v


# -- records ---------------------------------------------------------------------------


def persistent_node(node: mgmtd_pb2.NodeInfo) -> mgmtd_pb2.NodeInfo:
    """The fields of a node worth persisting (no status, no heartbeat time)."""
    return mgmtd_pb2.NodeInfo(
        node_id=node.node_id,
        type=node.type,
        address=node.address,
        data_address=node.data_address,
        hostname=node.hostname,
        tags=list(node.tags),
        name=node.name,
    )


def persistent_target(t: mgmtd_pb2.TargetInfo) -> mgmtd_pb2.TargetInfo:
    """The fields of a target worth persisting (where it lives, its chain, admin mark)."""
    return mgmtd_pb2.TargetInfo(
        target_id=t.target_id,
        node_id=t.node_id,
        chain_id=t.chain_id,
        public_state=t.public_state,
        capacity_bytes=t.capacity_bytes,
        admin_offline=t.admin_offline,
    )


def put_node(tr: Transaction, node: mgmtd_pb2.NodeInfo) -> None:
    tr.set(node_key(node.node_id), persistent_node(node).SerializeToString())


def put_target(tr: Transaction, t: mgmtd_pb2.TargetInfo) -> None:
    tr.set(target_key(t.target_id), persistent_target(t).SerializeToString())


def put_chain(tr: Transaction, c: mgmtd_pb2.ChainInfo) -> None:
    tr.set(chain_key(c.chain_id), c.SerializeToString())


def put_table(tr: Transaction, t: mgmtd_pb2.ChainTable) -> None:
    tr.set(table_key(t.table_id, t.version), t.SerializeToString())


@dataclass
class Snapshot:
    """Everything mgmtd persisted, as loaded by a new leader."""

    version: int = 0
    nodes: dict[int, mgmtd_pb2.NodeInfo] = field(default_factory=dict)
    targets: dict[int, mgmtd_pb2.TargetInfo] = field(default_factory=dict)
    chains: dict[int, mgmtd_pb2.ChainInfo] = field(default_factory=dict)
    tables: dict[tuple[int, int], mgmtd_pb2.ChainTable] = field(default_factory=dict)


def load_all(tr: Transaction) -> Snapshot:
    """Read every mgmtd record (one transaction, so a consistent picture)."""
    snap = Snapshot(version=get_version(tr))
    for _k, v in tr.get_range(*prefix_range(MGMTD, "node")):
        n = mgmtd_pb2.NodeInfo.FromString(v)
        snap.nodes[n.node_id] = n
    for _k, v in tr.get_range(*prefix_range(MGMTD, "target")):
        t = mgmtd_pb2.TargetInfo.FromString(v)
        snap.targets[t.target_id] = t
    for _k, v in tr.get_range(*prefix_range(MGMTD, "chain")):
        c = mgmtd_pb2.ChainInfo.FromString(v)
        snap.chains[c.chain_id] = c
    for _k, v in tr.get_range(*prefix_range(MGMTD, "table")):
        tab = mgmtd_pb2.ChainTable.FromString(v)
        snap.tables[(tab.table_id, tab.version)] = tab
    return snap
