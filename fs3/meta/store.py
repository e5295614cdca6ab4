"""Typed access to meta's records inside one KV transaction.

Ops never touch raw keys; they call these accessors, so the key layout in
:mod:`fs3.meta.schema` is the only place that knows the encoding. Reads are
serializable (they join the read-conflict set) unless ``snapshot=True``:
read-only ops use snapshot reads so they never make writers retry; mutating ops
read everything they depend on with conflict so concurrent changes serialize.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

from fs3.errors import posix
from fs3.kv import Database, Transaction
from fs3.meta import schema as S
from fs3.proto import meta_pb2

_DENSE_MIN = 8  # load_many: fewer inodes than this are read one by one
_DENSE_SPAN = 4  # load_many: one range read if max - min + 1 <= this x the number wanted


@dataclass
class Inode:
    """A loaded inode record (``attr`` is mutable; call :meth:`MetaTxn.put_inode`)."""

    attr: meta_pb2.Attr
    symlink_target: bytes = b""
    # the serialized AttrResponse of a SHARED node (decode_inode's), built once:
    # fs3.meta.ops.attrs answers getattr and lookup from it
    public: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def ino(self) -> int:
        return int(self.attr.inode)


def _set_times(attr: meta_pb2.Attr, raw_times: bytes) -> None:
    """A directory's mtime/ctime from its times key, set in place (S.timespec's
    split): no Timespec built and copied per field."""
    m, c = S.decode_times(raw_times)
    t = attr.mtime
    t.sec, t.nsec = divmod(m, 1_000_000_000)
    t = attr.ctime
    t.sec, t.nsec = divmod(c, 1_000_000_000)


_DECODED_MAX = 4096  # read_inode's cache of decoded inodes (entries, then it starts afresh)
_decoded: dict[tuple[bytes, bytes | None], Inode] = {}


def read_inode(db: Database, ino: int) -> Inode | None:
    """The inode with its directory times, read outside any transaction, or None.

    One :meth:`fs3.kv.Database.snapshot_get` of the record and the times key
    together (one consistent point: a single SQLite statement), for read-only
    ops that need nothing else (getattr). A non-directory has no times key; asking
    for it in the same read costs nothing. What :meth:`MetaTxn.load` returns with
    ``snapshot=True``.

    The result is SHARED and must not be modified: decoding is cached by the
    stored bytes themselves (record, times), so an inode read again unchanged
    (stat after stat) skips the protobuf parse and the times decode, and a
    changed one has other bytes and so decodes afresh. Nothing can go stale.
    """
    raw, raw_times = db.snapshot_get(inode_keys(ino))
    return None if raw is None else decode_inode(raw, raw_times)


_KEYS_MAX = 4096  # inode_keys' memo (entries, then it starts afresh)
_keys: dict[int, tuple[bytes, bytes]] = {}


def inode_keys(ino: int) -> tuple[bytes, bytes]:
    """The record and times keys of inode ``ino``, memoized: a point read of an inode
    read before (stat after stat) encodes nothing (keys never change)."""
    keys = _keys.get(ino)
    if keys is None:
        if len(_keys) >= _KEYS_MAX:
            _keys.clear()
        keys = _keys[ino] = (S.inode_key(ino), S.dir_times_key(ino))
    return keys


def decode_inode(raw: bytes, raw_times: bytes | None) -> Inode:
    """:func:`read_inode`'s decode of stored bytes (SHARED result, cached by the bytes).

    ``raw_times`` None: a directory without its times (a caller that checks only
    type and permissions, like :meth:`MetaTxn.load` with ``times=False``).
    """
    key = (raw, raw_times)
    node = _decoded.get(key)
    if node is not None:
        return node
    rec = meta_pb2.InodeRecord.FromString(raw)
    node = Inode(rec.attr, rec.symlink_target)
    if raw_times is not None and S.is_dir(node.attr):
        _set_times(node.attr, raw_times)
    if len(_decoded) >= _DECODED_MAX:
        _decoded.clear()
    _decoded[key] = node
    return node


class MetaTxn:
    """Meta's view of one KV transaction."""

    def __init__(self, tr: Transaction) -> None:
        self.tr = tr
        # One object per inode per transaction: ops that touch the same inode
        # through two roles (rename: parent and child) mutate one object.
        self._cache: dict[int, Inode] = {}
        self._conflicted: set[int] = set()

    # -- inodes ------------------------------------------------------------------

    def load(self, ino: int, *, snapshot: bool = False, times: bool = True) -> Inode | None:
        """The inode (one object per transaction), or None.

        ``times=False``: a directory's mtime/ctime (a second key) are not read
        and such a node is not kept for the rest of the transaction; for callers
        that only check the directory's type and permissions (a lookup's parent).
        """
        cached = self._cache.get(ino)
        if cached is not None:
            if not snapshot and ino not in self._conflicted:
                self.tr.add_read_conflict_key(S.inode_key(ino))
                self._conflicted.add(ino)
            return cached
        raw = self.tr.get(S.inode_key(ino), snapshot=snapshot)
        if not snapshot:
            self._conflicted.add(ino)
        if raw is None:
            return None
        rec = meta_pb2.InodeRecord.FromString(raw)
        node = Inode(rec.attr, rec.symlink_target)
        if S.is_dir(node.attr):
            if not times:
                return node
            # always a snapshot read: the times key is written blindly (see schema)
            raw_times = self.tr.get(S.dir_times_key(ino), snapshot=True)
            if raw_times is not None:
                _set_times(node.attr, raw_times)
        self._cache[ino] = node
        return node

    def load_many(self, inos: list[int]) -> dict[int, Inode]:
        """Snapshot-load several inodes (readdir with attributes): ino -> Inode, missing left out.

        Inode numbers come from per-server batches, so a directory's entries are
        often numbered densely; then one range read over ``[min, max]`` replaces
        one point read per entry (each costs a query and a Python round trip).
        Keys in that range that were not asked for (other inodes, xattrs) are
        skipped, so the range is used only while it stays small next to the
        number of inodes wanted.
        """
        want = sorted({i for i in inos if i not in self._cache})
        out = {i: self._cache[i] for i in inos if i in self._cache}
        if len(want) < _DENSE_MIN or want[-1] - want[0] + 1 > _DENSE_SPAN * len(want):
            for i in want:
                node = self.load(i, snapshot=True)
                if node is not None:
                    out[i] = node
            return out
        records = {S.inode_key(i): i for i in want}
        times = {S.dir_times_key(i): i for i in want}
        got_times: dict[int, bytes] = {}
        begin, end = S.inode_key(want[0]), S.inode_key(want[-1] + 1)
        for k, v in self.tr.get_range(begin, end, snapshot=True):
            ino = records.get(k)
            if ino is not None:
                rec = meta_pb2.InodeRecord.FromString(v)
                out[ino] = Inode(rec.attr, rec.symlink_target)
                continue
            ino = times.get(k)
            if ino is not None:
                got_times[ino] = v
        for ino in want:
            node = out.get(ino)
            if node is None:
                continue
            if S.is_dir(node.attr) and ino in got_times:
                m, c = S.decode_times(got_times[ino])
                node.attr.mtime.CopyFrom(S.timespec(m))
                node.attr.ctime.CopyFrom(S.timespec(c))
            self._cache[ino] = node
        return out

    def must(self, ino: int, *, snapshot: bool = False, times: bool = True) -> Inode:
        """The inode or ENOENT."""
        node = self.load(ino, snapshot=snapshot, times=times)
        if node is None:
            raise posix(errno.ENOENT, f"no inode {ino}")
        return node

    def must_dir(self, ino: int, *, snapshot: bool = False, times: bool = True) -> Inode:
        node = self.must(ino, snapshot=snapshot, times=times)
        if not S.is_dir(node.attr):
            raise posix(errno.ENOTDIR, f"inode {ino} is not a directory")
        return node

    def put_inode(self, node: Inode) -> None:
        self._cache[node.ino] = node
        rec = meta_pb2.InodeRecord(attr=node.attr, symlink_target=node.symlink_target)
        self.tr.set(S.inode_key(node.ino), rec.SerializeToString())
        if S.is_dir(node.attr):
            self._put_times(node)

    def _put_times(self, node: Inode) -> None:
        a = node.attr
        self.tr.set(S.dir_times_key(node.ino), S.encode_times(S.ts_ns(a.mtime), S.ts_ns(a.ctime)))

    def touch_dir(self, node: Inode, now_ns: int) -> None:
        """mtime = ctime = now on a directory whose entries changed (blind write, no conflict)."""
        ts = S.timespec(now_ns)
        node.attr.mtime.CopyFrom(ts)
        node.attr.ctime.CopyFrom(ts)
        self._cache[node.ino] = node
        self._put_times(node)

    def delete_inode(self, ino: int) -> None:
        """Remove the inode record, its xattrs and (directories) its times key."""
        self._cache.pop(ino, None)
        self.tr.clear(S.inode_key(ino))
        b, e = S.inode_children_range(ino)
        self.tr.clear_range(b, e)

    # -- directory entries ---------------------------------------------------------

    def get_entry(
        self, parent: int, name: bytes, *, snapshot: bool = False
    ) -> tuple[int, int] | None:
        raw = self.tr.get(S.dentry_key(parent, name), snapshot=snapshot)
        return None if raw is None else S.decode_dentry(raw)

    def set_entry(self, parent: int, name: bytes, ino: int, ftype: int) -> None:
        self.tr.set(S.dentry_key(parent, name), S.encode_dentry(ino, ftype))

    def clear_entry(self, parent: int, name: bytes) -> None:
        self.tr.clear(S.dentry_key(parent, name))

    def list_entries(
        self, parent: int, after: bytes, limit: int, *, snapshot: bool = True
    ) -> list[tuple[bytes, int, int]]:
        """Up to ``limit`` entries with name > ``after`` (b"" = from the start)."""
        begin, end = S.dentry_range(parent)
        if after:
            begin = S.dentry_key(parent, after) + b"\x00"
        out = []
        for k, v in self.tr.get_range(begin, end, limit=limit, snapshot=snapshot):
            name = S.K.unpack(k)[2]
            ino, ftype = S.decode_dentry(v)
            out.append((bytes(name), ino, ftype))
        return out

    def dir_is_empty(self, ino: int) -> bool:
        """Serializable emptiness check: a concurrent create into it conflicts."""
        begin, end = S.dentry_range(ino)
        return not self.tr.get_range(begin, end, limit=1)

    # -- sessions --------------------------------------------------------------------

    def get_session(self, ino: int, session_id: str) -> meta_pb2.SessionRecord | None:
        raw = self.tr.get(S.session_key(ino, session_id))
        return None if raw is None else meta_pb2.SessionRecord.FromString(raw)

    def put_session(self, ino: int, session_id: str, rec: meta_pb2.SessionRecord) -> None:
        self.tr.set(S.session_key(ino, session_id), rec.SerializeToString())

    def clear_session(self, ino: int, session_id: str) -> None:
        self.tr.clear(S.session_key(ino, session_id))

    def has_sessions(self, ino: int) -> bool:
        begin, end = S.session_range(ino)
        return bool(self.tr.get_range(begin, end, limit=1))

    # -- xattrs ------------------------------------------------------------------------

    def get_xattr(self, ino: int, name: bytes, *, snapshot: bool = False) -> bytes | None:
        return self.tr.get(S.xattr_key(ino, name), snapshot=snapshot)

    def set_xattr(self, ino: int, name: bytes, value: bytes) -> None:
        self.tr.set(S.xattr_key(ino, name), value)

    def clear_xattr(self, ino: int, name: bytes) -> None:
        self.tr.clear(S.xattr_key(ino, name))

    def list_xattrs(self, ino: int, *, snapshot: bool = True) -> list[bytes]:
        begin, end = S.xattr_range(ino)
        return [
            bytes(S.K.unpack(k)[3]) for k, _ in self.tr.get_range(begin, end, snapshot=snapshot)
        ]

    # -- GC queue ------------------------------------------------------------------------

    def enqueue_gc(self, due_ns: int, entry: meta_pb2.GcEntry) -> None:
        self.tr.set(S.gc_key(due_ns, entry.inode), entry.SerializeToString())

    # -- idempotency ----------------------------------------------------------------------

    def get_idem(self, request_id: str) -> meta_pb2.IdemRecord | None:
        raw = self.tr.get(S.idem_key(request_id))
        return None if raw is None else meta_pb2.IdemRecord.FromString(raw)

    def put_idem(self, request_id: str, rec: meta_pb2.IdemRecord) -> None:
        self.tr.set(S.idem_key(request_id), rec.SerializeToString())
