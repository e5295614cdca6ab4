"""The blocking native client (fs3/rpc/native/sync_client.py) against a real server.

The server is ``fs3.rpc.server.RpcServer`` serving a scripted MetaService on an
asyncio loop in a background thread (``fs3.client.bridge.Bridge``); the test's
own threads call it with :class:`SyncNativeClient`, as the sync Python API
does: answers, the server's errors, deadlines, a server restart under a kept
connection, an answer over the limit, refused credentials, many threads.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fs3.client.bridge import Bridge
from fs3.config import RpcSection
from fs3.errors import Code, FsError, posix
from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc
from fs3.rpc import auth
from fs3.rpc.native.sync_client import SyncNativeClient, SyncPool, sync_client
from fs3.rpc.server import add_servicer, bind, create_server
from fs3.security import keys
from fs3.security.tokens import Signer

pytestmark = pytest.mark.timeout(60)

LOOKUP = "/fs3.v1.MetaService/Lookup"
READLINK = "/fs3.v1.MetaService/ReadLink"
STATFS = "/fs3.v1.MetaService/StatFs"


class Meta(meta_pb2_grpc.MetaServiceServicer):
    """Scripted meta: Lookup answers by name; ReadLink answers ``inode`` bytes."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.calls = 0

    async def Lookup(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if request.name == b"missing":
            raise posix(errno.ENOENT, "no such entry")
        if request.name == b"slow":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return meta_pb2.AttrResponse(
            attr=meta_pb2.Attr(inode=request.parent * 1000 + len(request.name), mode=0o100644)
        )

    async def ReadLink(self, request: Any, context: Any) -> Any:
        return meta_pb2.ReadLinkResponse(target=b"x" * request.inode)

    async def StatFs(self, request: Any, context: Any) -> Any:
        return meta_pb2.StatFsResponse(block_size=request.user.uid + 1)


class Server:
    """A real RpcServer on the bridge's loop; restartable on the same port."""

    def __init__(self, bridge: Bridge, rpc: RpcSection | None = None) -> None:
        self.bridge = bridge
        self.rpc = rpc or RpcSection()
        self.meta = Meta()
        self.port = 0
        self.server: Any = None
        self.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        async def go() -> None:
            self.server = create_server(self.rpc)
            add_servicer(self.server, meta_pb2_grpc.add_MetaServiceServicer_to_server, self.meta)
            self.port = bind(self.server, "127.0.0.1", self.port)
            await self.server.start()

        self.bridge.run(go(), timeout=20)

    def stop(self) -> None:
        self.bridge.run(self.server.stop(0), timeout=20)


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge(name="test-server-loop")
    yield b
    b.close()


@pytest.fixture
def server(bridge: Bridge) -> Iterator[Server]:
    s = Server(bridge)
    yield s
    s.stop()


def _lookup(name: bytes, parent: int = 1) -> meta_pb2.LookupRequest:
    return meta_pb2.LookupRequest(user=common_pb2.UserInfo(uid=0), parent=parent, name=name)


def _client(server: Server, via: str, **kw: Any) -> SyncNativeClient:
    return SyncNativeClient(server.address, prefer_uds=via == "unix", **kw)


@pytest.mark.parametrize("via", ["unix", "tcp"])
def test_answers_and_server_errors(server: Server, via: str) -> None:
    c = _client(server, via)
    try:
        r = c.call(LOOKUP, _lookup(b"abc", parent=7), timeout=5)
        assert r.attr.inode == 7003
        assert c.via == via
        with pytest.raises(FsError) as ei:
            c.call(LOOKUP, _lookup(b"missing"), timeout=5)
        # the server's FsError, rebuilt as the asyncio client rebuilds it
        assert ei.value.code == Code.POSIX and ei.value.errno == errno.ENOENT
        assert not ei.value.retryable and "no such entry" in ei.value.message
        # an error answer leaves the connection in use
        assert c.call(LOOKUP, _lookup(b"a", parent=2), timeout=5).attr.inode == 2001
        assert c.connects == 1
        with pytest.raises(FsError) as ei:
            c.call("/fs3.v1.MetaService/NoSuchMethod", _lookup(b"a"))
        assert ei.value.code == Code.INVALID_ARGUMENT
    finally:
        c.close()
    with pytest.raises(FsError) as ei:
        c.call(LOOKUP, _lookup(b"abc"), timeout=5)
    assert ei.value.code == Code.UNAVAILABLE


@pytest.mark.parametrize("via", ["unix", "tcp"])
def test_deadline_fails_the_call_and_cancels_it_on_the_server(server: Server, via: str) -> None:
    c = _client(server, via)
    try:
        assert c.call(LOOKUP, _lookup(b"a"), timeout=5).attr.inode == 1001
        t0 = time.monotonic()
        with pytest.raises(FsError) as ei:
            c.call(LOOKUP, _lookup(b"slow"), timeout=0.3)
        took = time.monotonic() - t0
        assert ei.value.code == Code.TIMEOUT and ei.value.retryable
        assert 0.25 <= took < 5
        # the server got the deadline with the call (or saw the connection close)
        assert server.meta.cancelled.wait(10)
        assert c.call(LOOKUP, _lookup(b"ab"), timeout=5).attr.inode == 1002
    finally:
        c.close()


def test_deadline_with_a_peer_that_never_answers() -> None:
    """The socket timeout alone ends the call; its connection is closed, not reused."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)  # connections complete in the backlog; nothing is ever read or sent
    try:
        c = SyncNativeClient(f"127.0.0.1:{lsock.getsockname()[1]}", prefer_uds=False)
        for n in (1, 2):
            t0 = time.monotonic()
            with pytest.raises(FsError) as ei:
                c.call(LOOKUP, _lookup(b"a"), timeout=0.3)
            assert ei.value.code == Code.TIMEOUT and ei.value.retryable
            assert 0.25 <= time.monotonic() - t0 < 5
            assert c.connects == n  # a timed-out connection is never used again
            assert c.via == ""
        c.close()
    finally:
        lsock.close()


@pytest.mark.parametrize("via", ["unix", "tcp"])
def test_a_restarted_server_is_reached_on_a_new_connection(server: Server, via: str) -> None:
    c = _client(server, via)
    try:
        assert c.call(LOOKUP, _lookup(b"a"), timeout=5).attr.inode == 1001
        server.stop()
        with pytest.raises(FsError) as ei:  # down: a retryable UNAVAILABLE
            c.call(LOOKUP, _lookup(b"a"), timeout=5)
        assert ei.value.code == Code.UNAVAILABLE and ei.value.retryable
        server.start()
        assert c.call(LOOKUP, _lookup(b"a"), timeout=5).attr.inode == 1001
        n = c.connects
        # a server restart while the connection idles: the call goes through on a new one
        server.stop()
        server.start()
        assert c.call(LOOKUP, _lookup(b"abc"), timeout=5).attr.inode == 1003
        assert c.connects == n + 1
        # ... but not a call that must not be sent twice
        server.stop()
        server.start()
        with pytest.raises(FsError) as ei:
            c.call(LOOKUP, _lookup(b"abc"), timeout=5, idempotent=False)
        assert ei.value.code == Code.UNAVAILABLE and ei.value.retryable
        assert c.call(LOOKUP, _lookup(b"abc"), timeout=5).attr.inode == 1003
    finally:
        c.close()


@pytest.mark.parametrize("via", ["unix", "tcp"])
def test_an_answer_over_the_limit_is_refused(server: Server, via: str) -> None:
    c = _client(server, via, max_message_bytes=4096)
    try:
        assert len(c.call(READLINK, meta_pb2.ReadLinkRequest(inode=4000), timeout=5).target) == (
            4000
        )
        with pytest.raises(FsError) as ei:
            c.call(READLINK, meta_pb2.ReadLinkRequest(inode=100_000), timeout=5)
        assert ei.value.code == Code.UNAVAILABLE and not ei.value.retryable
        assert "exceeds the limit 4096" in ei.value.message
        # a request over the limit is not sent at all
        with pytest.raises(FsError) as ei:
            c.call(LOOKUP, _lookup(b"n" * 5000), timeout=5)
        assert ei.value.code == Code.INVALID_ARGUMENT
        # the connection was dropped; the next call works on a new one
        assert len(c.call(READLINK, meta_pb2.ReadLinkRequest(inode=10), timeout=5).target) == 10
    finally:
        c.close()
    # an answer larger than the receive buffer, within the limit, arrives whole
    big = _client(server, via)
    try:
        r = big.call(READLINK, meta_pb2.ReadLinkRequest(inode=1_000_000), timeout=10)
        assert r.target == b"x" * 1_000_000
    finally:
        big.close()


@pytest.mark.parametrize("via", ["unix", "tcp"])
def test_credentials_are_checked(bridge: Bridge, tmp_path: Path, via: str) -> None:
    secret = tmp_path / keys.SECRET_FILE_NAME
    signer = Signer(keys.create_secret(secret))
    srv = Server(bridge, RpcSection(secret_file=str(secret)))
    try:
        req = meta_pb2.StatFsRequest(user=common_pb2.UserInfo(uid=5))
        for token in ("", Signer(bytes(32)).service_token("intruder"), "not-a-token"):
            c = SyncNativeClient(srv.address, prefer_uds=via == "unix", token=token)
            try:
                with pytest.raises(FsError) as ei:
                    c.call(STATFS, req, timeout=5)
                assert ei.value.code == Code.UNAUTHENTICATED
            finally:
                c.close()
        c = SyncNativeClient(
            srv.address, prefer_uds=via == "unix", token=signer.service_token("test")
        )
        try:
            assert c.call(STATFS, req, timeout=5).block_size == 6
        finally:
            c.close()
    finally:
        srv.stop()
        auth.set_default(None)


def test_threads_each_use_their_own_connection(server: Server) -> None:
    pool = SyncPool(RpcSection())
    c = pool.get(server.address)
    assert pool.get(server.address) is c
    errors: list[BaseException] = []
    go = threading.Barrier(8)

    def worker(k: int) -> None:
        try:
            go.wait(10)
            for i in range(60):
                name = b"n" * (1 + (k * 7 + i) % 50)
                r = c.call(LOOKUP, _lookup(name, parent=k + 1), timeout=10)
                assert r.attr.inode == (k + 1) * 1000 + len(name)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    pool.close()
    assert not errors, errors
    assert c.connects == 8
    assert server.meta.calls == 8 * 60


def test_a_forked_child_never_uses_the_parents_connection(server: Server) -> None:
    """A child process (e.g. a data loader worker) connects on its own; the parent's
    connection keeps working, its frames never interleaved with the child's."""
    import multiprocessing

    c = _client(server, "unix")
    try:
        assert c.call(LOOKUP, _lookup(b"a"), timeout=5).attr.inode == 1001
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()

        def child() -> None:
            try:
                for i in range(50):
                    r = c.call(LOOKUP, _lookup(b"c" * (1 + i % 9), parent=9), timeout=5)
                    assert r.attr.inode == 9000 + 1 + i % 9
                q.put(("ok", c.connects))
            except BaseException as e:
                q.put(("error", repr(e)))

        p = ctx.Process(target=child)
        p.start()
        for i in range(50):  # the parent calls meanwhile, on its own connection
            assert c.call(LOOKUP, _lookup(b"p" * (1 + i % 7)), timeout=5).attr.inode == (
                1000 + 1 + i % 7
            )
        status, got = q.get(timeout=30)
        p.join(30)
        assert status == "ok", got
        assert got == 2  # the child made its own connection
        assert c.connects == 1 and c.call(LOOKUP, _lookup(b"ab"), timeout=5).attr.inode == 1002
    finally:
        c.close()


def test_tls_over_tcp(bridge: Bridge, tmp_path: Path) -> None:
    """With the cluster's CA the TCP connection is TLS (what sync_client() builds from a
    credential naming a CA); a client that does not trust the server's CA cannot call."""
    from fs3.security import tls

    ca, _ = tls.ensure_ca(tmp_path / "tls")
    cert, key = tls.issue(tmp_path / "tls", "node-1")
    srv = Server(bridge, RpcSection(tls_cert=str(cert), tls_key=str(key)))
    try:
        cred = auth.Credential(tls_ca=str(ca))
        c = sync_client(srv.address, RpcSection(unix_sockets=False), cred)
        try:
            assert c.ssl is not None
            assert c.call(LOOKUP, _lookup(b"tls", parent=3), timeout=10).attr.inode == 3003
            assert c.via == "tcp"
        finally:
            c.close()
        other, _ = tls.ensure_ca(tmp_path / "other")
        bad = sync_client(
            srv.address, RpcSection(unix_sockets=False), auth.Credential(tls_ca=str(other))
        )
        try:
            with pytest.raises(FsError) as ei:
                bad.call(LOOKUP, _lookup(b"tls"), timeout=10)
            assert ei.value.code == Code.UNAVAILABLE and "TLS" in ei.value.message
        finally:
            bad.close()
    finally:
        srv.stop()


def test_an_interrupted_call_drops_its_connection(server: Server) -> None:
    """Ctrl-C in a blocking receive: the answer may come later or half read, so the
    connection is never used again; the next call gets its own answer on a new one."""
    import signal

    c = _client(server, "unix")

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    # pytest-timeout's own alarm (signal method) is put back afterwards
    prev_handler = signal.signal(signal.SIGALRM, interrupt)
    prev_delay, t0 = signal.getitimer(signal.ITIMER_REAL)[0], time.monotonic()
    try:
        assert c.call(LOOKUP, _lookup(b"a"), timeout=5).attr.inode == 1001
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            c.call(LOOKUP, _lookup(b"slow"), timeout=5)
        assert c.via == ""
        assert c.call(LOOKUP, _lookup(b"abcd"), timeout=5).attr.inode == 1004
        assert c.connects == 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, prev_handler)
        if prev_delay > 0:
            left = prev_delay - (time.monotonic() - t0)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))
        c.close()
