"""Chunk capabilities at storage: forged, tampered, expired, mis-scoped grants are refused.

Each attack speaks the StorageService RPCs directly (a hostile client needs no
fs3 client code) against a cluster with a secret. After each one the victim
file reads back unchanged through a normal client, every replica's chunk
metadata is what it was, and the servers are still up. A positive control with
a correctly minted capability shows the raw path itself can write, so the
refusals are the capability check and not a malformed request.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import grpc
import pytest

from fs3.errors import Code, FsError
from fs3.proto import storage_pb2, storage_pb2_grpc
from fs3.rpc.channel import call_sync, sync_channel
from fs3.security import capability as C
from fs3.security.keys import PURPOSE_CAPABILITY, derive_key
from fs3.testing.cluster import ProcessCluster
from tests.security.conftest import CAP_TTL_S, HAVE_FUSE, all_alive

pytestmark = [pytest.mark.security, pytest.mark.integration, pytest.mark.timeout(180)]

CHUNK = 1 << 20
VICTIM = bytes((i * 7 + 3) % 251 for i in range(CHUNK + CHUNK // 2))  # two chunks


class Chain:
    def __init__(self, c: ProcessCluster) -> None:
        s = c.status()
        ch = s["chains"][0]
        self.id, self.version = int(ch["id"]), int(ch["version"])
        self.head, self.succ = int(ch["targets"][0]), int(ch["targets"][1])
        node = {t["id"]: t["node"] for t in s["targets"]}
        addr = {p["name"]: p["address"] for p in s["processes"]}
        self.head_addr, self.succ_addr = addr[node[self.head]], addr[node[self.succ]]


@pytest.fixture(scope="module")
def chans(secure_cluster: ProcessCluster) -> Iterator[dict[str, grpc.Channel]]:
    ch = Chain(secure_cluster)
    out = {"head": sync_channel(ch.head_addr), "succ": sync_channel(ch.succ_addr)}
    yield out
    for c in out.values():
        c.close()


@pytest.fixture(scope="module")
def victim(client: Any, secure_cluster: ProcessCluster) -> dict[str, Any]:
    client.makedirs("/cap", exist_ok=True)
    with client.open("/cap/victim", "wb") as f:
        f.write(VICTIM)
    with client.open("/cap/mine", "wb") as f:
        f.write(b"mine")
    core = client.core
    v = client.bridge.run(core.resolve(client.caller, "/cap/victim"))
    m = client.bridge.run(core.resolve(client.caller, "/cap/mine"))
    chains = list(v.layout.chain_ids)
    ch = Chain(secure_cluster)
    # single-chain cluster: every chunk of the file is on the chain the attacks use
    assert set(chains) == {ch.id}
    return {"inode": int(v.inode), "mine": int(m.inode), "chain": ch}


def stub(chans: dict[str, grpc.Channel], which: str = "head") -> Any:
    return storage_pb2_grpc.StorageServiceStub(chans[which])  # type: ignore[no-untyped-call]


def replica_state(chans: dict[str, grpc.Channel], ch: Chain, inode: int) -> list[tuple[Any, ...]]:
    out = []
    for which, tid in (("head", ch.head), ("succ", ch.succ)):
        r = call_sync(
            stub(chans, which).ListChunks,
            storage_pb2.ListChunksRequest(target_id=tid, inode=inode),
            timeout=10,
        )
        out += [(tid, m.chunk.index, m.commit_ver, m.length, m.checksum) for m in r.metas]
    return sorted(out)


def mint(
    secret: bytes,
    inode: int,
    rights: int,
    *,
    ttl: float = 60.0,
    clock: Callable[[], float] = time.time,
    first: int = 0,
    last: int = 0xFFFFFFFF,
) -> bytes:
    return C.CapabilitySigner(derive_key(secret, PURPOSE_CAPABILITY), clock).issue(
        inode, rights, ttl, first, last
    )


def write_req(ch: Chain, inode: int, token: bytes, index: int = 0, data: bytes = b"EVIL") -> Any:
    io = storage_pb2.UpdateIO(
        chain_id=ch.id,
        chain_version=ch.version,
        chunk=storage_pb2.ChunkId(inode=inode, index=index),
        type=storage_pb2.UPDATE_WRITE,
        offset=0,
        length=len(data),
        chunk_size=CHUNK,
        checksum=crc32c.crc32c(data),
    )
    io.data.inline = data
    return storage_pb2.WriteRequest(
        io=io,
        tag=storage_pb2.UpdateTag(client_id="attacker", channel_id=0),
        target_id=ch.head,
        capability=token,
    )


def rpc_code(fn: Callable[[], Any]) -> int:
    """The fs3 code of a whole-RPC failure, or of the first per-item error, or 0."""
    try:
        resp = fn()
    except FsError as e:
        return int(e.code)
    for r in getattr(resp, "results", []):
        if r.error.code:
            if hasattr(r, "data"):
                assert not r.data, "a refused read returned bytes"
            return int(r.error.code)
    return 0


def attacks(secret: bytes, v: dict[str, Any]) -> dict[str, tuple[Callable[[Any], Any], int]]:
    """name -> (attack(chans) returning the answer, the fs3 code it must get)."""
    ch: Chain = v["chain"]
    ino, mine = v["inode"], v["mine"]
    other_key_cap = C.CapabilitySigner(derive_key(os.urandom(32), PURPOSE_CAPABILITY)).issue(
        ino, C.WRITE, 60
    )
    read_cap = mint(secret, ino, C.READ)
    tampered = bytearray(read_cap)
    tampered[1] |= C.WRITE  # widen the rights byte, keep the MAC
    expired = mint(secret, ino, C.WRITE, ttl=1, clock=lambda: time.time() - 60)
    mine_w = mint(secret, mine, C.WRITE)
    chunk1_only = mint(secret, ino, C.WRITE, first=1, last=1)
    P = Code.PERMISSION_DENIED

    def via(method: str, req: Any, which: str = "head") -> Callable[[Any], Any]:
        """The attack: ``req`` sent to ``method`` of the head (or the successor)."""
        return lambda cs: call_sync(getattr(stub(cs, which), method), req, timeout=10)

    def w(token: bytes, index: int = 0) -> Callable[[Any], Any]:
        return via("Write", write_req(ch, ino, token, index))

    def trunc(token: bytes) -> Callable[[Any], Any]:
        op = storage_pb2.TruncateChunkOp(
            chain_id=ch.id,
            chain_version=ch.version,
            chunk=storage_pb2.ChunkId(inode=ino, index=0),
            length=0,
            chunk_size=CHUNK,
            capability=token,
        )
        return via("TruncateChunks", storage_pb2.TruncateChunksRequest(ops=[op]))

    def remove(token: bytes) -> Callable[[Any], Any]:
        op = storage_pb2.RemoveChunksOp(
            chain_id=ch.id,
            chain_version=ch.version,
            range=storage_pb2.ChunkRange(inode=ino, begin=0, end=0),
            capability=token,
        )
        return via("RemoveChunks", storage_pb2.RemoveChunksRequest(ops=[op]))

    def read(token: bytes) -> Callable[[Any], Any]:
        io = storage_pb2.ReadIO(
            chain_id=ch.id,
            chain_version=ch.version,
            chunk=storage_pb2.ChunkId(inode=ino, index=0),
            offset=0,
            length=4096,
            capability=token,
        )
        io.dest.inline = b""
        return via("BatchRead", storage_pb2.BatchReadRequest(ios=[io]))

    def update_direct(token: bytes) -> Callable[[Any], Any]:
        req = write_req(ch, ino, token)
        u = storage_pb2.UpdateRequest(
            io=req.io, tag=req.tag, from_target_id=ch.head, to_target_id=ch.succ, capability=token
        )
        u.io.update_ver = 1000
        return via("Update", u, "succ")

    def query(token: bytes) -> Callable[[Any], Any]:
        op = storage_pb2.QueryLastChunkOp(
            chain_id=ch.id,
            chain_version=ch.version,
            range=storage_pb2.ChunkRange(inode=ino),
            capability=token,
        )
        return via("QueryLastChunk", storage_pb2.QueryLastChunkRequest(ops=[op]))

    def sync(method: str, token: bytes) -> Callable[[Any], Any]:
        """SyncStart / SyncDone from the head to the successor."""
        request = getattr(storage_pb2, f"{method}Request")
        return via(
            method,
            request(
                chain_id=ch.id,
                chain_version=ch.version,
                target_id=ch.succ,
                from_target_id=ch.head,
                capability=token,
            ),
            "succ",
        )

    return {
        "write without capability": (w(b""), P),
        "write with random bytes as capability": (w(os.urandom(C.TOKEN_BYTES)), P),
        "write with a capability signed by another key": (w(other_key_cap), P),
        "write with a read capability whose rights were widened": (w(bytes(tampered)), P),
        "write with a read capability": (w(read_cap), P),
        "write with another inode's write capability": (w(mine_w), P),
        "write chunk 0 with a chunk-1-only capability": (w(chunk1_only, 0), P),
        "write with an expired capability": (w(expired), Code.CAPABILITY_EXPIRED),
        "truncate without capability": (trunc(b""), P),
        "truncate with a read capability": (trunc(read_cap), P),
        "remove without capability": (remove(b""), P),
        "remove with another inode's capability": (remove(mine_w), P),
        "remove with a chunk-1-only capability": (remove(chunk1_only), P),
        "read without capability": (read(b""), P),
        "read with another inode's capability": (read(mine_w), P),
        "read with an expired capability": (read(expired), Code.CAPABILITY_EXPIRED),
        "query length without capability": (query(b""), P),
        "Update straight to the successor with a user write capability": (
            update_direct(mint(secret, ino, C.WRITE)),
            P,
        ),
        "SyncDone without a service capability": (sync("SyncDone", b""), P),
        "SyncStart with a user capability": (sync("SyncStart", read_cap), P),
    }


ATTACKS = [
    "write without capability",
    "write with random bytes as capability",
    "write with a capability signed by another key",
    "write with a read capability whose rights were widened",
    "write with a read capability",
    "write with another inode's write capability",
    "write chunk 0 with a chunk-1-only capability",
    "write with an expired capability",
    "truncate without capability",
    "truncate with a read capability",
    "remove without capability",
    "remove with another inode's capability",
    "remove with a chunk-1-only capability",
    "read without capability",
    "read with another inode's capability",
    "read with an expired capability",
    "query length without capability",
    "Update straight to the successor with a user write capability",
    "SyncDone without a service capability",
    "SyncStart with a user capability",
]


@pytest.mark.parametrize("name", ATTACKS)
def test_attack_refused_and_nothing_changes(
    name: str,
    secret: bytes,
    victim: dict[str, Any],
    chans: dict[str, grpc.Channel],
    client: Any,
    secure_cluster: ProcessCluster,
) -> None:
    ch = victim["chain"]
    before = replica_state(chans, ch, victim["inode"])
    assert len(before) == 4  # two chunks on two replicas
    attack, want = attacks(secret, victim)[name]
    assert rpc_code(lambda: attack(chans)) == want
    assert replica_state(chans, ch, victim["inode"]) == before
    with client.open("/cap/victim", "rb") as f:
        assert zlib.crc32(f.read()) == zlib.crc32(VICTIM)
    all_alive(secure_cluster)


def test_positive_control_a_minted_capability_writes(
    secret: bytes, victim: dict[str, Any], chans: dict[str, grpc.Channel], client: Any
) -> None:
    """The raw path of the attacks works with a right grant (so refusals are the check)."""
    ch = victim["chain"]
    tok = mint(secret, victim["mine"], C.WRITE)
    call_sync(stub(chans).Write, write_req(ch, victim["mine"], tok, data=b"MINE"), timeout=10)
    with client.open("/cap/mine", "rb") as f:
        assert f.read() == b"MINE"


def test_capability_list_names_every_attack(secret: bytes, victim: dict[str, Any]) -> None:
    assert sorted(attacks(secret, victim)) == sorted(ATTACKS)


def test_long_running_handles_outlive_their_capabilities(client: Any) -> None:
    """A handle kept open across several capability lifetimes keeps reading and writing:
    the client renews grants (by its open session) without the caller noticing."""
    core = client.core
    before = core.capabilities.fetches
    data = os.urandom(CHUNK // 4)
    with client.open("/cap/long", "wb+") as f:
        deadline = time.monotonic() + 4 * (CAP_TTL_S + C.CLOCK_SKEW_S)
        n = 0
        while time.monotonic() < deadline:
            f.seek(n * len(data) % (4 * CHUNK))
            f.write(data)
            f.flush()
            f.seek(0)
            assert f.read(len(data)) == data
            n += 1
            time.sleep(0.5)  # the passing time is what this test is about
    assert core.capabilities.fetches > before, "no capability was ever renewed"


def test_open_grant_follows_the_open_mode(secure_cluster: ProcessCluster, client: Any) -> None:
    """A read-only open is granted read, not write; meta refuses a write grant to a user
    without write permission."""
    import fs3
    from fs3.client.core import Caller

    client.makedirs("/cap/ro", exist_ok=True)
    with client.open("/cap/ro/f", "wb") as f:
        f.write(b"root's")
    client.chmod("/cap/ro/f", 0o644)
    core = client.core
    attr = client.bridge.run(core.resolve(client.caller, "/cap/ro/f"))
    nobody = Caller(uid=65534, gid=65534, groups=())
    h = client.bridge.run(core.open(nobody, int(attr.inode), os.O_RDONLY))
    try:
        cap = C.peek(client.bridge.run(core.capabilities.token(int(attr.inode), False)))
        assert cap is not None and cap.rights == C.READ
        core.capabilities.forget(int(attr.inode))
        with pytest.raises(FsError) as e:  # refreshing as the read-only handle: meta says no
            client.bridge.run(core.capabilities.token(int(attr.inode), True))
        assert e.value.errno == 13
    finally:
        client.bridge.run(core.release(h))
    assert fs3 is not None


@pytest.mark.fuse
@pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3")
def test_fuse_and_usrbio_outlive_their_capabilities(secure_cluster: ProcessCluster) -> None:
    """Through the mount (FUSE writes, USRBIO ring reads and writes on the daemon's handle)
    a file stays usable across several capability lifetimes."""
    from fs3.usrbio import Ior, Iov, dereg_fd, prep_io, reg_fd, submit_ios, wait_for_ios

    mnt = str(secure_cluster.mountpoint)
    path = os.path.join(mnt, "long-fuse.bin")
    block = os.urandom(1 << 16)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        reg_fd(fd)
        with Iov(mnt, len(block)) as iov:
            deadline = time.monotonic() + 3 * (CAP_TTL_S + C.CLOCK_SKEW_S)
            rounds = 0
            while time.monotonic() < deadline:
                os.pwrite(fd, block, 0)  # FUSE write
                os.fsync(fd)
                iov.buf[:] = b"\x00" * len(block)
                with Ior(mnt, entries=2, for_read=True) as rd:  # USRBIO read of it
                    prep_io(rd, iov, 0, fd, 0, len(block))
                    submit_ios(rd)
                    (c,) = wait_for_ios(rd, max_results=1, min_results=1, timeout=30)
                assert c.result == len(block) and bytes(iov.buf) == block
                with Ior(mnt, entries=2, for_read=False) as wr:  # USRBIO write
                    prep_io(wr, iov, 0, fd, len(block), len(block))
                    submit_ios(wr)
                    (c,) = wait_for_ios(wr, max_results=1, min_results=1, timeout=30)
                assert c.result == len(block)
                rounds += 1
                time.sleep(1.0)  # the passing time is what this test is about
        dereg_fd(fd)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == block + block
    assert rounds >= 3
