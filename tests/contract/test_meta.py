"""Meta contract: POSIX semantics of every MetaOperator op, over memory and sqlite.

The operator is driven directly (no gRPC), with a fresh database per test.
Every test ends with the namespace invariant check (fs3.meta.fsck), so an op
that leaves a half-done change fails here even if its own result looked right.
"""

from __future__ import annotations

import errno
import os
import random
import stat
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from fs3 import faults
from fs3.config import MetaSection
from fs3.errors import Code, FsError
from fs3.kv import Database, Transaction, open_database
from fs3.meta.fsck import check_namespace
from fs3.meta.layout import StaticChainTables
from fs3.meta.operator import MetaOperator
from fs3.proto import common_pb2, meta_pb2
from fs3.testing.kv import engine_url

ENGINES = ("memory", "sqlite")
ROOT = common_pb2.UserInfo(uid=0, gid=0)
ALICE = common_pb2.UserInfo(uid=1000, gid=1000, groups=[1000, 3000])
BOB = common_pb2.UserInfo(uid=1001, gid=1001)
RW = os.O_RDWR
F = meta_pb2

_rid = iter(range(1, 1 << 62))


def rid() -> str:
    return f"r{next(_rid)}"


class Fs:
    """Small helpers over the operator: names as str, user per call, checks for errno."""

    def __init__(self, op: MetaOperator) -> None:
        self.op = op

    def mkdir(self, parent: int, name: str, mode: int = 0o755, user: Any = ROOT) -> meta_pb2.Attr:
        return self.op.mkdir(
            F.MkdirRequest(
                user=user, request_id=rid(), parent=parent, name=name.encode(), mode=mode
            )
        ).attr

    def create(
        self,
        parent: int,
        name: str,
        mode: int = 0o644,
        user: Any = ROOT,
        flags: int = RW,
        **kw: Any,
    ) -> meta_pb2.OpenResponse:
        return self.op.create(
            F.CreateRequest(
                user=user,
                request_id=rid(),
                parent=parent,
                name=name.encode(),
                mode=mode,
                flags=flags,
                client_id="c1",
                **kw,
            )
        )

    def touch(self, parent: int, name: str, mode: int = 0o644, user: Any = ROOT) -> meta_pb2.Attr:
        r = self.create(parent, name, mode, user)
        self.close(r.attr.inode, r.session_id, user)
        return r.attr

    def close(self, ino: int, sid: str, user: Any = ROOT, **kw: Any) -> meta_pb2.Attr:
        return self.op.close(
            F.CloseRequest(user=user, request_id=rid(), inode=ino, session_id=sid, **kw)
        ).attr

    def lookup(self, parent: int, name: str, user: Any = ROOT) -> meta_pb2.Attr:
        return self.op.lookup(F.LookupRequest(user=user, parent=parent, name=name.encode())).attr

    def getattr(self, ino: int, user: Any = ROOT) -> meta_pb2.Attr:
        return self.op.getattr(F.GetAttrRequest(user=user, inode=ino)).attr

    def unlink(self, parent: int, name: str, user: Any = ROOT) -> meta_pb2.RemoveResponse:
        return self.op.unlink(
            F.RemoveRequest(user=user, request_id=rid(), parent=parent, name=name.encode())
        )

    def rmdir(self, parent: int, name: str, user: Any = ROOT) -> meta_pb2.RemoveResponse:
        return self.op.rmdir(
            F.RemoveRequest(user=user, request_id=rid(), parent=parent, name=name.encode())
        )

    def rename(
        self, p: int, n: str, np: int, nn: str, flags: int = 0, user: Any = ROOT
    ) -> meta_pb2.RenameResponse:
        return self.op.rename(
            F.RenameRequest(
                user=user,
                request_id=rid(),
                parent=p,
                name=n.encode(),
                new_parent=np,
                new_name=nn.encode(),
                flags=flags,
            )
        )

    def setattr(self, ino: int, user: Any = ROOT, **kw: Any) -> meta_pb2.SetAttrResponse:
        return self.op.setattr(F.SetAttrRequest(user=user, request_id=rid(), inode=ino, **kw))

    def names(self, ino: int, user: Any = ROOT) -> list[str]:
        out: list[str] = []
        cursor = b""
        while True:
            r = self.op.readdir(F.ReadDirRequest(user=user, inode=ino, cursor=cursor, limit=3))
            out.extend(e.name.decode(errors="surrogateescape") for e in r.entries)
            if not r.more:
                return out
            cursor = r.entries[-1].name


def err(fn: Any, *args: Any, **kw: Any) -> int:
    """Call and return the errno of the FsError it must raise."""
    with pytest.raises(FsError) as ei:
        fn(*args, **kw)
    return ei.value.errno


def ns(ts: common_pb2.Timespec) -> int:
    return ts.sec * 1_000_000_000 + ts.nsec


@pytest.fixture(params=ENGINES)
def db(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Database]:
    d = open_database(engine_url(request.param, str(tmp_path)))
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def fs(db: Database) -> Iterator[Fs]:
    op = MetaOperator(
        db, MetaSection(inode_batch=64), StaticChainTables({1: [11, 12, 13, 14, 15, 16]}), seed=7
    )
    yield Fs(op)
    rep = check_namespace(db)
    assert rep.ok, str(rep)


pytestmark = pytest.mark.timeout(60)


# ----------------------------------------------------------------------------- basics


def test_root_and_statfs(fs: Fs) -> None:
    a = fs.getattr(1)
    assert (
        a.mode == stat.S_IFDIR | 0o755
        and a.uid == 0
        and a.gid == 0
        and a.nlink == 2
        and a.parent == 1
    )
    MetaOperator(fs.op.db)  # a second server start keeps the existing root
    assert fs.getattr(1) == a
    fs.touch(1, "f")
    s = fs.op.statfs(F.StatFsRequest(user=ALICE))
    assert s.name_max == 255 and s.used_files == 2 and s.total_bytes > 0 and s.block_size > 0
    assert fs.lookup(1, ".").inode == 1 and fs.lookup(1, "..").inode == 1


def test_create_mkdir_nlink_and_times(fs: Fs) -> None:
    before = fs.getattr(1)
    d = fs.mkdir(1, "d", 0o750)
    assert d.mode == stat.S_IFDIR | 0o750 and d.nlink == 2 and d.parent == 1
    root = fs.getattr(1)
    assert root.nlink == 3
    assert ns(root.mtime) >= ns(before.mtime) and ns(root.ctime) == ns(root.mtime)
    r = fs.create(d.inode, "f", 0o640)
    assert r.created and r.session_id
    f = r.attr
    assert f.mode == stat.S_IFREG | 0o640 and f.nlink == 1 and f.size == 0
    assert ns(f.mtime) == ns(f.ctime) == ns(f.atime)
    assert fs.getattr(d.inode).nlink == 2  # files don't count
    assert ns(fs.getattr(d.inode).mtime) >= ns(f.mtime)
    fs.close(f.inode, r.session_id)
    sub = fs.mkdir(d.inode, "sub")
    assert fs.getattr(d.inode).nlink == 3 and fs.lookup(sub.inode, "..").inode == d.inode
    assert fs.lookup(d.inode, "f").inode == f.inode
    assert err(fs.lookup, d.inode, "nope") == errno.ENOENT
    # mode 0 files are possible; the kernel already applied the umask
    assert fs.touch(d.inode, "zero", 0).mode == stat.S_IFREG


def test_inode_numbers_unique_across_servers(db: Database) -> None:
    ops = [MetaOperator(db, MetaSection(inode_batch=8)) for _ in range(2)]
    seen: set[int] = set()
    for i in range(40):
        a = (
            ops[i % 2]
            .mkdir(
                F.MkdirRequest(user=ROOT, request_id=rid(), parent=1, name=b"d%d" % i, mode=0o755)
            )
            .attr
        )
        assert a.inode not in seen and a.inode != 1
        seen.add(a.inode)
    assert check_namespace(db).ok


