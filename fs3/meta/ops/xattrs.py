"""Extended attributes, with Linux's namespace rules.

* ``user.*``: only on regular files and directories (EPERM elsewhere on set,
  ENODATA on get); reading needs READ, changing needs WRITE permission; in a
  sticky directory only its owner (or root) may change them.
* ``trusted.*``: root only (EPERM); invisible to others in ListXattr.
* ``security.*``: readable by all; changed by the owner or root.
* ``system.*`` (POSIX ACLs) and unknown namespaces: EOPNOTSUPP.

Limits as Linux: name 1..255 bytes (ERANGE), value ≤ 64 KiB (E2BIG).
"""

from __future__ import annotations

import errno

from fs3.errors import posix
from fs3.meta import perms
from fs3.meta import schema as S
from fs3.meta.ops.common import OpCtx, touch
from fs3.meta.store import Inode, MetaTxn
from fs3.proto import common_pb2, meta_pb2

XATTR_CREATE = 1
XATTR_REPLACE = 2


def _check_name(name: bytes) -> None:
    if not name or len(name) > S.XATTR_NAME_MAX:
        raise posix(errno.ERANGE, f"xattr name must be 1..{S.XATTR_NAME_MAX} bytes")
    if b"\x00" in name:
        raise posix(errno.EINVAL, "xattr name contains NUL")


def _check_access(ctx: OpCtx, node: Inode, name: bytes, write: bool) -> None:
    a = node.attr
    user = ctx.user
    if name.startswith(b"user."):
        if not (S.is_reg(a) or S.is_dir(a)):
            raise posix(
                errno.EPERM if write else errno.ENODATA, "user xattrs only on files and directories"
            )
        if write and S.is_dir(a) and a.mode & 0o1000 and not perms.is_owner_or_root(a, user):
            raise posix(errno.EPERM, "user xattrs of a sticky directory: owner only")
        perms.check(
            a, user, perms.W if write else perms.R, f"xattr access denied on inode {node.ino}"
        )
    elif name.startswith(b"trusted."):
        if not perms.is_root(user):
            raise posix(errno.EPERM, "trusted xattrs are root's")
    elif name.startswith(b"security."):
        if write and not perms.is_owner_or_root(a, user):
            raise posix(errno.EPERM, "security xattrs: owner or root only")
    else:
        raise posix(errno.EOPNOTSUPP, f"xattr namespace of {name!r} not supported")


def getxattr(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.GetXattrRequest) -> meta_pb2.GetXattrResponse:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    _check_name(req.name)
    node = tx.must(req.inode, snapshot=True)
    _check_access(ctx, node, req.name, write=False)
    value = tx.get_xattr(node.ino, req.name, snapshot=True)
    if value is None:
        raise posix(errno.ENODATA, f"no xattr {req.name!r}")
    return meta_pb2.GetXattrResponse(value=value)


def listxattr(
    ctx: OpCtx, tx: MetaTxn, req: meta_pb2.ListXattrRequest
) -> meta_pb2.ListXattrResponse:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    node = tx.must(req.inode, snapshot=True)
    names = tx.list_xattrs(node.ino)
    if not perms.is_root(ctx.user):
        names = [n for n in names if not n.startswith(b"trusted.")]
    return meta_pb2.ListXattrResponse(names=names)


def setxattr(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.SetXattrRequest) -> common_pb2.Empty:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    if req.flags & ~(XATTR_CREATE | XATTR_REPLACE) or req.flags == XATTR_CREATE | XATTR_REPLACE:
        raise posix(errno.EINVAL, f"bad setxattr flags {req.flags:#x}")
    _check_name(req.name)
    if len(req.value) > S.XATTR_VALUE_MAX:
        raise posix(
            errno.E2BIG, f"xattr value of {len(req.value)} bytes exceeds {S.XATTR_VALUE_MAX}"
        )
    node = tx.must(req.inode)
    _check_access(ctx, node, req.name, write=True)
    exists = tx.get_xattr(node.ino, req.name) is not None
    if req.flags & XATTR_CREATE and exists:
        raise posix(errno.EEXIST, f"xattr {req.name!r} exists")
    if req.flags & XATTR_REPLACE and not exists:
        raise posix(errno.ENODATA, f"no xattr {req.name!r}")
    tx.set_xattr(node.ino, req.name, req.value)
    touch(node.attr, ctx.now_ns, mtime=False)
    tx.put_inode(node)
    return common_pb2.Empty()


def removexattr(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.RemoveXattrRequest) -> common_pb2.Empty:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    _check_name(req.name)
    node = tx.must(req.inode)
    _check_access(ctx, node, req.name, write=True)
    if tx.get_xattr(node.ino, req.name) is None:
        raise posix(errno.ENODATA, f"no xattr {req.name!r}")
    tx.clear_xattr(node.ino, req.name)
    touch(node.attr, ctx.now_ns, mtime=False)
    tx.put_inode(node)
    return common_pb2.Empty()
