"""Three real ``fs3 mgmtd`` processes on one SQLite file: election, failover,
pause (SIGSTOP), restart of everybody, and ``fs3 admin`` against them.

Timings are short (lease 2 s, renewal 0.5 s, safety margin 0.5 s).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fs3.client.mgmtd_client import MgmtdClient
from fs3.errors import Code, FsError
from fs3.proto import mgmtd_pb2 as pb
from fs3.proto import mgmtd_pb2_grpc
from fs3.routing import Routing
from fs3.rpc.channel import call_sync, sync_channel

pytestmark = pytest.mark.integration

CLUSTER = "itest"
LEASE_S = 2.0
RENEW_S = 0.5
MARGIN_S = 0.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class MgmtdProcs:
    """N mgmtd processes with fixed ports; every pid is recorded and killed at the end."""

    def __init__(self, tmp: Path, n: int = 3) -> None:
        self.tmp = tmp
        self.db = tmp / "kv.db"
        self.ports = [free_port() for _ in range(n)]
        self.addresses = [f"127.0.0.1:{p}" for p in self.ports]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.cluster_file = tmp / "cluster"
        self.cluster_file.write_text(f"{CLUSTER}@{','.join(self.addresses)}\n")
        for i in range(n):
            (tmp / f"mgmtd-{i + 1}.toml").write_text(
                f"""
[node]
id = {i + 1}
host = "127.0.0.1"
port = {self.ports[i]}
[cluster]
id = "{CLUSTER}"
[kv]
url = "sqlite://{self.db}"
[log]
level = "INFO"
file = "{tmp / f"mgmtd-{i + 1}.log"}"
[mgmtd]
lease_length_s = {LEASE_S}
lease_renew_interval_s = {RENEW_S}
lease_safety_margin_s = {MARGIN_S}
heartbeat_interval_s = 0.5
heartbeat_timeout_s = 2.0
check_interval_s = 0.2
"""
            )

    def start(self, *ids: int) -> None:
        """Start processes (in parallel) and wait for each one's listening line."""
        for i in ids:
            assert i not in self.procs or self.procs[i].poll() is not None
            self.procs[i] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fs3.cli.main",
                    "mgmtd",
                    "--config",
                    str(self.tmp / f"mgmtd-{i + 1}.toml"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        for i in ids:
            out = self.procs[i].stdout
            assert out is not None
            line = out.readline().decode()  # bounded by the test timeout
            assert line.startswith("fs3-mgmtd listening on "), line
            assert line.split()[-1] == self.addresses[i]

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        p = self.procs[i]
        if p.poll() is None:
            p.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            p.wait(timeout=10)

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def get_leader(self, i: int, timeout: float = 0.5) -> pb.GetLeaderResponse | None:
        ch = sync_channel(self.addresses[i])
        try:
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(ch)
            return call_sync(stub.GetLeader, pb.GetLeaderRequest(), timeout=timeout)
        except FsError:
            return None
        finally:
            ch.close()

    def routing_from(self, i: int, timeout: float = 1.0) -> pb.RoutingInfo:
        """GetRoutingInfo straight from process i (no redirects): raises FsError."""
        ch = sync_channel(self.addresses[i])
        try:
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(ch)
            return call_sync(
                stub.GetRoutingInfo, pb.GetRoutingInfoRequest(), timeout=timeout
            ).routing
        finally:
            ch.close()

    def leaders(self, among: list[int] | None = None) -> list[int]:
        out = []
        for i in among if among is not None else list(self.procs):
            r = self.get_leader(i)
            if r is not None and r.is_leader:
                out.append(i)
        return out

    def wait_leader(self, among: list[int] | None = None, timeout: float = 10.0) -> int:
        ls = wait_until(lambda: self.leaders(among), timeout, "a leader")
        assert len(ls) == 1, f"two leaders at once: {ls}"
        return int(ls[0])

    def log(self, i: int) -> str:
        return (self.tmp / f"mgmtd-{i + 1}.log").read_text()


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtdProcs]:
    m = MgmtdProcs(tmp_path_factory.mktemp("mgmtd"))
    try:
        m.start(0, 1, 2)
        m.wait_leader()
        yield m
    finally:
        m.stop_all()


def client(m: MgmtdProcs) -> MgmtdClient:
    return MgmtdClient(m.addresses, CLUSTER, timeout_s=1.0, retry_deadline_s=15.0)