def test_name_rules(fs: Fs) -> None:
    assert err(fs.mkdir, 1, "") == errno.EINVAL
    assert err(fs.mkdir, 1, ".") == errno.EEXIST
    assert err(fs.mkdir, 1, "..") == errno.EEXIST
    assert err(fs.create, 1, "a/b") == errno.EINVAL
    assert err(fs.create, 1, "a\0b") == errno.EINVAL
    assert err(fs.create, 1, "x" * 256) == errno.ENAMETOOLONG
    assert err(fs.lookup, 1, "x" * 256) == errno.ENAMETOOLONG
    assert err(fs.mkdir, 1, "x" * 100_000) == errno.ENAMETOOLONG  # never reaches the KV
    fs.touch(1, "x" * 255)
    assert err(fs.unlink, 1, ".") == errno.EISDIR
    assert err(fs.rmdir, 1, ".") == errno.EINVAL
    assert err(fs.rmdir, 1, "..") == errno.ENOTEMPTY
    assert err(fs.rename, 1, ".", 1, "z") == errno.EINVAL
    # non-UTF-8 names are fine
    fs.op.mkdir(F.MkdirRequest(user=ROOT, request_id=rid(), parent=1, name=b"\xff\xfe", mode=0o755))
    assert "x" * 255 in fs.names(1)


def test_create_flags(fs: Fs) -> None:
    d = fs.mkdir(1, "d")
    fs.touch(d.inode, "f")
    assert err(fs.create, d.inode, "f", flags=RW | os.O_EXCL) == errno.EEXIST
    r = fs.create(d.inode, "f", flags=RW)
    assert not r.created
    fs.close(r.attr.inode, r.session_id)
    fs.mkdir(d.inode, "sub")
    assert err(fs.create, d.inode, "sub", flags=RW) == errno.EISDIR
    assert err(fs.create, d.inode, "sub", flags=os.O_RDONLY) == errno.EISDIR
    assert err(fs.create, d.inode, "sub", flags=RW | os.O_EXCL) == errno.EEXIST
    assert (
        err(
            fs.op.create,
            F.CreateRequest(
                user=ROOT, request_id=rid(), parent=d.inode, name=b"q", mode=stat.S_IFDIR | 0o755
            ),
        )
        == errno.EINVAL
    )


# ----------------------------------------------------------------------------- permissions


def test_search_and_write_permission(fs: Fs) -> None:
    assert err(fs.create, 1, "f", user=ALICE) == errno.EACCES  # root dir is 0755 root:root
    priv = fs.mkdir(1, "priv", 0o700)
    fs.touch(priv.inode, "secret")
    assert err(fs.lookup, priv.inode, "secret", user=ALICE) == errno.EACCES
    assert err(fs.op.readdir, F.ReadDirRequest(user=ALICE, inode=priv.inode)) == errno.EACCES
    xonly = fs.mkdir(1, "xonly", 0o711)
    f = fs.touch(xonly.inode, "f", 0o600)
    assert fs.lookup(xonly.inode, "f", user=ALICE).inode == f.inode  # search without read
    assert err(fs.op.readdir, F.ReadDirRequest(user=ALICE, inode=xonly.inode)) == errno.EACCES
    opn = fs.op.open
    assert (
        err(opn, F.OpenRequest(user=ALICE, request_id=rid(), inode=f.inode, flags=os.O_RDONLY))
        == errno.EACCES
    )
    # group class applies to supplementary groups; other class to strangers
    g = fs.mkdir(1, "g", 0o770)
    fs.setattr(g.inode, valid=F.SETATTR_GID, gid=3000)
    fs.touch(g.inode, "ok", user=ALICE)
    assert err(fs.create, g.inode, "no", user=BOB) == errno.EACCES
    # root: exec only if some x bit is set
    noexec = fs.touch(1, "noexec", 0o644)
    assert (
        err(fs.op.access, F.AccessRequest(user=ROOT, inode=noexec.inode, mask=os.X_OK))
        == errno.EACCES
    )
    fs.op.access(F.AccessRequest(user=ROOT, inode=noexec.inode, mask=os.R_OK | os.W_OK))
    fs.op.access(F.AccessRequest(user=ALICE, inode=noexec.inode, mask=os.R_OK))
    assert (
        err(fs.op.access, F.AccessRequest(user=ALICE, inode=noexec.inode, mask=os.W_OK))
        == errno.EACCES
    )


def test_open_modes(fs: Fs) -> None:
    d = fs.mkdir(1, "d")
    f = fs.touch(1, "f", 0o444)
    o = fs.op.open
    assert (
        err(o, F.OpenRequest(user=ALICE, request_id=rid(), inode=f.inode, flags=os.O_WRONLY))
        == errno.EACCES
    )
    assert (
        err(
            o,
            F.OpenRequest(
                user=ALICE, request_id=rid(), inode=f.inode, flags=os.O_RDONLY | os.O_TRUNC
            ),
        )
        == errno.EACCES
    )
    assert (
        err(o, F.OpenRequest(user=ROOT, request_id=rid(), inode=d.inode, flags=os.O_WRONLY))
        == errno.EISDIR
    )
    assert (
        err(
            o,
            F.OpenRequest(
                user=ROOT, request_id=rid(), inode=f.inode, flags=os.O_RDONLY | os.O_DIRECTORY
            ),
        )
        == errno.ENOTDIR
    )
    assert (
        err(o, F.OpenRequest(user=ROOT, request_id=rid(), inode=f.inode, flags=3)) == errno.EINVAL
    )
    r = o(
        F.OpenRequest(
            user=ROOT, request_id=rid(), inode=d.inode, flags=os.O_RDONLY | os.O_DIRECTORY
        )
    )
    assert r.session_id == ""  # directories need no session
    r = o(F.OpenRequest(user=ALICE, request_id=rid(), inode=f.inode, flags=os.O_RDONLY))
    assert r.session_id
    fs.close(f.inode, r.session_id, ALICE)
    # created with mode 0444 and O_RDWR: the creator may still write through its session
    c = fs.create(1, "ro", 0o444, user=ROOT)
    t = fs.setattr(c.attr.inode, user=ALICE, valid=F.SETATTR_SIZE, size=10, session_id=c.session_id)
    assert t.attr.size == 10
    fs.close(c.attr.inode, c.session_id)


def test_sticky_directory(fs: Fs) -> None:
    tmp = fs.mkdir(1, "tmp", 0o1777)
    fs.touch(tmp.inode, "a", user=ALICE)
    fs.touch(tmp.inode, "b", user=ALICE)
    fs.touch(tmp.inode, "bob", user=BOB)
    assert err(fs.unlink, tmp.inode, "a", user=BOB) == errno.EPERM
    assert err(fs.rename, tmp.inode, "a", tmp.inode, "z", user=BOB) == errno.EPERM
    assert (
        err(fs.rename, tmp.inode, "bob", tmp.inode, "a", user=BOB) == errno.EPERM
    )  # victim owned by alice
    fs.unlink(tmp.inode, "a", user=ALICE)
    fs.unlink(tmp.inode, "b", user=ROOT)
    fs.rename(tmp.inode, "bob", tmp.inode, "bob2", user=BOB)


def test_setgid_directory(fs: Fs) -> None:
    g = fs.mkdir(1, "g", 0o2777)
    fs.setattr(g.inode, valid=F.SETATTR_GID, gid=5000)
    assert fs.getattr(g.inode).mode & stat.S_ISGID
    f = fs.touch(g.inode, "f", 0o644, user=BOB)
    assert f.gid == 5000 and f.uid == BOB.uid
    sub = fs.mkdir(g.inode, "sub", 0o755, user=BOB)
    assert sub.gid == 5000 and sub.mode & stat.S_ISGID
    # a non-member creating a setgid file in it loses S_ISGID
    s = fs.touch(g.inode, "s", 0o2755, user=BOB)
    assert not s.mode & stat.S_ISGID
    plain = fs.mkdir(1, "plain", 0o777)
    assert fs.touch(plain.inode, "h", user=ALICE).gid == ALICE.gid


