"""Chunk engine: the per-target store of chunk data and metadata.

Semantics follow 3FS's *new* chunk engine (docs/architecture.md#where-fsync-happens;
the rows are in docs/kv-schema.md#chunk-metadata-of-storage-targets):

- **Copy-on-write.** An update is *staged* into a new data file (or, for a pure
  append, past the committed length of the current file, which readers never
  look at) and kept as the chunk's *pending* version. Readers keep seeing the
  last *committed* version until :meth:`commit` publishes the new one.
- **One atomic metadata commit.** Committed metadata lives in a per-target SQLite
  database (WAL, ``synchronous=FULL``). The data file is written and fsync'd (and
  its directory entry is durable) *before* the metadata row that names it is
  committed, so after ``kill -9`` or power loss a chunk is either its old
  committed version or its new one, never a mix, and its checksums match. Files
  no committed row names (a crash between staging and committing) are deleted
  at start-up. Concurrent commits share one transaction (group commit: one WAL
  fsync for many chunk versions).
- **Pending state is in memory.** A restarted target always resyncs from its
  predecessor (docs/chain-states.md#local-states-on-the-storage-node, start-up),
  so losing staged-but-uncommitted updates on a crash is safe.

The engine is two stores with one job each: :mod:`fs3.storage.chunk_data`
(data files: spare pool, copy-on-write staging, O_DIRECT, verified reads) and
:mod:`fs3.storage.chunk_meta` (rows, pending versions, prepare/publish, group
commit). :class:`FileChunkEngine` composes them.

Checksums: every chunk has a whole-chunk CRC32C (what replicas compare) and a
CRC32C per ``block_size`` block (default 64 KiB). Reads verify the blocks that
cover the requested range, so a 4 KiB random read checks 64 KiB rather than a
whole chunk, yet every byte served is verified; a mismatch raises
``CHECKSUM_MISMATCH``.

**Where each method may run.** The storage service runs the blocking ones in the
node's I/O thread pool (``[storage] io_threads``, via ``Replicator.run_blocking``):
every ``stage_*``, :meth:`~ChunkEngine.sync_pending`, :meth:`~ChunkEngine.prepare`,
:meth:`~ChunkEngine.commit`, :meth:`~ChunkEngine.abort`,
:meth:`~ChunkEngine.read_pending_full`, :meth:`FileChunkEngine.install`,
:meth:`FileChunkEngine.drop_files` and large reads. The event loop may call
:meth:`~ChunkEngine.get`, :meth:`~ChunkEngine.pending`, :meth:`~ChunkEngine.list`,
:meth:`~ChunkEngine.space` (one ``statvfs``), :meth:`FileChunkEngine.is_published_cheaply`,
:meth:`FileChunkEngine.publish_prepared` and reads up to ``operator.INLINE_READ_MAX``:
they take only locks that are never held across a disk flush (see the two stores'
docstrings). Per-chunk mutual exclusion of stage/commit is the caller's job (the
CRAQ layer's chunk locks); the engine only guards its own shared structures.

Errors are classified by errno (``OSError``) and by SQLite result code, never by
message text: NO_SPACE only for ENOSPC/EDQUOT/SQLITE_FULL; disk errors keep errno
EIO/EROFS so the caller takes the target offline.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from fs3.errors import Code, FsError, invalid
from fs3.limits import MAX_CHUNK_SIZE
from fs3.storage.chunk_data import (
    READ_FDS,
    SPARE_BATCH,
    ChunkDataStore,
    block_crcs,
    checksum_mismatch,
    crc32c,
    pack_crcs,
    page_aligned,
    unpack_crcs,
)
from fs3.storage.chunk_meta import (
    ALL_INDEXES,
    ChunkKey,
    ChunkMeta,
    ChunkMetaStore,
    CommitReq,
    PendingUpdate,
)

DEFAULT_BLOCK_SIZE = 64 << 10
_ALL_INDEXES = ALL_INDEXES


@dataclass(frozen=True)
class SpaceStats:
    capacity_bytes: int
    free_bytes: int
    used_bytes: int  # bytes held by this engine's chunk files
    chunk_count: int


class ChunkEngine(abc.ABC):
    """The storage of one target. See the module docstring for the guarantees."""

    block_size: int

    @abc.abstractmethod
    def get(self, key: ChunkKey) -> ChunkMeta | None:
        """The committed metadata of ``key`` (``update_ver`` shows a pending version)."""

    @abc.abstractmethod
    def pending(self, key: ChunkKey) -> PendingUpdate | None:
        """The staged update of ``key``, if any."""

    @abc.abstractmethod
    def list(
        self, inode: int | None = None, begin: int = 0, end: int = _ALL_INDEXES
    ) -> list[ChunkMeta]:
        """Committed chunks, ordered by key; optionally those of ``inode`` with index in [begin, end)."""

    @abc.abstractmethod
    def stage_write(
        self,
        key: ChunkKey,
        offset: int,
        data: bytes | bytearray | memoryview,
        *,
        update_ver: int,
        chain_ver: int,
        chunk_size: int,
        replace_all: bool = False,
        checksum: int | None = None,
        sync: bool = True,
    ) -> PendingUpdate:
        """Stage writing ``data`` at ``offset`` on top of the committed version.

        ``replace_all``: the chunk's content becomes exactly ``data`` (offset must
        be 0) — full-chunk replace used by resync and re-driven updates.
        ``checksum``: the CRC32C of ``data`` if the caller already verified it
        (saves one pass over the payload). Replaces any previously staged update.
        ``sync=False``: leave the data unsynced (``synced=False``) so the caller can
        overlap :meth:`sync_pending` with forwarding; :meth:`commit` syncs it
        anyway if the caller did not, so durability never depends on the caller.
        """

    def sync_pending(self, pending: PendingUpdate) -> None:
        """Make the staged data of ``pending`` durable (fdatasync) if it is not yet."""
        pending.synced = True

    def prepare(self, pending: PendingUpdate, chain_ver: int | None = None) -> None:
        """Make ``pending`` durable (data and metadata) without publishing it.

        After a crash a prepared chunk comes back as this version — the same state
        as "committed, then crashed before the predecessor committed", which the
        chain already handles (a restarted target resyncs; an unacknowledged write
        may or may not have happened). Readers of *this* process keep seeing the
        old version until :meth:`commit`, which is then memory-only. Why: the CRAQ
        write path prepares while the update travels down the chain, taking the
        metadata fsync of every non-tail replica off the critical path.
        :meth:`abort` of a prepared update restores the old row durably.
        """
        self.sync_pending(pending)  # an engine without separate rows: commit does the rest

    @abc.abstractmethod
    def stage_truncate(
        self,
        key: ChunkKey,
        length: int,
        *,
        update_ver: int,
        chain_ver: int,
        chunk_size: int,
        only_extend: bool,
    ) -> PendingUpdate:
        """Stage resizing the chunk to ``length`` (zero-filled when growing)."""

    @abc.abstractmethod
    def stage_remove(self, key: ChunkKey, *, update_ver: int, chain_ver: int) -> PendingUpdate:
        """Stage deleting the chunk."""

    @abc.abstractmethod
    def commit(self, pending: PendingUpdate, chain_ver: int | None = None) -> ChunkMeta | None:
        """Atomically publish ``pending``; returns the new meta (None after a remove)."""

    @abc.abstractmethod
    def abort(self, key: ChunkKey) -> None:
        """Drop the staged update of ``key`` (if any) and its private file."""

    @abc.abstractmethod
    def read(
        self, key: ChunkKey, offset: int, length: int, *, nowait: bool = False
    ) -> tuple[ChunkMeta, bytes]:
        """Read committed bytes [offset, offset+length) (short past the end), verified.

        Raises CHUNK_NOT_FOUND or CHECKSUM_MISMATCH. ``nowait``: raise
        ``BlockingIOError`` instead of waiting for the disk (the event loop calls
        with it; an engine that cannot tell may simply always raise it).
        """

    def read_into(
        self, key: ChunkKey, offset: int, length: int, dest: memoryview, *, nowait: bool = False
    ) -> tuple[ChunkMeta, int] | None:
        """Like :meth:`read` but straight into ``dest``; None if this engine/range cannot (use read)."""
        return None

    @abc.abstractmethod
    def read_pending_full(self, key: ChunkKey) -> bytes:
        """The whole content of the staged version (for full-chunk forwarding)."""

    @abc.abstractmethod
    def space(self) -> SpaceStats:
        """Capacity/free of the underlying disk and this engine's usage."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release files and the metadata database."""


