"""Ops that change directory entries: mknod, mkdir, symlink, link, unlink, rmdir, rename.

Each is one transaction that reads (with conflict) every inode and entry whose
state it depends on: the parent(s), the entry key(s), the child, and for
directory moves every ancestor of the destination (so two concurrent renames
cannot together create a cycle). Parents get mtime/ctime = now and their
nlink follows subdirectories; children get ctime = now on link count changes.
"""

from __future__ import annotations

import errno
import stat

from fs3.errors import posix
from fs3.meta import perms
from fs3.meta import schema as S
from fs3.meta.ops.common import (
    LINK_MAX,
    OpCtx,
    check_new_name,
    drop_link,
    new_node,
    search_dir,
    touch,
    writable_dir,
)
from fs3.meta.store import Inode, MetaTxn
from fs3.proto import meta_pb2

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
MAX_DEPTH = 4096

_MKNOD_TYPES = {stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK}


def _prepare_new_entry(tx: MetaTxn, ctx: OpCtx, parent_ino: int, name: bytes) -> Inode:
    """Checks shared by every op that adds ``name`` to ``parent``; returns the parent."""
    if name in (b".", b".."):
        search_dir(tx, ctx, parent_ino)
        raise posix(errno.EEXIST, "'.' and '..' always exist")
    check_new_name(name)
    parent = search_dir(tx, ctx, parent_ino)
    if tx.get_entry(parent.ino, name) is not None:
        raise posix(errno.EEXIST, f"{name!r} exists in directory {parent.ino}")
    writable_dir(parent, ctx)
    if parent.attr.nlink == 0:
        raise posix(errno.ENOENT, f"directory {parent.ino} was removed")
    return parent


def _with_parent(node: Inode, parent: Inode) -> meta_pb2.AttrResponse:
    """The new node's attributes plus its parent's as this op left them.

    The kernel drops its cached attributes of a directory whose entries it
    changed and asks for them again right away (its permission check of the
    next path walk); carrying them here lets the FUSE daemon answer that from
    this reply instead of one more GetAttr round trip.
    """
    return meta_pb2.AttrResponse(
        attr=S.public_attr(node.attr), parent_attr=S.public_attr(parent.attr)
    )


def mknod(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.MknodRequest) -> meta_pb2.AttrResponse:
    ftype = stat.S_IFMT(req.mode) or stat.S_IFREG
    if ftype not in _MKNOD_TYPES:
        raise posix(errno.EINVAL, f"mknod cannot create file type {oct(ftype)}")
    if ftype in (stat.S_IFCHR, stat.S_IFBLK) and not perms.is_root(ctx.user):
        raise posix(errno.EPERM, "only root creates device nodes")
    parent = _prepare_new_entry(tx, ctx, req.parent, req.name)
    rdev = req.rdev if ftype in (stat.S_IFCHR, stat.S_IFBLK) else 0
    mode = ftype | (req.mode & 0o7777)
    if ftype == stat.S_IFREG:
        node = _new_file(tx, ctx, parent, req.name, mode, meta_pb2.Layout())
    else:
        node = new_node(tx, ctx, parent, req.name, mode, rdev=rdev)
    return _with_parent(node, parent)


def _new_file(
    tx: MetaTxn, ctx: OpCtx, parent: Inode, name: bytes, mode: int, override: meta_pb2.Layout
) -> Inode:
    from fs3.meta.layout import merge_layout

    node = new_node(tx, ctx, parent, name, stat.S_IFREG | (mode & 0o7777))
    node.attr.layout.CopyFrom(ctx.place(merge_layout(parent.attr.layout, override)))
    tx.put_inode(node)
    return node


def mkdir(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.MkdirRequest) -> meta_pb2.AttrResponse:
    parent = _prepare_new_entry(tx, ctx, req.parent, req.name)
    if parent.attr.nlink >= LINK_MAX:
        raise posix(errno.EMLINK, f"directory {parent.ino} has too many subdirectories")
    node = new_node(tx, ctx, parent, req.name, stat.S_IFDIR | (req.mode & 0o7777))
    return _with_parent(node, parent)


def symlink(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.SymlinkRequest) -> meta_pb2.AttrResponse:
    if not req.target:
        raise posix(errno.ENOENT, "empty symlink target")
    if len(req.target) > S.SYMLINK_MAX:
        raise posix(errno.ENAMETOOLONG, f"symlink target longer than {S.SYMLINK_MAX} bytes")
    if b"\x00" in req.target:
        raise posix(errno.EINVAL, "symlink target contains NUL")
    parent = _prepare_new_entry(tx, ctx, req.parent, req.name)
    node = new_node(tx, ctx, parent, req.name, stat.S_IFLNK | 0o777, symlink_target=req.target)
    return _with_parent(node, parent)