def test_chown_chmod_rules(fs: Fs) -> None:
    d = fs.mkdir(1, "d", 0o777)
    f = fs.touch(d.inode, "f", 0o644, user=ALICE)
    assert err(fs.setattr, f.inode, user=ALICE, valid=F.SETATTR_UID, uid=BOB.uid) == errno.EPERM
    assert err(fs.setattr, f.inode, user=BOB, valid=F.SETATTR_MODE, mode=0o777) == errno.EPERM
    assert err(fs.setattr, f.inode, user=ALICE, valid=F.SETATTR_GID, gid=9999) == errno.EPERM
    assert err(fs.setattr, f.inode, user=BOB, valid=F.SETATTR_GID, gid=ALICE.gid) == errno.EPERM
    c0 = ns(fs.getattr(f.inode).ctime)
    a = fs.setattr(f.inode, user=ALICE, valid=F.SETATTR_GID, gid=3000).attr  # supplementary group
    assert a.gid == 3000 and ns(a.ctime) >= c0
    a = fs.setattr(f.inode, user=ALICE, valid=F.SETATTR_MODE, mode=0o6755).attr
    assert stat.S_IMODE(a.mode) == 0o6755 and stat.S_ISREG(a.mode)
    a = fs.setattr(
        f.inode, user=ROOT, valid=F.SETATTR_UID | F.SETATTR_GID, uid=BOB.uid, gid=BOB.gid
    ).attr
    assert (
        a.uid == BOB.uid and a.gid == BOB.gid and stat.S_IMODE(a.mode) == 0o755
    )  # suid/sgid cleared
    # chmod g+s by a non-member of the file's group: S_ISGID silently dropped
    a = fs.setattr(f.inode, user=BOB, valid=F.SETATTR_MODE, mode=0o2755).attr
    assert stat.S_IMODE(a.mode) == 0o2755  # bob is in group 1001
    fs.setattr(f.inode, user=ROOT, valid=F.SETATTR_GID, gid=4242)
    a = fs.setattr(f.inode, user=BOB, valid=F.SETATTR_MODE, mode=0o2755).attr
    assert stat.S_IMODE(a.mode) == 0o755
    # the kernel's "kill suid/sgid" setattr from a non-owner writer is accepted; a real chmod is not
    fs.setattr(f.inode, user=ROOT, valid=F.SETATTR_MODE, mode=0o6666)
    assert err(fs.setattr, f.inode, user=ALICE, valid=F.SETATTR_MODE, mode=0o6664) == errno.EPERM
    a = fs.setattr(f.inode, user=ALICE, valid=F.SETATTR_MODE, mode=0o0666).attr
    assert stat.S_IMODE(a.mode) == 0o666
    fs.setattr(f.inode, user=ROOT, valid=F.SETATTR_MODE, mode=0o6644)
    assert (
        err(fs.setattr, f.inode, user=ALICE, valid=F.SETATTR_MODE, mode=0o644) == errno.EPERM
    )  # no write
    # a non-root writer's truncate clears suid
    fs.setattr(f.inode, user=ROOT, valid=F.SETATTR_MODE, mode=0o4777)
    a = fs.setattr(f.inode, user=ALICE, valid=F.SETATTR_SIZE, size=1).attr
    assert stat.S_IMODE(a.mode) == 0o777


def test_utimes(fs: Fs) -> None:
    f = fs.touch(1, "f", 0o666)
    t = common_pb2.Timespec(sec=1_000_000_000, nsec=123_456_789)
    a = fs.setattr(f.inode, valid=F.SETATTR_ATIME | F.SETATTR_MTIME, atime=t, mtime=t).attr
    assert ns(a.atime) == ns(a.mtime) == 1_000_000_000_123_456_789
    assert ns(a.ctime) > ns(a.mtime)
    m = fs.setattr(f.inode, valid=F.SETATTR_MTIME, mtime=common_pb2.Timespec(sec=5)).attr
    assert ns(m.atime) == ns(a.atime) and m.mtime.sec == 5  # atime omitted
    assert err(fs.setattr, f.inode, user=ALICE, valid=F.SETATTR_MTIME, mtime=t) == errno.EPERM
    n = fs.setattr(
        f.inode, user=ALICE, valid=F.SETATTR_ATIME_NOW | F.SETATTR_MTIME_NOW
    ).attr  # writer may
    assert ns(n.mtime) > ns(m.mtime)
    ro = fs.touch(1, "ro", 0o644)
    assert err(fs.setattr, ro.inode, user=ALICE, valid=F.SETATTR_MTIME_NOW) == errno.EACCES
    assert err(fs.setattr, ro.inode, valid=1 << 20) == errno.EINVAL
    with pytest.raises(FsError) as ei:
        fs.setattr(ro.inode, valid=1 << 20)
    assert ei.value.code == Code.INVALID_ARGUMENT


# ----------------------------------------------------------------------------- files


def test_truncate_and_length_reports(fs: Fs) -> None:
    r = fs.create(1, "f", 0o644)
    ino, sid = r.attr.inode, r.session_id
    tv = r.attr.truncate_version
    s = fs.op.sync(
        F.SyncRequest(
            user=ROOT,
            request_id=rid(),
            inode=ino,
            session_id=sid,
            has_length_hint=True,
            length_hint=5000,
            truncate_version=tv,
        )
    )
    assert s.attr.size == 5000
    s = fs.op.sync(
        F.SyncRequest(
            user=ROOT,
            request_id=rid(),
            inode=ino,
            session_id=sid,
            has_length_hint=True,
            length_hint=100,
            truncate_version=tv,
        )
    )
    assert s.attr.size == 5000  # hints never shrink
    t = fs.setattr(ino, valid=F.SETATTR_SIZE, size=10)
    assert t.need_truncate and t.old_size == 5000 and t.attr.size == 10
    assert t.attr.truncate_version == tv + 1
    stale = fs.op.sync(
        F.SyncRequest(
            user=ROOT,
            request_id=rid(),
            inode=ino,
            session_id=sid,
            has_length_hint=True,
            length_hint=5000,
            truncate_version=tv,
        )
    )
    assert stale.attr.size == 10  # a report from before the truncate is ignored
    up = fs.setattr(ino, valid=F.SETATTR_SIZE, size=1 << 40)  # sparse extend: metadata only
    assert not up.need_truncate and up.attr.size == 1 << 40
    assert err(fs.setattr, ino, valid=F.SETATTR_SIZE, size=1 << 62) == errno.EFBIG
    mt = common_pb2.Timespec(sec=2_000_000_000, nsec=7)
    a = fs.close(
        ino,
        sid,
        has_length_hint=True,
        length_hint=(1 << 40) + 3,
        truncate_version=up.attr.truncate_version,
        mtime=mt,
    )
    assert a.size == (1 << 40) + 3 and ns(a.mtime) == ns(mt)
    assert err(fs.close, ino, sid) == errno.EBADF  # session is gone
    d = fs.mkdir(1, "d")
    assert err(fs.setattr, d.inode, valid=F.SETATTR_SIZE, size=0) == errno.EISDIR
    o = fs.op.open(
        F.OpenRequest(user=ROOT, request_id=rid(), inode=ino, flags=os.O_WRONLY | os.O_TRUNC)
    )
    assert o.need_truncate and o.attr.size == 0 and o.old_size == (1 << 40) + 3
    rd = fs.op.open(F.OpenRequest(user=ROOT, request_id=rid(), inode=ino, flags=os.O_RDONLY))
    assert (
        err(
            fs.op.sync,
            F.SyncRequest(
                user=ROOT,
                request_id=rid(),
                inode=ino,
                session_id=rd.session_id,
                has_length_hint=True,
                length_hint=9,
            ),
        )
        == errno.EBADF
    )
    fs.close(ino, o.session_id)
    fs.close(ino, rd.session_id)


