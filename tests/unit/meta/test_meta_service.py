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


def _spy_point_reads(monkeypatch: pytest.MonkeyPatch, op: MetaOperator) -> list[list[bytes]]:
    """Record the keys of every snapshot_get of ``op``'s KV; fail on any transaction."""
    from fs3.kv.database import Database

    calls: list[list[bytes]] = []
    real = type(op.db).snapshot_get

    def spy(self: Database, keys: list[bytes]) -> list[bytes | None]:
        calls.append(list(keys))
        return real(self, keys)  # type: ignore[arg-type]

    def no_txn(self: Database) -> None:
        raise AssertionError("a point read opened a transaction")

    monkeypatch.setattr(type(op.db), "snapshot_get", spy)
    monkeypatch.setattr(type(op.db), "create_transaction", no_txn)
    return calls


def test_point_reads_are_one_snapshot_get_and_no_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """getattr/access/readlink read the inode and its times key in one KV call, no transaction."""
    from fs3.meta import schema as S

    op = _op()
    d = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="d", parent=1, name=b"d", mode=0o700))
    ln = op.symlink(
        meta_pb2.SymlinkRequest(user=ROOT, request_id="l", parent=1, name=b"l", target=b"/t")
    )
    calls = _spy_point_reads(monkeypatch, op)
    ino = d.attr.inode
    r = op.read_once("getattr", meta_pb2.GetAttrRequest(user=ROOT, inode=ino))
    assert calls == [[S.inode_key(ino), S.dir_times_key(ino)]]
    assert r.attr.inode == ino and r.attr.mtime == d.attr.mtime and r.attr.ctime == d.attr.ctime
    assert r.attr.mode == 0o040700 and r.attr.nlink == 2
    user = common_pb2.UserInfo(uid=1000, gid=1000)
    with pytest.raises(FsError) as ei:
        op.read_once("access", meta_pb2.AccessRequest(user=user, inode=ino, mask=4))
    assert ei.value.errno == errno.EACCES
    r2 = op.read_once("readlink", meta_pb2.ReadLinkRequest(user=ROOT, inode=ln.attr.inode))
    assert r2.target == b"/t"
    assert len(calls) == 3
    for bad, code in ((0, errno.EINVAL), (987654, errno.ENOENT)):
        with pytest.raises(FsError) as ei:
            op.read_once("getattr", meta_pb2.GetAttrRequest(user=ROOT, inode=bad))
        assert ei.value.errno == code
    with pytest.raises(FsError) as ei:
        op.read_once("getattr", meta_pb2.GetAttrRequest(inode=1))  # no user
    assert ei.value.code.name == "INVALID_ARGUMENT"


def test_point_reads_see_every_change_and_the_decode_cache_stays_bounded() -> None:
    """read_inode caches decoded inodes by their stored bytes: a change is never hidden."""
    from fs3.meta import store

    op = _op()
    f = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="f", parent=1, name=b"f", mode=0o755))
    ino = f.attr.inode
    get = meta_pb2.GetAttrRequest(user=ROOT, inode=ino)
    assert op.read_once("getattr", get).attr.mode == 0o040755
    assert op.read_once("getattr", get).attr.mode == 0o040755  # from the cache
    op.setattr(
        meta_pb2.SetAttrRequest(
            user=ROOT, request_id="s", inode=ino, mode=0o600, valid=meta_pb2.SETATTR_MODE
        )
    )
    assert op.read_once("getattr", get).attr.mode == 0o040600
    root_before = op.read_once("getattr", meta_pb2.GetAttrRequest(user=ROOT, inode=1)).attr
    op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="d", parent=1, name=b"d", mode=0o755))
    root_after = op.read_once("getattr", meta_pb2.GetAttrRequest(user=ROOT, inode=1)).attr
    assert root_after.nlink == root_before.nlink + 1
    assert (root_after.mtime.sec, root_after.mtime.nsec) >= (
        root_before.mtime.sec,
        root_before.mtime.nsec,
    )
    for i in range(store._DECODED_MAX + 10):  # distinct stored bytes each time
        op.setattr(
            meta_pb2.SetAttrRequest(
                user=ROOT,
                request_id=f"t{i}",
                inode=ino,
                mode=0o600 | (i & 0o77),
                valid=meta_pb2.SETATTR_MODE,
            )
        )
        op.read_once("getattr", get)
        if i % 64 == 0:
            op.read_once("getattr", meta_pb2.GetAttrRequest(user=ROOT, inode=1))
    assert len(store._decoded) <= store._DECODED_MAX


