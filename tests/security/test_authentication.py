"""Who may call what, against a real launcher cluster (fs3 cluster up: secret, tokens, mount).

One cluster (mgmtd×1, meta×1, storage×2, FUSE mount) serves the module. Every
attack is made with fs3's own clients and stubs, with a credential that is
missing, forged, another user's, or revoked; after each, the test checks that
the refusal is the documented one and that nothing changed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fs3.config import RpcSection
from fs3.errors import Code
from fs3.proto import (
    common_pb2,
    meta_pb2,
    meta_pb2_grpc,
    mgmtd_pb2,
    mgmtd_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
    transport_pb2,
    transport_pb2_grpc,
)
from fs3.rpc import auth, settings
from fs3.rpc.channel import ChannelPool, call
from fs3.security.tokens import Signer
from fs3.testing.cluster import ProcessCluster
from fs3.testing.rpc import TRANSPORTS, code_of, pooled
from tests.integration.fuse_helpers import run_as
from tests.security.conftest import small_cluster

pytestmark = [pytest.mark.security, pytest.mark.integration, pytest.mark.timeout(120)]

FS3 = [sys.executable, "-m", "fs3.cli.main"]
FAST = {"storage": {"storage": {"fsync": False}}}

needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None or os.geteuid() != 0,
    reason="needs /dev/fuse, fusermount3 and root (allow_other, other uids)",
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProcessCluster]:
    can_mount = (
        os.geteuid() == 0 and os.path.exists("/dev/fuse") and bool(shutil.which("fusermount3"))
    )
    # the mount point must be reachable by the other uids the FUSE test runs as
    top = Path(tempfile.mkdtemp(prefix="fs3-sec-"))
    top.chmod(0o755)
    mount = str(top / "mnt") if can_mount else None
    with small_cluster(transport="grpc", mount=mount, overrides=FAST) as c:
        yield c
    auth.set_default(None)
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(autouse=True)
def _restore_rpc() -> Iterator[None]:
    yield
    settings.configure(RpcSection())


def admin(
    cluster: ProcessCluster, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``fs3 admin --cluster FILE ARGS`` as the operator (the secret beside the cluster file)."""
    r = subprocess.run(
        [*FS3, "admin", "--cluster", cluster.cluster_file, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("FS3_TOKEN")},
    )
    if check:
        assert r.returncode == 0, r.stderr
    return r


def add_user(cluster: ProcessCluster, name: str, uid: int, gid: int, *extra: str) -> str:
    return admin(
        cluster, "user", "add", name, "--uid", str(uid), "--gid", str(gid), *extra
    ).stdout.strip()


def addresses(cluster: ProcessCluster) -> dict[str, str]:
    return {p["role"]: p["address"] for p in cluster.status()["processes"] if p["address"]}


