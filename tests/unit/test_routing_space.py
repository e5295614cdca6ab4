"""Routing.space: capacity counts each file system once and divides by the replication factor."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fs3.proto import mgmtd_pb2
from fs3.routing import Routing
from fs3.storage.target import filesystem_id

pytestmark = pytest.mark.timeout(10)

GIB = 1 << 30


def _routing(fs_of: dict[int, str], *, replicas: int = 3, table: bool = True) -> Routing:
    """Three nodes x two targets, chains of ``replicas``; target t on file system fs_of[t]."""
    info = mgmtd_pb2.RoutingInfo(version=5)
    tids = sorted(fs_of)
    for tid in tids:
        info.targets.add(
            target_id=tid,
            node_id=tid // 100,
            capacity_bytes=252 * GIB,
            free_bytes=(228 * GIB) - tid,  # reports taken at slightly different moments
            used_bytes=GIB,
            fs_id=fs_of[tid],
        )
    chains = [tids[i : i + replicas] for i in range(0, len(tids), replicas)]
    for i, members in enumerate(chains, 1):
        c = info.chains.add(chain_id=i, version=1, preferred_order=members)
        for tid in members:
            c.targets.add(target_id=tid, public_state=mgmtd_pb2.PUBLIC_STATE_SERVING)
    if table:
        info.chain_tables.add(table_id=1, version=1, chain_ids=list(range(1, len(chains) + 1)))
    return Routing(info)


TIDS = [101, 102, 201, 202, 301, 302]


def test_one_shared_disk_counts_once_and_is_divided_by_replicas() -> None:
    sp = _routing({t: "host:803:abc" for t in TIDS}).space(1)
    assert sp is not None
    assert (sp.filesystems, sp.targets, sp.replicas) == (1, 6, 3)
    assert sp.raw_capacity_bytes == 252 * GIB
    assert sp.raw_free_bytes == 228 * GIB - 302  # the smallest report of that disk
    assert sp.capacity_bytes == 84 * GIB
    assert sp.free_bytes == (228 * GIB - 302) // 3
    assert sp.raw_used_bytes == 6 * GIB and sp.used_bytes == 2 * GIB


def test_one_disk_per_node() -> None:
    sp = _routing({t: f"host{t // 100}:803:{t // 100:x}" for t in TIDS}).space(1)
    assert sp is not None and sp.filesystems == 3
    assert sp.raw_capacity_bytes == 3 * 252 * GIB and sp.capacity_bytes == 252 * GIB


def test_targets_without_fs_id_each_count_and_two_replicas() -> None:
    sp = _routing({t: "" for t in TIDS}, replicas=2).space(1)
    assert sp is not None and (sp.filesystems, sp.replicas) == (6, 2)
    assert sp.capacity_bytes == 3 * 252 * GIB


def test_unknown_table_counts_every_target_raw_and_nothing_known_is_none() -> None:
    sp = _routing({t: "h:1:1" for t in TIDS}, table=False).space(1)
    assert sp is not None and sp.replicas == 1 and sp.capacity_bytes == 252 * GIB
    assert Routing.empty().space(1) is None


def test_filesystem_id_is_shared_by_directories_of_one_file_system(tmp_path: Path) -> None:
    (tmp_path / "t1").mkdir()
    (tmp_path / "t2").mkdir()
    a, b = filesystem_id(str(tmp_path / "t1")), filesystem_id(str(tmp_path / "t2"))
    assert a and a == b and a.startswith(os.uname().nodename)
    assert filesystem_id("/proc") not in ("", a)  # another file system