def test_unlink_while_open_and_gc(fs: Fs) -> None:
    r = fs.create(1, "f", 0o644)
    ino = r.attr.inode
    fs.op.sync(
        F.SyncRequest(
            user=ROOT,
            request_id=rid(),
            inode=ino,
            session_id=r.session_id,
            has_length_hint=True,
            length_hint=3 << 20,
        )
    )
    rd = fs.op.open(F.OpenRequest(user=ROOT, request_id=rid(), inode=ino, flags=os.O_RDONLY))
    u = fs.unlink(1, "f")
    assert u.inode == ino and not u.inode_removed
    assert err(fs.lookup, 1, "f") == errno.ENOENT
    a = fs.getattr(ino)  # still there for the open handles
    assert a.nlink == 0 and a.size == 3 << 20
    assert not fs.op.list_gc(F.ListGcRequest(user=ROOT)).entries
    fs.close(ino, r.session_id)
    assert fs.getattr(ino).nlink == 0  # the reader still holds it
    fs.close(ino, rd.session_id)
    assert err(fs.getattr, ino) == errno.ENOENT
    gc = fs.op.list_gc(F.ListGcRequest(user=ROOT)).entries
    assert [e.inode for e in gc] == [ino]
    assert (
        gc[0].length == 3 << 20
        and list(gc[0].layout.chain_ids)
        and gc[0].layout.chunk_size == MetaSection().default_chunk_size
    )
    assert err(fs.op.list_gc, F.ListGcRequest(user=ALICE)) == errno.EPERM
    fs.op.ack_gc(F.AckGcRequest(user=ROOT, ids=[gc[0].id]))
    assert not fs.op.list_gc(F.ListGcRequest(user=ROOT)).entries
    fs.op.ack_gc(F.AckGcRequest(user=ROOT, ids=[gc[0].id]))  # idempotent
    # a file with no open session goes to GC at once; pruned sessions release orphans
    q = fs.create(1, "q")
    fs.unlink(1, "q")
    assert fs.op.prune_sessions(F.PruneSessionsRequest(user=ROOT, client_id="c1")).pruned == 1
    assert err(fs.getattr, q.attr.inode) == errno.ENOENT
    assert [e.inode for e in fs.op.list_gc(F.ListGcRequest(user=ROOT)).entries] == [q.attr.inode]


def test_gc_delay(db: Database) -> None:
    from fs3.clock import FakeClock

    clock = FakeClock(1_700_000_000.0)
    op = MetaOperator(db, MetaSection(gc_delay_s=60), StaticChainTables({1: [1]}), clock=clock)
    fs = Fs(op)
    fs.touch(1, "f")
    fs.unlink(1, "f")
    assert not op.list_gc(F.ListGcRequest(user=ROOT)).entries
    clock.advance(61)
    assert len(op.list_gc(F.ListGcRequest(user=ROOT)).entries) == 1


# ----------------------------------------------------------------------------- links, removal, rename


def test_link_unlink_rmdir(fs: Fs) -> None:
    d = fs.mkdir(1, "d")
    f = fs.touch(d.inode, "f")
    c0 = ns(f.ctime)
    a = fs.op.link(
        F.LinkRequest(user=ROOT, request_id=rid(), inode=f.inode, new_parent=1, new_name=b"l")
    ).attr
    assert a.nlink == 2 and ns(a.ctime) >= c0
    assert (
        err(
            fs.op.link,
            F.LinkRequest(user=ROOT, request_id=rid(), inode=d.inode, new_parent=1, new_name=b"dl"),
        )
        == errno.EPERM
    )
    assert (
        err(
            fs.op.link,
            F.LinkRequest(user=ROOT, request_id=rid(), inode=f.inode, new_parent=1, new_name=b"d"),
        )
        == errno.EEXIST
    )
    assert err(fs.rmdir, 1, "d") == errno.ENOTEMPTY
    assert err(fs.unlink, 1, "d") == errno.EISDIR
    assert err(fs.rmdir, d.inode, "f") == errno.ENOTDIR
    assert not fs.unlink(d.inode, "f").inode_removed
    assert fs.getattr(f.inode).nlink == 1
    assert fs.unlink(1, "l").inode_removed
    fs.rmdir(1, "d")
    assert fs.getattr(1).nlink == 2
    assert err(fs.getattr, d.inode) == errno.ENOENT
    # a removed directory takes no new entries (its inode is gone)
    assert err(fs.mkdir, d.inode, "x") == errno.ENOENT


def test_symlink_mknod(fs: Fs) -> None:
    s = fs.op.symlink(
        F.SymlinkRequest(
            user=ALICE,
            request_id=rid(),
            parent=fs.mkdir(1, "d", 0o777).inode,
            name=b"s",
            target=b"../some/where",
        )
    ).attr
    assert stat.S_ISLNK(s.mode) and s.size == len(b"../some/where") and s.uid == ALICE.uid
    assert fs.op.readlink(F.ReadLinkRequest(user=ALICE, inode=s.inode)).target == b"../some/where"
    assert err(fs.op.readlink, F.ReadLinkRequest(user=ROOT, inode=1)) == errno.EINVAL
    assert (
        err(
            fs.op.symlink,
            F.SymlinkRequest(user=ROOT, request_id=rid(), parent=1, name=b"e", target=b""),
        )
        == errno.ENOENT
    )
    assert (
        err(
            fs.op.symlink,
            F.SymlinkRequest(user=ROOT, request_id=rid(), parent=1, name=b"e", target=b"x" * 4096),
        )
        == errno.ENAMETOOLONG
    )
    mk = fs.op.mknod
    fifo = mk(
        F.MknodRequest(
            user=ROOT, request_id=rid(), parent=1, name=b"fifo", mode=stat.S_IFIFO | 0o600
        )
    ).attr
    assert stat.S_ISFIFO(fifo.mode) and fifo.rdev == 0
    dev = mk(
        F.MknodRequest(
            user=ROOT,
            request_id=rid(),
            parent=1,
            name=b"chr",
            mode=stat.S_IFCHR | 0o600,
            rdev=os.makedev(1, 3),
        )
    ).attr
    assert stat.S_ISCHR(dev.mode) and os.major(dev.rdev) == 1 and os.minor(dev.rdev) == 3
    sock = mk(
        F.MknodRequest(
            user=ROOT, request_id=rid(), parent=1, name=b"sock", mode=stat.S_IFSOCK | 0o600
        )
    )
    assert stat.S_ISSOCK(sock.attr.mode)
    reg = mk(F.MknodRequest(user=ROOT, request_id=rid(), parent=1, name=b"reg", mode=0o600)).attr
    assert stat.S_ISREG(reg.mode) and len(reg.layout.chain_ids) == 4
    assert (
        err(
            mk,
            F.MknodRequest(
                user=ALICE,
                request_id=rid(),
                parent=fs.lookup(1, "d").inode,
                name=b"b",
                mode=stat.S_IFBLK | 0o600,
            ),
        )
        == errno.EPERM
    )
    assert (
        err(
            mk,
            F.MknodRequest(
                user=ROOT, request_id=rid(), parent=1, name=b"dd", mode=stat.S_IFDIR | 0o600
            ),
        )
        == errno.EINVAL
    )
    assert fs.lookup(1, "chr").rdev == os.makedev(1, 3)


def test_rename_files(fs: Fs) -> None:
    a = fs.touch(1, "a")
    b = fs.touch(1, "b")
    c0 = ns(fs.getattr(1).ctime)
    r = fs.rename(1, "a", 1, "b")
    assert r.inode == a.inode and r.replaced_inode == b.inode
    assert fs.lookup(1, "b").inode == a.inode and err(fs.lookup, 1, "a") == errno.ENOENT
    assert err(fs.getattr, b.inode) == errno.ENOENT
    assert [e.inode for e in fs.op.list_gc(F.ListGcRequest(user=ROOT)).entries] == [b.inode]
    assert ns(fs.getattr(1).ctime) >= c0 and ns(fs.getattr(a.inode).ctime) >= ns(a.ctime)
    # same inode under two names: nothing happens
    fs.op.link(
        F.LinkRequest(user=ROOT, request_id=rid(), inode=a.inode, new_parent=1, new_name=b"hl")
    )
    fs.rename(1, "b", 1, "hl")
    assert (
        fs.lookup(1, "b").inode == fs.lookup(1, "hl").inode == a.inode
        and fs.getattr(a.inode).nlink == 2
    )
    assert err(fs.rename, 1, "missing", 1, "x") == errno.ENOENT
    fs.touch(1, "c")
    assert err(fs.rename, 1, "c", 1, "b", flags=1) == errno.EEXIST  # NOREPLACE
    fs.rename(1, "c", 1, "new", flags=1)
    assert err(fs.rename, 1, "new", 1, "b", flags=3) == errno.EINVAL
    assert err(fs.rename, 1, "new", 1, "b", flags=8) == errno.EINVAL
    # a replaced file that is open stays until closed
    o = fs.create(1, "open")
    fs.rename(1, "new", 1, "open")
    assert fs.getattr(o.attr.inode).nlink == 0
    fs.close(o.attr.inode, o.session_id)
    assert err(fs.getattr, o.attr.inode) == errno.ENOENT