async def _register_storage(m: MgmtdProcs) -> pb.CreateChainTableResponse:
    async with client(m) as c:
        for i in (1, 2, 3):
            await c.register_node(
                pb.RegisterNodeRequest(
                    node_id=10000 + i,
                    type=pb.NODE_TYPE_STORAGE,
                    address=f"127.0.0.1:{30000 + i}",
                    name=f"storage-{i}",
                    targets=[
                        pb.LocalTargetReport(
                            target_id=i * 100 + j, local_state=pb.LOCAL_STATE_ONLINE
                        )
                        for j in (1, 2)
                    ],
                )
            )
        return await c.create_chain_table(1, 3, desc="itest")


@pytest.mark.timeout(60)
def test_one_leader_and_followers_redirect(procs: MgmtdProcs) -> None:
    leader = procs.wait_leader()
    for i in range(3):
        r = procs.get_leader(i)
        assert r is not None and r.address == procs.addresses[leader]
        if i != leader:
            with pytest.raises(FsError) as ei:
                procs.routing_from(i)
            assert ei.value.code == Code.NOT_LEADER and ei.value.leader == procs.addresses[leader]
    resp = asyncio.run(_register_storage(procs))
    assert len(resp.chains) == 2 and resp.table.version == 1
    # every mgmtd shows up in routing (followers heartbeat the leader)
    info = wait_until(
        lambda: (lambda r: r if len(Routing(r).mgmtd_nodes(online_only=True)) == 3 else None)(
            procs.routing_from(leader)
        ),
        10,
        "all mgmtds in routing",
    )
    assert {n.name for n in Routing(info).mgmtd_nodes()} == {"mgmtd-1", "mgmtd-2", "mgmtd-3"}


@pytest.mark.timeout(60)
def test_kill_9_leader_another_takes_over_and_the_old_one_follows(procs: MgmtdProcs) -> None:
    leader = procs.wait_leader()
    before = procs.routing_from(leader)
    killed_at = time.time()
    procs.kill(leader, signal.SIGKILL)
    t0 = time.monotonic()
    others = [i for i in range(3) if i != leader]
    new = procs.wait_leader(others, timeout=10)
    polled = time.monotonic() - t0
    # The bound: the dead leader's lease runs out at most LEASE_S after its last
    # renewal, and followers retry right at expiry. Measured from the new leader's
    # own "lease gained" log line (wall clock, ms), so the test's polling on a busy
    # machine does not count; the polled time only gets a loose sanity bound.
    gained = _last_lease_gained(procs.log(new))
    assert gained - killed_at <= LEASE_S + RENEW_S, f"takeover took {gained - killed_at:.2f}s"
    assert polled <= LEASE_S + RENEW_S + 3.0, f"leader visible only after {polled:.2f}s"
    after = wait_until(lambda: _try_routing(procs, new), 5, "routing from the new leader")
    assert after.version > before.version
    assert [c.SerializeToString() for c in after.chains] == [
        c.SerializeToString() for c in before.chains
    ]
    # the old leader comes back and follows
    procs.start(leader)
    # A just-started mgmtd answers before it has read the lease (address ""); wait
    # until it knows the leader, then it must name the new one and not lead itself.
    r = wait_until(
        lambda: (
            (g := procs.get_leader(leader)) is not None and bool(g.address or g.is_leader) and g
        ),
        10,
        "restarted mgmtd knows the leader",
    )
    assert not r.is_leader and r.address == procs.addresses[new]
    with pytest.raises(FsError) as ei:
        procs.routing_from(leader)
    assert ei.value.code == Code.NOT_LEADER
    assert procs.leaders() == [new]


def _last_lease_gained(log_text: str) -> float:
    """Wall-clock time of the last 'lease gained' line of an fs3 log."""
    lines = [ln for ln in log_text.splitlines() if " lease gained " in ln]
    assert lines, "no 'lease gained' in the new leader's log"
    stamp = lines[-1].split()[0]  # 2026-11-29T09:56:47.250 (local time)
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def _try_routing(m: MgmtdProcs, i: int) -> pb.RoutingInfo | None:
    try:
        return m.routing_from(i)
    except FsError:
        return None


