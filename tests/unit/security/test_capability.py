"""Chunk capabilities: signing, verification, refusal of forged/tampered/expired grants, the client cache."""

from __future__ import annotations

import asyncio

import pytest

from fs3.errors import Code, FsError
from fs3.limits import MAX_CHUNK_INDEX
from fs3.security import capability as C
from fs3.security.keys import PURPOSE_CAPABILITY, PURPOSE_USER_TOKEN, derive_key

pytestmark = pytest.mark.timeout(30)

SECRET = bytes(range(32))
KEY = derive_key(SECRET, PURPOSE_CAPABILITY)


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_issue_and_check_round_trip() -> None:
    clock = FakeClock()
    tok = C.CapabilitySigner(KEY, clock).issue(42, C.READ | C.WRITE, 60)
    assert len(tok) == C.TOKEN_BYTES
    cap = C.CapabilityVerifier(KEY, clock).check(tok, 42, 0, MAX_CHUNK_INDEX, C.WRITE, "t")
    assert (cap.inode, cap.rights, cap.first, cap.last) == (
        42,
        C.READ | C.WRITE,
        0,
        MAX_CHUNK_INDEX,
    )


@pytest.mark.parametrize(
    ("inode", "first", "last", "need", "code"),
    [
        (43, 0, 0, C.READ, Code.PERMISSION_DENIED),  # another inode
        (42, 0, 0, C.WRITE, Code.PERMISSION_DENIED),  # a read grant cannot write
        (42, 9, 11, C.READ, Code.PERMISSION_DENIED),  # outside [0, 10]
        (42, 10, 10, C.READ, None),
    ],
)
def test_scope(inode: int, first: int, last: int, need: int, code: Code | None) -> None:
    clock = FakeClock()
    tok = C.CapabilitySigner(KEY, clock).issue(42, C.READ, 60, first=0, last=10)
    v = C.CapabilityVerifier(KEY, clock)
    if code is None:
        v.check(tok, inode, first, last, need, "t")
        return
    with pytest.raises(FsError) as e:
        v.check(tok, inode, first, last, need, "t")
    assert e.value.code == code


def test_forged_tampered_truncated_and_empty_are_refused() -> None:
    clock = FakeClock()
    v = C.CapabilityVerifier(KEY, clock)
    good = C.CapabilitySigner(KEY, clock).issue(42, C.READ, 60)
    other_key = derive_key(SECRET, PURPOSE_USER_TOKEN)  # a key of another purpose
    bad = [
        b"",
        good[:-1],
        good + b"x",
        C.CapabilitySigner(other_key, clock).issue(42, C.READ, 60),
        bytes([good[0]]) + bytes([good[1] | C.WRITE | C.SERVICE]) + good[2:],  # widen rights
        good[:4] + (7).to_bytes(8, "little") + good[12:],  # another inode
        good[: C.TOKEN_BYTES - 1] + bytes([good[-1] ^ 1]),  # flip a MAC bit
    ]
    for tok in bad:
        with pytest.raises(FsError) as e:
            v.check(tok, 42, 0, 0, C.READ, "t")
        assert e.value.code == Code.PERMISSION_DENIED, tok


def test_expired_refused_after_skew() -> None:
    clock = FakeClock()
    tok = C.CapabilitySigner(KEY, clock).issue(42, C.READ, 5)
    v = C.CapabilityVerifier(KEY, clock, skew_s=1.0)
    clock.t += 5.5  # inside the skew allowance
    v.check(tok, 42, 0, 0, C.READ, "t")
    clock.t += 1.0
    with pytest.raises(FsError) as e:
        v.check(tok, 42, 0, 0, C.READ, "t")  # the cached verification still checks expiry
    assert e.value.code == Code.CAPABILITY_EXPIRED and e.value.retryable


