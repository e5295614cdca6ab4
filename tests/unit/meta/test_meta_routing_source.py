"""RoutingChainTables: chain tables and capacity figures from routing info."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fs3.errors import Code
from fs3.meta.layout import ChainAllocator, NoChainTable
from fs3.meta.server import RoutingChainTables
from fs3.proto import meta_pb2, mgmtd_pb2
from fs3.routing import Routing

pytestmark = pytest.mark.timeout(10)


def routing() -> Routing:
    info = mgmtd_pb2.RoutingInfo(version=5)
    for tid, cap, used, free in ((101, 1000, 100, 900), (102, 800, 300, 500), (201, 2000, 0, 2000)):
        info.targets.add(target_id=tid, capacity_bytes=cap, used_bytes=used, free_bytes=free)
    info.chains.add(
        chain_id=1,
        version=1,
        targets=[
            mgmtd_pb2.ChainTargetInfo(target_id=101),
            mgmtd_pb2.ChainTargetInfo(target_id=102),
        ],
    )
    info.chains.add(chain_id=2, version=1, targets=[mgmtd_pb2.ChainTargetInfo(target_id=201)])
    info.chain_tables.add(table_id=1, version=1, chain_ids=[1])
    info.chain_tables.add(table_id=1, version=2, chain_ids=[1, 2])
    return Routing(info)


def test_latest_table_and_space() -> None:
    src = RoutingChainTables(SimpleNamespace(current=routing()))
    assert src.latest_table(1) == (2, [1, 2])
    assert src.latest_table(9) is None
    # three file systems (no fs_id: each target its own), raw figures divided by the
    # table's replication factor (its longest chain: 2)
    assert src.space() == ((1000 + 800 + 2000) // 2, (100 + 300) // 2, (900 + 500 + 2000) // 2)
    shared = Routing(routing().info)
    for t in shared.info.targets:
        t.fs_id = "host:803:1"  # one disk under all three targets
    shared = Routing(shared.info)
    assert RoutingChainTables(SimpleNamespace(current=shared)).space() == (
        2000 // 2,
        400 // 2,
        500 // 2,
    )


def test_latest_table_is_made_once_per_routing_table() -> None:
    """Every create asks for the table: the same routing gives the same answer object
    (no copy of its chain list per create); a new routing's table is read afresh."""
    watcher = SimpleNamespace(current=routing())
    src = RoutingChainTables(watcher)
    first = src.latest_table(1)
    assert first == (2, [1, 2]) and src.latest_table(1) is first
    info = routing().info
    info.chain_tables.add(table_id=1, version=3, chain_ids=[2, 1])
    watcher.current = Routing(info)
    assert src.latest_table(1) == (3, [2, 1])


def test_empty_routing() -> None:
    src = RoutingChainTables(SimpleNamespace(current=Routing.empty()))
    assert src.latest_table(1) is None and src.space() is None


def test_a_meta_server_whose_routing_lags_refuses_creates_retryably() -> None:
    """Just after a restart a meta server's routing watcher may not have the chain table yet
    (a create there used to get a layout without chains: "inode has no chains in its
    layout" at the first write); the create fails retryably and works once routing has it."""
    watcher = SimpleNamespace(current=Routing.empty())
    alloc = ChainAllocator(RoutingChainTables(watcher))
    d = meta_pb2.Layout(chunk_size=1 << 20, stripe=2, table_id=1)
    with pytest.raises(NoChainTable) as ei:
        alloc.place(d)
    err = ei.value.error()
    assert err.code == Code.UNKNOWN_CHAIN_TABLE and err.retryable
    watcher.current = routing()
    assert sorted(alloc.place(d).chain_ids) == [1, 2]