def test_rename_directories(fs: Fs) -> None:
    a = fs.mkdir(1, "a")
    b = fs.mkdir(1, "b")
    sub = fs.mkdir(a.inode, "sub")
    fs.touch(b.inode, "file")
    assert err(fs.rename, 1, "a", 1, "b") == errno.ENOTEMPTY
    assert err(fs.rename, 1, "a", sub.inode, "x") == errno.EINVAL  # into its own subtree
    assert err(fs.rename, 1, "a", a.inode, "x") == errno.EINVAL
    assert err(fs.rename, b.inode, "file", 1, "a") == errno.EISDIR
    assert err(fs.rename, 1, "a", b.inode, "file") == errno.ENOTDIR
    empty = fs.mkdir(b.inode, "empty")
    assert fs.getattr(b.inode).nlink == 3
    r = fs.rename(a.inode, "sub", b.inode, "empty")  # dir over empty dir, across parents
    assert r.replaced_inode == empty.inode and err(fs.getattr, empty.inode) == errno.ENOENT
    assert fs.getattr(a.inode).nlink == 2 and fs.getattr(b.inode).nlink == 3
    assert fs.getattr(sub.inode).parent == b.inode
    assert fs.lookup(sub.inode, "..").inode == b.inode
    fs.rename(b.inode, "empty", 1, "top")
    assert fs.getattr(1).nlink == 5 and fs.getattr(b.inode).nlink == 2
    # moving a directory needs write permission on it (its '..' changes)
    pub = fs.mkdir(1, "pub", 0o777)
    fs.mkdir(pub.inode, "ro", 0o555, user=ALICE)
    other = fs.mkdir(1, "other", 0o777)
    assert err(fs.rename, pub.inode, "ro", other.inode, "ro", user=BOB) == errno.EACCES


def test_rename_exchange(fs: Fs) -> None:
    a = fs.mkdir(1, "a")
    b = fs.mkdir(1, "b")
    f = fs.touch(a.inode, "f")
    d = fs.mkdir(b.inode, "d")
    fs.rename(a.inode, "f", b.inode, "d", flags=2)
    assert fs.lookup(a.inode, "f").inode == d.inode and fs.lookup(b.inode, "d").inode == f.inode
    assert fs.getattr(a.inode).nlink == 3 and fs.getattr(b.inode).nlink == 2
    assert fs.getattr(d.inode).parent == a.inode
    assert err(fs.rename, a.inode, "f", b.inode, "nope", flags=2) == errno.ENOENT
    assert err(fs.rename, 1, "a", a.inode, "f", flags=2) == errno.EINVAL  # a would go below itself
    fs.rename(1, "a", 1, "b", flags=2)
    assert fs.lookup(1, "a").inode == b.inode and fs.lookup(1, "b").inode == a.inode


# ----------------------------------------------------------------------------- readdir


def test_readdir_sorted_paged_with_attrs(fs: Fs) -> None:
    d = fs.mkdir(1, "d", 0o777)
    names = [f"n{i:03d}" for i in range(25)]
    for n in random.Random(1).sample(names, len(names)):
        fs.touch(d.inode, n)
    assert fs.names(d.inode) == sorted(names)
    r = fs.op.readdir(F.ReadDirRequest(user=ROOT, inode=d.inode, limit=5, with_attrs=True))
    assert r.more and len(r.entries) == 5
    for e in r.entries:
        assert e.attr.inode == e.inode and e.type == stat.S_IFREG
    assert not fs.op.readdir(F.ReadDirRequest(user=ROOT, inode=d.inode, cursor=b"n024")).entries
    assert (
        err(fs.op.readdir, F.ReadDirRequest(user=ROOT, inode=fs.lookup(d.inode, "n001").inode))
        == errno.ENOTDIR
    )


def test_readdir_cursor_under_concurrent_changes(fs: Fs) -> None:
    d = fs.mkdir(1, "d", 0o777)
    stable = {f"s{i:03d}" for i in range(60)}
    for n in stable:
        fs.touch(d.inode, n)
    seen: list[str] = []
    cursor = b""
    i = 0
    while True:
        r = fs.op.readdir(F.ReadDirRequest(user=ROOT, inode=d.inode, cursor=cursor, limit=7))
        seen.extend(e.name.decode() for e in r.entries)
        # between pages: add entries before and after the cursor, remove volatile ones
        fs.touch(d.inode, f"a{i:03d}")
        fs.touch(d.inode, f"z{i:03d}")
        if i > 0:
            fs.unlink(d.inode, f"z{i - 1:03d}")
        i += 1
        if not r.more:
            break
        cursor = r.entries[-1].name
    assert len(seen) == len(set(seen)), "an entry was returned twice"
    assert stable <= set(seen), "an entry that existed throughout was skipped"
    assert seen == sorted(seen)


# ----------------------------------------------------------------------------- xattrs


def test_xattrs(fs: Fs) -> None:
    f = fs.touch(1, "f", 0o644)
    ino = f.inode
    sx, gx, lx, rx = fs.op.setxattr, fs.op.getxattr, fs.op.listxattr, fs.op.removexattr

    def set_(name: bytes, value: bytes, flags: int = 0, user: Any = ROOT) -> None:
        sx(
            F.SetXattrRequest(
                user=user, request_id=rid(), inode=ino, name=name, value=value, flags=flags
            )
        )

    set_(b"user.a", b"1")
    c0 = ns(fs.getattr(ino).ctime)
    set_(b"user.a", b"2", flags=2)
    assert ns(fs.getattr(ino).ctime) >= c0
    assert gx(F.GetXattrRequest(user=ALICE, inode=ino, name=b"user.a")).value == b"2"
    assert err(set_, b"user.a", b"3", 1) == errno.EEXIST
    assert err(set_, b"user.b", b"3", 2) == errno.ENODATA
    assert err(set_, b"user.b", b"3", 3) == errno.EINVAL
    assert err(set_, b"user.a", b"3", 0, ALICE) == errno.EACCES
    assert err(set_, b"", b"3") == errno.ERANGE
    assert err(set_, b"user." + b"x" * 300, b"3") == errno.ERANGE
    assert err(set_, b"user.big", b"x" * 65537) == errno.E2BIG
    set_(b"user.max", b"x" * 65536)
    assert err(set_, b"system.posix_acl_access", b"") == errno.EOPNOTSUPP
    assert err(set_, b"bogus.x", b"") == errno.EOPNOTSUPP
    set_(b"trusted.t", b"root")
    assert err(set_, b"trusted.u", b"x", 0, ALICE) == errno.EPERM
    assert sorted(lx(F.ListXattrRequest(user=ROOT, inode=ino)).names) == [
        b"trusted.t",
        b"user.a",
        b"user.max",
    ]
    assert sorted(lx(F.ListXattrRequest(user=ALICE, inode=ino)).names) == [b"user.a", b"user.max"]
    assert err(gx, F.GetXattrRequest(user=ROOT, inode=ino, name=b"user.none")) == errno.ENODATA
    rx(F.RemoveXattrRequest(user=ROOT, request_id=rid(), inode=ino, name=b"user.a"))
    assert (
        err(rx, F.RemoveXattrRequest(user=ROOT, request_id=rid(), inode=ino, name=b"user.a"))
        == errno.ENODATA
    )
    s = fs.op.symlink(
        F.SymlinkRequest(user=ROOT, request_id=rid(), parent=1, name=b"s", target=b"f")
    ).attr
    assert (
        err(
            sx,
            F.SetXattrRequest(
                user=ROOT, request_id=rid(), inode=s.inode, name=b"user.x", value=b""
            ),
        )
        == errno.EPERM
    )
    fs.unlink(1, "f")  # xattrs go with the inode (fsck checks none are left)