def link(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.LinkRequest) -> meta_pb2.AttrResponse:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    node = tx.must(req.inode)
    if S.is_dir(node.attr):
        raise posix(errno.EPERM, "hard links to directories are not allowed")
    parent = _prepare_new_entry(tx, ctx, req.new_parent, req.new_name)
    if node.attr.nlink == 0:
        raise posix(errno.ENOENT, f"inode {node.ino} has been unlinked")
    if node.attr.nlink >= LINK_MAX:
        raise posix(errno.EMLINK, f"inode {node.ino} has {node.attr.nlink} links")
    tx.set_entry(parent.ino, req.new_name, node.ino, stat.S_IFMT(node.attr.mode))
    node.attr.nlink += 1
    touch(node.attr, ctx.now_ns, mtime=False)
    tx.put_inode(node)
    tx.touch_dir(parent, ctx.now_ns)
    return _with_parent(node, parent)


def _lookup_child(tx: MetaTxn, ctx: OpCtx, parent_ino: int, name: bytes) -> tuple[Inode, Inode]:
    parent = search_dir(tx, ctx, parent_ino)
    perms.check_name(name)
    entry = tx.get_entry(parent.ino, name)
    if entry is None:
        raise posix(errno.ENOENT, f"{name!r} not found in directory {parent.ino}")
    child = tx.load(entry[0])
    if child is None:
        raise posix(errno.EIO, f"entry {name!r} of {parent.ino} points at missing inode {entry[0]}")
    return parent, child


def unlink(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.RemoveRequest) -> meta_pb2.RemoveResponse:
    if req.name in (b".", b".."):
        search_dir(tx, ctx, req.parent)
        raise posix(errno.EISDIR, "cannot unlink '.' or '..'")
    parent, child = _lookup_child(tx, ctx, req.parent, req.name)
    writable_dir(parent, ctx)
    perms.check_sticky(parent.attr, child.attr, ctx.user)
    if S.is_dir(child.attr):
        raise posix(errno.EISDIR, f"{req.name!r} is a directory")
    tx.clear_entry(parent.ino, req.name)
    tx.touch_dir(parent, ctx.now_ns)
    removed = drop_link(tx, ctx, child)
    return meta_pb2.RemoveResponse(
        inode=child.ino, inode_removed=removed, parent_attr=S.public_attr(parent.attr)
    )


def rmdir(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.RemoveRequest) -> meta_pb2.RemoveResponse:
    if req.name == b".":
        search_dir(tx, ctx, req.parent)
        raise posix(errno.EINVAL, "cannot rmdir '.'")
    if req.name == b"..":
        search_dir(tx, ctx, req.parent)
        raise posix(errno.ENOTEMPTY, "cannot rmdir '..'")
    parent, child = _lookup_child(tx, ctx, req.parent, req.name)
    writable_dir(parent, ctx)
    perms.check_sticky(parent.attr, child.attr, ctx.user)
    if not S.is_dir(child.attr):
        raise posix(errno.ENOTDIR, f"{req.name!r} is not a directory")
    if not tx.dir_is_empty(child.ino):
        raise posix(errno.ENOTEMPTY, f"directory {req.name!r} is not empty")
    _remove_empty_dir(tx, ctx, parent, req.name, child)
    return meta_pb2.RemoveResponse(
        inode=child.ino, inode_removed=True, parent_attr=S.public_attr(parent.attr)
    )


def _remove_empty_dir(tx: MetaTxn, ctx: OpCtx, parent: Inode, name: bytes, child: Inode) -> None:
    tx.clear_entry(parent.ino, name)
    tx.delete_inode(child.ino)
    child.attr.nlink = 0
    parent.attr.nlink = max(parent.attr.nlink - 1, 2)
    touch(parent.attr, ctx.now_ns)
    tx.put_inode(parent)


def _touch_parents(tx: MetaTxn, ctx: OpCtx, sp: Inode, dp: Inode, *, nlink_changed: bool) -> None:
    """mtime/ctime = now on both parents; rewrite their records only if nlink changed."""
    for p in (sp, dp):
        if nlink_changed:
            touch(p.attr, ctx.now_ns)
            tx.put_inode(p)
        else:
            tx.touch_dir(p, ctx.now_ns)


def _check_not_ancestor(tx: MetaTxn, moved: int, start: int) -> None:
    """EINVAL if directory ``moved`` is ``start`` or one of its ancestors.

    Every ancestor is read with conflict, so a concurrent rename that would
    combine with this one into a cycle makes one of them retry.
    """
    cur = start
    for _ in range(MAX_DEPTH):
        if cur == moved:
            raise posix(errno.EINVAL, "cannot move a directory into its own subtree")
        if cur == S.ROOT_INODE:
            return
        node = tx.must(cur)
        cur = int(node.attr.parent)
    raise posix(errno.ELOOP, "directory tree deeper than the limit")


