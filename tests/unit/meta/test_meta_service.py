"""MetaServicer dispatch: point reads inline on the loop, retryable failures fall back."""

from __future__ import annotations

import asyncio
import errno
import gc

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


def test_lookup_reads_no_parent_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup reads the parent's record, the entry and the child: not the parent's times key."""
    from fs3.kv.database import Transaction
    from fs3.meta import schema as S

    op = _op()
    d = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="d", parent=1, name=b"d", mode=0o755))
    sub = op.mkdir(
        meta_pb2.MkdirRequest(user=ROOT, request_id="s", parent=d.attr.inode, name=b"s", mode=0o755)
    )
    keys: list[bytes] = []
    real = Transaction.get

    def spy(self: Transaction, key: bytes, *, snapshot: bool = False) -> bytes | None:
        keys.append(key)
        return real(self, key, snapshot=snapshot)

    monkeypatch.setattr(Transaction, "get", spy)
    r = op.read_once("lookup", meta_pb2.LookupRequest(user=ROOT, parent=d.attr.inode, name=b"s"))
    assert r.attr.inode == sub.attr.inode
    assert S.dir_times_key(d.attr.inode) not in keys
    assert len(keys) == 4  # parent record, entry, child record, child's times (a directory)
    # the child directory's times are still read and returned
    assert r.attr.mtime == sub.attr.mtime and r.attr.ctime == sub.attr.ctime
    # "." returns the directory itself: with its times
    dot = op.read_once(
        "lookup", meta_pb2.LookupRequest(user=ROOT, parent=sub.attr.inode, name=b".")
    )
    assert dot.attr.mtime == sub.attr.mtime and dot.attr.ctime == sub.attr.ctime


def test_lookup_path_directories_keep_their_times() -> None:
    """In one LookupPath, a directory loaded as a parent is returned with mtime/ctime."""
    op = _op()
    a = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="a", parent=1, name=b"a", mode=0o755))
    b = op.mkdir(
        meta_pb2.MkdirRequest(user=ROOT, request_id="b", parent=a.attr.inode, name=b"b", mode=0o755)
    )
    f = op.mknod(
        meta_pb2.MknodRequest(
            user=ROOT, request_id="f", parent=b.attr.inode, name=b"f", mode=0o010644
        )
    )
    a_now = op.getattr(meta_pb2.GetAttrRequest(user=ROOT, inode=a.attr.inode)).attr
    b_now = op.getattr(meta_pb2.GetAttrRequest(user=ROOT, inode=b.attr.inode)).attr
    r = op.read_once(
        "lookup_path", meta_pb2.LookupPathRequest(user=ROOT, parent=1, names=[b"a", b"b", b"f"])
    )
    assert [x.inode for x in r.attrs] == [a.attr.inode, b.attr.inode, f.attr.inode]
    assert r.attrs[0].mtime == a_now.mtime and r.attrs[0].ctime == a_now.ctime
    assert r.attrs[1].mtime == b_now.mtime and r.attrs[1].ctime == b_now.ctime
    assert b_now.mtime.sec or b_now.mtime.nsec  # the times exist (not left out)


def test_request_metrics_count_outcomes_and_latency() -> None:
    """fs3_meta_requests_total and fs3_meta_request_seconds add up every live servicer."""
    from prometheus_client import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    ok0 = sample("fs3_meta_requests_total", method="getattr", outcome="ok")
    enoent0 = sample("fs3_meta_requests_total", method="getattr", outcome="errno_2")
    count0 = sample("fs3_meta_request_seconds_count", method="getattr")
    inf0 = sample("fs3_meta_request_seconds_bucket", method="getattr", le="+Inf")
    svcs = [MetaServicer(_op()), MetaServicer(_op())]

    async def main() -> None:
        for i in (0, 1, 0):
            await svcs[i].GetAttr(meta_pb2.GetAttrRequest(user=ROOT, inode=1), None)
        with pytest.raises(FsError):
            await svcs[1].GetAttr(meta_pb2.GetAttrRequest(user=ROOT, inode=99), None)

    asyncio.run(main())
    assert sample("fs3_meta_requests_total", method="getattr", outcome="ok") == ok0 + 3
    assert sample("fs3_meta_requests_total", method="getattr", outcome="errno_2") == enoent0 + 1
    assert sample("fs3_meta_request_seconds_count", method="getattr") == count0 + 4
    assert sample("fs3_meta_request_seconds_bucket", method="getattr", le="+Inf") == inf0 + 4
    # a point read on the loop takes far less than the smallest bucket (5 ms)
    assert sample("fs3_meta_request_seconds_bucket", method="getattr", le="0.005") >= 4
    svcs.clear()
    gc.collect()  # a servicer that is gone leaves the sums (its calls happened)
    assert sample("fs3_meta_requests_total", method="getattr", outcome="ok") == ok0 + 3


def test_concurrent_mutations_share_one_group_commit_beyond_the_default_executor(
    tmp_path,
) -> None:
    """Twenty creates at once all wait in the SQLite engine's group commit and go in
    one or two batches: the meta server's worker threads (``use_op_threads``) do not cap
    a batch at the size of asyncio's default executor (cores + 4)."""
    import os
    import uuid

    from fs3.meta.layout import StaticChainTables
    from fs3.meta.server import use_op_threads

    db = open_database(f"sqlite://{tmp_path}/kv.db")
    op = MetaOperator(db, chains=StaticChainTables({1: [1, 2, 3]}))
    op.alloc.give_back(op.alloc.allocate())  # inode numbers at hand: no commit of their own
    svc = MetaServicer(op)
    n = 20

    async def main() -> list[meta_pb2.OpenResponse]:
        use_op_threads(asyncio.get_running_loop())  # what the meta server's serve() does
        assert db._group.try_exclusive()  # type: ignore[attr-defined]  # the engine "busy"
        calls = [
            asyncio.ensure_future(
                svc.Create(
                    meta_pb2.CreateRequest(
                        user=ROOT,
                        request_id=uuid.uuid4().hex,
                        parent=1,
                        name=b"f%d" % i,
                        mode=0o644,
                        flags=os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                        client_id="c",
                    ),
                    None,
                )
            )
            for i in range(n)
        ]
        try:
            queued = await asyncio.to_thread(_await_queued, db, n)
        finally:
            db._group.end_exclusive()  # type: ignore[attr-defined]
        assert queued == n
        return await asyncio.gather(*calls)

    before = (db.commits, db.batches)  # type: ignore[attr-defined]
    rs = asyncio.run(main())
    assert all(r.created for r in rs)
    commits = db.commits - before[0]  # type: ignore[attr-defined]
    batches = db.batches - before[1]  # type: ignore[attr-defined]
    assert commits == n and batches <= 2
    db.close()


def _await_queued(db: object, n: int) -> int:
    """Wait (up to 20 s) until ``n`` transactions queue in ``db``'s group commit."""
    import time

    deadline = time.monotonic() + 20
    while db._group.queued < n and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.005)
    return db._group.queued  # type: ignore[attr-defined,no-any-return]