def test_lookup_is_two_point_reads_without_parent_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup reads [parent record, entry] then [child record, child times, entry]:
    never the parent's times key, and no transaction."""
    from fs3.meta import schema as S

    op = _op()
    d = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="d", parent=1, name=b"d", mode=0o755))
    sub = op.mkdir(
        meta_pb2.MkdirRequest(user=ROOT, request_id="s", parent=d.attr.inode, name=b"s", mode=0o755)
    )
    calls = _spy_point_reads(monkeypatch, op)
    di, si = d.attr.inode, sub.attr.inode
    r = op.read_once("lookup", meta_pb2.LookupRequest(user=ROOT, parent=di, name=b"s"))
    assert r.attr.inode == si
    entry = S.dentry_key(di, b"s")
    assert calls == [
        [S.inode_key(di), entry],
        [S.inode_key(si), S.dir_times_key(si), entry],
    ]
    # the child directory's times are still read and returned
    assert r.attr.mtime == sub.attr.mtime and r.attr.ctime == sub.attr.ctime
    # "." returns the directory itself: with its times; ".." its parent
    dot = op.read_once("lookup", meta_pb2.LookupRequest(user=ROOT, parent=si, name=b"."))
    assert dot.attr.mtime == sub.attr.mtime and dot.attr.ctime == sub.attr.ctime
    up = op.read_once("lookup", meta_pb2.LookupRequest(user=ROOT, parent=si, name=b".."))
    assert up.attr.inode == di


def test_lookup_errors_keep_their_order() -> None:
    """The parent's errors (ENOENT, ENOTDIR, EACCES) come before the name's, as in a transaction."""
    op = _op()
    d = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="d", parent=1, name=b"d", mode=0o700))
    ln = op.symlink(
        meta_pb2.SymlinkRequest(user=ROOT, request_id="l", parent=1, name=b"l", target=b"/t")
    )
    user = common_pb2.UserInfo(uid=1000, gid=1000)
    cases = [
        (ROOT, 0, b"x", errno.EINVAL),
        (ROOT, 424242, b"x", errno.ENOENT),
        (ROOT, 424242, b"a/b", errno.ENOENT),  # the parent first, then the bad name
        (ROOT, ln.attr.inode, b"x", errno.ENOTDIR),
        (ROOT, ln.attr.inode, b".", errno.ENOTDIR),
        (user, d.attr.inode, b"x", errno.EACCES),
        (user, d.attr.inode, b"x" * 300, errno.EACCES),
        (user, d.attr.inode, b"..", errno.EACCES),
        (ROOT, d.attr.inode, b"x" * 300, errno.ENAMETOOLONG),
        (ROOT, d.attr.inode, b"a/b", errno.EINVAL),
        (ROOT, d.attr.inode, b"missing", errno.ENOENT),
    ]
    for who, parent, name, want in cases:
        with pytest.raises(FsError) as ei:
            op.read_once("lookup", meta_pb2.LookupRequest(user=who, parent=parent, name=name))
        assert ei.value.errno == want, (parent, name)
        with pytest.raises(FsError) as ei:  # the retrying path answers alike
            op.lookup(meta_pb2.LookupRequest(user=who, parent=parent, name=name))
        assert ei.value.errno == want, (parent, name)


