"""Authentication and authorization on a real RpcServer, on every transport (fs3/rpc/auth.py).

The server is ``fs3.rpc.server.RpcServer`` with a cluster secret (both
transports on one port, optionally TLS); the servicers are scripted doubles of
the real proto services, so what is exercised is the real handshake (native
AUTH frame, gRPC metadata), the real guard and the real policy table.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from fs3.config import RpcSection
from fs3.errors import Code, FsError
from fs3.proto import (
    common_pb2,
    meta_pb2,
    meta_pb2_grpc,
    mgmtd_pb2,
    mgmtd_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
)
from fs3.rpc import auth, settings
from fs3.rpc.channel import BidiStream, ChannelPool, call
from fs3.rpc.loop import run
from fs3.rpc.native import wire
from fs3.rpc.server import add_servicer, bind, create_server
from fs3.security import keys, tls
from fs3.security.tokens import Claims, Signer
from fs3.testing.rpc import TRANSPORTS, code_of, pooled

pytestmark = pytest.mark.timeout(60)


class Meta(meta_pb2_grpc.MetaServiceServicer):
    async def StatFs(self, request: Any, context: Any) -> Any:
        return meta_pb2.StatFsResponse(block_size=request.user.uid + 1)

    async def PruneSessions(self, request: Any, context: Any) -> Any:
        return meta_pb2.PruneSessionsResponse(pruned=1)


class Mgmtd(mgmtd_pb2_grpc.MgmtdServiceServicer):
    async def GetLeader(self, request: Any, context: Any) -> Any:
        return mgmtd_pb2.GetLeaderResponse(node_id=7, is_leader=True)

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        return mgmtd_pb2.HeartbeatResponse(last_hb_version=1)


class Storage(storage_pb2_grpc.StorageServiceServicer):
    async def ReadStream(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        async for _req in requests:
            yield storage_pb2.BatchReadResponse()


class Users:
    """The user records a server confirms user tokens against (mgmtd's KV in production)."""

    def __init__(self) -> None:
        self.records: dict[str, mgmtd_pb2.UserRecord] = {}
        self.lookups = 0
        self.down = False  # the records cannot be reached (mgmtd failing over)

    def add(self, signer: Signer, name: str, uid: int, gid: int, admin: bool = False) -> str:
        rec = mgmtd_pb2.UserRecord(
            name=name, uid=uid, gid=gid, groups=[gid], admin=admin, token_id=f"id-{name}"
        )
        self.records[name] = rec
        return signer.sign(
            Claims(
                kind="user",
                name=name,
                uid=uid,
                gid=gid,
                groups=(gid,),
                admin=admin,
                token_id=rec.token_id,
            )
        )

    async def lookup(self, name: str) -> Any:
        if self.down:
            raise FsError(Code.UNAVAILABLE, "mgmtd is failing over", retryable=True)
        self.lookups += 1
        return self.records.get(name)


class Env:
    def __init__(self, tmp: Path, use_tls: bool) -> None:
        self.secret_file = tmp / keys.SECRET_FILE_NAME
        self.signer = Signer(keys.create_secret(self.secret_file))
        self.users = Users()
        self.ca = ""
        rpc = RpcSection(secret_file=str(self.secret_file))
        if use_tls:
            ca, _ = tls.ensure_ca(tmp / "tls")
            cert, key = tls.issue(tmp / "tls", "node-1")
            self.ca = str(ca)
            rpc = RpcSection(
                secret_file=str(self.secret_file), tls_cert=str(cert), tls_key=str(key)
            )
        self.rpc = rpc
        self.service = self.signer.service_token("test-service")
        self.alice = self.users.add(self.signer, "alice", 1000, 100)
        self.root_admin = self.users.add(self.signer, "ops", 1001, 100, admin=True)

    def cred(self, token: str = "") -> auth.Credential:
        return auth.Credential(token=token, tls_ca=self.ca)


class Node:
    def __init__(self, env: Env) -> None:
        self.server = create_server(env.rpc)
        assert self.server.auth is not None
        self.server.auth.lookup = env.users.lookup
        add_servicer(self.server, meta_pb2_grpc.add_MetaServiceServicer_to_server, Meta())
        add_servicer(self.server, mgmtd_pb2_grpc.add_MgmtdServiceServicer_to_server, Mgmtd())
        add_servicer(self.server, storage_pb2_grpc.add_StorageServiceServicer_to_server, Storage())
        self.address = ""

    async def __aenter__(self) -> Node:
        self.address = f"127.0.0.1:{bind(self.server, '127.0.0.1', 0)}"
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    yield
    settings.configure(RpcSection())
    auth.set_default(None)


async def _statfs(pool: ChannelPool, address: str, uid: int, gid: int = 100) -> Any:
    stub = meta_pb2_grpc.MetaServiceStub(pool.get(address))
    req = meta_pb2.StatFsRequest(user=common_pb2.UserInfo(uid=uid, gid=gid, groups=[gid]))
    return await call(stub.StatFs, req, timeout=5)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unauthenticated_calls_are_refused_and_probes_stay_open(
    tmp_path: Path, transport: str
) -> None:
    env = Env(tmp_path, use_tls=False)

    async def main() -> None:
        async with Node(env) as node:
            async with pooled(transport, env.cred()) as pool:
                with pytest.raises(FsError) as e:
                    await _statfs(pool, node.address, 0)
                assert e.value.code == Code.UNAUTHENTICATED
                assert "no credential" in e.value.message
                stub = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(node.address))
                assert await code_of(call(stub.Heartbeat, mgmtd_pb2.HeartbeatRequest())) == (
                    Code.UNAUTHENTICATED
                )
                r = await call(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=5)
                assert r.node_id == 7  # the health probe answers without a credential

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_forged_and_foreign_tokens_are_refused(tmp_path: Path, transport: str) -> None:
    env = Env(tmp_path, use_tls=False)
    foreign = Signer(bytes(32)).service_token("intruder")
    head, body, mac = env.alice.split(".")
    forged = f"{head}.{body}.{mac[:-4]}AAAA"

    async def main() -> None:
        async with Node(env) as node:
            for tok in (foreign, forged, "not-a-token"):
                async with pooled(transport, env.cred(tok)) as pool:
                    with pytest.raises(FsError) as e:
                        await _statfs(pool, node.address, 1000)
                    assert e.value.code == Code.UNAUTHENTICATED, tok

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_user_token_acts_only_as_its_own_identity(tmp_path: Path, transport: str) -> None:
    env = Env(tmp_path, use_tls=False)

    async def main() -> None:
        async with Node(env) as node:
            async with pooled(transport, env.cred(env.alice)) as pool:
                assert (await _statfs(pool, node.address, 1000)).block_size == 1001
                for uid, gid in ((0, 0), (0, 100), (1001, 100), (1000, 0)):
                    with pytest.raises(FsError) as e:
                        await _statfs(pool, node.address, uid, gid)
                    assert e.value.code == Code.PERMISSION_DENIED
                    assert "may not act as" in e.value.message
                # a request without a user at all claims uid 0: refused too
                stub = meta_pb2_grpc.MetaServiceStub(pool.get(node.address))
                assert await code_of(call(stub.StatFs, meta_pb2.StatFsRequest())) == (
                    Code.PERMISSION_DENIED
                )
            # a service credential passes its callers' identities on
            async with pooled(transport, env.cred(env.service)) as svc:
                assert (await _statfs(svc, node.address, 0)).block_size == 1

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_levels_admin_and_service_methods(tmp_path: Path, transport: str) -> None:
    env = Env(tmp_path, use_tls=False)

    async def main() -> None:
        async with Node(env) as node:
            for tok, prune, heartbeat in (
                (env.alice, Code.PERMISSION_DENIED, Code.PERMISSION_DENIED),
                (env.root_admin, "ok", Code.PERMISSION_DENIED),
                (env.service, "ok", "ok"),
            ):
                uid = 1000 if tok == env.alice else 1001
                async with pooled(transport, env.cred(tok)) as pool:
                    meta = meta_pb2_grpc.MetaServiceStub(pool.get(node.address))
                    req = meta_pb2.PruneSessionsRequest(
                        user=common_pb2.UserInfo(uid=uid, gid=100, groups=[100])
                    )
                    assert await code_of(call(meta.PruneSessions, req)) == prune
                    mg = mgmtd_pb2_grpc.MgmtdServiceStub(pool.get(node.address))
                    hb = mgmtd_pb2.HeartbeatRequest()
                    assert await code_of(call(mg.Heartbeat, hb)) == heartbeat

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_removed_user_is_refused_on_new_and_open_connections(
    tmp_path: Path, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = Env(tmp_path, use_tls=False)
    monkeypatch.setattr(auth, "RECHECK_S", 0.2)

    async def main() -> None:
        async with Node(env) as node:
            async with pooled(transport, env.cred(env.alice)) as pool:
                await _statfs(pool, node.address, 1000)
                del env.users.records["alice"]
                deadline = time.monotonic() + 10
                while True:  # the open connection: refused once its principal is rechecked
                    code = await code_of(_statfs(pool, node.address, 1000))
                    if code == Code.UNAUTHENTICATED or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                assert code == Code.UNAUTHENTICATED
            async with pooled(transport, env.cred(env.alice)) as fresh:
                with pytest.raises(FsError) as e:
                    await _statfs(fresh, node.address, 1000)
                assert e.value.code == Code.UNAUTHENTICATED
                assert "removed" in e.value.message

    run(main())


def test_a_rotated_token_is_refused(tmp_path: Path) -> None:
    env = Env(tmp_path, use_tls=False)

    async def main() -> None:
        async with Node(env) as node:
            env.users.records["alice"].token_id = "rotated"
            async with pooled("native-uds", env.cred(env.alice)) as pool:
                with pytest.raises(FsError) as e:
                    await _statfs(pool, node.address, 1000)
                assert e.value.code == Code.UNAUTHENTICATED and "replaced" in e.value.message

    run(main())


def test_native_checks_once_per_connection(tmp_path: Path) -> None:
    """Many calls on one native connection: the user record is read once, not per call."""
    env = Env(tmp_path, use_tls=False)

    async def main() -> None:
        async with Node(env) as node:
            async with pooled("native-uds", env.cred(env.alice)) as pool:
                await asyncio.gather(*(_statfs(pool, node.address, 1000) for _ in range(200)))
                assert env.users.lookups == 1

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_request_streams_are_authenticated(tmp_path: Path, transport: str) -> None:
    env = Env(tmp_path, use_tls=False)

    async def main() -> None:
        async with Node(env) as node:
            for tok, ok in (("", False), (env.alice, True)):
                async with pooled(transport, env.cred(tok)) as pool:
                    stub = storage_pb2_grpc.StorageServiceStub(pool.get(node.address))
                    s = BidiStream(stub.ReadStream)
                    try:
                        await s.write(storage_pb2.BatchReadRequest())
                    except FsError:
                        assert not ok  # refused before the write: the reason comes below
                    got: Any = None
                    try:
                        async for r in s.responses():
                            got = r
                            break
                    except FsError as e:
                        got = e
                    s.cancel()
                    if ok:
                        assert isinstance(got, storage_pb2.BatchReadResponse)
                    else:
                        assert isinstance(got, FsError) and got.code == Code.UNAUTHENTICATED

    run(main())


def test_auth_frame_after_a_call_closes_the_connection(tmp_path: Path) -> None:
    """AUTH is only valid as the first frame: a late one is a protocol violation (closed)."""
    env = Env(tmp_path, use_tls=False)

    async def main() -> None:
        async with Node(env) as node:
            host, port = node.address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            body = meta_pb2.StatFsRequest().SerializeToString()
            from fs3.rpc.native.methods import service_methods

            mid = next(m.id for m in service_methods("fs3.v1.MetaService") if m.name == "StatFs")
            writer.write(
                wire.PREFACE
                + wire.pack(wire.CALL, wire.HAS_MESSAGE, mid, 1, 0, body)
                + wire.pack(wire.AUTH, wire.HAS_MESSAGE, 0, 0, 0, env.service.encode())
            )
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(), 10)  # until the server closes
            except ConnectionResetError:
                data = b""
            writer.close()
            # closed without a successful answer to the call made before AUTH
            assert data == b"" or wire.HEADER.unpack_from(data, 0)[0] == wire.ERROR

    run(main())


