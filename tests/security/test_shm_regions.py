"""Shared memory by handle: no local user can make a storage node map memory it does not own.

The node's region socket gets descriptors (SCM_RIGHTS) and the peer's uid and
pid from the kernel (SO_PEERCRED). Victim and attacker are real processes of
two unprivileged uids (``shm_peer.py`` under ``/usr/bin/python3``), talking to
a storage node of the secure cluster. Positive controls (the victim's and the
attacker's own registrations succeed) show the socket path and protocol are
right, so the refusals are the checks.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fs3 import config as fs3config
from fs3.errors import Code, FsError
from fs3.proto import common_pb2, transport_pb2, transport_pb2_grpc
from fs3.rpc.channel import call_sync, sync_channel
from fs3.testing.cluster import ProcessCluster
from fs3.transport.region import ShmRegion
from fs3.transport.shm import region_socket_path
from tests.security.conftest import all_alive

pytestmark = [
    pytest.mark.security,
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run peers as other uids"),
]

PEER = str(Path(__file__).with_name("shm_peer.py"))
PYTHON = "/usr/bin/python3"
VICTIM, ATTACKER = 65533, 65534
SIZE = 1 << 16


def req_hex(client_id: str, region: str, size: int = SIZE) -> str:
    r = transport_pb2.RegisterRegionRequest(client_id=client_id, region=region, size=size)
    return str(r.SerializeToString().hex())


def answer(out: str) -> common_pb2.ErrorDetail | int:
    """The node's answer (ErrorDetail) or the errno the peer got from the kernel."""
    word, value = out.split()[:2]
    if word == "oserror":
        return int(value)
    return common_pb2.ErrorDetail.FromString(bytes.fromhex(value))


def as_user(uid: int, *args: str) -> common_pb2.ErrorDetail | int:
    p = subprocess.run(
        [PYTHON, PEER, *args], user=uid, group=uid, capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0, p.stderr
    return answer(p.stdout)


@contextlib.contextmanager
def holding_region(
    uid: int, path: str, sock: str, client_id: str, rid: str
) -> Iterator[common_pb2.ErrorDetail | int]:
    """A peer of ``uid`` that creates ``path``, registers it by descriptor and stays alive."""
    p = subprocess.Popen(
        [PYTHON, PEER, "victim", path, str(SIZE), sock, req_hex(client_id, rid)],
        user=uid,
        group=uid,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        yield answer(p.stdout.readline())
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=10)


@pytest.fixture(scope="module")
def node(secure_cluster: ProcessCluster) -> dict[str, Any]:
    s = secure_cluster.status()
    proc = next(p for p in s["processes"] if p["role"] == "storage")
    cfg = fs3config.load(fs3config.StorageConfig, secure_cluster.config_path(proc["name"]), env={})
    return {
        "address": proc["address"],
        "sock": region_socket_path(proc["address"], cfg.rpc.socket_dir),
    }


@pytest.fixture(scope="module")
def victim(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    path = f"/dev/shm/fs3-sec-victim-{uuid.uuid4().hex}"
    rid = uuid.uuid4().hex
    with holding_region(VICTIM, path, node["sock"], "victim", rid) as got:
        assert isinstance(got, common_pb2.ErrorDetail) and got.code == 0, got  # positive control
        yield {"path": path, "rid": rid}


def test_register_by_path_refused(node: dict[str, Any], victim: dict[str, Any]) -> None:
    ch = sync_channel(node["address"])
    try:
        stub = transport_pb2_grpc.TransportServiceStub(ch)  # type: ignore[no-untyped-call]
        for path in (victim["path"], "/etc/shadow"):
            req = transport_pb2.RegisterRegionRequest(
                client_id="attacker", region="evil", path=path, size=SIZE, pid=os.getpid()
            )
            with pytest.raises(FsError) as e:
                call_sync(stub.RegisterRegion, req, timeout=10)
            assert e.value.code == Code.PERMISSION_DENIED
    finally:
        ch.close()


def test_attacker_cannot_hand_over_the_victims_region(
    node: dict[str, Any], victim: dict[str, Any]
) -> None:
    got = as_user(ATTACKER, "fd", node["sock"], req_hex("attacker", "a1"), victim["path"], "rw")
    assert got == 13  # EACCES from the kernel: the descriptor cannot even be made


def test_read_only_descriptor_refused(node: dict[str, Any], tmp_path: Path) -> None:
    pub = Path(f"/dev/shm/fs3-sec-public-{uuid.uuid4().hex}")
    pub.write_bytes(b"\x11" * SIZE)
    os.chown(pub, VICTIM, VICTIM)
    pub.chmod(0o644)  # readable by all, writable by its owner only
    try:
        got = as_user(ATTACKER, "fd", node["sock"], req_hex("attacker", "a2"), str(pub), "r")
        assert isinstance(got, common_pb2.ErrorDetail) and got.code == Code.PERMISSION_DENIED
    finally:
        pub.unlink()


def test_region_takeover_refused(node: dict[str, Any], victim: dict[str, Any]) -> None:
    """Another uid registering its own memory under the victim's client and region id."""
    own = f"/dev/shm/fs3-sec-attacker-{uuid.uuid4().hex}"
    with holding_region(ATTACKER, own, node["sock"], "victim", victim["rid"]) as got:
        assert isinstance(got, common_pb2.ErrorDetail) and got.code == Code.PERMISSION_DENIED


def test_attackers_own_region_is_accepted(node: dict[str, Any]) -> None:
    """Positive control: the same peer registering its own memory succeeds."""
    own = f"/dev/shm/fs3-sec-own-{uuid.uuid4().hex}"
    with holding_region(ATTACKER, own, node["sock"], "a3", uuid.uuid4().hex) as got:
        assert isinstance(got, common_pb2.ErrorDetail) and got.code == 0, got


@pytest.mark.parametrize(
    ("what", "data", "nfds"),
    [
        ("no descriptor", req_hex("a4", "r4"), 0),
        ("three descriptors", req_hex("a4", "r4"), 3),
        ("garbage body", "ff" * 64, 1),
        ("oversized body", "00" * 8192, 1),
        ("size beyond the file", req_hex("a4", "r4", size=1 << 30), 1),
        ("zero size", req_hex("a4", "r4", size=0), 1),
        ("empty ids", req_hex("", ""), 1),
    ],
)
def test_malformed_registrations_refused(
    what: str, data: str, nfds: int, node: dict[str, Any], secure_cluster: ProcessCluster
) -> None:
    got = as_user(ATTACKER, "raw", node["sock"], data, str(nfds))
    assert isinstance(got, common_pb2.ErrorDetail) and got.code != 0, (what, got)
    all_alive(secure_cluster)


def test_directory_descriptor_refused(node: dict[str, Any]) -> None:
    got = as_user(ATTACKER, "fd", node["sock"], req_hex("a5", "r5"), "/tmp", "dir")
    assert isinstance(got, common_pb2.ErrorDetail) and got.code == Code.INVALID_ARGUMENT


def test_region_ids_are_not_in_file_names() -> None:
    r = ShmRegion.create(4096, prefix="fs3-sec-names")
    try:
        assert r.id not in r.path and r.id not in "".join(os.listdir("/dev/shm"))
    finally:
        r.close()


def test_client_still_works_after_the_attacks(client: Any, secure_cluster: ProcessCluster) -> None:
    with client.open("/shm-after", "wb") as f:
        f.write(b"fine")
    with client.open("/shm-after", "rb") as f:
        assert f.read() == b"fine"
    all_alive(secure_cluster)
