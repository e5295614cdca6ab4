"""MetaOperator: every meta RPC as one KV transaction, with idempotent retries.

The servicer (fs3/meta/service.py) only forwards here, so tests drive the
operator directly over any KV engine (tests/contract/test_meta.py). For each
request the operator

1. validates the envelope (``user`` present, request id size, message type);
2. pre-allocates an inode number if the op may create one (outside the
   transaction: the allocator runs its own small transaction);
3. runs the op in :meth:`fs3.kv.Database.run` (retried on conflicts); a
   mutating op with a ``request_id`` first looks for the idempotency record
   ``("rq", request_id)`` and, if present, returns the stored response; else it
   runs and stores its response in the same transaction (3FS's ``IDEM``). So a
   client retry after a lost reply, or an engine retry after an unknown commit
   result, applies the change exactly once.

Everything is synchronous (KV engines block); the servicer calls it from
worker threads.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from fs3.clock import Clock, SystemClock
from fs3.config import MetaSection
from fs3.errors import FsError, invalid, posix
from fs3.kv import Database, Transaction
from fs3.logs import event
from fs3.meta import perms
from fs3.meta import schema as S
from fs3.meta.alloc import InodeAllocator
from fs3.meta.layout import ChainAllocator, ChainTableSource, NoChainTable, NoChainTables
from fs3.meta.ops import attrs, files, namespace, xattrs
from fs3.meta.ops.common import OpCtx, release
from fs3.meta.store import Inode, MetaTxn
from fs3.proto import common_pb2, meta_pb2
from fs3.security import capability as cap

log = logging.getLogger("fs3.meta")

R = TypeVar("R", bound=Message)
R2 = TypeVar("R2")
Op = Callable[[OpCtx, MetaTxn, Any], Any]
PointOp = Callable[[Database, Any], Any]  # a read of one inode outside any transaction

STATFS_TOTAL_FILES = 1 << 40  # no inode limit; report a large constant
STATFS_BLOCK = 4096
IDEM_MAX_AGE_S = 1800.0  # idempotency records older than this are pruned


class WouldWait(Exception):
    """:meth:`MetaOperator.write_once` could not finish without waiting (for other
    transactions' commit, or for an inode-number reservation); it changed nothing."""


class _OnceFlag(threading.local):
    """Per thread: whether the running op is :meth:`MetaOperator.write_once`'s."""

    once = False


class MetaOperator:
    """The meta service's logic over a :class:`~fs3.kv.Database`.

    Args:
        db: the shared KV.
        cfg: the ``[meta]`` config section.
        chains: where chain tables come from (routing info); None: no tables yet.
        clock: time source (tests inject a fake one).
        seed: RNG seed of the chain allocator's starting offset (tests).
    """

    def __init__(
        self,
        db: Database,
        cfg: MetaSection | None = None,
        chains: ChainTableSource | None = None,
        *,
        clock: Clock | None = None,
        seed: int | None = None,
    ) -> None:
        self.db = db
        self.cfg = cfg or MetaSection()
        self.chains = chains or NoChainTables()
        self.clock = clock or SystemClock()
        self.alloc = InodeAllocator(db, self.cfg.inode_batch)
        self.placer = ChainAllocator(self.chains, seed=seed)
        self._statfs_lock = threading.Lock()
        self._statfs_cache: tuple[float, int, int] | None = None  # (at, files, bytes)
        # Signs chunk capabilities (fs3/security/capability.py); None: the cluster has no
        # secret and storage checks nothing, so none are issued.
        self.signer: cap.CapabilitySigner | None = None
        self.capability_ttl_s = cap.DEFAULT_TTL_S
        self._local = _OnceFlag()
        self.ensure_root()

    # ------------------------------------------------------------------ plumbing

    def now_ns(self) -> int:
        if isinstance(self.clock, SystemClock):
            return time.time_ns()
        return int(self.clock.time() * 1e9)

    def ensure_root(self) -> None:
        """Create the root directory (inode 1, 0755 root:root) if missing; idempotent."""
        cfg = self.cfg

        def txn(tr: Transaction) -> bool:
            tx = MetaTxn(tr)
            if tx.load(S.ROOT_INODE) is not None:
                return False
            now = S.timespec(self.now_ns())
            attr = meta_pb2.Attr(
                inode=S.ROOT_INODE,
                mode=0o040755,
                nlink=2,
                uid=0,
                gid=0,
                parent=S.ROOT_INODE,
                atime=now,
                mtime=now,
                ctime=now,
                layout=meta_pb2.Layout(
                    chunk_size=cfg.default_chunk_size,
                    stripe=cfg.default_stripe,
                    table_id=cfg.default_chain_table,
                ),
            )
            tx.put_inode(Inode(attr))
            return True

        if self.db.run(txn):
            event(log, "created root directory", inode=S.ROOT_INODE)

    def _ctx(self, user: common_pb2.UserInfo, new_ino: int = 0) -> OpCtx:
        return OpCtx(user, self.now_ns(), self.cfg, self.placer.place, new_ino)

    @staticmethod
    def _check_request(req: Any, cls: type[Message]) -> None:
        if not isinstance(req, cls):
            raise invalid(f"expected {cls.__name__}, got {type(req).__name__}")
        if not req.HasField("user"):  # type: ignore[attr-defined]
            raise invalid("user is required")
        for name in _id_fields(cls):
            if len(getattr(req, name)) > S.REQUEST_ID_MAX:
                raise invalid(f"{name} longer than {S.REQUEST_ID_MAX} characters")

    def _read(self, op: Op, req: Any, cls: type[Message], *, max_retries: int = 100) -> Any:
        self._check_request(req, cls)
        return self.db.run(
            lambda tr: op(self._ctx(req.user), MetaTxn(tr), req), max_retries=max_retries
        )

    def _point(self, op: PointOp, req: Any, cls: type[Message]) -> Any:
        """A point op (fs3/meta/ops/attrs.py) with retries: it runs in no transaction
        of its own, so the one in :meth:`fs3.kv.Database.run` (whose retry loop this
        borrows) stays unused, and never opens a read on any engine."""
        self._check_request(req, cls)
        db = self.db
        return db.run(lambda _tr: op(db, req))

    #: Point reads cheap enough to run on the server's event loop (see :meth:`read_once`).
    INLINE_READS = frozenset(
        {"lookup", "lookup_path", "getattr", "access", "readlink", "getxattr", "listxattr"}
    )

    def read_once(self, method: str, req: Any) -> Any:
        """One attempt of the read-only op ``method`` (a name in :data:`INLINE_READS`).

        Never sleeps or retries: a retryable failure (a KV conflict, injected or
        real) is raised so the caller can fall back to the retrying path on a
        worker thread. The servicer uses this to answer lookups and getattrs on
        its event loop when the KV's reads are local (SQLite, memory): a read
        there costs tens of microseconds, less than the two thread hand-offs of
        ``asyncio.to_thread`` on a busy host.

        One attempt: :meth:`_once`.
        """
        point = _POINT_OPS.get(method)
        if point is not None:  # one snapshot read, no transaction (see _point)
            pop, pcls = point
            self._check_request(req, pcls)
            try:
                return pop(self.db, req)
            except FsError as e:
                if e.retryable:
                    self.db.retries += 1
                raise
        entry = _READ_OPS.get(method)
        if entry is None or method not in self.INLINE_READS:
            raise invalid(f"{method} is not an inline read")
        op, cls = entry
        self._check_request(req, cls)
        return self._once(lambda tr: op(self._ctx(req.user), MetaTxn(tr), req), wait=True)

    #: Mutations :meth:`write_once` runs (every op of :meth:`_write`, and the quiet closes).
    INLINE_WRITES = frozenset(
        {
            "close_sessions",
            "setattr",
            "create",
            "open",
            "close",
            "sync",
            "mknod",
            "mkdir",
            "symlink",
            "link",
            "unlink",
            "rmdir",
            "rename",
            "setxattr",
            "removexattr",
            "setlayout",
        }
    )

    def write_once(self, method: str, req: Any) -> Any:
        """One attempt of the mutation ``method`` (a name in :data:`INLINE_WRITES`)
        that never waits for anything but its own commit.

        The servicer runs a lone mutation (none other in flight) with this on its
        event loop: a thread hand-off there and back costs more CPU and wake-ups
        than the transaction's own work, and with no other transaction to share
        a commit with, a worker thread would only wait for the same fsync. The
        commit is :meth:`fs3.kv.Transaction.commit_now`: durable when it returns,
        exactly as through the group commit. :class:`WouldWait` when it would
        have to queue (another commit in progress or newer than the snapshot) or
        reserve inode numbers; a retryable :class:`FsError` as from one attempt
        of :meth:`fs3.kv.Database.run`. Either way nothing was written and the
        caller runs the method the ordinary way (``request_id`` makes a retry
        apply once).
        """
        if method not in self.INLINE_WRITES:
            raise invalid(f"{method} is not an inline write")
        self._local.once = True
        try:
            return getattr(self, method)(req)
        finally:
            self._local.once = False

    def _once(self, fn: Callable[[Transaction], R2], *, wait: bool) -> R2:
        """:meth:`fs3.kv.Database.run` with no retry, spelled out: that loop's deadline,
        backoff and closure are per-call work a single attempt does not need (a
        retryable failure still counts in ``db.retries``). ``wait=False``: commit
        only if it needs no wait (:class:`WouldWait` otherwise)."""
        db = self.db
        tr = db.create_transaction()
        try:
            result = fn(tr)
            if wait:
                tr.commit()
            elif not tr.commit_now():
                raise WouldWait
        except FsError as e:
            tr.cancel()
            if e.retryable:
                db.retries += 1
            raise
        except BaseException:
            tr.cancel()
            raise
        return result

    def _write(
        self,
        name: str,
        op: Op,
        req: Any,
        cls: type[Message],
        resp_cls: type[R],
        *,
        creates: bool = False,
    ) -> R:
        self._check_request(req, cls)
        rid: str = req.request_id
        once = self._local.once
        if not creates:
            new_ino = 0
        elif not once:
            new_ino = self.alloc.allocate()
        else:
            got = self.alloc.try_allocate()  # a reservation is a commit of its own: not inline
            if got is None:
                raise WouldWait
            new_ino = got
        attempts = 0
        used = False

        def txn(tr: Transaction) -> R:
            nonlocal attempts, used
            attempts += 1
            tx = MetaTxn(tr)
            if rid:
                rec = tx.get_idem(rid)
                if rec is not None:
                    if rec.op != name:
                        raise invalid(f"request_id {rid!r} was already used for {rec.op}")
                    used = True  # an earlier attempt committed; never hand its inode out again
                    return resp_cls.FromString(rec.response)
            ctx = self._ctx(req.user, new_ino)
            resp = op(ctx, tx, req)
            used = ctx.ino_used
            if rid and ctx.changed:
                tx.put_idem(
                    rid,
                    meta_pb2.IdemRecord(
                        time=ctx.now_ns / 1e9, response=resp.SerializeToString(), op=name
                    ),
                )
            return resp  # type: ignore[no-any-return]

        try:
            result = self._once(txn, wait=False) if once else self.db.run(txn)
        except BaseException as e:
            if creates and attempts <= 1:
                self.alloc.give_back(new_ino)
            if isinstance(e, NoChainTable):
                raise e.error() from None  # answered now, retried by the client (see its doc)
            raise
        if creates and not used and attempts == 1:
            self.alloc.give_back(new_ino)
        return result

    def _scan_page(self, begin: bytes, end: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """One snapshot page of a range (its own short transaction)."""

        def txn(tr: Transaction) -> list[tuple[bytes, bytes]]:
            return tr.get_range(begin, end, limit=limit, snapshot=True)

        return self.db.run(txn)

    # ------------------------------------------------------------------ reads

    def lookup(self, req: meta_pb2.LookupRequest) -> meta_pb2.AttrResponse:
        return self._point(attrs.lookup, req, meta_pb2.LookupRequest)  # type: ignore[no-any-return]

    def lookup_path(self, req: meta_pb2.LookupPathRequest) -> meta_pb2.LookupPathResponse:
        return self._read(attrs.lookup_path, req, meta_pb2.LookupPathRequest)  # type: ignore[no-any-return]

    def getattr(self, req: meta_pb2.GetAttrRequest) -> meta_pb2.AttrResponse:
        return self._point(attrs.getattr_, req, meta_pb2.GetAttrRequest)  # type: ignore[no-any-return]

    def access(self, req: meta_pb2.AccessRequest) -> common_pb2.Empty:
        return self._point(attrs.access, req, meta_pb2.AccessRequest)  # type: ignore[no-any-return]

    def readlink(self, req: meta_pb2.ReadLinkRequest) -> meta_pb2.ReadLinkResponse:
        return self._point(attrs.readlink, req, meta_pb2.ReadLinkRequest)  # type: ignore[no-any-return]

    def readdir(self, req: meta_pb2.ReadDirRequest) -> meta_pb2.ReadDirResponse:
        return self._read(attrs.readdir, req, meta_pb2.ReadDirRequest)  # type: ignore[no-any-return]

    def getxattr(self, req: meta_pb2.GetXattrRequest) -> meta_pb2.GetXattrResponse:
        return self._read(xattrs.getxattr, req, meta_pb2.GetXattrRequest)  # type: ignore[no-any-return]

    def listxattr(self, req: meta_pb2.ListXattrRequest) -> meta_pb2.ListXattrResponse:
        return self._read(xattrs.listxattr, req, meta_pb2.ListXattrRequest)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ writes

    def setattr(self, req: meta_pb2.SetAttrRequest) -> meta_pb2.SetAttrResponse:
        return self._write(
            "SetAttr", files.setattr, req, meta_pb2.SetAttrRequest, meta_pb2.SetAttrResponse
        )

    def create(self, req: meta_pb2.CreateRequest) -> meta_pb2.OpenResponse:
        resp = self._write(
            "Create", files.create, req, meta_pb2.CreateRequest, meta_pb2.OpenResponse, creates=True
        )
        return self._grant(resp, req.flags)

    def open(self, req: meta_pb2.OpenRequest) -> meta_pb2.OpenResponse:
        resp = self._write("Open", files.open_, req, meta_pb2.OpenRequest, meta_pb2.OpenResponse)
        return self._grant(resp, req.flags)

    # ------------------------------------------------------------------ capabilities

    @staticmethod
    def _open_rights(flags: int) -> int:
        """The chunk rights an open with ``flags`` was allowed (its permission check passed)."""
        acc = flags & os.O_ACCMODE
        rights = 0
        if acc in (os.O_RDONLY, os.O_RDWR) or flags & files.FMODE_EXEC:
            rights |= cap.READ
        if acc in (os.O_WRONLY, os.O_RDWR) or flags & os.O_TRUNC:
            rights |= cap.WRITE
        return rights

    def _grant(self, resp: meta_pb2.OpenResponse, flags: int) -> meta_pb2.OpenResponse:
        """Attach the open's chunk capability (after the transaction: a replayed
        request gets a fresh grant, never one stored in its idempotency record)."""
        rights = self._open_rights(flags)
        if self.signer is not None and resp.session_id and rights:
            resp.capability = self.signer.issue(int(resp.attr.inode), rights, self.capability_ttl_s)
        return resp

    def get_capability(self, req: meta_pb2.GetCapabilityRequest) -> meta_pb2.GetCapabilityResponse:
        """A fresh grant for an inode: by its open session, else by permission now."""
        self._check_request(req, meta_pb2.GetCapabilityRequest)
        if self.signer is None:
            return meta_pb2.GetCapabilityResponse()
        need = cap.WRITE if req.write else cap.READ

        def txn(tr: Transaction) -> None:
            tx = MetaTxn(tr)
            node = tx.load(req.inode)
            if node is None:
                raise posix(errno.ENOENT, f"inode {req.inode} does not exist")
            if not S.is_reg(node.attr):
                raise posix(errno.EINVAL, f"inode {req.inode} is not a regular file")
            if req.session_id:
                rec = tx.get_session(req.inode, req.session_id)
                if rec is not None and self._open_rights(rec.flags) & need:
                    return
            perms.check(
                node.attr,
                req.user,
                perms.W if req.write else perms.R,
                f"{'write' if req.write else 'read'} of inode {req.inode} denied",
            )

        self.db.run(txn)
        token = self.signer.issue(int(req.inode), need, self.capability_ttl_s)
        return meta_pb2.GetCapabilityResponse(capability=token)

    def close(self, req: meta_pb2.CloseRequest) -> meta_pb2.AttrResponse:
        return self._write("Close", files.close, req, meta_pb2.CloseRequest, meta_pb2.AttrResponse)

    def close_sessions(self, req: meta_pb2.CloseSessionsRequest) -> meta_pb2.CloseSessionsResponse:
        """Many no-report closes in one transaction (idempotent: gone sessions are skipped)."""
        self._check_request(req, meta_pb2.CloseSessionsRequest)

        def txn(tr: Transaction) -> meta_pb2.CloseSessionsResponse:
            return files.close_sessions(self._ctx(req.user), MetaTxn(tr), req)  # type: ignore[no-any-return]

        return self._once(txn, wait=False) if self._local.once else self.db.run(txn)

    def sync(self, req: meta_pb2.SyncRequest) -> meta_pb2.AttrResponse:
        return self._write("Sync", files.sync, req, meta_pb2.SyncRequest, meta_pb2.AttrResponse)

    def mknod(self, req: meta_pb2.MknodRequest) -> meta_pb2.AttrResponse:
        return self._write(
            "Mknod",
            namespace.mknod,
            req,
            meta_pb2.MknodRequest,
            meta_pb2.AttrResponse,
            creates=True,
        )

    def mkdir(self, req: meta_pb2.MkdirRequest) -> meta_pb2.AttrResponse:
        return self._write(
            "Mkdir",
            namespace.mkdir,
            req,
            meta_pb2.MkdirRequest,
            meta_pb2.AttrResponse,
            creates=True,
        )

    def symlink(self, req: meta_pb2.SymlinkRequest) -> meta_pb2.AttrResponse:
        return self._write(
            "Symlink",
            namespace.symlink,
            req,
            meta_pb2.SymlinkRequest,
            meta_pb2.AttrResponse,
            creates=True,
        )

    def link(self, req: meta_pb2.LinkRequest) -> meta_pb2.AttrResponse:
        return self._write("Link", namespace.link, req, meta_pb2.LinkRequest, meta_pb2.AttrResponse)

    def unlink(self, req: meta_pb2.RemoveRequest) -> meta_pb2.RemoveResponse:
        return self._write(
            "Unlink", namespace.unlink, req, meta_pb2.RemoveRequest, meta_pb2.RemoveResponse
        )

    def rmdir(self, req: meta_pb2.RemoveRequest) -> meta_pb2.RemoveResponse:
        return self._write(
            "Rmdir", namespace.rmdir, req, meta_pb2.RemoveRequest, meta_pb2.RemoveResponse
        )

    def rename(self, req: meta_pb2.RenameRequest) -> meta_pb2.RenameResponse:
        return self._write(
            "Rename", namespace.rename, req, meta_pb2.RenameRequest, meta_pb2.RenameResponse
        )

    def setxattr(self, req: meta_pb2.SetXattrRequest) -> common_pb2.Empty:
        return self._write(
            "SetXattr", xattrs.setxattr, req, meta_pb2.SetXattrRequest, common_pb2.Empty
        )

    def removexattr(self, req: meta_pb2.RemoveXattrRequest) -> common_pb2.Empty:
        return self._write(
            "RemoveXattr", xattrs.removexattr, req, meta_pb2.RemoveXattrRequest, common_pb2.Empty
        )

    def setlayout(self, req: meta_pb2.SetLayoutRequest) -> meta_pb2.AttrResponse:
        return self._write(
            "SetLayout", attrs.setlayout, req, meta_pb2.SetLayoutRequest, meta_pb2.AttrResponse
        )

    # ------------------------------------------------------------------ statfs

    def statfs(self, req: meta_pb2.StatFsRequest) -> meta_pb2.StatFsResponse:
        """Capacity from routing (storage targets) when known, else the KV's own figures.

        Used inodes and bytes come from a scan of the inode records, cached for
        ``statfs_cache_s`` (a shared counter key would make every create conflict).
        """
        self._check_request(req, meta_pb2.StatFsRequest)
        files_used, bytes_used = self._usage()
        space = self.chains.space()
        if space is not None:
            total, used, free = space
        else:
            total = max(1 << 40, bytes_used * 2)
            used = bytes_used
            free = total - used
        return meta_pb2.StatFsResponse(
            block_size=STATFS_BLOCK,
            total_bytes=total,
            free_bytes=free,
            avail_bytes=free,
            total_files=STATFS_TOTAL_FILES,
            free_files=STATFS_TOTAL_FILES - files_used,
            used_files=files_used,
            name_max=S.NAME_MAX,
        )

    def _usage(self) -> tuple[int, int]:
        with self._statfs_lock:
            now = time.monotonic()
            c = self._statfs_cache
            if c is not None and now - c[0] < self.cfg.statfs_cache_s:
                return c[1], c[2]
        files_used = 0
        bytes_used = 0
        begin, end = S.inode_range()
        page = 2000
        while True:
            rows = self._scan_page(begin, end, page)
            for k, v in rows:
                if len(S.K.unpack(k)) == 2:
                    files_used += 1
                    bytes_used += meta_pb2.InodeRecord.FromString(v).attr.size
            if len(rows) < page:
                break
            begin = rows[-1][0] + b"\x00"
        with self._statfs_lock:
            self._statfs_cache = (time.monotonic(), files_used, bytes_used)
        return files_used, bytes_used

    # ------------------------------------------------------------------ sessions and GC

    @staticmethod
    def _require_root(user: common_pb2.UserInfo, what: str) -> None:
        if user.uid != 0:
            raise posix(errno.EPERM, f"{what} is for root only")

    def prune_sessions(self, req: meta_pb2.PruneSessionsRequest) -> meta_pb2.PruneSessionsResponse:
        """Close every session of ``client_id``; orphans they held go to GC."""
        self._check_request(req, meta_pb2.PruneSessionsRequest)
        self._require_root(req.user, "PruneSessions")
        if not req.client_id:
            raise invalid("client_id is required")
        begin, end = S.all_sessions_range()
        victims: list[tuple[int, str]] = []
        while True:
            rows = self._scan_page(begin, end, 1000)
            for k, v in rows:
                if meta_pb2.SessionRecord.FromString(v).client_id == req.client_id:
                    _, ino, sid = S.K.unpack(k)
                    victims.append((int(ino), str(sid)))
            if len(rows) < 1000:
                break
            begin = rows[-1][0] + b"\x00"
        pruned = 0
        for ino, sid in victims:

            def txn(tr: Transaction, ino: int = ino, sid: str = sid) -> int:
                tx = MetaTxn(tr)
                if tx.get_session(ino, sid) is None:
                    return 0
                tx.clear_session(ino, sid)
                node = tx.load(ino)
                if node is not None and node.attr.nlink == 0 and not tx.has_sessions(ino):
                    release(tx, self._ctx(req.user), node)
                return 1

            pruned += self.db.run(txn)
        if pruned:
            event(log, "pruned sessions", client_id=req.client_id, count=pruned)
        return meta_pb2.PruneSessionsResponse(pruned=pruned)

    def list_gc(self, req: meta_pb2.ListGcRequest) -> meta_pb2.ListGcResponse:
        """Due GC entries (removed files whose chunks must be deleted), oldest first."""
        self._check_request(req, meta_pb2.ListGcRequest)
        self._require_root(req.user, "ListGc")
        limit = min(req.limit or 1024, 4096)
        begin, _ = S.gc_range()
        end = S.gc_key(self.now_ns() + 1, 0)
        rows = self.db.run(lambda tr: tr.get_range(begin, end, limit=limit, snapshot=True))
        resp = meta_pb2.ListGcResponse()
        for k, v in rows:
            e = resp.entries.add()
            e.ParseFromString(v)
            e.id = k
        return resp

    def ack_gc(self, req: meta_pb2.AckGcRequest) -> common_pb2.Empty:
        """Drop GC entries whose chunks are gone (idempotent)."""
        self._check_request(req, meta_pb2.AckGcRequest)
        self._require_root(req.user, "AckGc")
        if len(req.ids) > 4096:
            raise invalid("at most 4096 GC ids per AckGc")
        gb, ge = S.gc_range()
        for k in req.ids:
            if not gb <= k < ge:
                raise invalid("not a GC entry id")
        ids = list(req.ids)

        def txn(tr: Transaction) -> None:
            for k in ids:
                tr.clear(k)

        self.db.run(txn)
        return common_pb2.Empty()

    def prune_requests(self, max_age_s: float = IDEM_MAX_AGE_S, *, batch: int = 1000) -> int:
        """Delete idempotency records older than ``max_age_s``; returns how many."""
        cutoff = self.now_ns() / 1e9 - max_age_s
        begin, end = S.idem_range()
        removed = 0
        while True:
            rows = self._scan_page(begin, end, batch)
            old = [k for k, v in rows if meta_pb2.IdemRecord.FromString(v).time < cutoff]
            if old:

                def txn(tr: Transaction, keys: list[bytes] = old) -> None:
                    for k in keys:
                        tr.clear(k)

                self.db.run(txn)
                removed += len(old)
            if len(rows) < batch:
                return removed
            begin = rows[-1][0] + b"\x00"


_ID_FIELDS: dict[type[Message], tuple[str, ...]] = {}


def _id_fields(cls: type[Message]) -> tuple[str, ...]:
    """The bounded id fields (request, client, session) that requests of ``cls`` have.

    Looked up once per message class: ``getattr(req, name, "")`` on a field the
    message lacks raises and catches an AttributeError inside protobuf, which
    costs more than the whole check on every point read.
    """
    names = _ID_FIELDS.get(cls)
    if names is None:
        fields = cls.DESCRIPTOR.fields_by_name
        names = tuple(n for n in ("request_id", "client_id", "session_id") if n in fields)
        _ID_FIELDS[cls] = names
    return names


_POINT_OPS: dict[str, tuple[PointOp, type[Message]]] = {
    "lookup": (attrs.lookup, meta_pb2.LookupRequest),
    "getattr": (attrs.getattr_, meta_pb2.GetAttrRequest),
    "access": (attrs.access, meta_pb2.AccessRequest),
    "readlink": (attrs.readlink, meta_pb2.ReadLinkRequest),
}
_READ_OPS: dict[str, tuple[Op, type[Message]]] = {
    "lookup_path": (attrs.lookup_path, meta_pb2.LookupPathRequest),
    "getxattr": (xattrs.getxattr, meta_pb2.GetXattrRequest),
    "listxattr": (xattrs.listxattr, meta_pb2.ListXattrRequest),
}

__all__ = ["MetaOperator", "WouldWait"]
