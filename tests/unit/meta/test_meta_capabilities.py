"""Meta grants chunk capabilities as the open allowed, and renews them by session or permission."""

from __future__ import annotations

import errno
import os

import pytest

from fs3.errors import FsError
from fs3.kv import open_database
from fs3.meta.layout import StaticChainTables
from fs3.meta.operator import MetaOperator
from fs3.proto import common_pb2, meta_pb2
from fs3.security import capability as C

pytestmark = pytest.mark.timeout(30)

KEY = bytes(range(32))
ROOT = common_pb2.UserInfo(uid=0, gid=0)
ALICE = common_pb2.UserInfo(uid=1000, gid=1000)
BOB = common_pb2.UserInfo(uid=1001, gid=1001)


@pytest.fixture
def op() -> MetaOperator:
    o = MetaOperator(open_database("memory://"), chains=StaticChainTables({1: [1, 2]}))
    o.signer = C.CapabilitySigner(KEY)
    o.capability_ttl_s = 30
    return o


def create(
    op: MetaOperator, user: common_pb2.UserInfo, name: bytes, mode: int, flags: int
) -> meta_pb2.OpenResponse:
    return op.create(
        meta_pb2.CreateRequest(
            user=user,
            request_id=f"r-{name.decode()}",
            parent=1,
            name=name,
            mode=mode,
            flags=flags,
            client_id="c",
        )
    )


def grant(resp: meta_pb2.OpenResponse | meta_pb2.GetCapabilityResponse) -> C.Capability:
    cap = C.CapabilityVerifier(KEY).check(
        resp.capability, C.peek(resp.capability).inode, 0, 0, 0, "t"
    )  # type: ignore[union-attr]
    return cap


@pytest.mark.parametrize(
    ("flags", "rights"),
    [
        (os.O_RDONLY, C.READ),
        (os.O_WRONLY, C.WRITE),
        (os.O_RDWR, C.READ | C.WRITE),
        (os.O_RDONLY | os.O_TRUNC, C.READ | C.WRITE),
    ],
)
def test_open_grants_what_the_open_allowed(op: MetaOperator, flags: int, rights: int) -> None:
    r = create(op, ROOT, b"f", 0o644, os.O_RDWR)
    o = op.open(
        meta_pb2.OpenRequest(
            user=ROOT, request_id="o", inode=r.attr.inode, flags=flags, client_id="c"
        )
    )
    g = grant(o)
    assert g.rights == rights and g.inode == r.attr.inode


def test_no_secret_no_grant() -> None:
    o = MetaOperator(open_database("memory://"), chains=StaticChainTables({1: [1]}))
    r = create(o, ROOT, b"f", 0o644, os.O_RDWR)
    assert r.capability == b""
    g = o.get_capability(meta_pb2.GetCapabilityRequest(user=ROOT, inode=r.attr.inode))
    assert g.capability == b""


def test_renewal_by_session_survives_chmod_but_not_for_another_right(op: MetaOperator) -> None:
    op.setattr(meta_pb2.SetAttrRequest(user=ROOT, inode=1, valid=meta_pb2.SETATTR_MODE, mode=0o777))
    r = create(op, ALICE, b"a", 0o600, os.O_WRONLY)
    ino = r.attr.inode
    op.setattr(
        meta_pb2.SetAttrRequest(user=ALICE, inode=ino, valid=meta_pb2.SETATTR_MODE, mode=0o000)
    )
    renew = op.get_capability(
        meta_pb2.GetCapabilityRequest(user=ALICE, inode=ino, write=True, session_id=r.session_id)
    )
    assert grant(renew).rights == C.WRITE  # the open file stays writable (POSIX)
    with pytest.raises(FsError) as e:  # a write-only open does not renew into reading
        op.get_capability(
            meta_pb2.GetCapabilityRequest(
                user=ALICE, inode=ino, write=False, session_id=r.session_id
            )
        )
    assert e.value.errno == errno.EACCES


def test_without_session_permission_decides(op: MetaOperator) -> None:
    op.setattr(meta_pb2.SetAttrRequest(user=ROOT, inode=1, valid=meta_pb2.SETATTR_MODE, mode=0o777))
    ino = create(op, ALICE, b"b", 0o644, os.O_RDWR).attr.inode
    assert (
        grant(op.get_capability(meta_pb2.GetCapabilityRequest(user=BOB, inode=ino))).rights
        == C.READ
    )
    for req in (
        meta_pb2.GetCapabilityRequest(user=BOB, inode=ino, write=True),
        meta_pb2.GetCapabilityRequest(user=BOB, inode=ino, write=True, session_id="not-a-session"),
    ):
        with pytest.raises(FsError) as e:
            op.get_capability(req)
        assert e.value.errno == errno.EACCES


@pytest.mark.parametrize(("inode", "err"), [(1, errno.EINVAL), (987654321, errno.ENOENT)])
def test_only_existing_regular_files(op: MetaOperator, inode: int, err: int) -> None:
    with pytest.raises(FsError) as e:
        op.get_capability(meta_pb2.GetCapabilityRequest(user=ROOT, inode=inode))
    assert e.value.errno == err


def test_replayed_create_gets_a_fresh_grant_not_a_stored_one(op: MetaOperator) -> None:
    a = create(op, ROOT, b"c", 0o644, os.O_RDWR)
    b = create(op, ROOT, b"c", 0o644, os.O_RDWR)  # same request_id: the idempotent replay
    assert a.attr.inode == b.attr.inode and b.capability and grant(b).rights == C.READ | C.WRITE
