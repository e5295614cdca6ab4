"""Chunk engine: the per-target store of chunk data and metadata.

Semantics follow 3FS's *new* chunk engine (docs/architecture.md#where-fsync-happens;
the rows are in docs/kv-schema.md#chunk-metadata-of-storage-targets):

- **Copy-on-write.** An update is *staged* into a new data file (or, for a pure
  append, past the committed length of the current file, which readers never
  look at) and kept as the chunk's *pending* version. Readers keep seeing the
  last *committed* version until :meth:`commit` publishes the new one.
- **One atomic metadata commit.** Committed metadata lives in a per-target SQLite
  database (WAL, ``synchronous=FULL``). The data file is written and fsync'd (and
  its directory fsync'd) *before* the metadata row that names it is committed, so
  after ``kill -9`` or power loss a chunk is either its old committed version or
  its new one, never a mix, and its checksums match. Files no committed row names
  (a crash between staging and committing) are deleted at start-up.
- **Pending state is in memory.** A restarted target always resyncs from its
  predecessor (docs/chain-states.md#local-states-on-the-storage-node, start-up),
  so losing staged-but-uncommitted updates on a crash is safe.

Checksums: every chunk has a whole-chunk CRC32C (what replicas compare) and a
CRC32C per ``block_size`` block (default 64 KiB). Reads verify the blocks that
cover the requested range, so a 4 KiB random read checks 64 KiB rather than a
whole chunk, yet every byte served is verified; a mismatch raises
``CHECKSUM_MISMATCH``.

All methods are synchronous and may block on disk I/O. The storage service runs
them in the node's I/O thread pool (``[storage] io_threads``, via
``Replicator.run_blocking``); a few cheap calls run on the event loop itself
(``list``/``get``/``space``, small reads up to ``operator.INLINE_READ_MAX``,
``is_published_cheaply``/``publish_prepared``). Per-chunk mutual exclusion of
stage/commit is the caller's job (the CRAQ layer's chunk locks); the engine only
guards its own shared structures.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import errno as _errno
import fcntl
import os
import secrets
import sqlite3
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

import crc32c as _crc32c

from fs3.durable import fsync_dir, makedirs_durably
from fs3.errors import Code, FsError, invalid
from fs3.limits import MAX_CHUNK_SIZE
from fs3.transport.region import buffer_address

DEFAULT_BLOCK_SIZE = 64 << 10
SPARE_BATCH = 32  # empty data files created (and their directory fsync'd) at a time
_ALL_INDEXES = 0xFFFFFFFF


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, C-accelerated."""
    return int(_crc32c.crc32c(data, value))


@dataclass(frozen=True, order=True)
class ChunkKey:
    """A chunk: (inode, chunk index). Ordered like 3FS chunk ids within an inode."""

    inode: int
    index: int

    def __str__(self) -> str:
        return f"{self.inode:x}:{self.index}"


@dataclass(frozen=True)
class ChunkMeta:
    """Committed state of one chunk (plus the pending version, if any)."""

    key: ChunkKey
    commit_ver: int
    chain_ver: int
    length: int
    checksum: int
    block_crcs: bytes = b""  # packed little-endian u32 per block
    file: str = ""  # data file name relative to the target's data dir ("" for an empty chunk)
    update_ver: int = 0  # == commit_ver unless an update is pending

    @property
    def uncommitted(self) -> bool:
        return self.update_ver != self.commit_ver


@dataclass
class PendingUpdate:
    """A staged, not yet committed chunk version (in memory only)."""

    key: ChunkKey
    update_ver: int
    chain_ver: int
    remove: bool
    length: int = 0
    checksum: int = 0
    block_crcs: bytes = b""
    file: str = ""
    owns_file: bool = False  # the file was created for this update (delete it on abort)
    tag: tuple[str, int, int] | None = None  # (client, channel, seqnum) of the request, for retries
    extra: dict[str, object] = field(default_factory=dict)
    synced: bool = True  # the staged data is durable (see ChunkEngine.sync_pending)
    prepared: bool = False  # its metadata row is already durable (see ChunkEngine.prepare)
    prepared_chain_ver: int = 0  # the chain version that row carries


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


