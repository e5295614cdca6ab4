"""One chunk-size limit (fs3.limits) for meta, client, storage and the config check.

Each place is probed at the boundary, so a place that kept (or regrew) its own
limit fails here: meta refuses a create or setlayout above the limit with
EINVAL and changes nothing; the client's layout, the storage replicator's
update check and the chunk engine accept exactly ``MAX_CHUNK_SIZE`` and refuse
the next power of two; ``[meta] default_chunk_size`` follows the same rule.
"""

from __future__ import annotations

import errno
import os

import pytest

from fs3 import limits
from fs3.client import layout as client_layout
from fs3.config import ConfigError, MetaConfig, from_dict
from fs3.errors import Code, FsError
from fs3.kv import open_database
from fs3.meta.layout import StaticChainTables, validate_layout
from fs3.meta.operator import MetaOperator
from fs3.proto import common_pb2, meta_pb2, storage_pb2
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine
from fs3.storage.craq import Replicator

pytestmark = pytest.mark.timeout(30)

ROOT = common_pb2.UserInfo(uid=0, gid=0)
MAX = limits.MAX_CHUNK_SIZE
ABOVE = MAX * 2  # the next power of two: valid in shape, too large


def test_the_rule() -> None:
    assert limits.MIN_CHUNK_SIZE == 4096 and MAX == 64 << 20
    assert limits.valid_chunk_size(limits.MIN_CHUNK_SIZE) and limits.valid_chunk_size(MAX)
    for bad in (0, 2048, 3 << 20, ABOVE, 1 << 30):
        assert not limits.valid_chunk_size(bad)


def _operator() -> MetaOperator:
    return MetaOperator(open_database("memory://"), chains=StaticChainTables({1: [1, 2, 3]}))


def _err(fn, req) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(FsError) as ei:
        fn(req)
    return ei.value.errno


def _create(name: bytes, chunk_size: int) -> meta_pb2.CreateRequest:
    return meta_pb2.CreateRequest(
        user=ROOT,
        request_id=f"c-{name.decode()}",
        parent=1,
        name=name,
        mode=0o644,
        flags=os.O_RDWR,
        client_id="c1",
        layout=meta_pb2.Layout(chunk_size=chunk_size),
    )


def test_meta_refuses_create_and_setlayout_above_the_limit() -> None:
    op = _operator()
    assert _err(op.create, _create(b"f", ABOVE)) == errno.EINVAL
    lookup = meta_pb2.LookupRequest(user=ROOT, parent=1, name=b"f")
    assert _err(op.lookup, lookup) == errno.ENOENT  # nothing was created
    assert op.create(_create(b"g", MAX)).attr.layout.chunk_size == MAX

    d = op.mkdir(
        meta_pb2.MkdirRequest(user=ROOT, request_id="m", parent=1, name=b"d", mode=0o755)
    ).attr
    before = d.layout.chunk_size
    set_above = meta_pb2.SetLayoutRequest(
        user=ROOT, request_id="s-above", inode=d.inode, layout=meta_pb2.Layout(chunk_size=ABOVE)
    )
    assert _err(op.setlayout, set_above) == errno.EINVAL
    after = op.getattr(meta_pb2.GetAttrRequest(user=ROOT, inode=d.inode)).attr
    assert after.layout.chunk_size == before  # unchanged
    set_max = meta_pb2.SetLayoutRequest(
        user=ROOT, request_id="s-max", inode=d.inode, layout=meta_pb2.Layout(chunk_size=MAX)
    )
    assert op.setlayout(set_max).attr.layout.chunk_size == MAX

    validate_layout(meta_pb2.Layout(chunk_size=MAX), partial=True)
    with pytest.raises(FsError) as ei:
        validate_layout(meta_pb2.Layout(chunk_size=ABOVE), partial=True)
    assert ei.value.errno == errno.EINVAL


def test_client_layout_uses_the_same_limit() -> None:
    client_layout.Layout(chunk_size=MAX, stripe=1).validate()
    with pytest.raises(FsError) as ei:
        client_layout.Layout(chunk_size=ABOVE, stripe=1).validate()
    assert ei.value.code == Code.INVALID_ARGUMENT
    assert client_layout.MAX_CHUNK_INDEX is limits.MAX_CHUNK_INDEX


def _update(chunk_size: int) -> storage_pb2.UpdateIO:
    return storage_pb2.UpdateIO(
        chunk=storage_pb2.ChunkId(inode=1, index=0),
        type=storage_pb2.UPDATE_WRITE,
        chunk_size=chunk_size,
        offset=0,
        length=4096,
    )


def test_storage_uses_the_same_limit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert Replicator.validate(_update(MAX)) == ChunkKey(1, 0)
    with pytest.raises(FsError) as ei:
        Replicator.validate(_update(MAX + 1))
    assert ei.value.code == Code.INVALID_ARGUMENT

    eng = FileChunkEngine(tmp_path / "t", fsync=False)
    try:
        FileChunkEngine._check_bounds(0, 4096, MAX)
        with pytest.raises(FsError) as ei:
            FileChunkEngine._check_bounds(0, 4096, MAX + 1)
        assert ei.value.code == Code.INVALID_ARGUMENT
    finally:
        eng.close()


def test_config_default_chunk_size_follows_the_rule() -> None:
    assert from_dict(MetaConfig, {"meta": {"default_chunk_size": MAX}}).meta.default_chunk_size
    with pytest.raises(ConfigError):
        from_dict(MetaConfig, {"meta": {"default_chunk_size": ABOVE}})
