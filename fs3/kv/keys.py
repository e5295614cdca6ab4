"""The key layout of fs3, in one table.

Keys are packed with FoundationDB's tuple layer (``fdb.tuple``; it needs no FDB
client library), so every engine stores byte-identical keys and orders them the
same way. Each subsystem owns one top-level subspace, a short string that is the
first tuple element:

=========  ====================================================  ==============
subspace   key tuple                                             owner
=========  ====================================================  ==============
``mg``     ("mg", "lease") -> lease record                        mgmtd
           ("mg", "routing_version") -> u64                       mgmtd
           ("mg", "node", node_id) -> NodeInfo                    mgmtd
           ("mg", "target", target_id) -> TargetInfo              mgmtd
           ("mg", "chain", chain_id) -> ChainInfo                 mgmtd
           ("mg", "table", table_id, version) -> ChainTable       mgmtd
``in``     ("in", inode) -> inode record                          meta
``de``     ("de", parent_inode, name_bytes) -> dir entry          meta
``se``     ("se", inode, session_id) -> write session             meta
``gc``     ("gc", due_time, inode) -> GC entry                     meta
``id``     ("id", shard) -> inode allocator counter               meta
``rq``     ("rq", request_id) -> idempotency record               meta
``mx``     ("mx", ...) meta misc (counters, statfs cache, ...)     meta
``t``      ("t", ...) reserved for tests                          tests
=========  ====================================================  ==============

Values are protobuf messages or small packed tuples; each owner documents its own.
"""

from __future__ import annotations

from typing import Any

import fdb.tuple as _tuple

from fs3.kv.database import strinc

MGMTD = "mg"
INODE = "in"
DENTRY = "de"
SESSION = "se"
GC = "gc"
INODE_ALLOC = "id"
REQUEST = "rq"
META_MISC = "mx"
TEST = "t"


def pack(*parts: Any) -> bytes:
    """Pack a key tuple: ``pack("in", 42)``."""
    return bytes(_tuple.pack(parts))


def unpack(key: bytes) -> tuple[Any, ...]:
    """Unpack a key packed with :func:`pack`."""
    return tuple(_tuple.unpack(key))


def prefix_range(*parts: Any) -> tuple[bytes, bytes]:
    """[begin, end) of every key that extends the tuple ``parts``.

    Uses the tuple layer's ``range``, which excludes the packed prefix itself.
    """
    r = _tuple.range(parts)
    return bytes(r.start), bytes(r.stop)


def raw_prefix_range(prefix: bytes) -> tuple[bytes, bytes]:
    """[begin, end) of every key that starts with the raw bytes ``prefix``."""
    return prefix, strinc(prefix)
