"""Meta's key layout and record encodings, in one place.

All keys live in the subspaces fs3.kv.keys assigns to meta (FoundationDB tuple
layer, so every engine orders them alike):

=================================  =========================================
key                                value
=================================  =========================================
("in", ino)                        InodeRecord (meta.proto): Attr + symlink target
("in", ino, "t")                   directories: (mtime_ns, ctime_ns), 2 x u64
("in", ino, "x", name)             raw xattr value bytes
("de", parent, name)               tuple (child ino, S_IFMT type bits)
("se", ino, session_id)            SessionRecord (open sessions, read and write)
("gc", due_ns, ino)                GcEntry (chunks of a removed file to delete)
("id", shard)                      u64 counter of the inode batch allocator
("rq", request_id)                 IdemRecord (idempotent retries)
=================================  =========================================

A directory's mtime/ctime live in their own key, written *blindly* (never read
with conflict): adding or removing a file only touches the parent's times, so
creates/unlinks in one directory do not conflict with each other (3FS does not
update the parent at all; we keep POSIX parent timestamps without the
conflicts). Ops that change the parent's record (nlink, mode, ...) write both.
Concurrent entry changes may leave the parent's mtime at any of their times
(last writer wins), never older than before them.

Names are ``bytes`` inside the key tuples, so a directory's entries sort by raw
name bytes, which is what the readdir cursor relies on. Why one InodeRecord per
inode rather than one key per attribute: almost every operation needs the whole
attribute set (permission check + reply) and reads it in one get.
"""

from __future__ import annotations

import stat
import struct

from fs3.kv import keys as K
from fs3.proto import common_pb2, meta_pb2

ROOT_INODE = 1
NAME_MAX = 255
SYMLINK_MAX = 4095
XATTR_NAME_MAX = 255
XATTR_VALUE_MAX = 65536
REQUEST_ID_MAX = 128

_U64 = struct.Struct(">Q")


# ----------------------------------------------------------------------------- keys
#
# The tuple layer encodes a tuple as the concatenation of its elements'
# encodings, so hot keys are assembled from cached pieces instead of calling
# fdb.tuple.pack each time (it costs ~30 µs a call, a large share of a lookup).
# tests/unit/meta checks these are byte-identical to K.pack.


def _int(v: int) -> bytes:
    """The tuple layer's integer: 0x14 + byte count, then the big-endian bytes (0: 0x14).

    Spelled out for 0 <= v < 2**64 - 1 (inode numbers, file types): every create
    packs a new inode number, where a cache of ``K.pack`` results misses.
    """
    if 0 <= v < _INT_FAST_END:
        n = (v.bit_length() + 7) >> 3
        return _INT_CODES[n] + v.to_bytes(n, "big")
    return K.pack(v)


_INT_CODES = [bytes((0x14 + n,)) for n in range(9)]
# from 2**64 - 1 on the tuple layer writes a length byte instead (code 0x1d)
_INT_FAST_END = (1 << 64) - 1


def _bytes(b: bytes) -> bytes:
    return b"\x01" + b.replace(b"\x00", b"\x00\xff") + b"\x00"


def _str(v: str) -> bytes:
    return b"\x02" + v.encode().replace(b"\x00", b"\x00\xff") + b"\x00"


_P_INODE = K.pack(K.INODE)
_P_SESSION = K.pack(K.SESSION)
_P_REQUEST = K.pack(K.REQUEST)
_P_DENTRY = K.pack(K.DENTRY)
_X = K.pack("x")
_T = K.pack("t")
_TIMES = struct.Struct(">QQ")


def inode_key(ino: int) -> bytes:
    return _P_INODE + _int(ino)


def inode_range() -> tuple[bytes, bytes]:
    """Every ("in", ...) key: inode records and their xattrs."""
    return K.prefix_range(K.INODE)


def dir_times_key(ino: int) -> bytes:
    return _P_INODE + _int(ino) + _T


