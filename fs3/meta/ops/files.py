"""File ops: create, open, close, sync (length reports) and setattr (incl. truncate).

Sessions: every successful Create/Open of a regular file records a session
(``("se", ino, session_id)``), so a file unlinked while open keeps its inode
(nlink 0, an *orphan*) until its last session closes; only then do its chunks
go to the GC queue. Read sessions are recorded too (unlike 3FS) because POSIX
lets a reader keep reading an unlinked file.

Length: writers report hints (Sync/Close); a hint only grows the file and only
if it was produced under the inode's current ``truncate_version``, so a late
report from before a truncate cannot resurrect the old length. Only SetAttr
(size) and O_TRUNC shrink a file; both bump ``truncate_version``.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Sequence

from fs3.errors import invalid, posix
from fs3.limits import MAX_CHUNK_INDEX
from fs3.meta import perms
from fs3.meta import schema as S
from fs3.meta.ops.common import OpCtx, release, search_dir, touch
from fs3.meta.ops.namespace import _new_file
from fs3.meta.store import Inode, MetaTxn
from fs3.proto import common_pb2, meta_pb2

F = meta_pb2  # SetAttrField values live on the module
_SETATTR_ALL = (
    F.SETATTR_MODE
    | F.SETATTR_UID
    | F.SETATTR_GID
    | F.SETATTR_SIZE
    | F.SETATTR_ATIME
    | F.SETATTR_MTIME
    | F.SETATTR_ATIME_NOW
    | F.SETATTR_MTIME_NOW
    | F.SETATTR_CTIME
)


def _max_size(attr: meta_pb2.Attr) -> int:
    cs = attr.layout.chunk_size or (1 << 20)
    return (MAX_CHUNK_INDEX + 1) * cs


# The kernel opens a program for execve(2) with this bit (``__FMODE_EXEC``) in
# the open flags it passes on (FUSE forwards them): such an open needs execute
# permission, not read permission, so a mode --x program can run.
FMODE_EXEC = 0x20


def _access_mask(flags: int) -> int:
    acc = flags & os.O_ACCMODE
    if acc == 3:
        raise posix(errno.EINVAL, "invalid access mode O_ACCMODE")
    if flags & FMODE_EXEC and acc == os.O_RDONLY and not flags & os.O_TRUNC:
        return perms.X
    mask = 0
    if acc in (os.O_RDONLY, os.O_RDWR):
        mask |= perms.R
    if acc in (os.O_WRONLY, os.O_RDWR) or flags & os.O_TRUNC:
        mask |= perms.W
    return mask


def _truncate(node: Inode, ctx: OpCtx, size: int) -> tuple[bool, int]:
    """Set the length (bumping truncate_version); returns (shrank, old size)."""
    a = node.attr
    if size > _max_size(a):
        raise posix(errno.EFBIG, f"size {size} exceeds the layout's maximum {_max_size(a)}")
    old = int(a.size)
    a.size = size
    a.truncate_version += 1
    if not perms.is_root(ctx.user):
        a.mode = perms.should_clear_suid_sgid(a.mode)
    touch(a, ctx.now_ns)
    return size < old, old


def _open_session(
    tx: MetaTxn, ctx: OpCtx, node: Inode, flags: int, client_id: str, request_id: str
) -> str:
    if not S.is_reg(node.attr):
        return ""
    sid = request_id or uuid.uuid4().hex
    write = (flags & os.O_ACCMODE) != os.O_RDONLY
    tx.put_session(
        node.ino,
        sid,
        meta_pb2.SessionRecord(
            client_id=client_id, flags=flags, opened_at=ctx.now_ns / 1e9, write=write
        ),
    )
    return sid


def _open_existing(
    tx: MetaTxn, ctx: OpCtx, node: Inode, flags: int, client_id: str, request_id: str
) -> meta_pb2.OpenResponse:
    a = node.attr
    acc = flags & os.O_ACCMODE
    mask = _access_mask(flags)
    if S.is_lnk(a):
        raise posix(errno.ELOOP, "cannot open a symlink")
    if S.is_dir(a):
        if acc != os.O_RDONLY or flags & os.O_TRUNC:
            raise posix(errno.EISDIR, f"inode {node.ino} is a directory")
    elif flags & os.O_DIRECTORY:
        raise posix(errno.ENOTDIR, f"inode {node.ino} is not a directory")
    perms.check(a, ctx.user, mask, f"open of inode {node.ino} denied")
    resp = meta_pb2.OpenResponse()
    if flags & os.O_TRUNC and S.is_reg(a):
        shrank, old = _truncate(node, ctx, 0)
        resp.need_truncate = shrank
        resp.old_size = old
        tx.put_inode(node)
    resp.session_id = _open_session(tx, ctx, node, flags, client_id, request_id)
    if not resp.session_id and not flags & os.O_TRUNC:
        ctx.changed = False  # e.g. opendir: a pure permission check
    resp.attr.CopyFrom(S.public_attr(a))
    return resp


def open_(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.OpenRequest) -> meta_pb2.OpenResponse:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    check_session_refs(req.close_sessions)
    node = tx.must(req.inode)
    resp = _open_existing(tx, ctx, node, req.flags, req.client_id, req.request_id)
    if end_sessions(tx, ctx, req.close_sessions):
        ctx.changed = True
    return resp


def create(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.CreateRequest) -> meta_pb2.OpenResponse:
    check_session_refs(req.close_sessions)
    resp = _create(ctx, tx, req)
    end_sessions(tx, ctx, req.close_sessions)
    return resp


def _create(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.CreateRequest) -> meta_pb2.OpenResponse:
    from fs3.meta.layout import validate_layout
    from fs3.meta.ops.common import check_new_name, writable_dir

    if req.HasField("layout"):
        validate_layout(req.layout, partial=True)
    ftype = stat.S_IFMT(req.mode)
    if ftype not in (0, stat.S_IFREG):
        raise posix(errno.EINVAL, "create makes regular files only")
    parent = search_dir(tx, ctx, req.parent)
    if req.name in (b".", b".."):
        raise posix(
            errno.EEXIST if req.flags & os.O_EXCL else errno.EISDIR, "'.' and '..' are directories"
        )
    check_new_name(req.name)
    entry = tx.get_entry(parent.ino, req.name)
    if entry is not None:
        if req.flags & os.O_EXCL:
            raise posix(errno.EEXIST, f"{req.name!r} exists")
        node = tx.must(entry[0])
        if S.is_dir(node.attr):
            raise posix(errno.EISDIR, f"{req.name!r} is a directory")
        resp = _open_existing(tx, ctx, node, req.flags, req.client_id, req.request_id)
        resp.created = False
        resp.parent_attr.CopyFrom(S.public_attr(parent.attr))
        return resp
    writable_dir(parent, ctx)
    if parent.attr.nlink == 0:
        raise posix(errno.ENOENT, f"directory {parent.ino} was removed")
    node = _new_file(tx, ctx, parent, req.name, req.mode, req.layout)
    resp = meta_pb2.OpenResponse(created=True)
    resp.session_id = _open_session(tx, ctx, node, req.flags, req.client_id, req.request_id)
    resp.attr.CopyFrom(S.public_attr(node.attr))
    resp.parent_attr.CopyFrom(S.public_attr(parent.attr))
    return resp


def _apply_report(
    node: Inode, ctx: OpCtx, has_hint: bool, hint: int, tv: int, mtime: common_pb2.Timespec | None
) -> bool:
    a = node.attr
    changed = False
    if has_hint and tv == a.truncate_version and hint > a.size:
        if hint > _max_size(a):
            raise posix(errno.EFBIG, f"length {hint} exceeds the layout's maximum")
        a.size = hint
        changed = True
    wrote = changed
    if mtime is not None and (mtime.sec or mtime.nsec):
        a.mtime.CopyFrom(mtime)
        if S.ts_ns(mtime) > S.ts_ns(a.ctime):
            a.ctime.CopyFrom(mtime)
        changed = wrote = True
    elif changed:
        touch(a, ctx.now_ns)
    if wrote and not perms.is_root(ctx.user):
        # A write by anyone but root drops S_ISUID/S_ISGID, as Linux does
        # (file_remove_privs), whatever path the data took: the kernel's own
        # setattr covers buffered FUSE writes, this covers the rest (the Python
        # API, USRBIO), which meta learns of only through these reports.
        cleared = perms.should_clear_suid_sgid(a.mode)
        if cleared != a.mode:
            a.mode = cleared
            touch(a, ctx.now_ns, mtime=False)
            changed = True
    return changed


def _session(tx: MetaTxn, ino: int, session_id: str) -> meta_pb2.SessionRecord:
    if not session_id:
        raise posix(errno.EBADF, "a session id is required")
    sess = tx.get_session(ino, session_id)
    if sess is None:
        raise posix(errno.EBADF, f"no open session {session_id!r} on inode {ino}")
    return sess


def close(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.CloseRequest) -> meta_pb2.AttrResponse:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    node = tx.must(req.inode)
    sess = _session(tx, node.ino, req.session_id)
    changed = False
    if sess.write:
        changed = _apply_report(
            node,
            ctx,
            req.has_length_hint,
            req.length_hint,
            req.truncate_version,
            req.mtime if req.HasField("mtime") else None,
        )
    elif req.has_length_hint and req.length_hint > node.attr.size:
        raise posix(errno.EBADF, "length report on a read-only session")
    tx.clear_session(node.ino, req.session_id)
    if node.attr.nlink == 0:
        if not tx.has_sessions(node.ino):
            release(tx, ctx, node)
        elif changed:
            tx.put_inode(node)
    elif changed:
        # A handle that reported nothing new (it never wrote, or Sync already told
        # meta) leaves the inode record alone: only its session goes.
        tx.put_inode(node)
    return meta_pb2.AttrResponse(attr=S.public_attr(node.attr))


CLOSE_SESSIONS_MAX = 1024


def check_session_refs(refs: Sequence[meta_pb2.SessionRef]) -> None:
    """Session references of CloseSessions (or piggybacked on Create/Open) are well formed."""
    if len(refs) > CLOSE_SESSIONS_MAX:
        raise invalid(f"at most {CLOSE_SESSIONS_MAX} sessions per request")
    for s in refs:
        if s.inode == 0 or not s.session_id:
            raise invalid("every session needs an inode and a session_id")
        if len(s.session_id) > S.REQUEST_ID_MAX:
            raise invalid(f"session_id longer than {S.REQUEST_ID_MAX} characters")


def end_sessions(tx: MetaTxn, ctx: OpCtx, refs: Sequence[meta_pb2.SessionRef]) -> int:
    """End sessions that report nothing; returns how many were still open.

    Only the session records go (and an orphan whose last session this was):
    with no length or mtime to apply the inode records stay as they are. A
    session already gone is skipped, so a repeat is harmless.
    """
    closed = 0
    for s in refs:
        if tx.get_session(s.inode, s.session_id) is None:
            continue
        tx.clear_session(s.inode, s.session_id)
        closed += 1
        node = tx.load(s.inode)
        if node is not None and node.attr.nlink == 0 and not tx.has_sessions(node.ino):
            release(tx, ctx, node)
    return closed


def close_sessions(
    ctx: OpCtx, tx: MetaTxn, req: meta_pb2.CloseSessionsRequest
) -> meta_pb2.CloseSessionsResponse:
    """End many no-report sessions in one transaction (idempotent: no idempotency record)."""
    check_session_refs(req.sessions)
    closed = end_sessions(tx, ctx, req.sessions)
    ctx.changed = closed > 0
    return meta_pb2.CloseSessionsResponse(closed=closed)


def sync(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.SyncRequest) -> meta_pb2.AttrResponse:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    node = tx.must(req.inode)
    mtime = req.mtime if req.HasField("mtime") else None
    reporting = req.has_length_hint or (mtime is not None and (mtime.sec or mtime.nsec))
    if reporting:
        sess = _session(tx, node.ino, req.session_id)
        if not sess.write:
            raise posix(errno.EBADF, "length/mtime report on a read-only session")
        if _apply_report(
            node, ctx, req.has_length_hint, req.length_hint, req.truncate_version, mtime
        ):
            tx.put_inode(node)
            return meta_pb2.AttrResponse(attr=S.public_attr(node.attr))
    ctx.changed = False  # nothing new: a retry may simply run again
    return meta_pb2.AttrResponse(attr=S.public_attr(node.attr))


def _is_kill_priv(
    tx: MetaTxn, node: Inode, req: meta_pb2.SetAttrRequest, user: common_pb2.UserInfo
) -> bool:
    """A non-owner writer's setattr that only drops S_ISUID/S_ISGID.

    The kernel sends it (as the writing user) before a write or truncate by a
    non-owner, when it clears the set-id bits (``file_remove_privs``); Linux
    performs that without an ownership check, so meta must accept it from
    anyone who may write the file.
    """
    old = node.attr.mode & 0o7777
    new = req.mode & 0o7777
    if new & ~old or (old & ~new) & ~(stat.S_ISUID | stat.S_ISGID):
        return False
    if req.session_id:
        sess = tx.get_session(node.ino, req.session_id)
        if sess is not None and sess.write:
            return True
    return perms.allowed(node.attr, user, perms.W)


def setattr(ctx: OpCtx, tx: MetaTxn, req: meta_pb2.SetAttrRequest) -> meta_pb2.SetAttrResponse:
    if req.inode == 0:
        raise posix(errno.EINVAL, "inode is required")
    valid = req.valid
    if valid & ~_SETATTR_ALL:
        raise invalid(f"unknown SetAttr fields {valid & ~_SETATTR_ALL:#x}")
    node = tx.must(req.inode)
    a = node.attr
    user = ctx.user
    root = perms.is_root(user)
    owner = perms.is_owner_or_root(a, user)
    resp = meta_pb2.SetAttrResponse()
    if not valid:
        resp.attr.CopyFrom(S.public_attr(a))
        return resp

    # ---- checks first: nothing changes unless every requested field is allowed
    if valid & F.SETATTR_SIZE:
        if S.is_dir(a):
            raise posix(errno.EISDIR, "cannot truncate a directory")
        if not S.is_reg(a):
            raise posix(errno.EINVAL, "only regular files can be truncated")
        sess = tx.get_session(node.ino, req.session_id) if req.session_id else None
        if sess is None or not sess.write:
            perms.check(a, user, perms.W, f"truncate of inode {node.ino} denied")
    if valid & F.SETATTR_MODE and not owner and not _is_kill_priv(tx, node, req, user):
        raise posix(errno.EPERM, "only the owner or root may chmod")
    if valid & (F.SETATTR_UID | F.SETATTR_GID) and not root:
        if valid & F.SETATTR_UID and (req.uid != a.uid or user.uid != a.uid):
            raise posix(errno.EPERM, "only root may change the owner")
        if (
            valid & F.SETATTR_GID
            and req.gid != a.gid
            and (user.uid != a.uid or not perms.in_group(user, req.gid))
        ):
            raise posix(errno.EPERM, "the owner may change the group only to one of its groups")
        if valid & F.SETATTR_GID and user.uid != a.uid:
            raise posix(errno.EPERM, "only the owner or root may change the group")
    explicit_times = (valid & F.SETATTR_ATIME and not valid & F.SETATTR_ATIME_NOW) or (
        valid & F.SETATTR_MTIME and not valid & F.SETATTR_MTIME_NOW
    )
    now_times = valid & (F.SETATTR_ATIME_NOW | F.SETATTR_MTIME_NOW)
    if explicit_times and not owner:
        raise posix(errno.EPERM, "only the owner or root may set explicit times")
    if now_times and not owner and not perms.allowed(a, user, perms.W):
        raise posix(errno.EACCES, "setting times to now needs ownership or write permission")
    if valid & F.SETATTR_CTIME and not owner:
        raise posix(errno.EPERM, "only the owner or root may set ctime")

    # ---- apply
    if valid & F.SETATTR_SIZE:
        shrank, old = _truncate(node, ctx, req.size)
        resp.need_truncate = shrank
        resp.old_size = old
    if valid & F.SETATTR_MODE:
        mode = req.mode & 0o7777
        if not root and not perms.in_group(user, a.gid):
            mode &= ~stat.S_ISGID
        a.mode = stat.S_IFMT(a.mode) | mode
    if valid & (F.SETATTR_UID | F.SETATTR_GID):
        if valid & F.SETATTR_UID:
            a.uid = req.uid
        if valid & F.SETATTR_GID:
            a.gid = req.gid
        if not S.is_dir(a):
            a.mode = perms.should_clear_suid_sgid(a.mode)
    now = S.timespec(ctx.now_ns)
    if valid & F.SETATTR_ATIME_NOW:
        a.atime.CopyFrom(now)
    elif valid & F.SETATTR_ATIME:
        a.atime.CopyFrom(req.atime)
    if valid & F.SETATTR_MTIME_NOW:
        a.mtime.CopyFrom(now)
    elif valid & F.SETATTR_MTIME:
        a.mtime.CopyFrom(req.mtime)
    if valid & F.SETATTR_CTIME:
        a.ctime.CopyFrom(req.ctime)
    else:
        a.ctime.CopyFrom(now)
    tx.put_inode(node)
    resp.attr.CopyFrom(S.public_attr(a))
    return resp
