"""Read-mostly ops: lookup, getattr, access, readlink, readdir, and setlayout.

Read-only ops use snapshot reads: they never make a writer retry, and a
snapshot is still a consistent point-in-time view of the namespace. The ops
that read one inode and nothing else (getattr, access, readlink) are *point
ops* ``op(db, req)``: they read that inode with one
:meth:`fs3.kv.Database.snapshot_get` outside any transaction, the cheapest
consistent read every engine has (on SQLite one statement, where a transaction
would add BEGIN, a version read and ROLLBACK).

ReadDir pages by name: entries come sorted by raw name bytes and the cursor is
the last name returned, so an entry that exists for the whole listing is
returned exactly once however entries are added or removed in between pages
(entries added or removed meanwhile may or may not appear, as POSIX allows).
"." and ".." are not returned; the FUSE layer adds them (it knows the
directory's inode and ``Attr.parent``).
"""

from __future__ import annotations

import errno
import os

from fs3.errors import posix
from fs3.kv import Database
from fs3.meta import perms
from fs3.meta import schema as S
from fs3.meta.layout import validate_layout
from fs3.meta.ops.common import OpCtx, search_dir, touch
from fs3.meta.store import Inode, MetaTxn, read_inode
from fs3.proto import common_pb2, meta_pb2

READDIR_DEFAULT = 1024
READDIR_MAX = 4096


LOOKUP_PATH_MAX = 64  # names per LookupPath


def _lookup(ctx: OpCtx, tx: MetaTxn, parent_ino: int, name: bytes) -> Inode:
    # the parent's own attributes are returned only for "."; otherwise its
    # mtime/ctime (a second key) are not needed
    parent = search_dir(tx, ctx, parent_ino, snapshot=True, times=name == b".")
    if name == b".":
        return parent
    if name == b"..":
        return tx.must(int(parent.attr.parent) or S.ROOT_INODE, snapshot=True)
    perms.check_name(name)
    entry = tx.get_entry(parent.ino, name, snapshot=True)
    if entry is None:
        raise posix(errno.ENOENT, f"{name!r} not found in directory {parent.ino}")
    return tx.must(entry[0], snapshot=True)


def lookup(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.LookupRequest) -> meta_pb2.AttrResponse:
    return meta_pb2.AttrResponse(attr=S.public_attr(_lookup(ctx, tx, req.parent, req.name).attr))


def lookup_path(
    ctx: OpCtx, tx: MetaTxn, req: meta_pb2.LookupPathRequest
) -> meta_pb2.LookupPathResponse:
    """Lookup of each name in the previous result, in one snapshot (one RPC per path).

    Stops after a symlink (the client reads and follows it) or a non-directory
    that is not the last name (the client raises ENOTDIR, as a stepwise walk would).
    """
    if not req.names:
        raise posix(errno.EINVAL, "names are required")
    if len(req.names) > LOOKUP_PATH_MAX:
        raise posix(errno.EINVAL, f"more than {LOOKUP_PATH_MAX} names")
    resp = meta_pb2.LookupPathResponse()
    cur = req.parent
    for name in req.names:
        node = _lookup(ctx, tx, cur, name)
        resp.attrs.append(S.public_attr(node.attr))
        if not S.is_dir(node.attr):
            break
        cur = node.ino
    return resp


def getattr_(db: Database, req: meta_pb2.GetAttrRequest) -> meta_pb2.AttrResponse:
    """A point op (see :func:`fs3.meta.store.read_inode`): one snapshot read, no transaction."""
    ino = req.inode
    if ino == 0:
        raise posix(errno.EINVAL, "inode is required")
    node = read_inode(db, ino)
    if node is None:
        raise posix(errno.ENOENT, f"no inode {ino}")
    resp = meta_pb2.AttrResponse()
    S.fill_public_attr(resp.attr, node.attr)
    return resp


def access(db: Database, req: meta_pb2.AccessRequest) -> common_pb2.Empty:
    """A point op, like :func:`getattr_`; the caller is ``req.user``."""
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    if req.mask & ~(os.R_OK | os.W_OK | os.X_OK):
        raise posix(errno.EINVAL, f"bad access mask {req.mask:#o}")
    node = read_inode(db, req.inode)
    if node is None:
        raise posix(errno.ENOENT, f"no inode {req.inode}")
    if req.mask:
        perms.check(
            node.attr, req.user, req.mask, f"access {req.mask:#o} denied on inode {node.ino}"
        )
    return common_pb2.Empty()


def readlink(db: Database, req: meta_pb2.ReadLinkRequest) -> meta_pb2.ReadLinkResponse:
    """A point op, like :func:`getattr_`."""
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    node = read_inode(db, req.inode)
    if node is None:
        raise posix(errno.ENOENT, f"no inode {req.inode}")
    if not S.is_lnk(node.attr):
        raise posix(errno.EINVAL, f"inode {node.ino} is not a symlink")
    return meta_pb2.ReadLinkResponse(target=node.symlink_target)


def readdir(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.ReadDirRequest) -> meta_pb2.ReadDirResponse:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    if len(req.cursor) > S.NAME_MAX:
        raise posix(errno.EINVAL, "cursor longer than a name")
    d = tx.must_dir(req.inode, snapshot=True)
    perms.check(d.attr, ctx.user, perms.R, f"no read permission on directory {d.ino}")
    limit = min(req.limit or READDIR_DEFAULT, READDIR_MAX)
    rows = tx.list_entries(d.ino, bytes(req.cursor), limit + 1, snapshot=True)
    resp = meta_pb2.ReadDirResponse(more=len(rows) > limit)
    rows = rows[:limit]
    nodes = tx.load_many([ino for _, ino, _ in rows]) if req.with_attrs else {}
    for name, ino, ftype in rows:
        e = resp.entries.add(name=name, inode=ino, type=ftype)
        child = nodes.get(ino)
        if child is not None:
            e.attr.CopyFrom(S.public_attr(child.attr))
    return resp


def setlayout(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.SetLayoutRequest) -> meta_pb2.AttrResponse:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    validate_layout(req.layout, partial=True)
    d = tx.must_dir(req.inode)
    if not perms.is_owner_or_root(d.attr, ctx.user):
        raise posix(errno.EPERM, "only the owner or root may set a directory's layout")
    lay = d.attr.layout
    if req.layout.chunk_size:
        lay.chunk_size = req.layout.chunk_size
    if req.layout.stripe:
        lay.stripe = req.layout.stripe
    if req.layout.table_id:
        lay.table_id = req.layout.table_id
    touch(d.attr, ctx.now_ns, mtime=False)
    tx.put_inode(d)
    return meta_pb2.AttrResponse(attr=S.public_attr(d.attr))