# ----------------------------------------------------------------------------- layout


def test_layout_inheritance_and_placement(db: Database) -> None:
    op = MetaOperator(
        db,
        MetaSection(default_stripe=3),
        StaticChainTables({1: [1, 2, 3, 4, 5, 6, 7], 2: [90, 91]}),
        seed=3,
    )
    fs = Fs(op)
    files = [fs.touch(1, f"f{i}") for i in range(7)]
    used: list[int] = []
    for f in files:
        lay = f.layout
        assert (
            lay.chunk_size == MetaSection().default_chunk_size
            and lay.stripe == 3
            and lay.table_id == 1
            and lay.table_version == 1
        )
        assert len(set(lay.chain_ids)) == 3
        used.extend(lay.chain_ids)
    assert sorted(set(used)) == [1, 2, 3, 4, 5, 6, 7]  # round-robin spreads over every chain
    assert max(used.count(c) for c in set(used)) - min(used.count(c) for c in set(used)) <= 1
    d = fs.mkdir(1, "d")
    sl = op.setlayout(
        F.SetLayoutRequest(
            user=ROOT,
            request_id=rid(),
            inode=d.inode,
            layout=F.Layout(chunk_size=1 << 16, stripe=8, table_id=2),
        )
    ).attr
    assert sl.layout.chunk_size == 1 << 16 and sl.layout.stripe == 8
    f = fs.touch(d.inode, "f")
    assert (
        f.layout.chunk_size == 1 << 16
        and f.layout.stripe == 2
        and sorted(f.layout.chain_ids) == [90, 91]
    )
    sub = fs.mkdir(d.inode, "sub")
    assert sub.layout.chunk_size == 1 << 16 and sub.layout.table_id == 2  # directories inherit too
    o = fs.create(1, "big", layout=F.Layout(chunk_size=1 << 22))
    assert o.attr.layout.chunk_size == 1 << 22 and o.attr.layout.stripe == 3
    fs.close(o.attr.inode, o.session_id)
    assert (
        err(
            op.setlayout,
            F.SetLayoutRequest(
                user=ROOT, request_id=rid(), inode=d.inode, layout=F.Layout(chunk_size=5000)
            ),
        )
        == errno.EINVAL
    )
    assert (
        err(
            op.setlayout,
            F.SetLayoutRequest(
                user=ROOT, request_id=rid(), inode=f.inode, layout=F.Layout(stripe=1)
            ),
        )
        == errno.ENOTDIR
    )
    assert (
        err(
            op.setlayout,
            F.SetLayoutRequest(
                user=ALICE, request_id=rid(), inode=d.inode, layout=F.Layout(stripe=1)
            ),
        )
        == errno.EPERM
    )
    assert check_namespace(db).ok


def test_no_chain_table_yet_fails_file_creates_retryably(db: Database) -> None:
    """A file is never created without chains (its layout is fixed at create): while the
    chain table is not in the meta server's routing (just after a restart), create and mknod
    fail with a retryable error and change nothing; the client's retry of the same request
    succeeds, with chains, once the table is known."""
    src = StaticChainTables({})
    fs = Fs(MetaOperator(db, MetaSection(inode_batch=8), src))
    d = fs.mkdir(1, "d")  # the namespace works without chains
    req = F.CreateRequest(
        user=ROOT, request_id=rid(), parent=d.inode, name=b"f", mode=0o644, flags=RW, client_id="c1"
    )
    mknod = F.MknodRequest(
        user=ROOT, request_id=rid(), parent=d.inode, name=b"n", mode=stat.S_IFREG | 0o644
    )
    for call in (lambda: fs.op.create(req), lambda: fs.op.mknod(mknod)):
        with pytest.raises(FsError) as ei:
            call()
        assert ei.value.code == Code.UNKNOWN_CHAIN_TABLE and ei.value.retryable
    for name in ("f", "n"):
        with pytest.raises(FsError) as ei:
            fs.lookup(d.inode, name)
        assert ei.value.errno == errno.ENOENT
    assert fs.getattr(d.inode).nlink == 2 and check_namespace(db).ok
    src.tables[1] = [5, 6]  # the routing watcher caught up
    r = fs.op.create(req)
    assert sorted(r.attr.layout.chain_ids) == [5, 6]  # default stripe capped at the table
    fs.close(r.attr.inode, r.session_id)
    assert sorted(fs.op.mknod(mknod).attr.layout.chain_ids) == [5, 6]
    assert check_namespace(db).ok


def test_meta_without_routing_refuses_file_creates(db: Database) -> None:
    fs = Fs(MetaOperator(db))  # no chain table source: a meta server without a cluster file
    fs.mkdir(1, "d")
    with pytest.raises(FsError) as ei:
        fs.touch(1, "f")
    assert ei.value.code == Code.UNKNOWN_CHAIN_TABLE and not ei.value.retryable
    with pytest.raises(FsError):
        fs.lookup(1, "f")


# ----------------------------------------------------------------------------- robustness


def test_malformed_requests(fs: Fs) -> None:
    op = fs.op
    with pytest.raises(FsError) as ei:
        op.mkdir(F.MkdirRequest(request_id=rid(), parent=1, name=b"x", mode=0o755))  # no user
    assert ei.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(FsError) as ei:
        op.mkdir(F.LookupRequest(user=ROOT, parent=1, name=b"x"))  # type: ignore[arg-type]
    assert ei.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(FsError) as ei:
        op.mkdir(F.MkdirRequest(user=ROOT, request_id="x" * 1000, parent=1, name=b"x", mode=0o755))
    assert ei.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(FsError) as ei:
        op.create(
            F.CreateRequest(
                user=ROOT, request_id=rid(), parent=1, name=b"c", mode=0o644, client_id="c" * 10**6
            )
        )
    assert ei.value.code == Code.INVALID_ARGUMENT
    assert err(op.getattr, F.GetAttrRequest(user=ROOT)) == errno.EINVAL
    assert err(op.getattr, F.GetAttrRequest(user=ROOT, inode=987654321)) == errno.ENOENT
    assert err(fs.mkdir, 987654321, "x") == errno.ENOENT
    f = fs.touch(1, "f")
    assert err(fs.mkdir, f.inode, "x") == errno.ENOTDIR
    assert err(op.readdir, F.ReadDirRequest(user=ROOT, inode=1, cursor=b"c" * 300)) == errno.EINVAL
    assert err(op.access, F.AccessRequest(user=ROOT, inode=1, mask=64)) == errno.EINVAL
    assert err(op.ack_gc, F.AckGcRequest(user=ROOT, ids=[b"garbage"])) == errno.EINVAL
    assert fs.names(1) == ["f"]  # nothing else was created


def test_idempotent_retries(fs: Fs) -> None:
    op = fs.op
    req = F.MkdirRequest(user=ROOT, request_id="same-1", parent=1, name=b"d", mode=0o755)
    a = op.mkdir(req)
    assert op.mkdir(req) == a  # the retry returns the stored answer
    assert fs.getattr(1).nlink == 3
    c = F.CreateRequest(
        user=ROOT,
        request_id="same-2",
        parent=a.attr.inode,
        name=b"f",
        mode=0o644,
        flags=RW | os.O_EXCL,
    )
    r1 = op.create(c)
    assert op.create(c) == r1  # not EEXIST: same request
    u = F.RemoveRequest(user=ROOT, request_id="same-3", parent=a.attr.inode, name=b"f")
    assert op.unlink(u) == op.unlink(u)  # not ENOENT
    fs.close(r1.attr.inode, r1.session_id)
    fs.touch(1, "x")
    mv = F.RenameRequest(
        user=ROOT, request_id="same-4", parent=1, name=b"x", new_parent=a.attr.inode, new_name=b"y"
    )
    assert op.rename(mv) == op.rename(mv)
    assert fs.lookup(a.attr.inode, "y")
    with pytest.raises(FsError) as ei:
        op.rmdir(F.RemoveRequest(user=ROOT, request_id="same-4", parent=1, name=b"d"))
    assert ei.value.code == Code.INVALID_ARGUMENT
    assert op.prune_requests(max_age_s=-1.0) >= 4
    assert op.prune_requests(max_age_s=-1.0) == 0


