"""``fs3 cluster up --tls``: every TCP connection is TLS; a plaintext client is refused.

Unix sockets are off for every process here, so services reach each other
(heartbeats, CRAQ forwarding between storage nodes, meta's routing) over TLS
TCP too, not only the test's clients.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fs3.config import RpcSection
from fs3.errors import Code, FsError
from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc, mgmtd_pb2, mgmtd_pb2_grpc
from fs3.rpc import auth, settings
from fs3.rpc.channel import call as rpc_call
from fs3.rpc.channel import insecure_channel, native_channel
from fs3.testing.cluster import ProcessCluster
from tests.security.conftest import small_cluster

pytestmark = [pytest.mark.security, pytest.mark.integration, pytest.mark.timeout(180)]

NO_UDS = {"rpc": {"unix_sockets": False}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProcessCluster]:
    with small_cluster(
        transport="tcp",
        tls=True,
        overrides={
            "mgmtd": NO_UDS,
            "meta": NO_UDS,
            "storage": {**NO_UDS, "storage": {"fsync": False}},
        },
    ) as c:
        yield c
    auth.set_default(None)
    settings.configure(RpcSection())


def test_every_service_has_its_own_certificate(cluster: ProcessCluster) -> None:
    tls = Path(cluster.cluster_file).parent / "tls"
    names = {p.stem for p in tls.glob("*.pem")}
    assert {"ca", "mgmtd-1", "meta-1", "storage-1", "storage-2"} <= names
    for key in tls.glob("*.key"):
        assert key.stat().st_mode & 0o777 == 0o600


def test_a_client_over_tls_reads_and_writes(cluster: ProcessCluster) -> None:
    """A separate client process, TCP only: the CA comes from tls/ beside the cluster file."""
    code = (
        "import fs3, os\n"
        f"c = fs3.connect({cluster.cluster_file!r})\n"
        "data = os.urandom(3 << 20)\n"
        "with c.open('/over-tls', 'wb') as f: f.write(data)\n"
        "with c.open('/over-tls', 'rb') as f: assert f.read() == data\n"
        "print('ok')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FS3_RPC_UNIX_SOCKETS": "false"},
        check=False,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert set(cluster.target_states(cluster.status()).values()) == {"serving"}


@pytest.mark.parametrize("transport", ["native", "grpc"])
def test_a_plaintext_client_is_refused(cluster: ProcessCluster, transport: str) -> None:
    a = {p["role"]: p["address"] for p in cluster.status()["processes"] if p["address"]}
    good = auth.credential_from(cluster_file=cluster.cluster_file)
    assert good.tls_ca and good.token
    plain = auth.Credential(token=good.token)  # the right token, but no TLS

    def channel(cred: auth.Credential) -> object:
        if transport == "native":
            return native_channel(a["meta"], RpcSection(unix_sockets=False), cred)
        return insecure_channel(a["meta"], cred)

    async def statfs(cred: auth.Credential) -> object:
        ch: object = channel(cred)
        try:
            stub = meta_pb2_grpc.MetaServiceStub(ch)
            return await rpc_call(
                stub.StatFs, meta_pb2.StatFsRequest(user=common_pb2.UserInfo()), timeout=5
            )
        finally:
            await ch.close()  # type: ignore[attr-defined]

    async def main() -> None:
        await statfs(good)
        with pytest.raises(FsError) as e:
            await statfs(plain)
        assert e.value.code in (Code.UNAVAILABLE, Code.TIMEOUT)
        # not even the open health probe answers in plaintext
        ch: object = (
            native_channel(a["mgmtd"], RpcSection(unix_sockets=False), plain)
            if transport == "native"
            else insecure_channel(a["mgmtd"], plain)
        )
        try:
            with pytest.raises(FsError):
                await rpc_call(
                    mgmtd_pb2_grpc.MgmtdServiceStub(ch).GetLeader,
                    mgmtd_pb2.GetLeaderRequest(),
                    timeout=5,
                )
        finally:
            await ch.close()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_status_and_admin_work_over_tls(cluster: ProcessCluster) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fs3.cli.main",
            "admin",
            "--cluster",
            cluster.cluster_file,
            "--json",
            "nodes",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FS3_RPC_UNIX_SOCKETS": "false"},
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 4  # mgmtd, meta, 2 storage