def _every_call(pool: ChannelPool, a: dict[str, str]) -> list[tuple[str, Any]]:
    """One call of each kind to every service: client, admin and service-only methods."""
    mg = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(a["mgmtd"]))
    me = meta_pb2_grpc.MetaServiceStub(pool.get(a["meta"]))
    st = storage_pb2_grpc.StorageServiceStub(pool.get(a["storage"]))
    tr = transport_pb2_grpc.TransportServiceStub(pool.get(a["storage"]))
    root = common_pb2.UserInfo(uid=0, gid=0)
    return [
        ("mgmtd.GetRoutingInfo", call(mg.GetRoutingInfo, mgmtd_pb2.GetRoutingInfoRequest())),
        ("mgmtd.Heartbeat", call(mg.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=10001))),
        (
            "mgmtd.SetTargetState",
            call(mg.SetTargetState, mgmtd_pb2.SetTargetStateRequest(target_id=101, offline=True)),
        ),
        ("mgmtd.AddUser", call(mg.AddUser, mgmtd_pb2.AddUserRequest(name="evil", uid=0))),
        ("mgmtd.ListUsers", call(mg.ListUsers, mgmtd_pb2.ListUsersRequest())),
        ("meta.StatFs", call(me.StatFs, meta_pb2.StatFsRequest(user=root))),
        (
            "meta.Mkdir",
            call(me.Mkdir, meta_pb2.MkdirRequest(user=root, parent=1, name=b"evil", mode=0o777)),
        ),
        ("meta.ListGc", call(me.ListGc, meta_pb2.ListGcRequest(user=root))),
        (
            "storage.RemoveChunks",
            call(
                st.RemoveChunks,
                storage_pb2.RemoveChunksRequest(
                    ops=[storage_pb2.RemoveChunksOp(chain_id=1, range=storage_pb2.ChunkRange())]
                ),
            ),
        ),
        ("storage.SpaceInfo", call(st.SpaceInfo, storage_pb2.SpaceInfoRequest())),
        ("storage.Update", call(st.Update, storage_pb2.UpdateRequest())),
        (
            "transport.RegisterRegion",
            call(tr.RegisterRegion, transport_pb2.RegisterRegionRequest()),
        ),
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unauthenticated_calls_to_every_service_are_refused(
    cluster: ProcessCluster, transport: str
) -> None:
    a = addresses(cluster)
    foreign = Signer(bytes(32)).service_token("intruder")  # a token of another cluster

    async def main() -> None:
        for token in ("", foreign):
            async with pooled(transport, auth.Credential(token=token)) as pool:
                for what, coro in _every_call(pool, a):
                    code = await code_of(coro)
                    assert code == Code.UNAUTHENTICATED, (what, token[:10], code)
                # the health probe stays open and says only who leads
                mg = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(a["mgmtd"]))
                r = await call(mg.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
                assert r.is_leader

    asyncio.run(main())
    # nothing changed: every target still serving, no user, no directory
    assert set(cluster.target_states(cluster.status()).values()) == {"serving"}
    assert "evil" not in admin(cluster, "user", "list").stdout
    with cluster.connect() as c:
        assert "evil" not in c.listdir("/")


def test_a_user_token_acts_only_as_its_user(cluster: ProcessCluster) -> None:
    token = add_user(cluster, "carol", 1100, 1100, "--groups", "50")
    with cluster.connect() as root:
        root.mkdir("/carol")
        root.chown("/carol", 1100, 1100)
        root.mkdir("/rootonly", 0o755)
    c = cluster.connect(token=token)
    try:
        assert (c.caller.uid, c.caller.gid, c.caller.groups) == (1100, 1100, (50,))
        with c.open("/carol/f", "wb") as f:
            f.write(b"mine")
        assert c.stat("/carol/f").st_uid == 1100
        with pytest.raises(PermissionError):
            c.open("/rootonly/x", "wb")
    finally:
        c.close()
    for kw in ({"uid": 0}, {"uid": 0, "gid": 0}, {"uid": 1101}, {"gid": 0}, {"groups": (0,)}):
        liar = cluster.connect(token=token, **kw)
        try:
            with pytest.raises(PermissionError) as e:
                liar.listdir("/carol")
            assert "may not act as" in str(e.value), kw
            with pytest.raises(PermissionError):
                liar.open("/rootonly/x", "wb")
        finally:
            liar.close()
    with cluster.connect() as root:
        assert root.listdir("/rootonly") == []


@pytest.mark.parametrize("transport", ["native-uds", "grpc"])
def test_admin_rpcs_need_an_admin_credential(cluster: ProcessCluster, transport: str) -> None:
    plain = add_user(cluster, f"dave-{transport}", 1200, 1200)
    boss = add_user(cluster, f"erin-{transport}", 1201, 1201, "--admin")
    a = addresses(cluster)

    async def main() -> None:
        async with pooled(transport, auth.Credential(token=plain)) as pool:
            mg = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(a["mgmtd"]))
            for coro in (
                call(
                    mg.SetTargetState, mgmtd_pb2.SetTargetStateRequest(target_id=101, offline=True)
                ),
                call(
                    mg.CreateChainTable, mgmtd_pb2.CreateChainTableRequest(table_id=9, replicas=1)
                ),
                call(mg.AddUser, mgmtd_pb2.AddUserRequest(name="mallory", uid=0, gid=0)),
                call(mg.UserToken, mgmtd_pb2.UserTokenRequest(name="carol")),
                call(mg.RemoveUser, mgmtd_pb2.RemoveUserRequest(name="carol")),
                call(mg.Heartbeat, mgmtd_pb2.HeartbeatRequest(node_id=10001)),
            ):
                assert await code_of(coro) == Code.PERMISSION_DENIED
            assert await code_of(call(mg.GetRoutingInfo, mgmtd_pb2.GetRoutingInfoRequest())) == "ok"
        async with pooled(transport, auth.Credential(token=boss)) as pool:
            mg = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(a["mgmtd"]))
            req = mgmtd_pb2.SetTargetStateRequest(target_id=101, offline=False)  # no change
            assert await code_of(call(mg.SetTargetState, req)) == "ok"
            assert await code_of(call(mg.ListUsers, mgmtd_pb2.ListUsersRequest())) == "ok"
            # an admin user is still no service: it cannot pose as a storage node
            hb = mgmtd_pb2.HeartbeatRequest(node_id=10001)
            assert await code_of(call(mg.Heartbeat, hb)) == Code.PERMISSION_DENIED

    asyncio.run(main())
    users = json.loads(admin(cluster, "--json", "user", "list").stdout)
    assert "mallory" not in {u["name"] for u in users}
    assert set(cluster.target_states(cluster.status()).values()) == {"serving"}


