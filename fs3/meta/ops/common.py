"""Shared pieces of meta operations: the per-attempt context and inode helpers.

An op is a plain function ``op(ctx, tx, req) -> response`` that runs inside one
KV transaction (``tx``); it raises ``FsError`` to abort with nothing changed.
Because :meth:`fs3.kv.Database.run` may run it several times, it takes
everything non-deterministic (the clock, a pre-allocated inode number, chain
placement) from ``ctx`` and has no side effects outside ``tx``.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable
from dataclasses import dataclass

from fs3.config import MetaSection
from fs3.errors import posix
from fs3.meta import perms
from fs3.meta import schema as S
from fs3.meta.store import Inode, MetaTxn
from fs3.proto import common_pb2, meta_pb2

LINK_MAX = 65000


@dataclass
class OpCtx:
    """What one attempt of an op may use besides the transaction."""

    user: common_pb2.UserInfo
    now_ns: int
    cfg: MetaSection
    place: Callable[[meta_pb2.Layout], meta_pb2.Layout]
    new_ino: int = 0  # pre-allocated inode number for ops that create one
    ino_used: bool = False
    changed: bool = True  # False: the op wrote nothing (no idempotency record needed)

    def take_ino(self) -> int:
        if not self.new_ino:
            raise RuntimeError("op creates an inode but none was pre-allocated")
        self.ino_used = True
        return self.new_ino


def touch(
    attr: meta_pb2.Attr, now_ns: int, *, mtime: bool = True, ctime: bool = True, atime: bool = False
) -> None:
    ts = S.timespec(now_ns)
    if mtime:
        attr.mtime.CopyFrom(ts)
    if ctime:
        attr.ctime.CopyFrom(ts)
    if atime:
        attr.atime.CopyFrom(ts)


def search_dir(
    tx: MetaTxn, ctx: OpCtx, ino: int, *, snapshot: bool = False, times: bool = True
) -> Inode:
    """A directory the caller may search (EXEC), or ENOENT/ENOTDIR/EACCES.

    ``times=False`` when the caller uses only its type and permissions (see
    :meth:`MetaTxn.load`): one KV read fewer.
    """
    if ino == 0:
        raise posix(errno.EINVAL, "parent inode is required")
    d = tx.must_dir(ino, snapshot=snapshot, times=times)
    perms.check(d.attr, ctx.user, perms.X, f"no search permission on directory {ino}")
    return d


def writable_dir(d: Inode, ctx: OpCtx) -> None:
    """Adding/removing entries needs WRITE+EXEC; a removed directory takes no new entries."""
    perms.check(d.attr, ctx.user, perms.W | perms.X, f"no write permission on directory {d.ino}")


def new_node(
    tx: MetaTxn,
    ctx: OpCtx,
    parent: Inode,
    name: bytes,
    mode: int,
    *,
    rdev: int = 0,
    symlink_target: bytes = b"",
) -> Inode:
    """Create an inode and its entry in ``parent`` (checks already done).

    Applies Linux's ownership rules: uid = caller; gid = parent's gid if the
    parent is set-group-ID (and new directories inherit S_ISGID), else the
    caller's gid; a non-directory keeps S_ISGID only if its creator is in its
    group (or root), as ``inode_init_owner`` does.
    """
    if parent.attr.nlink == 0:
        raise posix(errno.ENOENT, f"directory {parent.ino} was removed")
    ftype = stat.S_IFMT(mode)
    perm = mode & 0o7777
    pa = parent.attr
    uid = ctx.user.uid
    if pa.mode & stat.S_ISGID:
        gid = pa.gid
        if ftype == stat.S_IFDIR:
            perm |= stat.S_ISGID
    else:
        gid = ctx.user.gid
    if (
        ftype != stat.S_IFDIR
        and perm & stat.S_ISGID
        and not perms.is_root(ctx.user)
        and not perms.in_group(ctx.user, gid)
    ):
        perm &= ~stat.S_ISGID
    ino = ctx.take_ino()
    attr = meta_pb2.Attr(inode=ino, mode=ftype | perm, uid=uid, gid=gid, rdev=rdev)
    touch(attr, ctx.now_ns, atime=True)
    if ftype == stat.S_IFDIR:
        attr.nlink = 2
        attr.parent = parent.ino
        attr.layout.CopyFrom(
            meta_pb2.Layout(
                chunk_size=pa.layout.chunk_size,
                stripe=pa.layout.stripe,
                table_id=pa.layout.table_id,
            )
        )
        pa.nlink += 1
    else:
        attr.nlink = 1
    if ftype == stat.S_IFLNK:
        attr.size = len(symlink_target)
    node = Inode(attr, symlink_target)
    tx.put_inode(node)
    tx.set_entry(parent.ino, name, ino, ftype)
    if ftype == stat.S_IFDIR:
        touch(pa, ctx.now_ns)
        tx.put_inode(parent)  # nlink changed
    else:
        tx.touch_dir(parent, ctx.now_ns)  # times only: no conflict with sibling creates
    return node


def release(tx: MetaTxn, ctx: OpCtx, node: Inode) -> bool:
    """Delete an inode whose last link went, unless an open session holds it.

    Returns True if the inode record was deleted. A regular file's chunks go to
    the GC queue (due after ``gc_delay_s``) in the same transaction, so a file is
    either still visible or queued for chunk deletion, never lost in between.
    """
    a = node.attr
    if S.is_dir(a):
        tx.delete_inode(node.ino)
        return True
    if tx.has_sessions(node.ino):
        tx.put_inode(node)  # orphan: nlink 0, kept until the last Close
        return False
    if S.is_reg(a) and a.layout.chain_ids:
        due = ctx.now_ns + int(ctx.cfg.gc_delay_s * 1e9)
        tx.enqueue_gc(
            due,
            meta_pb2.GcEntry(
                inode=node.ino, layout=a.layout, length=a.size, removed_at=ctx.now_ns / 1e9
            ),
        )
    tx.delete_inode(node.ino)
    return True


def drop_link(tx: MetaTxn, ctx: OpCtx, node: Inode) -> bool:
    """One entry of a non-directory went away: nlink--, ctime; release at 0."""
    a = node.attr
    a.nlink = max(a.nlink - 1, 0)
    touch(a, ctx.now_ns, mtime=False)
    if a.nlink == 0:
        return release(tx, ctx, node)
    tx.put_inode(node)
    return False


def check_new_name(name: bytes) -> None:
    """Names of new entries: '.'/'..' exist already (EEXIST); other rules via perms."""
    if name in (b".", b".."):
        raise posix(errno.EEXIST, "'.' and '..' always exist")
    perms.check_name(name)