@pytest.mark.parametrize("transport", ["native-tcp", "grpc"])
def test_tls_server_serves_tls_clients_and_refuses_plaintext(
    tmp_path: Path, transport: str
) -> None:
    env = Env(tmp_path, use_tls=True)

    async def main() -> None:
        async with Node(env) as node:
            async with pooled(transport, env.cred(env.alice)) as pool:
                assert (await _statfs(pool, node.address, 1000)).block_size == 1001
            async with pooled(transport, auth.Credential(token=env.alice)) as plain:
                with pytest.raises(FsError) as e:
                    await _statfs(plain, node.address, 1000)
                assert e.value.code in (Code.UNAVAILABLE, Code.TIMEOUT)

    run(main())


def test_server_without_secret_does_not_authenticate(tmp_path: Path) -> None:
    """No [rpc] secret_file: no authenticator (the launcher and deploy always set one)."""
    assert auth.server_authenticator(RpcSection()) is None

    async def main() -> None:
        assert create_server(RpcSection()).auth is None

    run(main())


def test_unreachable_user_records_neither_admit_nor_stick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records down at connect: the connection closes (retryable); later it works.

    Records down at a recheck: the user confirmed before keeps being served.
    """
    env = Env(tmp_path, use_tls=False)
    monkeypatch.setattr(auth, "RECHECK_S", 0.1)
    env.users.down = True

    async def main() -> None:
        async with Node(env) as node:
            assert node.server.auth is not None
            async with pooled("native-uds", env.cred(env.alice)) as pool:
                with pytest.raises(FsError) as e:
                    await _statfs(pool, node.address, 1000)
                assert e.value.code == Code.UNAVAILABLE and e.value.retryable
                env.users.down = False
                await pool.drop(node.address)
                assert (await _statfs(pool, node.address, 1000)).block_size == 1001
                env.users.down = True
                await asyncio.sleep(0.3)  # past the recheck interval
                assert (await _statfs(pool, node.address, 1000)).block_size == 1001

    run(main())


def test_grpc_user_token_is_never_admitted_unconfirmed_and_revocation_is_cached(
    tmp_path: Path,
) -> None:
    env = Env(tmp_path, use_tls=False)
    env.users.down = True

    async def main() -> None:
        async with Node(env) as node:
            assert node.server.auth is not None
            async with pooled("grpc", env.cred(env.alice)) as pool:
                assert await code_of(_statfs(pool, node.address, 1000)) == Code.UNAVAILABLE
                env.users.down = False
                assert await code_of(_statfs(pool, node.address, 1000)) == "ok"
            del env.users.records["ops"]
            async with pooled("grpc", env.cred(env.root_admin)) as pool:
                before = env.users.lookups
                for _ in range(5):
                    assert await code_of(_statfs(pool, node.address, 1001)) == Code.UNAUTHENTICATED
                assert env.users.lookups == before + 1  # the refusal is remembered

    run(main())