def rename(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.RenameRequest) -> meta_pb2.RenameResponse:
    flags = req.flags
    if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE):
        raise posix(errno.EINVAL, f"unknown rename flags {flags:#x}")
    if flags & RENAME_NOREPLACE and flags & RENAME_EXCHANGE:
        raise posix(errno.EINVAL, "RENAME_NOREPLACE and RENAME_EXCHANGE together")
    for n in (req.name, req.new_name):
        if n in (b".", b".."):
            raise posix(errno.EINVAL, "cannot rename '.' or '..'")
        perms.check_name(n)
    sp = search_dir(tx, ctx, req.parent)
    dp = search_dir(tx, ctx, req.new_parent)
    src = tx.get_entry(sp.ino, req.name)
    if src is None:
        raise posix(errno.ENOENT, f"{req.name!r} not found in directory {sp.ino}")
    dst = tx.get_entry(dp.ino, req.new_name)
    writable_dir(sp, ctx)
    writable_dir(dp, ctx)
    s = tx.must(src[0])
    d = tx.must(dst[0]) if dst is not None else None
    if flags & RENAME_EXCHANGE and d is None:
        raise posix(errno.ENOENT, f"{req.new_name!r} not found in directory {dp.ino}")
    if flags & RENAME_NOREPLACE and d is not None:
        raise posix(errno.EEXIST, f"{req.new_name!r} exists in directory {dp.ino}")
    if d is not None and d.ino == s.ino:
        # both names are links to the same inode: POSIX says do nothing
        return meta_pb2.RenameResponse(inode=s.ino)
    s_dir = S.is_dir(s.attr)
    d_dir = d is not None and S.is_dir(d.attr)
    perms.check_sticky(sp.attr, s.attr, ctx.user)
    if d is not None:
        perms.check_sticky(dp.attr, d.attr, ctx.user)
    moving = sp.ino != dp.ino
    if s_dir and moving:
        perms.check(s.attr, ctx.user, perms.W, "moving a directory needs write permission on it")
    if flags & RENAME_EXCHANGE:
        assert d is not None
        if d_dir and moving:
            perms.check(
                d.attr, ctx.user, perms.W, "moving a directory needs write permission on it"
            )
        if s_dir and moving:
            _check_not_ancestor(tx, s.ino, dp.ino)
        if d_dir and moving:
            _check_not_ancestor(tx, d.ino, sp.ino)
        tx.set_entry(sp.ino, req.name, d.ino, stat.S_IFMT(d.attr.mode))
        tx.set_entry(dp.ino, req.new_name, s.ino, stat.S_IFMT(s.attr.mode))
        if moving:
            if s_dir:
                sp.attr.nlink -= 1
                dp.attr.nlink += 1
                s.attr.parent = dp.ino
            if d_dir:
                dp.attr.nlink -= 1
                sp.attr.nlink += 1
                d.attr.parent = sp.ino
        for node in (s, d):
            touch(node.attr, ctx.now_ns, mtime=False)
            tx.put_inode(node)
        _touch_parents(tx, ctx, sp, dp, nlink_changed=moving and (s_dir or d_dir))
        return meta_pb2.RenameResponse(inode=s.ino, replaced_inode=d.ino)

    if d is not None:
        if s_dir and not d_dir:
            raise posix(
                errno.ENOTDIR, f"cannot replace non-directory {req.new_name!r} with a directory"
            )
        if not s_dir and d_dir:
            raise posix(
                errno.EISDIR, f"cannot replace directory {req.new_name!r} with a non-directory"
            )
        if d_dir and not tx.dir_is_empty(d.ino):
            raise posix(errno.ENOTEMPTY, f"directory {req.new_name!r} is not empty")
    if s_dir and moving:
        _check_not_ancestor(tx, s.ino, dp.ino)
    if s_dir and moving and d is None and dp.attr.nlink >= LINK_MAX:
        raise posix(errno.EMLINK, f"directory {dp.ino} has too many subdirectories")
    tx.clear_entry(sp.ino, req.name)
    if d is not None:
        if d_dir:
            _remove_empty_dir(tx, ctx, dp, req.new_name, d)
        else:
            drop_link(tx, ctx, d)
    tx.set_entry(dp.ino, req.new_name, s.ino, stat.S_IFMT(s.attr.mode))
    if s_dir and moving:
        sp.attr.nlink -= 1
        dp.attr.nlink += 1
        s.attr.parent = dp.ino
    touch(s.attr, ctx.now_ns, mtime=False)
    tx.put_inode(s)
    _touch_parents(tx, ctx, sp, dp, nlink_changed=(s_dir and moving) or d_dir)
    return meta_pb2.RenameResponse(inode=s.ino, replaced_inode=d.ino if d is not None else 0)