def test_lookup_resolves_again_when_the_entry_changes_between_its_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rename between the two reads: the answer is never the old inode under the new binding."""
    from fs3.meta.ops import attrs

    op = _op()
    a = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="a", parent=1, name=b"a", mode=0o755))
    b = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, request_id="b", parent=1, name=b"b", mode=0o755))
    real = type(op.db).snapshot_get
    n = [0]

    def racing(self: object, keys: list[bytes]) -> list[bytes | None]:
        n[0] += 1
        if n[0] == 2:  # between read 1 and read 2: "b" replaces "a"
            op.rename(
                meta_pb2.RenameRequest(
                    user=ROOT, request_id="r", parent=1, name=b"b", new_parent=1, new_name=b"a"
                )
            )
        return real(self, keys)  # type: ignore[arg-type]

    monkeypatch.setattr(type(op.db), "snapshot_get", racing)
    r = op.read_once("lookup", meta_pb2.LookupRequest(user=ROOT, parent=1, name=b"a"))
    assert r.attr.inode == b.attr.inode != a.attr.inode
    assert n[0] == 4  # read 1, read 2 (changed), read 1 again, read 2

    def always(self: object, keys: list[bytes]) -> list[bytes | None]:
        out = real(self, keys)  # type: ignore[arg-type]
        return out[:-1] + [b"changed"] if len(keys) == 3 else out

    monkeypatch.setattr(type(op.db), "snapshot_get", always)
    with pytest.raises(FsError) as ei:
        op.read_once("lookup", meta_pb2.LookupRequest(user=ROOT, parent=1, name=b"a"))
    assert ei.value.retryable
    assert attrs.LOOKUP_POINT_ATTEMPTS > 1


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


def _sqlite_servicer(tmp_path, *, reserve: bool = True) -> tuple[MetaServicer, object]:
    from fs3.meta.layout import StaticChainTables

    db = open_database(f"sqlite://{tmp_path}/kv.db")
    op = MetaOperator(db, chains=StaticChainTables({1: [1, 2, 3]}))
    if reserve:
        op.alloc.give_back(op.alloc.allocate())  # inode numbers at hand
    return MetaServicer(op), db


def _create(name: bytes, rid: str = "") -> meta_pb2.CreateRequest:
    import os

    return meta_pb2.CreateRequest(
        user=ROOT,
        request_id=rid or name.hex(),
        parent=1,
        name=name,
        mode=0o644,
        flags=os.O_CREAT | os.O_EXCL | os.O_WRONLY,
        client_id="c",
    )


def _no_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (and refuse) every hand-off of the servicer to a worker thread."""
    from fs3.meta import service

    hops: list[str] = []

    async def to_thread(fn, *args, **kw):  # type: ignore[no-untyped-def]
        hops.append(fn.__name__)
        return fn(*args, **kw)

    monkeypatch.setattr(service.asyncio, "to_thread", to_thread)
    return hops


def test_lone_mutations_commit_on_the_loop_durably(tmp_path, monkeypatch) -> None:
    """One client's mutations, one after another: each commits on the event loop (no
    thread hand-off), one KV commit each, and is in the file when acknowledged."""
    from fs3.meta import service

    monkeypatch.setattr(service, "LONE_GAP_S", 0.0)
    hops = _no_threads(monkeypatch)
    svc, db = _sqlite_servicer(tmp_path)
    commits0 = db.commits  # type: ignore[attr-defined]

    async def main() -> None:
        sessions = []
        for i in range(5):
            r = await svc.Create(_create(b"f%d" % i), None)
            assert r.created and r.session_id
            sessions.append(meta_pb2.SessionRef(inode=r.attr.inode, session_id=r.session_id))
        closed = await svc.CloseSessions(
            meta_pb2.CloseSessionsRequest(user=ROOT, sessions=sessions), None
        )
        assert closed.closed == 5
        await svc.Mkdir(
            meta_pb2.MkdirRequest(user=ROOT, request_id="m", parent=1, name=b"d", mode=0o755),
            None,
        )
        await svc.Unlink(
            meta_pb2.RemoveRequest(user=ROOT, request_id="u", parent=1, name=b"f0"), None
        )

    asyncio.run(main())
    assert hops == []
    assert svc.writes_inline == 8
    assert db.commits - commits0 == 8  # type: ignore[attr-defined]
    db.close()  # type: ignore[attr-defined]
    other = MetaOperator(open_database(f"sqlite://{tmp_path}/kv.db"))
    names = {
        e.name
        for e in other.readdir(meta_pb2.ReadDirRequest(user=ROOT, inode=1, limit=100)).entries
    }
    assert {b"f1", b"f2", b"f3", b"f4", b"d"} <= names and b"f0" not in names
    other.db.close()


