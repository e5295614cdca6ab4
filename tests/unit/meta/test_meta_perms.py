"""Permission and name rules (fs3.meta.perms) against the Linux semantics."""

from __future__ import annotations

import errno
import stat

import pytest

from fs3.errors import FsError
from fs3.meta import perms
from fs3.proto import common_pb2, meta_pb2

pytestmark = pytest.mark.timeout(10)

ROOT = common_pb2.UserInfo(uid=0, gid=0)
OWNER = common_pb2.UserInfo(uid=10, gid=10)
MEMBER = common_pb2.UserInfo(uid=11, gid=99, groups=[20])
OTHER = common_pb2.UserInfo(uid=12, gid=12)


def attr(mode: int, uid: int = 10, gid: int = 20) -> meta_pb2.Attr:
    return meta_pb2.Attr(inode=5, mode=mode, uid=uid, gid=gid)


@pytest.mark.parametrize(
    "mode,user,mask,ok",
    [
        (0o640, OWNER, perms.R | perms.W, True),
        (0o640, OWNER, perms.X, False),
        (0o640, MEMBER, perms.R, True),  # supplementary group
        (0o640, MEMBER, perms.W, False),
        (0o640, OTHER, perms.R, False),
        (0o004, OWNER, perms.R, False),  # owner class applies even if "other" would allow
        (0o000, ROOT, perms.R | perms.W, True),
        (0o644, ROOT, perms.X, False),  # root needs some x bit on files
        (0o100, ROOT, perms.X, True),
    ],
)
def test_allowed_classes(mode: int, user: common_pb2.UserInfo, mask: int, ok: bool) -> None:
    assert perms.allowed(attr(stat.S_IFREG | mode), user, mask) is ok


def test_root_searches_any_directory() -> None:
    assert perms.allowed(attr(stat.S_IFDIR | 0o000), ROOT, perms.X)


def test_sticky() -> None:
    d = attr(stat.S_IFDIR | 0o1777, uid=1)
    child = attr(stat.S_IFREG | 0o644, uid=10)
    perms.check_sticky(d, child, OWNER)
    perms.check_sticky(d, child, ROOT)
    perms.check_sticky(attr(stat.S_IFDIR | 0o1777, uid=12), child, OTHER)  # dir owner
    with pytest.raises(FsError) as ei:
        perms.check_sticky(d, child, OTHER)
    assert ei.value.errno == errno.EPERM
    perms.check_sticky(attr(stat.S_IFDIR | 0o777, uid=1), child, OTHER)  # not sticky


def test_clear_suid_sgid() -> None:
    assert perms.should_clear_suid_sgid(0o6755) == 0o755
    assert perms.should_clear_suid_sgid(0o6745) == 0o2745  # sgid without group-x stays
    assert perms.should_clear_suid_sgid(0o0755) == 0o755


@pytest.mark.parametrize(
    "name,code",
    [
        (b"", errno.EINVAL),
        (b"a/b", errno.EINVAL),
        (b"a\0", errno.EINVAL),
        (b".", errno.EINVAL),
        (b"..", errno.EINVAL),
        (b"x" * 256, errno.ENAMETOOLONG),
    ],
)
def test_bad_names(name: bytes, code: int) -> None:
    with pytest.raises(FsError) as ei:
        perms.check_name(name)
    assert ei.value.errno == code


def test_good_names() -> None:
    perms.check_name(b"x" * 255)
    perms.check_name(b"\xff odd but fine")
    perms.check_name(b"..", allow_dots=True)


def test_open_access_masks() -> None:
    """An exec open (__FMODE_EXEC in the flags) needs execute permission only."""
    import os

    from fs3.meta.ops.files import FMODE_EXEC, _access_mask

    assert _access_mask(os.O_RDONLY) == perms.R
    assert _access_mask(os.O_RDONLY | FMODE_EXEC) == perms.X
    assert _access_mask(os.O_RDWR) == perms.R | perms.W
    assert _access_mask(os.O_RDWR | FMODE_EXEC) == perms.R | perms.W  # not an exec open
    assert _access_mask(os.O_RDONLY | os.O_TRUNC | FMODE_EXEC) == perms.R | perms.W
    with pytest.raises(FsError) as ei:
        _access_mask(os.O_ACCMODE)
    assert ei.value.errno == errno.EINVAL