class _UnknownResult(Database):
    """Commits, then (sometimes) reports a retryable 'commit unknown' error, like FDB."""

    engine = "unknown-result"

    def __init__(self, inner: Database, prob: float, seed: int) -> None:
        super().__init__()
        self.inner = inner
        self.rng = random.Random(seed)
        self.prob = prob
        self.lies = 0

    def create_transaction(self) -> Transaction:
        tr = self.inner.create_transaction()
        outer = self
        orig = tr.commit

        def commit() -> None:
            orig()
            if outer.rng.random() < outer.prob:
                outer.lies += 1
                raise FsError(
                    Code.KV_COMMIT_UNKNOWN, "commit result unknown (test)", retryable=True
                )

        tr.commit = commit  # type: ignore[method-assign]
        return tr


def _workload(fs: Fs, tag: str) -> None:
    """A fixed sequence whose end state is known; every step must apply exactly once."""
    d = fs.mkdir(1, f"w{tag}")
    for i in range(12):
        fs.touch(d.inode, f"f{i}")
    for i in range(0, 12, 3):
        fs.rename(d.inode, f"f{i}", d.inode, f"g{i}")
    for i in range(1, 12, 3):
        fs.unlink(d.inode, f"f{i}")
    sub = fs.mkdir(d.inode, "sub")
    fs.rename(d.inode, "f2", sub.inode, "moved")
    fs.op.link(
        F.LinkRequest(
            user=ROOT,
            request_id=rid(),
            inode=fs.lookup(d.inode, "g0").inode,
            new_parent=sub.inode,
            new_name=b"hard",
        )
    )
    names = fs.names(d.inode)
    assert names == sorted(["f5", "f8", "f11", "g0", "g3", "g6", "g9", "sub"])
    assert fs.names(sub.inode) == ["hard", "moved"]
    assert fs.getattr(d.inode).nlink == 3 and fs.lookup(d.inode, "g0").nlink == 2


def test_exactly_once_under_injected_faults(db: Database) -> None:
    op = MetaOperator(db, MetaSection(inode_batch=16), StaticChainTables({1: [1, 2]}))
    with faults.inject(0.2, seed=1234) as scope:
        _workload(Fs(op), "a")
    assert scope.total > 10  # faults really happened
    assert check_namespace(db).ok


def test_exactly_once_when_commit_result_is_unknown(db: Database) -> None:
    liar = _UnknownResult(db, 0.3, seed=99)
    op = MetaOperator(liar, MetaSection(inode_batch=16), StaticChainTables({1: [1, 2]}))
    _workload(Fs(op), "b")
    assert liar.lies > 5
    rep = check_namespace(db)
    assert rep.ok, str(rep)


def test_concurrent_servers_keep_invariants(db: Database) -> None:
    ops = [
        MetaOperator(db, MetaSection(inode_batch=16), StaticChainTables({1: [1, 2, 3]}))
        for _ in range(2)
    ]
    for i in range(2):
        Fs(ops[0]).mkdir(1, f"d{i}", 0o777)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        fs = Fs(ops[k % 2])
        rng = random.Random(k)
        d = [fs.lookup(1, "d0").inode, fs.lookup(1, "d1").inode]
        try:
            for _ in range(30):
                choice = rng.random()
                name = f"n{rng.randrange(10)}"
                try:
                    if choice < 0.4:
                        fs.touch(rng.choice(d), name)
                    elif choice < 0.55:
                        fs.mkdir(rng.choice(d), "dir" + name)
                    elif choice < 0.8:
                        fs.rename(rng.choice(d), name, rng.choice(d), f"n{rng.randrange(10)}")
                    else:
                        fs.unlink(rng.choice(d), name)
                except FsError as e:
                    if e.code != Code.POSIX:
                        raise
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    assert not errors, errors
    rep = check_namespace(db)
    assert rep.ok, str(rep)


def test_creates_in_one_directory_do_not_conflict(db: Database) -> None:
    """File creates/unlinks only touch the parent's times key (blind write): no retries."""
    op = MetaOperator(db, MetaSection(inode_batch=4096), StaticChainTables({1: [1]}))
    d = op.mkdir(F.MkdirRequest(user=ROOT, request_id=rid(), parent=1, name=b"d", mode=0o777)).attr
    t = common_pb2.Timespec(sec=100, nsec=5)
    op.setattr(
        F.SetAttrRequest(user=ROOT, request_id=rid(), inode=d.inode, valid=F.SETATTR_MTIME, mtime=t)
    )
    assert ns(op.getattr(F.GetAttrRequest(user=ROOT, inode=d.inode)).attr.mtime) == ns(t)
    base = db.retries

    def worker(k: int) -> None:
        for i in range(25):
            op.mknod(
                F.MknodRequest(
                    user=ROOT,
                    request_id=rid(),
                    parent=d.inode,
                    name=b"f%d-%d" % (k, i),
                    mode=stat.S_IFREG | 0o644,
                )
            )
            if i % 5 == 0:
                op.unlink(
                    F.RemoveRequest(
                        user=ROOT, request_id=rid(), parent=d.inode, name=b"f%d-%d" % (k, i)
                    )
                )

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert db.retries == base
    a = op.getattr(F.GetAttrRequest(user=ROOT, inode=d.inode)).attr
    assert ns(a.mtime) > ns(t) and ns(a.ctime) == ns(a.mtime) and a.nlink == 2
    assert len(Fs(op).names(d.inode)) == 80
    rep = check_namespace(db)
    assert rep.ok, str(rep)


# ------------------------------- fast paths (entry ops return parent attrs, LookupPath)


def test_entry_ops_return_parent_attrs(fs: Fs) -> None:
    """Every op that adds or removes an entry returns the parent as it left it (= GetAttr)."""
    d = fs.mkdir(1, "d", 0o777)
    r = fs.create(d.inode, "f")
    assert r.parent_attr == fs.getattr(d.inode)
    assert ns(r.parent_attr.mtime) == ns(r.attr.ctime)
    fs.close(r.attr.inode, r.session_id)
    again = fs.create(d.inode, "f")  # opens the existing file: parent unchanged
    assert again.parent_attr == fs.getattr(d.inode)
    fs.close(again.attr.inode, again.session_id)
    sub = fs.op.mkdir(F.MkdirRequest(user=ROOT, request_id=rid(), parent=d.inode, name=b"s"))
    assert sub.parent_attr == fs.getattr(d.inode) and sub.parent_attr.nlink == 3
    node = fs.op.mknod(
        F.MknodRequest(user=ROOT, request_id=rid(), parent=d.inode, name=b"p", mode=0o10644)
    )
    assert node.parent_attr == fs.getattr(d.inode)
    ln = fs.op.symlink(
        F.SymlinkRequest(user=ROOT, request_id=rid(), parent=d.inode, name=b"l", target=b"f")
    )
    assert ln.parent_attr == fs.getattr(d.inode)
    hard = fs.op.link(
        F.LinkRequest(user=ROOT, request_id=rid(), inode=r.attr.inode, new_parent=1, new_name=b"h")
    )
    assert hard.parent_attr == fs.getattr(1)
    assert fs.unlink(d.inode, "f").parent_attr == fs.getattr(d.inode)
    rm = fs.rmdir(d.inode, "s")
    assert rm.parent_attr == fs.getattr(d.inode) and rm.parent_attr.nlink == 2