def inode_children_range(ino: int) -> tuple[bytes, bytes]:
    """Every key under ("in", ino, ...): times and xattrs (not the record itself)."""
    return K.prefix_range(K.INODE, ino)


def encode_times(mtime_ns: int, ctime_ns: int) -> bytes:
    return _TIMES.pack(mtime_ns, ctime_ns)


def decode_times(v: bytes) -> tuple[int, int]:
    m, c = _TIMES.unpack(v)
    return int(m), int(c)


def xattr_key(ino: int, name: bytes) -> bytes:
    return _P_INODE + _int(ino) + _X + _bytes(name)


def xattr_range(ino: int) -> tuple[bytes, bytes]:
    return K.prefix_range(K.INODE, ino, "x")


def dentry_key(parent: int, name: bytes) -> bytes:
    return _P_DENTRY + _int(parent) + _bytes(name)


def dentry_range(parent: int) -> tuple[bytes, bytes]:
    return K.prefix_range(K.DENTRY, parent)


def all_dentries_range() -> tuple[bytes, bytes]:
    return K.prefix_range(K.DENTRY)


def session_key(ino: int, session_id: str) -> bytes:
    return _P_SESSION + _int(ino) + _str(session_id)


def session_range(ino: int) -> tuple[bytes, bytes]:
    return K.prefix_range(K.SESSION, ino)


def all_sessions_range() -> tuple[bytes, bytes]:
    return K.prefix_range(K.SESSION)


def gc_key(due_ns: int, ino: int) -> bytes:
    return K.pack(K.GC, due_ns, ino)


def gc_range() -> tuple[bytes, bytes]:
    return K.prefix_range(K.GC)


def alloc_key(shard: int = 0) -> bytes:
    return K.pack(K.INODE_ALLOC, shard)


def idem_key(request_id: str) -> bytes:
    return _P_REQUEST + _str(request_id)


def idem_range() -> tuple[bytes, bytes]:
    return K.prefix_range(K.REQUEST)


# ----------------------------------------------------------------------------- values


def encode_dentry(ino: int, ftype: int) -> bytes:
    return _int(ino) + _int(ftype)


def decode_dentry(value: bytes) -> tuple[int, int]:
    ino, ftype = K.unpack(value)
    return int(ino), int(ftype)


def encode_u64(v: int) -> bytes:
    return _U64.pack(v)


def decode_u64(v: bytes | None) -> int:
    return 0 if v is None else int(_U64.unpack(v)[0])


def timespec(ns: int) -> common_pb2.Timespec:
    return common_pb2.Timespec(sec=ns // 1_000_000_000, nsec=ns % 1_000_000_000)


def ts_ns(ts: common_pb2.Timespec) -> int:
    return int(ts.sec) * 1_000_000_000 + int(ts.nsec)


def file_type(mode: int) -> int:
    return stat.S_IFMT(mode)


def is_dir(attr: meta_pb2.Attr) -> bool:
    return stat.S_ISDIR(attr.mode)


def is_reg(attr: meta_pb2.Attr) -> bool:
    return stat.S_ISREG(attr.mode)


def is_lnk(attr: meta_pb2.Attr) -> bool:
    return stat.S_ISLNK(attr.mode)


def public_attr(attr: meta_pb2.Attr) -> meta_pb2.Attr:
    """The Attr a client sees: stored fields plus derived ones (blocks, blksize)."""
    out = meta_pb2.Attr()
    fill_public_attr(out, attr)
    return out


def fill_public_attr(out: meta_pb2.Attr, attr: meta_pb2.Attr) -> None:
    """:func:`public_attr` written into ``out`` (say a response's ``attr``): one copy, not two."""
    out.CopyFrom(attr)
    if stat.S_ISREG(attr.mode):
        out.blocks = (attr.size + 511) // 512
        out.blksize = attr.layout.chunk_size or 4096
    else:
        out.blocks = 0
        out.blksize = 4096
