"""POSIX permission rules and name rules, as pure functions.

meta checks every operation by these rules (the mount also uses
``default_permissions``, so the kernel checks as well, by the same rules; see
:mod:`fs3.fuse.ops`), so these functions follow the Linux man pages and the
kernel's ``generic_permission``/``inode_owner_or_capable``/``chown_ok`` logic:

* root (uid 0) passes read/write checks always, and exec/search on a directory
  always, but exec on a non-directory only if some ``x`` bit is set;
* otherwise exactly one class applies: owner, else group (primary or any
  supplementary gid), else other;
* the sticky bit on a directory restricts removing/renaming an entry to the
  entry's owner, the directory's owner or root.
"""

from __future__ import annotations

import errno
import stat

from fs3.errors import posix
from fs3.meta.schema import NAME_MAX
from fs3.proto import common_pb2, meta_pb2

R = 4
W = 2
X = 1


def is_root(user: common_pb2.UserInfo) -> bool:
    return user.uid == 0


def in_group(user: common_pb2.UserInfo, gid: int) -> bool:
    return user.gid == gid or gid in user.groups


def allowed(attr: meta_pb2.Attr, user: common_pb2.UserInfo, mask: int) -> bool:
    """Whether ``user`` has all of ``mask`` (R/W/X bits) on ``attr``."""
    mode = attr.mode
    if is_root(user):
        if mask & X and not stat.S_ISDIR(mode) and not mode & 0o111:
            return False
        return True
    if user.uid == attr.uid:
        bits = (mode >> 6) & 7
    elif in_group(user, attr.gid):
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & mask == mask


def check(attr: meta_pb2.Attr, user: common_pb2.UserInfo, mask: int, what: str = "") -> None:
    """Raise EACCES unless ``user`` has ``mask`` on ``attr``."""
    if not allowed(attr, user, mask):
        raise posix(errno.EACCES, what or f"permission denied on inode {attr.inode}")


def is_owner_or_root(attr: meta_pb2.Attr, user: common_pb2.UserInfo) -> bool:
    return is_root(user) or user.uid == attr.uid


def check_sticky(parent: meta_pb2.Attr, child: meta_pb2.Attr, user: common_pb2.UserInfo) -> None:
    """In a sticky directory only the entry's owner, the directory's owner or root may remove it."""
    if parent.mode & stat.S_ISVTX and not is_root(user) and user.uid not in (parent.uid, child.uid):
        raise posix(errno.EPERM, "sticky directory: not the owner of the entry or the directory")


def should_clear_suid_sgid(mode: int) -> int:
    """The mode with S_ISUID and (if group-executable) S_ISGID cleared.

    Linux keeps S_ISGID without group-exec (it marks mandatory locking), as
    ``should_remove_suid`` does.
    """
    out = mode & ~stat.S_ISUID
    if mode & stat.S_IXGRP:
        out &= ~stat.S_ISGID
    return out


def check_name(name: bytes, *, allow_dots: bool = False) -> None:
    """Refuse names Linux would never store in a directory.

    Empty, containing '/' or NUL → EINVAL; '.'/'..' → EINVAL unless the caller
    handles them (lookup) — ops that create give EEXIST for them before calling
    this; > 255 bytes → ENAMETOOLONG.
    """
    if not isinstance(name, bytes | bytearray):
        raise posix(errno.EINVAL, "name must be bytes")
    if len(name) == 0:
        raise posix(errno.EINVAL, "empty name")
    if len(name) > NAME_MAX:
        raise posix(errno.ENAMETOOLONG, f"name of {len(name)} bytes exceeds {NAME_MAX}")
    if b"/" in name or b"\x00" in name:
        raise posix(errno.EINVAL, "name contains '/' or NUL")
    if not allow_dots and name in (b".", b".."):
        raise posix(errno.EINVAL, "name is '.' or '..'")
