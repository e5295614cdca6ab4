"""getattr and lookup answer from a decoded node's serialized AttrResponse (fs3.meta.ops.attrs)."""

from __future__ import annotations

import pytest

from fs3.kv import open_database
from fs3.meta import schema as S
from fs3.meta import store
from fs3.meta.operator import MetaOperator
from fs3.proto import common_pb2, meta_pb2

pytestmark = pytest.mark.timeout(30)
ROOT = common_pb2.UserInfo(uid=0, gid=0)


def _built(node: store.Inode) -> meta_pb2.AttrResponse:
    """The answer as it was built before the cache: copy plus derived fields."""
    resp = meta_pb2.AttrResponse()
    S.fill_public_attr(resp.attr, node.attr)
    return resp


def test_answers_equal_the_built_ones_and_are_independent_copies() -> None:
    op = MetaOperator(open_database("memory://"))
    f = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="c", parent=1, name=b"f", mode=0o755))
    ino = f.attr.inode
    get = meta_pb2.GetAttrRequest(user=ROOT, inode=ino)
    first = op.read_once("getattr", get)  # builds and keeps the bytes
    node = store.read_inode(op.db, ino)
    assert node is not None and node.public is not None
    assert first == _built(node)
    second = op.read_once("getattr", get)  # parsed from the kept bytes
    assert second == first and second is not first
    assert second.attr.blksize == _built(node).attr.blksize > 0  # derived fields kept
    second.attr.mode = 0  # a caller changing its answer changes no later one
    assert op.read_once("getattr", get) == first
    look = op.read_once("lookup", meta_pb2.LookupRequest(user=ROOT, parent=1, name=b"f"))
    assert look == first


def test_a_changed_inode_is_answered_afresh() -> None:
    op = MetaOperator(open_database("memory://"))
    f = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="c", parent=1, name=b"f", mode=0o755))
    ino = f.attr.inode
    get = meta_pb2.GetAttrRequest(user=ROOT, inode=ino)
    lookup = meta_pb2.LookupRequest(user=ROOT, parent=1, name=b"f")
    assert op.read_once("getattr", get).attr.mode & 0o777 == 0o755
    assert op.read_once("lookup", lookup).attr.mode & 0o777 == 0o755
    op.setattr(
        meta_pb2.SetAttrRequest(
            user=ROOT, request_id="s", inode=ino, mode=0o600, valid=meta_pb2.SETATTR_MODE
        )
    )
    assert op.read_once("getattr", get).attr.mode & 0o777 == 0o600
    assert op.read_once("lookup", lookup).attr.mode & 0o777 == 0o600


def test_inode_keys_are_the_encoded_keys_and_the_memo_stays_bounded() -> None:
    for ino in (1, 255, 256, 1 << 40):
        assert store.inode_keys(ino) == (S.inode_key(ino), S.dir_times_key(ino))
    for ino in range(store._KEYS_MAX + 10):
        store.inode_keys(ino + 2)
    assert len(store._keys) <= store._KEYS_MAX