def _pack_crcs(crcs: Iterable[int]) -> bytes:
    lst = list(crcs)
    return struct.pack(f"<{len(lst)}I", *lst)


def _unpack_crcs(blob: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(blob) // 4}I", blob)


def _block_crcs(data: bytes | bytearray | memoryview, block: int) -> bytes:
    mv = memoryview(data)
    return _pack_crcs(crc32c(mv[i : i + block]) for i in range(0, len(mv), block))


_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


def _preadv_nowait(fd: int, view: memoryview, offset: int) -> int:
    """``preadv(RWF_NOWAIT)``: bytes already in the page cache, or ``BlockingIOError``.

    A short answer (part of the range cached) and a file system without
    ``RWF_NOWAIT`` also raise ``BlockingIOError``: the caller reads in a thread.
    """
    if not _NOWAIT:
        raise BlockingIOError(_errno.EAGAIN, "RWF_NOWAIT not available")
    try:
        n = os.preadv(fd, [view], offset, _NOWAIT)
    except OSError as e:
        if e.errno in (_errno.EAGAIN, _errno.EOPNOTSUPP, _errno.EINVAL):
            raise BlockingIOError(_errno.EAGAIN, "not in the page cache") from None
        raise
    if 0 < n < len(view):
        raise BlockingIOError(_errno.EAGAIN, "partly in the page cache")
    return n


def _pread_nowait(fd: int, length: int, offset: int) -> bytes:
    buf = bytearray(length)
    n = _preadv_nowait(fd, memoryview(buf), offset)
    return bytes(memoryview(buf)[:n])  # small (inline reads only): the copy is cheap


def _no_space(what: str) -> FsError:
    return FsError(Code.NO_SPACE, f"no space left on device: {what}", retryable=False)


def _superseded(key: ChunkKey) -> FsError:
    """A commit whose staged update another stage replaced meanwhile (a resync's full-chunk
    write racing a forwarded update on a syncing target): retryable, and not a disk error,
    which would take the whole target offline until restart."""
    return FsError(
        Code.CHUNK_BUSY,
        f"chunk {key}: commit of an update that is no longer staged (replaced by a newer stage)",
    )


def _os_error(e: OSError, what: str) -> FsError:
    if e.errno in (_errno.ENOSPC, _errno.EDQUOT):
        return _no_space(what)
    return FsError(Code.INTERNAL, f"{what}: {e}", errno=e.errno or _errno.EIO)


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
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fsync: bool = True,
        block_size: int = DEFAULT_BLOCK_SIZE,
        reserved_bytes: int = 0,
        direct_write: bool = False,
    ) -> None:
        if block_size <= 0 or block_size & (block_size - 1):
            raise invalid("block_size must be a power of two")
        self.root = Path(root)
        self.data_dir = self.root / "data"
        if fsync:
            # every new level fsync'd into its parent: a power cut must not drop the target
            makedirs_durably(self.data_dir)
        else:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self._data_prefix = str(self.data_dir) + os.sep
        self.fsync = fsync
        self.block_size = block_size
        self.reserved_bytes = reserved_bytes
        self.direct_write = direct_write and fsync and hasattr(os, "O_DIRECT")
        self.direct_writes = 0  # chunk versions written with O_DIRECT (tests, metrics)
        self._lock = threading.Lock()  # guards _metas, _pending, _db, counters
        self._metas: dict[ChunkKey, ChunkMeta] = {}
        self._pending: dict[ChunkKey, PendingUpdate] = {}
        self._nonce = secrets.token_hex(4)
        self._seq = 0
        self._used = 0
        self._cq = threading.Condition()  # group commit queue
        self._queue: builtins.list[_CommitReq] = []
        self._leading = False
        self._spares: builtins.list[str] = []  # pre-created empty data files, dir entry durable
        self._spare_lock = threading.Lock()  # one batch creation at a time
        self._spare_round = 0
        self._db = sqlite3.connect(
            str(self.root / "meta.db"), check_same_thread=False, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS chunks (inode INTEGER, idx INTEGER, commit_ver INTEGER,"
            " chain_ver INTEGER, length INTEGER, checksum INTEGER, block_crcs BLOB, file TEXT,"
            " PRIMARY KEY (inode, idx)) WITHOUT ROWID"
        )
        for row in self._db.execute(
            "SELECT inode, idx, commit_ver, chain_ver, length, checksum, block_crcs, file FROM chunks"
        ):
            key = ChunkKey(_u64(row[0]), row[1])
            self._metas[key] = ChunkMeta(
                key, row[2], row[3], row[4], row[5], bytes(row[6]), row[7], row[2]
            )
            self._used += row[4]
        self._cleanup_orphans()

    # -- helpers

    def _cleanup_orphans(self) -> None:
        """Delete data files no committed row names (left by a crash before commit)."""
        live = {m.file for m in self._metas.values() if m.file}
        for sub in self.data_dir.iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                rel = f"{sub.name}/{f.name}"
                if rel not in live:
                    f.unlink(missing_ok=True)

    def _new_file(self, key: ChunkKey) -> str:
        """A fresh, empty data file whose directory entry is already durable.

        Why a pool: a chunk version lives in a new file (copy-on-write), and a new
        file's directory entry must be on disk before the metadata row naming it
        commits. Creating spare files in batches of ``SPARE_BATCH`` and fsyncing
        their directory once per batch takes that directory fsync off the write
        path (one fsync per batch instead of one per write); the staged data
        itself is made durable by the ``fdatasync`` of the file (which also covers
        its size). Unused spares are ordinary orphans: deleted at start-up.
        """
        with self._lock:
            if self._spares:
                return self._spares.pop()
        with self._spare_lock:
            with self._lock:
                if self._spares:
                    return self._spares.pop()
            made = self._make_spares(SPARE_BATCH)
            with self._lock:
                rel = made.pop()
                self._spares.extend(made)
            return rel

    def _make_spares(self, count: int) -> builtins.list[str]:
        with self._lock:
            self._spare_round += 1
            sub = f"{(self._spare_round * 37) & 0xFF:02x}"
            first = self._seq + 1
            self._seq += count
        d = self.data_dir / sub
        made: builtins.list[str] = []
        try:
            if not d.is_dir():
                d.mkdir(exist_ok=True)
                if self.fsync:
                    fsync_dir(self.data_dir)
            for seq in range(first, first + count):
                rel = f"{sub}/{self._nonce}{seq:x}"
                os.close(os.open(self._path(rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                made.append(rel)
            if self.fsync:
                fsync_dir(d)
        except OSError as e:
            for rel in made:
                self._unlink(rel)
            raise _os_error(e, f"create data files in {d}") from None
        return made

    def spare_files(self) -> set[str]:
        """Names of the pre-created empty data files not yet handed out (tests, fsck)."""
        with self._lock:
            return set(self._spares)

    def _path(self, rel: str) -> str:
        return self._data_prefix + rel  # plain concatenation: this is on every read

    def _sync_file_and_dir(self, fd: int, rel: str) -> None:
        """Make the staged data durable (its directory entry already is: see :meth:`_new_file`)."""
        if self.fsync:
            os.fdatasync(fd)

    def check_room(self, growth: int) -> None:
        """Raise NO_SPACE if growing by ``growth`` bytes would eat into the reserve (a statvfs)."""
        self._check_room(growth)

    def _check_room(self, growth: int) -> None:
        if growth <= 0:
            return
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        if free - growth < self.reserved_bytes:
            raise _no_space(
                f"target {self.root}: {free} bytes free, need {growth} (+{self.reserved_bytes} reserved)"
            )

    def _read_file(self, rel: str, offset: int, length: int) -> bytes:
        if length <= 0 or not rel:
            return b""
        fd = os.open(self._path(rel), os.O_RDONLY)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def _copy_prefix(self, src_rel: str, dst_fd: int, length: int) -> None:
        """Copy the first ``length`` bytes of ``src_rel`` into ``dst_fd`` in the kernel."""
        if length <= 0 or not src_rel:
            return
        src = os.open(self._path(src_rel), os.O_RDONLY)
        try:
            off_in, off_out, left = 0, 0, length
            try:
                while left > 0:
                    n = os.copy_file_range(src, dst_fd, left, off_in, off_out)
                    if n == 0:
                        break
                    off_in += n
                    off_out += n
                    left -= n
            except OSError as e:
                if e.errno not in (_errno.EXDEV, _errno.ENOSYS, _errno.EOPNOTSUPP, _errno.EINVAL):
                    raise
                while left > 0:  # fallback: buffered copy
                    buf = os.pread(src, min(left, 1 << 20), off_in)
                    if not buf:
                        break
                    os.pwrite(dst_fd, buf, off_out)
                    off_in += len(buf)
                    off_out += len(buf)
                    left -= len(buf)
            if left > 0:
                raise FsError(
                    Code.INTERNAL, f"chunk file {src_rel} shorter than its committed length"
                )
        finally:
            os.close(src)

    def _set_pending(self, p: PendingUpdate) -> PendingUpdate:
        with self._lock:
            old = self._pending.pop(p.key, None)
            self._pending[p.key] = p
        if old is not None and old.owns_file and old.file and old.file != p.file:
            self._unlink(old.file)
        return p

    def _unlink(self, rel: str) -> None:
        try:
            os.unlink(self._path(rel))
        except FileNotFoundError:
            pass

    @staticmethod
    def _check_bounds(offset: int, length: int, chunk_size: int) -> None:
        if not 0 < chunk_size <= MAX_CHUNK_SIZE:
            raise invalid(f"chunk size {chunk_size} out of range (1..{MAX_CHUNK_SIZE})")
        if offset < 0 or length < 0 or offset + length > chunk_size:
            raise invalid(f"range [{offset}, {offset + length}) exceeds chunk size {chunk_size}")

    # -- ChunkEngine

    def get(self, key: ChunkKey) -> ChunkMeta | None:
        with self._lock:
            m = self._metas.get(key)
            p = self._pending.get(key)
        if m is None:
            return None
        return replace(m, update_ver=p.update_ver) if p is not None else m

    def pending(self, key: ChunkKey) -> PendingUpdate | None:
        with self._lock:
            return self._pending.get(key)

    def list(
        self, inode: int | None = None, begin: int = 0, end: int = _ALL_INDEXES
    ) -> list[ChunkMeta]:
        with self._lock:
            items = [
                m if (p := self._pending.get(k)) is None else replace(m, update_ver=p.update_ver)
                for k, m in self._metas.items()
                if inode is None or (k.inode == inode and begin <= k.index < end)
            ]
        items.sort(key=lambda m: m.key)
        return items

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
        bs = self.block_size
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
        rel = old.file if in_place and old else self._new_file(key)
        direct = self.direct_write and full and not in_place and _page_aligned(data) and length > 0
        try:
            try:
                fd = os.open(self._path(rel), os.O_WRONLY | (os.O_DIRECT if direct else 0))
            except OSError as e:
                if not direct or e.errno != _errno.EINVAL:
                    raise
                direct = False  # a file system without O_DIRECT (tmpfs)
                fd = os.open(self._path(rel), os.O_WRONLY)
        except OSError as e:
            raise _os_error(e, f"create chunk file for {key}") from None
        try:
            try:
                if not full and not in_place and old is not None:
                    self._copy_prefix(old.file, fd, old_len)
                if new_len == 0:
                    pass
                elif offset > old_len and not full:
                    os.ftruncate(fd, offset)  # zero-fill the gap (sparse)
                mv = memoryview(data)
                done = 0
                while done < length:
                    try:
                        done += os.pwrite(fd, mv[done:], offset + done)
                    except OSError as e:
                        if not direct or e.errno != _errno.EINVAL:
                            raise
                        # the file system refused this alignment: plain buffered write
                        direct = False
                        fcntl.fcntl(
                            fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT
                        )
                if direct:
                    self.direct_writes += 1
                if not in_place and os.fstat(fd).st_size < new_len:
                    os.ftruncate(fd, new_len)
                if sync:
                    self._sync_file_and_dir(fd, rel)
            except OSError as e:
                if not in_place:
                    self._unlink(rel)
                raise _os_error(e, f"write chunk {key}") from None
            except BaseException:
                if not in_place:
                    self._unlink(rel)
                raise
            # checksums of the new content
            if full:
                crc = crc32c(data) if checksum is None else checksum
                blocks = _block_crcs(data, bs)
            else:
                # Partial update: checksum the resulting content (a page-cache read of
                # at most one chunk; CRC32C runs at ~15 GB/s).
                content = self._read_file(rel, 0, new_len)
                if len(content) != new_len:
                    if not in_place:
                        self._unlink(rel)
                    raise FsError(Code.INTERNAL, f"chunk {key}: short read-back of staged content")
                crc = crc32c(content)
                blocks = _block_crcs(content, bs)
        finally:
            os.close(fd)
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
        try:
            fd = os.open(self._path(pending.file), os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise FsError(
                Code.INTERNAL, f"sync staged chunk {pending.key}: {e}", errno=e.errno or _errno.EIO
            ) from None
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
            # Growing: zero-fill — an "append" of zeros; reuse the write path.
            self._check_room(length - old_len)
            return self._stage_zero_extend(key, old, length, update_ver, chain_ver, chunk_size)
        # Shrinking (or same): the committed file is shared; only the length changes.
        rel = old.file if old else ""
        if length == 0:
            return self._set_pending(
                PendingUpdate(key, update_ver, chain_ver, False, 0, 0, b"", "", owns_file=False)
            )
        assert old is not None
        bs = self.block_size
        keep = length // bs
        blocks = list(_unpack_crcs(old.block_crcs)[:keep])
        head = self._read_file(rel, 0, length)
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
                _pack_crcs(blocks),
                rel,
                False,
            )
        )

    def _stage_zero_extend(
        self,
        key: ChunkKey,
        old: ChunkMeta | None,
        length: int,
        update_ver: int,
        chain_ver: int,
        chunk_size: int,
    ) -> PendingUpdate:
        old_len = old.length if old else 0
        rel = self._new_file(key)
        try:
            fd = os.open(self._path(rel), os.O_WRONLY)
        except OSError as e:
            raise _os_error(e, f"create chunk file for {key}") from None
        try:
            try:
                if old is not None:
                    self._copy_prefix(old.file, fd, old_len)
                os.ftruncate(fd, length)
                if self.fsync:
                    try:
                        os.posix_fallocate(fd, 0, length)  # really reserve the space now
                    except OSError as e:
                        if e.errno in (_errno.ENOSPC, _errno.EDQUOT):
                            raise
                self._sync_file_and_dir(fd, rel)
            except OSError as e:
                self._unlink(rel)
                raise _os_error(e, f"extend chunk {key}") from None
        finally:
            os.close(fd)
        content = self._read_file(rel, 0, length)
        p = PendingUpdate(
            key,
            update_ver,
            chain_ver,
            False,
            length,
            crc32c(content),
            _block_crcs(content, self.block_size),
            rel,
            True,
        )
        return self._set_pending(p)

    def stage_remove(self, key: ChunkKey, *, update_ver: int, chain_ver: int) -> PendingUpdate:
        self.abort(key)
        return self._set_pending(PendingUpdate(key, update_ver, chain_ver, True))

    def commit(self, pending: PendingUpdate, chain_ver: int | None = None) -> ChunkMeta | None:
        """Publish ``pending`` (group commit: concurrent commits share one SQLite transaction).

        The first caller that finds no batch in progress becomes the leader: it
        takes every queued commit, fsyncs the directories of their new files once,
        and writes all rows in one transaction (one WAL fsync). The others wait
        for their result. A failing batch is retried one commit at a time so one
        bad commit (e.g. NO_SPACE) fails alone.
        """
        cv = pending.chain_ver if chain_ver is None else chain_ver
        if self.is_published_cheaply(pending, cv):
            return self._publish_prepared(pending, cv)
        if not pending.synced:
            self.sync_pending(pending)  # the data is durable before the row naming it commits
        return self._group_commit(_CommitReq(pending, cv))

    def prepare(self, pending: PendingUpdate, chain_ver: int | None = None) -> None:
        cv = pending.chain_ver if chain_ver is None else chain_ver
        if self.is_published_cheaply(pending, cv):
            return
        if not pending.synced:
            self.sync_pending(pending)  # the data is durable before the row naming it is
        self._group_commit(_CommitReq(pending, cv, publish=False))

    def is_published_cheaply(self, pending: PendingUpdate, chain_ver: int) -> bool:
        """True if :meth:`commit` of ``pending`` needs no disk I/O but unlinking an old file."""
        return pending.prepared and pending.prepared_chain_ver == chain_ver

    def publish_prepared(
        self, pending: PendingUpdate, chain_ver: int
    ) -> tuple[ChunkMeta | None, builtins.list[str]]:
        """Commit a prepared ``pending`` in memory only; returns (new meta, superseded files).

        No disk I/O at all, so the event loop may call it: the caller deletes the
        returned files later with :meth:`drop_files` (freeing a file's blocks costs
        about as much as writing them; an orphan left by a crash meanwhile is
        swept at start-up).
        """
        if not self.is_published_cheaply(pending, chain_ver):
            raise FsError(Code.INTERNAL, f"chunk {pending.key}: publish of an unprepared update")
        req = _CommitReq(pending, chain_ver)
        unlink: builtins.list[str] = []
        with self._lock:
            if self._pending.get(pending.key) is not pending:
                raise _superseded(pending.key)
            self._publish(req, unlink)
        return req.meta, unlink

    def drop_files(self, files: Iterable[str]) -> None:
        """Delete superseded data files (see :meth:`publish_prepared`); missing ones are fine."""
        for f in files:
            with contextlib.suppress(OSError):
                self._unlink(f)

    def _publish_prepared(self, pending: PendingUpdate, chain_ver: int) -> ChunkMeta | None:
        meta, unlink = self.publish_prepared(pending, chain_ver)
        for f in unlink:
            self._unlink(f)
        return meta

    def _group_commit(self, req: _CommitReq) -> ChunkMeta | None:
        with self._cq:
            self._queue.append(req)
            while not req.done and self._leading:
                self._cq.wait()
            if req.done:
                return req.result()
            self._leading = True
            batch, self._queue = self._queue, []
        try:
            self._commit_batch(batch)
        finally:
            with self._cq:
                self._leading = False
                self._cq.notify_all()
        return req.result()

    def _commit_batch(self, batch: builtins.list[_CommitReq]) -> None:
        try:
            # New files come from the spare pool, whose directory entries are
            # already durable: only the WAL fsync of this one transaction remains.
            self._commit_rows(batch)
        except BaseException as exc:
            if len(batch) > 1 and isinstance(exc, FsError):
                for r in batch:  # isolate the failing commit
                    try:
                        self._commit_rows([r])
                    except FsError as e:
                        r.error = e
                    r.done = True
            else:
                for r in batch:
                    r.error = (
                        exc
                        if isinstance(exc, FsError)
                        else FsError(Code.INTERNAL, f"commit: {exc}")
                    )
                    r.done = True
            return
        finally:
            for r in batch:
                r.done = True

    def _commit_rows(self, batch: builtins.list[_CommitReq]) -> None:
        """Write the rows of ``batch`` in one transaction, then update memory and drop old files.

        Requests with ``publish=False`` (:meth:`prepare`) only get their row made durable.
        """
        unlink: builtins.list[str] = []
        with self._lock:
            for r in batch:
                if self._pending.get(r.pending.key) is not r.pending:
                    raise _superseded(r.pending.key)
            try:
                self._db.execute("BEGIN")
                for r in batch:
                    p, key = r.pending, r.pending.key
                    if p.remove:
                        self._db.execute(
                            "DELETE FROM chunks WHERE inode=? AND idx=?",
                            (_i64(key.inode), key.index),
                        )
                    else:
                        self._db.execute(
                            "INSERT OR REPLACE INTO chunks VALUES (?,?,?,?,?,?,?,?)",
                            (
                                _i64(key.inode),
                                key.index,
                                p.update_ver,
                                r.chain_ver,
                                p.length,
                                p.checksum,
                                p.block_crcs,
                                p.file,
                            ),
                        )
                self._db.execute("COMMIT")
            except sqlite3.Error as e:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                if "full" in str(e).lower() or "disk" in str(e).lower():
                    raise _no_space(f"commit: {e}") from None
                raise FsError(Code.INTERNAL, f"commit: {e}") from None
            for r in batch:
                if r.publish:
                    self._publish(r, unlink)
                else:
                    r.pending.prepared, r.pending.prepared_chain_ver = True, r.chain_ver
        for f in unlink:
            self._unlink(f)  # open readers keep their descriptor; an orphan is swept at start

    def _publish(self, r: _CommitReq, unlink: builtins.list[str]) -> None:
        """Make ``r``'s update the committed version in memory (its row is durable). Holds _lock."""
        p, key = r.pending, r.pending.key
        del self._pending[key]
        old = self._metas.get(key)
        new: ChunkMeta | None = None
        if p.remove:
            self._metas.pop(key, None)
        else:
            new = ChunkMeta(
                key,
                p.update_ver,
                r.chain_ver,
                p.length,
                p.checksum,
                p.block_crcs,
                p.file,
                p.update_ver,
            )
            self._metas[key] = new
        self._used += (new.length if new else 0) - (old.length if old else 0)
        r.meta = new
        if old is not None and old.file and (new is None or new.file != old.file):
            unlink.append(old.file)

    def _restore_row(self, key: ChunkKey) -> None:
        """Durably put back the committed row of ``key`` (undo a :meth:`prepare`). Holds _lock."""
        old = self._metas.get(key)
        try:
            if old is None:
                self._db.execute(
                    "DELETE FROM chunks WHERE inode=? AND idx=?", (_i64(key.inode), key.index)
                )
            else:
                self._db.execute(
                    "INSERT OR REPLACE INTO chunks VALUES (?,?,?,?,?,?,?,?)",
                    (
                        _i64(key.inode),
                        key.index,
                        old.commit_ver,
                        old.chain_ver,
                        old.length,
                        old.checksum,
                        old.block_crcs,
                        old.file,
                    ),
                )
        except sqlite3.Error as e:
            raise FsError(Code.INTERNAL, f"abort of chunk {key}: {e}") from None

    def abort(self, key: ChunkKey) -> None:
        with self._lock:
            p = self._pending.pop(key, None)
            if p is not None and p.prepared:
                self._restore_row(key)  # before its file goes: the row must never name a lost file
        if p is not None and p.owns_file and p.file:
            self._unlink(p.file)

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
        bs = self.block_size
        start = offset // bs * bs
        stop = min(meta.length, -(-end // bs) * bs)
        try:
            fd = os.open(self._path(meta.file), os.O_RDONLY)
        except FileNotFoundError:
            # Superseded between get() and open(): read the newer version.
            return self.read(key, offset, length) if self.get(key) != meta else self._missing(meta)
        except OSError as e:
            raise _os_error(e, f"open chunk {key}") from None
        try:
            buf = (
                _pread_nowait(fd, stop - start, start)
                if nowait
                else os.pread(fd, stop - start, start)
            )
        except BlockingIOError:
            raise
        except OSError as e:
            raise _os_error(e, f"read chunk {key}") from None
        finally:
            os.close(fd)
        if len(buf) != stop - start:
            raise FsError(
                Code.CHECKSUM_MISMATCH, f"chunk {key}: data file truncated", retryable=False
            )
        blocks = _unpack_crcs(meta.block_crcs)
        mv = memoryview(buf)
        for i in range(start // bs, -(-stop // bs)):
            lo = i * bs - start
            got = crc32c(mv[lo : lo + bs])
            if i >= len(blocks) or got != blocks[i]:
                raise FsError(
                    Code.CHECKSUM_MISMATCH,
                    f"chunk {key}: checksum mismatch in block {i}",
                    retryable=False,
                )
        if start == offset and stop == end:
            return meta, buf
        return meta, bytes(mv[offset - start : end - start])

    def read_into(
        self, key: ChunkKey, offset: int, length: int, dest: memoryview, *, nowait: bool = False
    ) -> tuple[ChunkMeta, int] | None:
        """Read committed bytes [offset, offset+length) straight into ``dest``, verified in place.

        ``nowait``: as for :meth:`read` (``BlockingIOError`` if not all cached).

        The zero-copy read path (shm destinations, i.e. USRBIO): ``preadv`` lands
        the file pages directly in the client's region and the block CRCs are
        checked on that memory, so no Python-level copy of the payload is made.
        Only ranges that start on a checksum block boundary and end on one (or at
        the chunk's end) qualify — otherwise verifying would need bytes outside
        ``dest``; then it returns None and the caller uses :meth:`read`.
        On CHECKSUM_MISMATCH ``dest`` may hold unverified bytes (the caller
        reports an error, so the client never uses them).
        """
        if offset < 0 or length < 0 or len(dest) < length:
            raise invalid("bad read range or destination too small")
        meta = self.get(key)
        if meta is None:
            raise FsError(Code.CHUNK_NOT_FOUND, f"chunk {key} not found")
        end = min(meta.length, offset + length)
        if end <= offset:
            return meta, 0
        bs = self.block_size
        if offset % bs or (end % bs and end != meta.length):
            return None
        try:
            fd = os.open(self._path(meta.file), os.O_RDONLY)
        except FileNotFoundError:
            return (
                self.read_into(key, offset, length, dest)
                if self.get(key) != meta
                else self._missing(meta)
            )
        except OSError as e:
            raise _os_error(e, f"open chunk {key}") from None
        n = end - offset
        view = dest[:n]
        try:
            done = 0
            while done < n:
                if nowait:
                    k = _preadv_nowait(fd, view[done:], offset + done)
                else:
                    k = os.preadv(fd, [view[done:]], offset + done)
                if k == 0:
                    break
                done += k
        except BlockingIOError:
            raise
        except OSError as e:
            raise _os_error(e, f"read chunk {key}") from None
        finally:
            os.close(fd)
        if done != n:
            raise FsError(
                Code.CHECKSUM_MISMATCH, f"chunk {key}: data file truncated", retryable=False
            )
        blocks = _unpack_crcs(meta.block_crcs)
        first = offset // bs
        for i in range(first, -(-end // bs)):
            lo = (i - first) * bs
            if i >= len(blocks) or crc32c(view[lo : lo + bs]) != blocks[i]:
                raise FsError(
                    Code.CHECKSUM_MISMATCH,
                    f"chunk {key}: checksum mismatch in block {i}",
                    retryable=False,
                )
        return meta, n

    @staticmethod
    def _missing(meta: ChunkMeta) -> NoReturn:
        raise FsError(
            Code.CHECKSUM_MISMATCH, f"chunk {meta.key}: data file missing", retryable=False
        )

    def read_pending_full(self, key: ChunkKey) -> bytes:
        p = self.pending(key)
        if p is None or p.remove:
            raise FsError(Code.INTERNAL, f"chunk {key}: no staged content")
        data = self._read_file(p.file, 0, p.length)
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
        st = os.statvfs(self.root)
        with self._lock:
            used, count = self._used, len(self._metas)
        return SpaceStats(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, used, count)

    def close(self) -> None:
        with self._lock:
            pend = list(self._pending)
        for k in pend:
            self.abort(k)
        with self._lock:
            spares, self._spares = self._spares, []
        for rel in spares:
            self._unlink(rel)
        self._db.close()


@dataclass
class _CommitReq:
    pending: PendingUpdate
    chain_ver: int
    publish: bool = True  # False: only make the row durable (prepare)
    done: bool = False
    meta: ChunkMeta | None = None
    error: BaseException | None = None

    def result(self) -> ChunkMeta | None:
        if self.error is not None:
            raise self.error
        return self.meta


_DIRECT_ALIGN = 4096


def _page_aligned(data: bytes | bytearray | memoryview) -> bool:
    """True if ``data`` starts on a page and is a whole number of pages (O_DIRECT rules)."""
    if len(data) % _DIRECT_ALIGN:
        return False
    try:
        addr, _n = buffer_address(data)
    except FsError:
        return False
    return addr % _DIRECT_ALIGN == 0


def _i64(v: int) -> int:
    """SQLite integers are signed 64-bit; store u64 inode ids two's-complement."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _u64(v: int) -> int:
    return v + (1 << 64) if v < 0 else v


__all__ = [
    "ChunkEngine",
    "ChunkKey",
    "ChunkMeta",
    "FileChunkEngine",
    "PendingUpdate",
    "SpaceStats",
    "crc32c",
]