def test_inline_mutation_errors_are_final(tmp_path, monkeypatch) -> None:
    from fs3.meta import service

    monkeypatch.setattr(service, "LONE_GAP_S", 0.0)
    hops = _no_threads(monkeypatch)
    svc, db = _sqlite_servicer(tmp_path)

    async def main() -> None:
        await svc.Create(_create(b"f", "r1"), None)
        with pytest.raises(FsError) as ei:
            await svc.Create(_create(b"f", "r2"), None)  # O_EXCL on an existing name
        assert ei.value.errno == errno.EEXIST

    asyncio.run(main())
    assert hops == [] and svc.writes_inline == 1
    db.close()  # type: ignore[attr-defined]


def test_a_mutation_that_would_wait_goes_to_a_thread(tmp_path, monkeypatch) -> None:
    """Inode numbers to reserve (a commit of its own), an injected retryable commit
    failure, a mutation hard on the heels of another: each runs on a worker thread
    instead, exactly once."""
    from fs3.meta import service

    monkeypatch.setattr(service, "LONE_GAP_S", 0.0)
    hops = _no_threads(monkeypatch)
    svc, db = _sqlite_servicer(tmp_path, reserve=False)
    commits0 = db.commits  # type: ignore[attr-defined]

    async def main() -> None:
        await svc.Create(_create(b"a"), None)  # no inode numbers reserved yet
        assert (hops, svc.writes_inline) == (["create"], 0)
        with faults.inject(1.0, points={"kv.commit"}, max_faults=1) as scope:
            await svc.Create(_create(b"b"), None)
        assert scope.injected == {"kv.commit": 1}
        assert (hops, svc.writes_inline) == (["create", "create"], 0)
        await svc.Create(_create(b"c"), None)
        assert (hops, svc.writes_inline) == (["create", "create"], 1)
        monkeypatch.setattr(service, "LONE_GAP_S", 3600.0)
        await svc.Create(_create(b"d"), None)  # "right after" the last one
        assert (hops, svc.writes_inline) == (["create", "create", "create"], 1)

    asyncio.run(main())
    ops = svc.op
    for name in (b"a", b"b", b"c", b"d"):
        ops.lookup(meta_pb2.LookupRequest(user=ROOT, parent=1, name=name))
    # 4 creates + 1 reservation: the failed inline attempts wrote nothing
    assert db.commits - commits0 == 5  # type: ignore[attr-defined]
    db.close()  # type: ignore[attr-defined]


def test_a_cancelled_mutation_counts_as_off_loop_until_its_thread_ends(
    tmp_path, monkeypatch
) -> None:
    """A call whose deadline passed is cancelled, but its worker thread runs on
    (here: inside an inode-number reservation). Until that thread is done no
    mutation may run on the loop, or the loop would wait for that thread's locks."""
    import threading
    import time

    from fs3.meta import service

    monkeypatch.setattr(service, "LONE_GAP_S", 0.0)
    svc, db = _sqlite_servicer(tmp_path, reserve=False)
    inside, release = threading.Event(), threading.Event()
    reserve = svc.op.alloc._reserve

    def slow_reserve() -> list[int]:
        inside.set()
        assert release.wait(10)
        return reserve()

    monkeypatch.setattr(svc.op.alloc, "_reserve", slow_reserve)

    async def main() -> None:
        call = asyncio.ensure_future(svc.Create(_create(b"a"), None))
        assert await asyncio.to_thread(inside.wait, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert svc._writes_off_loop == 1  # its thread still runs
        release.set()

        def thread_done() -> bool:
            deadline = time.monotonic() + 10
            while svc._writes_off_loop and time.monotonic() < deadline:
                time.sleep(0.001)
            return not svc._writes_off_loop

        assert await asyncio.to_thread(thread_done)
        r = await svc.Create(_create(b"b"), None)  # lone again: on the loop
        assert r.created and svc.writes_inline == 1

    asyncio.run(asyncio.wait_for(main(), 20))
    db.close()  # type: ignore[attr-defined]


def test_write_once_only_for_mutations() -> None:
    op = _op()
    with pytest.raises(FsError):
        op.write_once("lookup", meta_pb2.LookupRequest(user=ROOT, parent=1, name=b"."))
