"""User records and their tokens on mgmtd (fs3/mgmtd/users.py), on the in-memory KV."""

from __future__ import annotations

import asyncio

import pytest

from fs3.errors import Code, FsError
from fs3.kv import open_database
from fs3.mgmtd.users import Users
from fs3.proto import mgmtd_pb2
from fs3.security.tokens import Signer, Verifier

pytestmark = pytest.mark.timeout(30)

SECRET = bytes(range(32))


def _users() -> Users:
    return Users(open_database("memory://"), Signer(SECRET))


def _add(u: Users, name: str = "alice", **kw: object) -> mgmtd_pb2.UserTokenResponse:
    args: dict[str, object] = dict(name=name, uid=1000, gid=100, groups=[20, 10, 20])
    args.update(kw)
    return asyncio.run(u.add(mgmtd_pb2.AddUserRequest(**args)))  # type: ignore[arg-type]


def test_add_returns_a_token_naming_the_record() -> None:
    u = _users()
    r = _add(u, admin=True)
    c = Verifier.from_secret(SECRET).verify(r.token)
    assert (c.kind, c.name, c.uid, c.gid, c.groups, c.admin) == (
        "user",
        "alice",
        1000,
        100,
        (10, 20),
        True,
    )
    rec = asyncio.run(u.lookup("alice"))
    assert rec is not None and rec.token_id == c.token_id
    assert r.user.token_id == ""  # never handed out beyond the token itself
    listed = asyncio.run(u.list()).users
    assert [x.name for x in listed] == ["alice"] and listed[0].token_id == ""


def test_duplicate_and_bad_names_change_nothing() -> None:
    u = _users()
    first = _add(u)
    for name in ("alice", "", "1abc", "-x", "a" * 65, "a/b", "a b"):
        with pytest.raises(FsError) as e:
            _add(u, name=name, uid=0)
        assert e.value.code == Code.INVALID_ARGUMENT
    rec = asyncio.run(u.lookup("alice"))
    assert rec is not None and rec.uid == 1000
    assert Verifier.from_secret(SECRET).verify(first.token).token_id == rec.token_id
    with pytest.raises(FsError):
        _add(u, name="bob", groups=list(range(100)))


def test_token_again_is_the_same_until_rotated() -> None:
    u = _users()
    v = Verifier.from_secret(SECRET)
    first = v.verify(_add(u).token)
    again = v.verify(asyncio.run(u.token(mgmtd_pb2.UserTokenRequest(name="alice"))).token)
    assert again.token_id == first.token_id
    rotated = v.verify(
        asyncio.run(u.token(mgmtd_pb2.UserTokenRequest(name="alice", rotate=True))).token
    )
    assert rotated.token_id != first.token_id
    rec = asyncio.run(u.lookup("alice"))
    assert rec is not None and rec.token_id == rotated.token_id


def test_remove_deletes_the_record() -> None:
    u = _users()
    _add(u)
    asyncio.run(u.remove("alice"))
    assert asyncio.run(u.lookup("alice")) is None
    with pytest.raises(FsError):
        asyncio.run(u.remove("alice"))
    with pytest.raises(FsError):
        asyncio.run(u.token(mgmtd_pb2.UserTokenRequest(name="alice")))


def test_without_the_secret_no_user_is_added() -> None:
    u = Users(open_database("memory://"), None)
    with pytest.raises(FsError) as e:
        _add(u)
    assert e.value.code == Code.UNAUTHENTICATED
    assert asyncio.run(u.list()).users == []