def test_a_removed_or_rotated_users_token_is_refused(cluster: ProcessCluster) -> None:
    token = add_user(cluster, "frank", 1300, 1300)
    c = cluster.connect(token=token)
    try:
        c.listdir("/")
        admin(cluster, "user", "remove", "frank")
        deadline = time.monotonic() + 4 * auth.RECHECK_S
        while True:  # the open connection: refused at its next recheck
            try:
                c.listdir("/")
            except PermissionError as e:
                assert "revoked" in str(e)
                break
            assert time.monotonic() < deadline, "removed user still served"
            time.sleep(0.2)
    finally:
        c.close()
    with pytest.raises(PermissionError, match="removed"):
        cluster.connect(token=token).listdir("/")
    # rotation: the old token stops, the new one works
    old = add_user(cluster, "grace", 1301, 1301)
    new = admin(cluster, "user", "token", "grace", "--rotate").stdout.strip()
    assert new != old
    with pytest.raises(PermissionError, match="replaced"):
        cluster.connect(token=old).listdir("/")
    c = cluster.connect(token=new)
    try:
        c.listdir("/")
    finally:
        c.close()


def test_token_from_the_environment(cluster: ProcessCluster, tmp_path: Path) -> None:
    """FS3_TOKEN_FILE names the credential of a process that has no cluster secret."""
    token = add_user(cluster, "heidi", 1400, 1400)
    tf = tmp_path / "token"
    tf.write_text(token + "\n")
    cf = tmp_path / "fs3.cluster"  # a copy of the cluster file, away from the secret
    shutil.copy(cluster.cluster_file, cf)
    code = (
        "import fs3, json\n"
        f"c = fs3.connect({str(cf)!r})\n"
        "print(json.dumps([c.caller.uid, c.caller.gid, sorted(c.listdir('/'))[:1]]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FS3_TOKEN")}
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "FS3_TOKEN_FILE": str(tf)},
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[:2] == [1400, 1400]
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert r.returncode != 0 and "no credential" in r.stderr


# ------------------------------------------------------------------- FUSE: the mount credential


@needs_fuse
@pytest.mark.fuse
def test_fuse_acts_for_each_local_user_with_their_own_permissions(cluster: ProcessCluster) -> None:
    """The mount's credential passes on the kernel's uid/gid; meta checks each user."""
    import errno

    assert cluster.mountpoint
    base = Path(cluster.mountpoint) / "perm"
    base.mkdir()
    base.chmod(0o777)
    users = [(2001, 2001), (2002, 2002), (65534, 65534)]
    for uid, gid in users:
        home = base / str(uid)
        assert run_as(uid, gid, [], f"os.mkdir({str(home)!r}, 0o700); result = 'ok'") == "ok"
        r = run_as(uid, gid, [], f"open({str(home / 'f')!r}, 'w').write('x'); result = 'ok'")
        assert r == "ok"
        st = (home / "f").stat()
        assert (st.st_uid, st.st_gid) == (uid, gid)
    for uid, gid in users:
        for other, _ in users:
            if other == uid:
                continue
            r = run_as(uid, gid, [], f"result = os.listdir({str(base / str(other))!r})")
            assert r == {"errno": errno.EACCES}, (uid, other)
            r = run_as(uid, gid, [], f"open({str(base / str(other) / 'g')!r}, 'w'); result = 'ok'")
            assert r == {"errno": errno.EACCES}
        r = run_as(uid, gid, [], f"os.chown({str(base / str(uid) / 'f')!r}, 0, 0); result = 'ok'")
        assert r == {"errno": errno.EPERM}
        r = run_as(
            uid, gid, [], f"os.mkdir({str(Path(cluster.mountpoint) / 'x')!r}); result = 'ok'"
        )
        assert r == {"errno": errno.EACCES}
    # the mount token is no admin credential
    token = Path(cluster.cluster_file).parent.joinpath("fuse.token").read_text()

    async def try_admin() -> Any:
        async with pooled("native-uds", auth.Credential(token=token)) as pool:
            mg = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(addresses(cluster)["mgmtd"]))
            req = mgmtd_pb2.SetTargetStateRequest(target_id=101, offline=True)
            return await code_of(call(mg.SetTargetState, req))

    assert asyncio.run(try_admin()) == Code.PERMISSION_DENIED