def test_service_capability_covers_everything_but_only_from_the_key() -> None:
    clock = FakeClock()
    v = C.CapabilityVerifier(KEY, clock)
    svc = C.ServiceToken(C.CapabilitySigner(KEY, clock)).token()
    v.check_service(svc, "t")
    v.check(svc, 99, 5, 7, C.WRITE, "t")
    user = C.CapabilitySigner(KEY, clock).issue(42, C.READ | C.WRITE, 60)
    with pytest.raises(FsError) as e:
        v.check_service(user, "t")
    assert e.value.code == Code.PERMISSION_DENIED


def test_bad_issue_arguments() -> None:
    s = C.CapabilitySigner(KEY)
    for rights, first, last in ((0, 0, 0), (8, 0, 0), (C.READ, 5, 4)):
        with pytest.raises(FsError):
            s.issue(1, rights, 10, first, last)


def test_cache_renews_before_expiry_and_after_invalidate() -> None:
    clock = FakeClock()
    signer = C.CapabilitySigner(KEY, clock)
    asked: list[tuple[int, bool]] = []

    async def fetch(inode: int, write: bool) -> bytes:
        asked.append((inode, write))
        await asyncio.sleep(0)
        return signer.issue(inode, C.WRITE if write else C.READ, 10)

    async def main() -> None:
        cache = C.CapabilityCache(fetch, clock)
        cache.put(signer.issue(5, C.READ | C.WRITE, 10))  # an Open answer
        t1 = await cache.token(5, True)
        assert await cache.token(5, False) == t1 and asked == []
        clock.t += 6  # past half its life: renewed
        got = await asyncio.gather(*(cache.token(5, False) for _ in range(5)))
        assert asked == [(5, False)] and len(set(got)) == 1  # one fetch for concurrent users
        cache.invalidate(5, got[0])
        await cache.token(5, False)
        assert asked == [(5, False), (5, False)]
        cache.invalidate(5, b"not the cached one")  # a stale refusal keeps the newer grant
        await cache.token(5, False)
        assert len(asked) == 2

    asyncio.run(main())


def test_capability_key_from_the_cluster_directory(tmp_path: object) -> None:
    from pathlib import Path

    from fs3.security.keys import create_secret

    d = Path(str(tmp_path))
    cf = d / "fs3.cluster"
    assert C.capability_key("", str(cf)) is None  # no secret: checks off
    create_secret(d / "fs3.secret")
    assert C.capability_key("", str(cf)) == derive_key(
        (d / "fs3.secret").read_bytes(), PURPOSE_CAPABILITY
    )
    with pytest.raises(FsError):
        C.capability_key(str(d / "missing"), str(cf))  # a configured secret must exist


def test_cache_does_not_trust_its_clock_to_match_metas() -> None:
    """A client clock an hour ahead of meta's still keeps a fresh grant for half its life."""
    meta_clock, client_clock = FakeClock(), FakeClock(1_000_000.0 + 3600)
    signer = C.CapabilitySigner(KEY, meta_clock)
    fetched: list[int] = []

    async def fetch(inode: int, write: bool) -> bytes:
        fetched.append(inode)
        return signer.issue(inode, C.READ, 10)

    async def main() -> None:
        cache = C.CapabilityCache(fetch, client_clock)
        for _ in range(5):
            await cache.token(9, False)
        assert fetched == [9]
        client_clock.t += 6
        await cache.token(9, False)
        assert fetched == [9, 9]

    asyncio.run(main())


def test_cache_of_a_cluster_without_secret_asks_once() -> None:
    clock = FakeClock()
    asked: list[int] = []

    async def fetch(inode: int, write: bool) -> bytes:
        asked.append(inode)
        return b""  # meta has no secret: storage checks nothing

    async def main() -> None:
        cache = C.CapabilityCache(fetch, clock)
        for ino in range(10):
            assert await cache.token(ino, ino % 2 == 0) == b""
        assert asked == [0]
        clock.t += C.OPEN_CLUSTER_RECHECK_S + 1
        await cache.token(3, False)
        assert asked == [0, 3]

    asyncio.run(main())
