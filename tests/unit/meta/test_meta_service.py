"""MetaServicer dispatch: point reads inline on the loop, retryable failures fall back."""

from __future__ import annotations

import asyncio
import errno

import pytest

from fs3 import faults
from fs3.errors import FsError
from fs3.kv import open_database
from fs3.meta.operator import MetaOperator
from fs3.meta.service import MetaServicer, local_reads
from fs3.proto import common_pb2, meta_pb2

pytestmark = pytest.mark.timeout(30)
ROOT = common_pb2.UserInfo(uid=0, gid=0)


def _op() -> MetaOperator:
    return MetaOperator(open_database("memory://"))


def test_local_engines_read_inline() -> None:
    op = _op()
    assert local_reads(op.db)
    assert MetaServicer(op).inline_reads
    assert not MetaServicer(op, inline_reads=False).inline_reads


def test_inline_read_falls_back_after_a_retryable_failure() -> None:
    op = _op()
    svc = MetaServicer(op)
    req = meta_pb2.GetAttrRequest(user=ROOT, inode=1)

    async def main() -> meta_pb2.AttrResponse:
        with faults.inject(1.0, points={"kv.get"}, max_faults=1) as scope:
            r = await svc.GetAttr(req, None)
        assert scope.injected == {"kv.get": 1}  # the inline attempt failed, the thread retried
        return r  # type: ignore[no-any-return]

    assert asyncio.run(main()).attr.inode == 1


def test_inline_read_errors_are_final() -> None:
    svc = MetaServicer(_op())
    req = meta_pb2.LookupRequest(user=ROOT, parent=1, name=b"missing")
    with pytest.raises(FsError) as ei:
        asyncio.run(svc.Lookup(req, None))
    assert ei.value.errno == errno.ENOENT


def test_read_once_only_for_point_reads() -> None:
    op = _op()
    with pytest.raises(FsError):
        op.read_once("unlink", meta_pb2.RemoveRequest(user=ROOT, parent=1, name=b"x"))
    r = op.read_once("lookup", meta_pb2.LookupRequest(user=ROOT, parent=1, name=b"."))
    assert r.attr.inode == 1