# --------------------------------------------------------------------------- file engine


class FileChunkEngine(ChunkEngine):
    """One file per chunk version under ``<root>/data/XX/``, metadata in ``<root>/meta.db``.

    Args:
        root: the target directory (created if missing).
        fsync: make data and metadata durable before :meth:`commit` returns
            (tests may disable it for speed; crash tests keep it on).
        block_size: checksum block size (power of two).
        reserved_bytes: refuse growth when the disk would drop below this many free bytes.
        direct_write: write whole new chunk versions with ``O_DIRECT`` when the
            payload is page aligned (with ``fsync`` only): the kernel then DMAs
            from the payload (e.g. the client's shared memory) instead of copying
            it into the page cache, the largest CPU cost of a replica write here.
            Such chunks are not in this node's page cache afterwards.
        read_fds: data-file descriptors kept open between reads
            (:class:`fs3.storage.chunk_data.ReadFds`; 0 = open per read).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fsync: bool = True,
        block_size: int = DEFAULT_BLOCK_SIZE,
        reserved_bytes: int = 0,
        direct_write: bool = False,
        read_fds: int = READ_FDS,
    ) -> None:
        if block_size <= 0 or block_size & (block_size - 1):
            raise invalid("block_size must be a power of two")
        self.root = Path(root)
        self.data = ChunkDataStore(
            self.root / "data",
            fsync=fsync,
            block_size=block_size,
            reserved_bytes=reserved_bytes,
            direct_write=direct_write,
            read_fds=read_fds,
        )
        self.data_dir = self.data.dir
        self.fsync = fsync
        self.block_size = block_size
        self.reserved_bytes = reserved_bytes
        self.direct_write = self.data.direct_write
        self.meta = ChunkMetaStore(self.root / "meta.db", fsync=fsync)
        self.data.sweep_orphans(self.meta.live_files())

    @property
    def direct_writes(self) -> int:
        """Chunk versions written with O_DIRECT (tests, metrics)."""
        return self.data.direct_writes

    @property
    def _db(self) -> object:
        """The SQLite connection (crash tests close it to drop the engine without cleanup)."""
        return self.meta.db

    def spare_files(self) -> set[str]:
        """Names of the pre-created empty data files not yet handed out (tests, fsck)."""
        return self.data.spare_files()

    def check_room(self, growth: int) -> None:
        """Raise NO_SPACE if growing by ``growth`` bytes would eat into the reserve (a statvfs)."""
        self._check_room(growth)

    def _check_room(self, growth: int) -> None:
        self.data.check_room(growth)

    def _set_pending(self, p: PendingUpdate) -> PendingUpdate:
        old = self.meta.set_pending(p)
        if old is not None and old.owns_file and old.file and old.file != p.file:
            self.data.unlink(old.file)
        return p

    @staticmethod
    def _check_bounds(offset: int, length: int, chunk_size: int) -> None:
        if not 0 < chunk_size <= MAX_CHUNK_SIZE:
            raise invalid(f"chunk size {chunk_size} out of range (1..{MAX_CHUNK_SIZE})")
        if offset < 0 or length < 0 or offset + length > chunk_size:
            raise invalid(f"range [{offset}, {offset + length}) exceeds chunk size {chunk_size}")

    # -- ChunkEngine: reads of metadata (event loop allowed)

    def get(self, key: ChunkKey) -> ChunkMeta | None:
        return self.meta.get(key)

    def pending(self, key: ChunkKey) -> PendingUpdate | None:
        return self.meta.pending(key)

    def list(
        self, inode: int | None = None, begin: int = 0, end: int = _ALL_INDEXES
    ) -> builtins.list[ChunkMeta]:
        return self.meta.list(inode, begin, end)

    # -- staging (I/O threads)

    def stage_write(
        self,
        key: ChunkKey,
        offset: int,
        data: bytes | bytearray | memoryview,
        *,
        update_ver: int,
        chain_ver: int,
        chunk_size: int,
        replace_all: bool = False,
        checksum: int | None = None,
        sync: bool = True,
    ) -> PendingUpdate:
        length = len(data)
        self._check_bounds(offset, length, chunk_size)
        if replace_all and offset != 0:
            raise invalid("a full-chunk replace starts at offset 0")
        self.abort(key)
        old = self.get(key)
        old_len = old.length if old else 0
        new_len = length if replace_all else max(old_len, offset + length)
        self._check_room(new_len - old_len if not replace_all else new_len)
        # Pure append into the committed file: bytes past the committed length are
        # invisible to readers and to a crash-recovered engine, so no copy is needed.
        in_place = (
            old is not None
            and old.file != ""
            and not replace_all
            and offset == old_len
            and length > 0
        )
        full = replace_all or (offset == 0 and length >= old_len)
        rel = old.file if in_place and old else self.data.new_file()
        self.data.write_version(
            rel,
            str(key),
            data,
            offset,
            copy_from=old.file if old is not None and not full and not in_place else "",
            copy_len=old_len if old is not None and not full and not in_place else 0,
            new_len=new_len,
            sparse_to=offset if new_len and offset > old_len and not full else 0,
            direct=self.direct_write
            and full
            and not in_place
            and length > 0
            and page_aligned(data),
            sync=sync,
            fresh=not in_place,
        )
        # checksums of the new content
        if full:
            crc = crc32c(data) if checksum is None else checksum
            blocks = block_crcs(data, self.block_size)
        else:
            # Partial update: checksum the resulting content (a page-cache read of
            # at most one chunk; CRC32C runs at ~15 GB/s).
            content = self.data.read_file(rel, 0, new_len)
            if len(content) != new_len:
                if not in_place:
                    self.data.unlink(rel)
                raise FsError(Code.INTERNAL, f"chunk {key}: short read-back of staged content")
            crc = crc32c(content)
            blocks = block_crcs(content, self.block_size)
        return self._set_pending(
            PendingUpdate(
                key,
                update_ver,
                chain_ver,
                False,
                new_len,
                crc,
                blocks,
                rel,
                owns_file=not in_place,
                synced=sync or not self.fsync,
            )
        )

    def sync_pending(self, pending: PendingUpdate) -> None:
        """fdatasync the staged file of ``pending`` (no-op if already durable).

        Runs concurrently with forwarding the update down the chain, so the
        replicas' data syncs overlap instead of adding up; :meth:`commit` calls
        it too, so nothing is committed before its data is durable. A failure
        is reported as an OSError-derived FsError (errno kept): after a failed
        fsync the page cache state is unknown, so the caller takes the target
        out of service.
        """
        if pending.synced or not self.fsync or pending.remove or not pending.file:
            pending.synced = True
            return
        self.data.sync(pending.file, str(pending.key))
        pending.synced = True

    def stage_truncate(
        self,
        key: ChunkKey,
        length: int,
        *,
        update_ver: int,
        chain_ver: int,
        chunk_size: int,
        only_extend: bool,
    ) -> PendingUpdate:
        self._check_bounds(0, length, chunk_size)
        self.abort(key)
        old = self.get(key)
        old_len = old.length if old else 0
        if only_extend and length <= old_len:
            length = old_len
        if length > old_len:
            # Growing: zero-fill into a new version (copy-on-write of the old bytes).
            self._check_room(length - old_len)
            rel = self.data.new_file()
            self.data.extend_version(rel, str(key), old.file if old else "", old_len, length)
            content = self.data.read_file(rel, 0, length)
            crcs = block_crcs(content, self.block_size)
            return self._set_pending(
                PendingUpdate(
                    key, update_ver, chain_ver, False, length, crc32c(content), crcs, rel, True
                )
            )
        # Shrinking (or same): the committed file is shared; only the length changes.
        rel = old.file if old else ""
        if length == 0:
            return self._set_pending(
                PendingUpdate(key, update_ver, chain_ver, False, 0, 0, b"", "", owns_file=False)
            )
        assert old is not None
        bs = self.block_size
        keep = length // bs
        blocks = list(unpack_crcs(old.block_crcs)[:keep])
        head = self.data.read_file(rel, 0, length)
        if len(head) != length:
            raise FsError(Code.INTERNAL, f"chunk {key}: data file shorter than committed length")
        if length % bs:
            blocks.append(crc32c(memoryview(head)[keep * bs :]))
        return self._set_pending(
            PendingUpdate(
                key,
                update_ver,
                chain_ver,
                False,
                length,
                crc32c(head),
                pack_crcs(blocks),
                rel,
                False,
            )
        )

    def stage_remove(self, key: ChunkKey, *, update_ver: int, chain_ver: int) -> PendingUpdate:
        self.abort(key)
        return self._set_pending(PendingUpdate(key, update_ver, chain_ver, True))

    # -- commit (I/O threads, except publish_prepared)

    def commit(self, pending: PendingUpdate, chain_ver: int | None = None) -> ChunkMeta | None:
        """Publish ``pending`` (group commit: concurrent commits share one SQLite transaction).

        See :meth:`ChunkMetaStore.commit`; the data is made durable first.
        """
        cv = pending.chain_ver if chain_ver is None else chain_ver
        if self.is_published_cheaply(pending, cv):
            return self._publish_prepared(pending, cv)
        if not pending.synced:
            self.sync_pending(pending)  # the data is durable before the row naming it commits
        req = CommitReq(pending, cv)
        unlink = self.meta.commit(req)
        self.drop_files(unlink)  # open readers keep their descriptor; an orphan is swept at start
        return req.meta

    def prepare(self, pending: PendingUpdate, chain_ver: int | None = None) -> None:
        cv = pending.chain_ver if chain_ver is None else chain_ver
        if self.is_published_cheaply(pending, cv):
            return
        if not pending.synced:
            self.sync_pending(pending)  # the data is durable before the row naming it is
        self.meta.commit(CommitReq(pending, cv, publish=False))

    def is_published_cheaply(self, pending: PendingUpdate, chain_ver: int) -> bool:
        """True if :meth:`commit` of ``pending`` needs no disk I/O but unlinking an old file."""
        return self.meta.is_published_cheaply(pending, chain_ver)

    def publish_prepared(
        self, pending: PendingUpdate, chain_ver: int
    ) -> tuple[ChunkMeta | None, builtins.list[str]]:
        """Commit a prepared ``pending`` in memory only; returns (new meta, superseded files).

        No disk I/O at all, so the event loop may call it: the caller deletes the
        returned files later with :meth:`drop_files` (freeing a file's blocks costs
        about as much as writing them; an orphan left by a crash meanwhile is
        swept at start-up).
        """
        return self.meta.publish_prepared(pending, chain_ver)

    def drop_files(self, files: Iterable[str]) -> None:
        """Delete superseded data files (see :meth:`publish_prepared`); missing ones are fine."""
        for f in files:
            with contextlib.suppress(OSError):
                self.data.unlink(f)

    def _publish_prepared(self, pending: PendingUpdate, chain_ver: int) -> ChunkMeta | None:
        meta, unlink = self.publish_prepared(pending, chain_ver)
        self.drop_files(unlink)
        return meta

    def abort(self, key: ChunkKey) -> None:
        p = self.meta.pop_pending(key)
        if p is not None and p.owns_file and p.file:
            self.data.unlink(p.file)

    # -- reads

    def read(
        self, key: ChunkKey, offset: int, length: int, *, nowait: bool = False
    ) -> tuple[ChunkMeta, bytes]:
        """Committed bytes [offset, offset+length), their checksum blocks verified.

        ``nowait``: only from the page cache (``RWF_NOWAIT``); raises
        ``BlockingIOError`` when the bytes would have to come from the disk, so an
        event-loop caller can hand the read to a thread instead of stalling.
        """
        if offset < 0 or length < 0:
            raise invalid("negative offset or length")
        meta = self.get(key)
        if meta is None:
            raise FsError(Code.CHUNK_NOT_FOUND, f"chunk {key} not found")
        end = min(meta.length, offset + length)
        if end <= offset:
            return meta, b""
        buf = self.data.read_verified(
            meta.file, str(key), meta.block_crcs, meta.length, offset, end, nowait=nowait
        )
        if buf is None:
            # Superseded between get() and open(): read the newer version.
            if self.get(key) != meta:
                return self.read(key, offset, length, nowait=nowait)
            return self._missing(meta)
        return meta, buf

    def read_into(
        self, key: ChunkKey, offset: int, length: int, dest: memoryview, *, nowait: bool = False
    ) -> tuple[ChunkMeta, int] | None:
        """Read committed bytes [offset, offset+length) straight into ``dest``, verified in place.

        ``nowait``: as for :meth:`read` (``BlockingIOError`` if not all cached).

        The zero-copy read path (shm destinations, i.e. USRBIO): a range on
        checksum-block boundaries is ``preadv``'d straight into the client's
        region and its block CRCs are checked there; any other range (a 4 KiB
        random read) reads its covering blocks into a scratch buffer, is verified
        there and copied into ``dest``. Either way no Python object is made per
        read and the chunk's metadata is looked up once. On CHECKSUM_MISMATCH
        ``dest`` may hold unverified bytes (the caller reports an error, so the
        client never uses them).
        """
        if offset < 0 or length < 0 or len(dest) < length:
            raise invalid("bad read range or destination too small")
        meta = self.get(key)
        if meta is None:
            raise FsError(Code.CHUNK_NOT_FOUND, f"chunk {key} not found")
        end = min(meta.length, offset + length)
        if end <= offset:
            return meta, 0
        n = self.data.read_verified_into(
            meta.file, str(key), meta.block_crcs, meta.length, offset, end, dest, nowait=nowait
        )
        if n is None:
            if self.get(key) != meta:  # superseded between get() and open(): the newer one
                return self.read_into(key, offset, length, dest, nowait=nowait)
            self._missing(meta)
        return meta, n

    @staticmethod
    def _missing(meta: ChunkMeta) -> NoReturn:
        raise checksum_mismatch(f"chunk {meta.key}: data file missing")

    def read_pending_full(self, key: ChunkKey) -> bytes:
        p = self.pending(key)
        if p is None or p.remove:
            raise FsError(Code.INTERNAL, f"chunk {key}: no staged content")
        data = self.data.read_file(p.file, 0, p.length)
        if len(data) != p.length or crc32c(data) != p.checksum:
            raise FsError(
                Code.CHECKSUM_MISMATCH, f"chunk {key}: staged content does not match its checksum"
            )
        return data

    def install(self, meta: ChunkMeta, data: bytes | bytearray | memoryview) -> ChunkMeta:
        """Install ``data`` as the committed version ``meta.commit_ver`` (resync, repair)."""
        p = self.stage_write(
            meta.key,
            0,
            data,
            update_ver=meta.commit_ver,
            chain_ver=meta.chain_ver,
            chunk_size=max(len(data), 1),
            replace_all=True,
        )
        out = self.commit(p)
        assert out is not None
        return out

    def space(self) -> SpaceStats:
        capacity, free = self.data.capacity()
        used, count = self.meta.usage()
        return SpaceStats(capacity, free, used, count)

    def close(self) -> None:
        for k in self.meta.pending_keys():
            self.abort(k)
        self.data.drop_spares()
        self.data.close()
        self.meta.close()


__all__ = [
    "SPARE_BATCH",
    "ChunkEngine",
    "ChunkKey",
    "ChunkMeta",
    "FileChunkEngine",
    "PendingUpdate",
    "SpaceStats",
    "crc32c",
]