def test_close_without_report_keeps_inode_record(fs: Fs, db: Database) -> None:
    """A Close that reports nothing new rewrites no inode; one that does still records it."""
    from fs3.meta import schema as S

    r = fs.create(1, "f")
    before = db.run(lambda tr: tr.get(S.inode_key(r.attr.inode)))
    after_attr = fs.close(r.attr.inode, r.session_id)
    assert db.run(lambda tr: tr.get(S.inode_key(r.attr.inode))) == before
    assert after_attr == fs.getattr(r.attr.inode)
    w = fs.create(1, "f")
    fs.close(w.attr.inode, w.session_id, has_length_hint=True, length_hint=10)
    assert fs.getattr(w.attr.inode).size == 10
    # an orphan whose last session closes without a report is still released
    o = fs.create(1, "o")
    fs.unlink(1, "o")
    fs.close(o.attr.inode, o.session_id)
    assert err(fs.getattr, o.attr.inode) == errno.ENOENT


def test_close_sessions_ends_many_in_one_call_and_is_idempotent(fs: Fs, db: Database) -> None:
    """CloseSessions: sessions go, inode records stay, an orphan's last session releases it,
    sessions already gone are skipped, bad requests change nothing."""
    from fs3.meta import schema as S

    a = fs.create(1, "a")
    b = fs.create(1, "b")
    o = fs.create(1, "o")
    held = fs.op.open(F.OpenRequest(user=ROOT, request_id=rid(), inode=a.attr.inode, flags=RW))
    fs.unlink(1, "o")
    rec_a = db.run(lambda tr: tr.get(S.inode_key(a.attr.inode)))
    refs = [F.SessionRef(inode=r.attr.inode, session_id=r.session_id) for r in (a, b, o)]

    # bad input first: nothing may change
    too_many = [refs[0]] * 1025
    assert err(fs.op.close_sessions, F.CloseSessionsRequest(user=ROOT, sessions=too_many)) == (
        errno.EINVAL
    )
    bad = [*refs, F.SessionRef(inode=0, session_id="x")]
    assert err(fs.op.close_sessions, F.CloseSessionsRequest(user=ROOT, sessions=bad)) == (
        errno.EINVAL
    )
    assert fs.getattr(o.attr.inode).nlink == 0  # still held by its session

    r = fs.op.close_sessions(F.CloseSessionsRequest(user=ROOT, sessions=refs))
    assert r.closed == 3
    assert db.run(lambda tr: tr.get(S.inode_key(a.attr.inode))) == rec_a  # untouched
    assert err(fs.getattr, o.attr.inode) == errno.ENOENT  # the orphan went to GC
    assert [e.inode for e in fs.op.list_gc(F.ListGcRequest(user=ROOT)).entries] == [o.attr.inode]
    assert err(fs.close, a.attr.inode, a.session_id) == errno.EBADF  # really gone
    # a retry (lost reply) finds nothing left to do
    assert fs.op.close_sessions(F.CloseSessionsRequest(user=ROOT, sessions=refs)).closed == 0
    # the other open session of "a" is untouched
    fs.close(a.attr.inode, held.session_id)


def test_create_and_open_end_piggybacked_sessions_in_their_transaction(fs: Fs) -> None:
    """Sessions riding on Create/Open end with it; a failing Create ends none of them."""
    a = fs.create(1, "a")
    b = fs.create(1, "b")
    fs.unlink(1, "b")  # an orphan, held by its session
    ref_a = F.SessionRef(inode=a.attr.inode, session_id=a.session_id)
    ref_b = F.SessionRef(inode=b.attr.inode, session_id=b.session_id)
    # O_EXCL on an existing name fails: nothing may change, the sessions stay
    assert err(fs.create, 1, "a", flags=RW | os.O_EXCL, close_sessions=[ref_a, ref_b]) == (
        errno.EEXIST
    )
    assert fs.getattr(b.attr.inode).nlink == 0
    assert err(fs.create, 1, "c", close_sessions=[F.SessionRef(inode=0, session_id="x")]) == (
        errno.EINVAL
    )
    assert err(fs.lookup, 1, "c") == errno.ENOENT
    c = fs.create(1, "c", close_sessions=[ref_a, ref_b])
    assert c.created
    assert err(fs.getattr, b.attr.inode) == errno.ENOENT  # the orphan's last session went
    assert err(fs.close, a.attr.inode, a.session_id) == errno.EBADF
    o = fs.op.open(
        F.OpenRequest(
            user=ROOT,
            request_id=rid(),
            inode=a.attr.inode,
            flags=os.O_RDONLY,
            close_sessions=[F.SessionRef(inode=c.attr.inode, session_id=c.session_id)],
        )
    )
    assert err(fs.close, c.attr.inode, c.session_id) == errno.EBADF
    fs.close(a.attr.inode, o.session_id)


@pytest.mark.parametrize("step", [1, 3, 50])
def test_readdir_attrs_dense_and_sparse_inodes(fs: Fs, step: int) -> None:
    """Attributes in ReadDir equal GetAttr's whether inodes are dense (range read) or not."""
    d = fs.mkdir(1, "d", 0o777)
    names = []
    for i in range(40):
        for j in range(step - 1):  # burn inode numbers elsewhere to spread ours out
            fs.touch(1, f"x{i}_{j}")
        n = f"e{i:03d}"
        names.append(n)
        if i % 7 == 0:
            fs.mkdir(d.inode, n)
        else:
            fs.touch(d.inode, n)
    # xattrs and directory times sit between inode records in the key space
    some = fs.lookup(d.inode, "e001")
    fs.op.setxattr(
        F.SetXattrRequest(user=ROOT, request_id=rid(), inode=some.inode, name=b"user.a", value=b"v")
    )
    fs.unlink(d.inode, "e002")  # an entry gone: not listed
    names.remove("e002")
    r = fs.op.readdir(F.ReadDirRequest(user=ROOT, inode=d.inode, limit=100, with_attrs=True))
    assert [e.name.decode() for e in r.entries] == names
    for e in r.entries:
        assert e.attr == fs.getattr(e.inode), e.name


def test_lookup_path_equals_stepwise_lookups(fs: Fs) -> None:
    """LookupPath resolves like one Lookup per name, stops at symlinks/non-dirs, same errors."""
    a = fs.mkdir(1, "a", 0o755)
    b = fs.mkdir(a.inode, "b", 0o700)
    f = fs.touch(b.inode, "f")
    fs.op.symlink(
        F.SymlinkRequest(user=ROOT, request_id=rid(), parent=a.inode, name=b"l", target=b"b")
    )

    def path(*names: bytes, user: Any = ROOT, parent: int = 1) -> list[meta_pb2.Attr]:
        r = fs.op.lookup_path(F.LookupPathRequest(user=user, parent=parent, names=list(names)))
        return list(r.attrs)

    assert path(b"a", b"b", b"f") == [fs.getattr(a.inode), fs.getattr(b.inode), fs.getattr(f.inode)]
    assert [x.inode for x in path(b"a", b".", b"b", b"..", b"b")] == [
        a.inode,
        a.inode,
        b.inode,
        a.inode,
        b.inode,
    ]
    assert [x.inode for x in path(b"a", b"l", b"f")] == [a.inode, fs.lookup(a.inode, "l").inode]
    assert [x.inode for x in path(b"a", b"b", b"f", b"x")] == [a.inode, b.inode, f.inode]
    assert err(path, b"a", b"nope", b"f") == errno.ENOENT
    assert err(path, b"a", b"b", b"f", user=ALICE) == errno.EACCES  # b is 0700 root's
    assert err(path, b"a", b"x" * 256) == errno.ENAMETOOLONG
    assert err(path) == errno.EINVAL
    assert err(path, *([b"."] * 65)) == errno.EINVAL
    assert (
        fs.op.read_once("lookup_path", F.LookupPathRequest(user=ROOT, parent=1, names=[b"a"]))
        .attrs[0]
        .inode
        == a.inode
    )
