"""The launcher's own files (state.json, the cluster file, conf/*.toml) across a power cut.

Each test lays a cluster out on a lossy mount (fs3.testing.lossyfs), cuts the
power and checks that the launcher can still use the directory: everything it
wrote before returning is durable, and a damaged state file is rebuilt from the
configs instead of refusing the directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from fs3 import config
from fs3.durable import makedirs_durably, write_durably
from fs3.launcher import ClusterSpec, LauncherError, LocalCluster
from fs3.testing.lossyfs import LossyMount, lossy_dir, skip_reason

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
    pytest.mark.timeout(60),
]


@pytest.fixture
def lossy() -> Iterator[LossyMount]:
    with lossy_dir("fs3-launcher-lossy-") as m:
        yield m


def _launcher(root: Path, said: list[str]) -> LocalCluster:
    return LocalCluster(root, out=said.append)


def test_durable_write_and_mkdir_survive_a_cut(lossy: LossyMount) -> None:
    root = lossy.mountpoint
    makedirs_durably(root / "a" / "b")
    write_durably(root / "a" / "b" / "f", "one")
    write_durably(root / "a" / "b" / "f", b"two")
    lossy.crash()
    assert (root / "a" / "b" / "f").read_bytes() == b"two"
    assert os.listdir(root / "a" / "b") == ["f"]  # no temporary file left behind


def test_a_new_cluster_layout_survives_a_cut(lossy: LossyMount) -> None:
    """Regression: configs, cluster file and state.json were written with write_text +
    os.replace and no fsync; after a cut they were empty or missing."""
    said: list[str] = []
    root = lossy.mountpoint / "cluster"
    lc = _launcher(root, said)
    with lc._locked(create=True):
        st = lc.create(ClusterSpec(storage_nodes=2, replicas=2, meta=1, mgmtd=1))
    lossy.crash()
    got = lc.load_state()
    assert got is not None and got.to_json() == st.to_json()
    assert not [s for s in said if "damaged" in s]
    cf = config.read_cluster_file(root / "fs3.cluster")
    assert cf.cluster_id == st.cluster_id
    for rec in st.processes:
        assert tomllib.loads(Path(rec.config).read_text())["node"]["id"] == rec.node_id
    for d in ("data/storage-1/t1", "data/storage-2/t2", "kv", "logs"):
        assert (root / d).is_dir(), d


def test_a_damaged_state_file_is_rebuilt_from_the_configs(lossy: LossyMount) -> None:
    said: list[str] = []
    root = lossy.mountpoint / "cluster"
    lc = _launcher(root, said)
    with lc._locked(create=True):
        st = lc.create(ClusterSpec(storage_nodes=3, targets_per_node=2, meta=2, mgmtd=2))
    (root / "state.json").write_text("")  # what the unsynced write_text left after a cut
    (root / "fs3.cluster").write_text("")
    got = lc.load_state()
    assert got is not None
    assert got.cluster_id == st.cluster_id
    assert [
        (r.name, r.role, r.command, r.ports, r.address, r.node_id, r.config) for r in got.processes
    ] == [
        (r.name, r.role, r.command, r.ports, r.address, r.node_id, r.config) for r in st.processes
    ]
    assert (got.spec.storage_nodes, got.spec.targets_per_node, got.spec.meta, got.spec.mgmtd) == (
        3,
        2,
        2,
        2,
    )
    assert any("damaged" in s and "rebuilt it from the configs" in s for s in said), said
    assert list(root.glob("state.json.damaged-*")), "the damaged file is kept for inspection"
    assert json.loads((root / "state.json").read_text())["cluster_id"] == st.cluster_id
    lc._repair_cluster_file(got)
    assert config.read_cluster_file(root / "fs3.cluster").cluster_id == st.cluster_id


def test_state_and_configs_both_gone_point_to_a_way_out(tmp_path: Path) -> None:
    said: list[str] = []
    root = tmp_path / "cluster"
    root.mkdir()
    (root / "state.json").write_text("{")
    lc = _launcher(root, said)
    with pytest.raises(LauncherError, match="--wipe"):
        lc.load_state()
    lc.down(wipe=True)  # the way out works: not a dead end
    assert not root.exists()


def test_cli_status_on_a_damaged_state_file_rebuilds_it(tmp_path: Path) -> None:
    """`fs3 cluster status` answers on a damaged state file instead of refusing the directory."""
    root = tmp_path / "cluster"
    lc = LocalCluster(root, out=lambda s: None)
    with lc._locked(create=True):
        lc.create(ClusterSpec(storage_nodes=1, replicas=1, meta=1, mgmtd=1))
    (root / "state.json").write_text("")
    r = subprocess.run(
        [sys.executable, "-m", "fs3.cli.main", "cluster", "status", "--dir", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "unreadable" not in r.stdout + r.stderr
    assert "rebuilt it from the configs" in r.stdout + r.stderr
