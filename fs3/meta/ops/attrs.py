"""Read-mostly ops: lookup, getattr, access, readlink, readdir, and setlayout.

Read-only ops use snapshot reads: they never make a writer retry, and a
snapshot is still a consistent point-in-time view of the namespace. The ops
that read one inode and nothing else (getattr, access, readlink) are *point
ops* ``op(db, req)``: they read that inode with one
:meth:`fs3.kv.Database.snapshot_get` outside any transaction, the cheapest
consistent read every engine has (on SQLite one statement, where a transaction
would add BEGIN, a version read and ROLLBACK). Lookup is one too, in two such
reads (see :func:`_lookup_point`); LookupPath, several names deep, stays a
transaction.

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

from fs3.errors import Code, FsError, posix
from fs3.kv import Database
from fs3.meta import perms
from fs3.meta import schema as S
from fs3.meta.layout import validate_layout
from fs3.meta.ops.common import OpCtx, search_dir, touch
from fs3.meta.store import Inode, MetaTxn, decode_inode, inode_keys, read_inode
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


LOOKUP_POINT_ATTEMPTS = 8  # lookup's name->inode re-reads before it gives up (retryable)


def _searchable(d: Inode | None, ino: int, user: common_pb2.UserInfo) -> Inode:
    """:func:`search_dir`'s checks on a directory read by a point op."""
    if d is None:
        raise posix(errno.ENOENT, f"no inode {ino}")
    if not S.is_dir(d.attr):
        raise posix(errno.ENOTDIR, f"inode {ino} is not a directory")
    perms.check(d.attr, user, perms.X, f"no search permission on directory {ino}")
    return d


def _parent(raw: bytes | None) -> Inode | None:
    """A parent directory's record from a point read (its times not read: not needed)."""
    return None if raw is None else decode_inode(raw, None)


def _lookup_point(db: Database, user: common_pb2.UserInfo, parent_ino: int, name: bytes) -> Inode:
    """:func:`_lookup` in two snapshot reads instead of a transaction.

    Read 1: the parent's record and the entry, together (one consistent
    point). Read 2: the child's record and times and the entry again; the
    answer is given only if the entry still names the same inode, so the
    name->inode binding and the attributes are those of one instant (read 2's),
    as a transaction's snapshot would give them. The parent's search permission
    is the one of read 1, an instant earlier in the same call. A rename in
    between makes it read again (a few times, then a retryable conflict).
    """
    if parent_ino == 0:
        raise posix(errno.EINVAL, "parent inode is required")
    if name == b"." or name == b"..":
        parent = _searchable(read_inode(db, parent_ino), parent_ino, user)  # "." returns it
        if name == b".":
            return parent
        up = int(parent.attr.parent) or S.ROOT_INODE
        node = read_inode(db, up)
        if node is None:
            raise posix(errno.ENOENT, f"no inode {up}")
        return node
    pkey = S.inode_key(parent_ino)
    try:
        perms.check_name(name)
    except FsError:  # the parent's errors come first, as in _lookup
        _searchable(_parent(db.snapshot_get((pkey,))[0]), parent_ino, user)
        raise
    ekey = S.dentry_key(parent_ino, name)
    for _ in range(LOOKUP_POINT_ATTEMPTS):
        raw_parent, raw_entry = db.snapshot_get((pkey, ekey))
        _searchable(_parent(raw_parent), parent_ino, user)
        if raw_entry is None:
            raise posix(errno.ENOENT, f"{name!r} not found in directory {parent_ino}")
        ino = S.decode_dentry(raw_entry)[0]
        raw, raw_times, again = db.snapshot_get((*inode_keys(ino), ekey))
        if again != raw_entry:
            continue  # renamed or removed in between: resolve the name again
        if raw is None:
            raise posix(errno.ENOENT, f"no inode {ino}")
        return decode_inode(raw, raw_times)
    raise FsError(
        Code.KV_CONFLICT,
        f"{name!r} in directory {parent_ino} kept changing during lookup",
        retryable=True,
    )


def lookup(db: Database, req: meta_pb2.LookupRequest) -> meta_pb2.AttrResponse:
    """A point op (see the module docstring): :func:`_lookup_point`."""
    return _attr_response(_lookup_point(db, req.user, req.parent, req.name))


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
    return _attr_response(node)


def _attr_response(node: Inode) -> meta_pb2.AttrResponse:
    """The answer for a SHARED node (:func:`fs3.meta.store.decode_inode`'s, never modified).

    Built (the attributes copied, blocks and blksize derived) and serialized
    once per decoded node; every later answer is parsed from those bytes,
    which costs about half as much as building it. A changed inode has other
    stored bytes, so another node: nothing can go stale.
    """
    raw = node.public
    if raw is not None:
        return meta_pb2.AttrResponse.FromString(raw)
    resp = meta_pb2.AttrResponse()
    S.fill_public_attr(resp.attr, node.attr)
    node.public = resp.SerializeToString()
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
