"""Pure parts of the local cluster launcher (fs3.launcher): options, configs, layout, rendering."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fs3 import config, launcher
from fs3.launcher import ClusterSpec, LauncherError, LocalCluster, layout, supervise


@pytest.mark.timeout(10)
def test_parse_set_reads_toml_values_and_refuses_malformed_items() -> None:
    got = launcher.parse_set(
        [
            "storage.storage.fsync=false",
            "mgmtd.mgmtd.lease_length_s=3",
            "meta.log.level=DEBUG",
            "storage.storage.targets=['/a', '/b']",
        ]
    )
    assert got == {
        "storage": {"storage": {"fsync": False, "targets": ["/a", "/b"]}},
        "mgmtd": {"mgmtd": {"lease_length_s": 3}},
        "meta": {"log": {"level": "DEBUG"}},
    }
    for bad in ["storage.fsync=false", "x", "a..b=1"]:
        with pytest.raises(LauncherError, match="ROLE.SECTION.KEY=VALUE"):
            launcher.parse_set([bad])


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "spec, message",
    [
        (ClusterSpec(replicas=4), "--replicas must be 1..3"),
        (ClusterSpec(storage_nodes=0), "--storage-nodes"),
        (ClusterSpec(kv="redis"), "--kv must be sqlite or fdb"),
        (ClusterSpec(transport="rdma"), "--transport must be auto, grpc, tcp or shm"),
        (ClusterSpec(base_port=80), "--base-port"),
        (ClusterSpec(overrides={"gateway": {}}), "unknown role 'gateway'"),
        (ClusterSpec(overrides={"meta": {"storage": {}}}), "meta has no section [storage]"),
        (ClusterSpec(overrides={"meta": {"meta": {"nope": 1}}}), "has no key 'nope'"),
    ],
)
def test_spec_validation(spec: ClusterSpec, message: str) -> None:
    with pytest.raises(LauncherError, match=message.replace("[", r"\[").replace("]", r"\]")):
        spec.validate()


@pytest.mark.timeout(10)
def test_layout_names_node_ids_ports_and_configs(tmp_path: Path) -> None:
    lc = LocalCluster(tmp_path, out=lambda s: None)
    spec = ClusterSpec(
        storage_nodes=3, targets_per_node=2, meta=2, mgmtd=2, transport="tcp", base_port=20000
    )
    st, cf = lc.layout(spec, "local-test")
    assert [(p.name, p.node_id) for p in st.processes] == [
        ("mgmtd-1", 1),
        ("mgmtd-2", 2),
        ("meta-1", 101),
        ("meta-2", 102),
        ("storage-1", 10001),
        ("storage-2", 10002),
        ("storage-3", 10003),
    ]
    ports = [port for p in st.processes for port in p.ports]
    assert ports == list(range(20000, 20000 + len(ports))), "distinct, consecutive from --base-port"
    assert cf.render() == "local-test@127.0.0.1:20000,127.0.0.1:20002\n"
    lc.write_configs(st)
    s2 = config.load(config.StorageConfig, tmp_path / "conf" / "storage-2.toml", env={})
    assert s2.node.id == 10002 and s2.node.port == st.proc("storage-2").ports[0]
    assert s2.storage.target_ids == [201, 202]
    assert s2.storage.targets == [
        str(tmp_path / "data" / "storage-2" / "t1"),
        str(tmp_path / "data" / "storage-2" / "t2"),
    ]
    assert all(Path(t).is_dir() for t in s2.storage.targets)
    assert s2.transport.kind == "tcp" and s2.transport.tcp_port == 0, "no data port: native RPC"
    assert all(len(p.ports) == 2 for p in st.processes), "RPC and metrics ports only"
    m1 = config.load(config.MgmtdConfig, tmp_path / "conf" / "mgmtd-1.toml", env={})
    assert m1.kv.url == f"sqlite://{tmp_path / 'kv' / 'kv.db'}" and m1.cluster.id == "local-test"
    assert m1.mgmtd.heartbeat_timeout_s == 5.0, "local clusters detect failures in seconds"
    meta = config.load(config.MetaConfig, tmp_path / "conf" / "meta-2.toml", env={})
    assert meta.kv.url == m1.kv.url, "mgmtd and meta share one KV"
    if hasattr(meta.node, "name"):
        assert meta.node.name == "meta-2"
    assert st.proc("meta-1").command[-3:] == [
        "meta",
        "--config",
        str(tmp_path / "conf" / "meta-1.toml"),
    ]


@pytest.mark.timeout(10)
def test_render_config_applies_overrides_and_refuses_bad_values(tmp_path: Path) -> None:
    text = launcher.render_config(
        "storage", {"storage": {"fsync": False}}, {"storage": {"no_such": 1}}, "x.toml"
    )
    data = tomllib.loads(text.split("\n", 1)[1])
    assert data["storage"]["fsync"] is False and "no_such" not in data["storage"]
    with pytest.raises(LauncherError, match="no key \\[storage\\] no_such"):
        launcher.render_config("storage", {"storage": {"no_such": 1}}, {}, "x.toml")
    with pytest.raises(LauncherError, match="lease_length_s must be > 0"):
        launcher.render_config("mgmtd", {"mgmtd": {"lease_length_s": -1.0}}, {}, "x.toml")


@pytest.mark.timeout(10)
def test_mountinfo_unescaping_and_absent_mount(tmp_path: Path) -> None:
    from fs3 import mounts

    assert mounts._unescape(r"/mnt/with\040space\011tab") == "/mnt/with space\ttab"
    assert launcher.mount_fstype(str(tmp_path)) is None
    assert launcher.mount_state(str(tmp_path / "missing")) == "absent"
    assert launcher.mount_fstype("/proc") == "proc"
    assert launcher.mount_state("/proc") == "other"


@pytest.mark.timeout(10)
def test_log_tail_shows_only_the_last_start(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("old line\n\n=== fs3 cluster: starting x at T: cmd\nnew 1\nnew 2\n")
    assert launcher.log_tail(log) == "=== fs3 cluster: starting x at T: cmd\nnew 1\nnew 2"
    assert launcher.log_tail(tmp_path / "none.log") == "(no log file)"


@pytest.mark.timeout(10)
def test_render_status_table() -> None:
    s = {
        "cluster_id": "local-x",
        "dir": "/d",
        "cluster_file": "/d/fs3.cluster",
        "leader": "mgmtd-1",
        "routing_version": 7,
        "mount": None,
        "mount_state": None,
        "errors": [],
        "processes": [
            {
                "name": "storage-1",
                "role": "storage",
                "pid": 5,
                "alive": False,
                "address": "127.0.0.1:1",
                "node_id": 10001,
            }
        ],
        "nodes": [{"name": "storage-1", "status": "offline"}],
        "targets": [
            {
                "id": 101,
                "node": "storage-1",
                "state": "offline",
                "local_state": "offline",
                "chain": 1,
                "used_bytes": 2048,
                "free_bytes": 3 << 30,
            }
        ],
        "chains": [
            {"id": 1, "version": 2, "targets": [201, 101], "states": ["serving", "offline"]}
        ],
        "capacity": {
            "chain_table": 1,
            "replicas": 2,
            "capacity_bytes": 5 << 30,
            "free_bytes": 3 << 29,
            "used_bytes": 1024,
            "raw_capacity_bytes": 10 << 30,
            "raw_free_bytes": 3 << 30,
            "raw_used_bytes": 2048,
            "filesystems": 1,
            "targets": 2,
        },
    }
    out = launcher.render_status(s)
    assert "leader: mgmtd-1" in out and "storage-1  storage  5    NO" in out
    assert "201(serving) -> 101(offline)" in out
    assert (
        "capacity: 1.5 GiB free of 5.0 GiB (raw / 2 replicas of chain table 1); data 1.0 KiB" in out
    )
    assert "raw: 3.0 GiB free of 10.0 GiB on 1 file system (2 targets" in out
    assert "spare targets" not in out
    s["spare_targets"] = [301]
    assert "spare targets (in no chain, hold no data): 301" in launcher.render_status(s)


@pytest.mark.timeout(20)
def test_picked_ports_are_outside_the_kernels_ephemeral_range(tmp_path: Path) -> None:
    """Regression: ports from ``bind(0)`` are ephemeral ones, which the kernel also gives to
    clients; a client reconnecting to a dead process's port could self-connect from that
    very port and hold it, so `fs3 cluster restart` failed with "port ... in use"."""
    lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    st, _ = LocalCluster(tmp_path, out=lambda s: None).layout(ClusterSpec(), "local-test")
    ports = [port for p in st.processes for port in p.ports]
    assert len(set(ports)) == len(ports) == 2 * 7
    outside = [p for p in ports if not lo <= p <= hi]
    assert outside == ports, f"ports in the ephemeral range {lo}-{hi}: {set(ports) - set(outside)}"
    assert all(launcher.port_is_free(p) for p in ports), "released after picking"


@pytest.mark.timeout(20)
def test_port_picking_skips_taken_ports_and_follows_the_ephemeral_range() -> None:
    import socket

    assert layout.ephemeral_port_range("/nonexistent") == layout.LINUX_DEFAULT_EPHEMERAL
    assert layout.service_port_candidates((32768, 60999)) == list(range(20000, 32768)) + list(
        range(61000, 65536)
    )
    # a range starting low: below it from 1024; a range reaching 65535: nothing above
    assert layout.service_port_candidates((10000, 65535)) == list(range(1024, 10000))
    assert layout.service_port_candidates((1024, 65000)) == list(range(65001, 65536))
    with pytest.raises(LauncherError, match="leaves fewer than 3 ports"):
        launcher.pick_free_ports(3, ephemeral=(1024, 65535))
    # with only five candidates and one of them taken, the other four come back
    cands = layout.service_port_candidates((1024, 65530))
    assert cands == [65531, 65532, 65533, 65534, 65535]
    if not all(launcher.port_is_free(p) for p in cands):
        pytest.skip("a port in 65531..65535 is in use on this host")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 65533))
        s.listen()
        got = launcher.pick_free_ports(4, ephemeral=(1024, 65530))
        assert sorted(got) == [65531, 65532, 65534, 65535]
        with pytest.raises(LauncherError, match="fewer than 5 free ports"):
            launcher.pick_free_ports(5, ephemeral=(1024, 65530))


HALF_EXITED = """
import ctypes, socket, sys, threading
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
threading.Thread(target=sys.stdin.read).start()  # holds the process until stdin closes
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)  # the main thread exits, the process does not
"""


@pytest.mark.timeout(30)
def test_a_process_whose_main_thread_exited_holds_its_ports_until_its_last_thread_is_gone() -> None:
    """Regression: a killed process showed as dead (its main thread a zombie) while another
    thread still held its files, so `restart` found its port "in use by another program"."""
    import subprocess
    import sys
    import time

    [port] = launcher.pick_free_ports(1)
    cmd = [sys.executable, "-c", HALF_EXITED, str(port)]
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        stat = supervise._proc_stat(child.pid)
        assert stat is not None
        rec = launcher.ProcRecord(
            name="x", role="meta", command=cmd, log="", config="", pid=child.pid
        )
        rec.start_ticks = stat[1]
        while (supervise._proc_stat(child.pid) or ("?",))[0] != "Z":
            assert child.poll() is None
            time.sleep(0.01)
        assert not launcher.is_alive(rec), "no command line: not running as far as /proc shows"
        assert not launcher.port_is_free(port)
        assert supervise._wait_dead([rec], 0.2) == [rec], "not dead while a thread holds its port"
        assert not launcher.is_gone(rec)
        assert child.stdin is not None
        child.stdin.close()
        assert supervise._wait_dead([rec], 20) == []
        assert launcher.is_gone(rec) and launcher.port_is_free(port)
    finally:
        child.kill()
        child.wait(10)