@pytest.mark.timeout(60)
def test_paused_leader_stops_acting_before_anyone_else_leads(procs: MgmtdProcs) -> None:
    leader = procs.wait_leader()
    procs.kill(leader, signal.SIGSTOP)
    try:
        others = [i for i in range(3) if i != leader]
        new = procs.wait_leader(others, timeout=10)
    finally:
        procs.kill(leader, signal.SIGCONT)
    # the moment it runs again, before any renewal, it must refuse to act
    with pytest.raises(FsError) as ei:
        procs.routing_from(leader, timeout=2.0)
    assert ei.value.code == Code.NOT_LEADER
    r = procs.get_leader(leader, timeout=2.0)
    assert r is not None and not r.is_leader
    # and never two leaders afterwards
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert len(procs.leaders()) <= 1
    assert procs.leaders() == [new]
    # it notices by itself and says why (trust window closed / lease held by another)
    wait_until(
        lambda: "lease lost" in procs.log(leader), 5, "the paused leader to log 'lease lost'"
    )


@pytest.mark.timeout(60)
def test_restart_of_every_mgmtd_loses_nothing(procs: MgmtdProcs) -> None:
    leader = procs.wait_leader()

    def settled() -> pb.RoutingInfo | None:
        # the storage nodes of the earlier tests never heartbeat: wait until the
        # leader has declared them offline (chains updated in the same tick), so
        # nothing changes between this snapshot and the shutdown
        r = _try_routing(procs, leader)
        if r is None or any(n.status != pb.NODE_STATUS_OFFLINE for n in Routing(r).storage_nodes()):
            return None
        return r

    before = wait_until(settled, 10, "storage nodes declared offline")
    assert before.chains, "earlier tests created chains"
    for i in range(3):
        procs.kill(i, signal.SIGTERM)
    procs.start(0, 1, 2)
    new = procs.wait_leader(timeout=10)
    after = wait_until(lambda: _try_routing(procs, new), 5, "routing after restart")
    assert after.version > before.version
    assert [(c.chain_id, c.version, [t.target_id for t in c.targets]) for c in after.chains] == [
        (c.chain_id, c.version, [t.target_id for t in c.targets]) for c in before.chains
    ]
    assert list(after.chain_tables) == list(before.chain_tables)
    assert {n.node_id for n in after.nodes} >= {10001, 10002, 10003}


@pytest.mark.timeout(60)
def test_admin_cli(procs: MgmtdProcs, capsys: pytest.CaptureFixture[str]) -> None:
    procs.wait_leader()
    # once as a real command line ...
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fs3.cli.main",
            "admin",
            "--cluster",
            str(procs.cluster_file),
            "nodes",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0 and "storage-1" in r.stdout and "mgmtd-1" in r.stdout, (
        r.stdout + r.stderr
    )

    # ... the rest in-process (same main(), without paying interpreter start-up each time)
    from fs3.cli import admin as admin_cli

    def admin(*args: str) -> tuple[int, str, str]:
        rc = admin_cli.main(["--cluster", str(procs.cluster_file), *args])
        out, err = capsys.readouterr()
        return rc, out, err

    rc, out, err = admin("--json", "chains")
    assert rc == 0, err
    chains = json.loads(out)
    assert len(chains) == 2 and all(len(c["targets"]) == 3 for c in chains)
    rc, out, _ = admin("chain-tables", "--json")
    assert rc == 0 and json.loads(out)[0]["chains"] == [1, 2]
    tid = chains[0]["targets"][0]
    rc, out, err = admin("--json", "target-offline", str(tid))
    assert rc == 0, err
    res = json.loads(out)
    assert res["chain"]["states"][res["chain"]["targets"].index(tid)] in ("offline", "lastsrv")
    rc, out, _ = admin("--json", "targets")
    assert rc == 0 and any(t["id"] == tid and t["admin_offline"] for t in json.loads(out))
    rc, out, err = admin("target-online", str(tid))
    assert rc == 0 and f"target {tid} marked online" in out, err
    rc, out, _ = admin("targets")
    assert rc == 0 and str(tid) in out and "STATE" in out
    rc, out, err = admin("--json", "status")
    assert rc == 0, err
    st = json.loads(out)
    assert st["leader"].startswith("mgmtd-") and st["chains"] == 2
    rc, out, err = admin("target-offline", "99999")
    assert rc == 1 and "UNKNOWN_TARGET" in err
    rc, out, err = admin("create-chain-table", "--table-id", "2", "--replicas", "5")
    assert rc == 1 and "CANNOT_SATISFY" in err
