"""Chunk data-file store: spare pool, copy-on-write staging, O_DIRECT writes, verified reads.

The data half of the chunk engine (:mod:`fs3.storage.chunk_engine` composes it
with the metadata store of :mod:`fs3.storage.chunk_meta`). One file per chunk
version under ``<root>/data/XX/``; which file is a chunk's committed version
is decided by the metadata store, never here.

**Which methods may run on the event loop.** :meth:`path` and
:meth:`spare_files` (memory only), and :meth:`read`/:meth:`read_into` of small
ranges (a page-cache ``pread``; the storage operator inlines reads up to
``operator.INLINE_READ_MAX``). Everything else may block on the disk
(``fsync``, file creation, large copies) and runs in the node's I/O threads.
The only lock here, ``_lock``, guards the spare list and the file counter and
is never held across disk I/O; ``_spare_lock`` (one batch of spare files
created at a time) is taken by I/O threads only.

Errors: an ``OSError`` becomes an FsError by its errno (:func:`os_error`):
ENOSPC/EDQUOT are NO_SPACE, everything else INTERNAL with the errno kept
(EIO/EROFS take the target offline, see ``Replicator.note_disk_error``).
"""

from __future__ import annotations

import builtins
import ctypes
import errno as _errno
import fcntl
import os
import secrets
import struct
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import crc32c as _crc32c

from fs3.durable import fsync_dir, makedirs_durably
from fs3.errors import Code, FsError
from fs3.storage.chunk_meta import no_space
from fs3.transport.region import buffer_address

SPARE_BATCH = 32  # empty data files created (and their directory fsync'd) at a time
_DIRECT_ALIGN = 4096
# Reads at least this large into page-aligned memory that the page cache does not
# hold go to the disk with O_DIRECT (see ChunkDataStore.read_verified_into).
DIRECT_READ_MIN = 256 << 10
# Read descriptors of committed data files kept open per target (see ReadFds), at most.
READ_FDS = 256


def read_fds_per_target(targets: int) -> int:
    """How many read descriptors each of ``targets`` targets may keep open.

    One budget per process, not per target: kept descriptors may use at most a
    quarter of the soft ``RLIMIT_NOFILE``, so a node with many targets under a
    small limit (1,024 is common) still has descriptors for its sockets, SQLite
    and staging files. At most :data:`READ_FDS` per target either way.
    """
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return READ_FDS
    return max(0, min(READ_FDS, soft // 4 // max(1, targets)))


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, C-accelerated."""
    return int(_crc32c.crc32c(data, value))


def pack_crcs(crcs: Iterable[int]) -> bytes:
    lst = list(crcs)
    return struct.pack(f"<{len(lst)}I", *lst)


def unpack_crcs(blob: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(blob) // 4}I", blob)


def block_crcs(data: bytes | bytearray | memoryview, block: int) -> bytes:
    mv = memoryview(data)
    return pack_crcs(crc32c(mv[i : i + block]) for i in range(0, len(mv), block))


def os_error(e: OSError, what: str) -> FsError:
    """The FsError for a failed system call, by errno."""
    if e.errno in (_errno.ENOSPC, _errno.EDQUOT):
        return no_space(what)
    return FsError(Code.INTERNAL, f"{what}: {e}", errno=e.errno or _errno.EIO)


def page_aligned(data: bytes | bytearray | memoryview) -> bool:
    """True if ``data`` starts on a page and is a whole number of pages (O_DIRECT rules)."""
    if len(data) % _DIRECT_ALIGN:
        return False
    try:
        addr, _n = buffer_address(data)
    except FsError:
        return False
    return addr % _DIRECT_ALIGN == 0


def checksum_mismatch(what: str) -> FsError:
    return FsError(Code.CHECKSUM_MISMATCH, what, retryable=False)


class _Fd:
    """An open read-only descriptor of one data file and its users."""

    __slots__ = ("fd", "refs", "cached")

    def __init__(self, fd: int, cached: bool) -> None:
        self.fd = fd
        self.refs = 1
        self.cached = cached  # False: closed by its last release


class ReadFds:
    """Read-only descriptors of committed data files, kept open between reads (LRU, bounded).

    Why: a 4 KiB read cost an ``open`` and a ``close`` of its chunk file besides the
    ``preadv`` (two of three syscalls, on the storage node's event loop for page-cache
    hits). Keyed by the file's name, which is safe because a data file's name is never
    reused while the process lives (a nonce per process and a counter, see
    :meth:`ChunkDataStore._make_spares`) and the bytes a committed version's readers
    see are never rewritten in place (copy-on-write; an append writes past the
    committed length only).

    Invalidation: :meth:`ChunkDataStore.unlink` (superseded versions, aborted staging,
    removed chunks, spares) calls :meth:`forget` after the unlink, so the file's blocks
    are freed once its in-flight reads finish. A descriptor is closed only when no
    read holds it (``refs``), so a concurrent read never sees its number reused for
    another file. An ``open`` that raced with a :meth:`forget` (the generation moved
    meanwhile) is used once and not kept: it may name a file just unlinked.
    """

    def __init__(self, prefix: str, capacity: int = READ_FDS) -> None:
        self._prefix = prefix
        self.capacity = capacity
        self._lock = threading.Lock()  # no syscall but close() under it
        self._fds: OrderedDict[str, _Fd] = OrderedDict()
        self._gen = 0  # bumped by every forget()
        self._closed = False  # after close(): descriptors are used once, never kept
        self.opens = 0  # files opened (tests, metrics): a hit costs none

    def __len__(self) -> int:
        return len(self._fds)

    def acquire(self, rel: str) -> _Fd | None:
        """The open descriptor of ``rel`` (give it back with :meth:`release`); None if gone."""
        with self._lock:
            e = self._fds.get(rel)
            if e is not None:
                e.refs += 1
                self._fds.move_to_end(rel)
                return e
            gen = self._gen
        try:
            fd = os.open(self._prefix + rel, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno not in (_errno.EMFILE, _errno.ENFILE):
                raise
            self.clear()  # out of descriptors: give back the idle ones, then once more
            try:
                fd = os.open(self._prefix + rel, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
        idle: builtins.list[int] = []
        with self._lock:
            self.opens += 1
            e = self._fds.get(rel)
            if e is not None:  # another reader opened it meanwhile: use that one
                e.refs += 1
                idle.append(fd)
            elif gen != self._gen or self.capacity <= 0 or self._closed:
                e = _Fd(fd, cached=False)
            else:
                e = self._fds[rel] = _Fd(fd, cached=True)
                while len(self._fds) > self.capacity:
                    _, old = self._fds.popitem(last=False)
                    old.cached = False
                    if old.refs == 0:
                        idle.append(old.fd)
        for x in idle:
            os.close(x)
        return e

    def release(self, e: _Fd) -> None:
        with self._lock:
            e.refs -= 1
            close = e.refs == 0 and not e.cached
        if close:
            os.close(e.fd)

    def forget(self, rel: str) -> None:
        """``rel`` was unlinked: close its descriptor once no read holds it."""
        with self._lock:
            self._gen += 1
            e = self._fds.pop(rel, None)
            if e is None:
                return
            e.cached = False
            close = e.refs == 0
        if close:
            os.close(e.fd)

    def close(self) -> None:
        """Close the kept descriptors and keep none from now on (a read still in
        flight when the engine shuts down gets a descriptor of its own)."""
        with self._lock:
            self._closed = True
        self.clear()

    def clear(self) -> None:
        """Close every descriptor no read holds; the held ones close on release."""
        with self._lock:
            self._gen += 1
            entries, self._fds = list(self._fds.values()), OrderedDict()
            idle = []
            for e in entries:
                e.cached = False
                if e.refs == 0:
                    idle.append(e.fd)
        for fd in idle:
            os.close(fd)


class ChunkDataStore:
    """The data files of one target.

    Args:
        data_dir: ``<target>/data`` (created, durably when ``fsync``).
        fsync: make staged data durable (``fdatasync``) and new directories' entries.
        block_size: checksum block size (reads verify whole blocks).
        reserved_bytes: refuse growth when the disk would drop below this many free bytes.
        direct_write: write whole new chunk versions with ``O_DIRECT`` when the payload is
            page aligned (with ``fsync`` only): the kernel then DMAs from the payload (e.g. the
            client's shared memory) instead of copying it into the page cache.
        read_fds: read descriptors kept open between reads (:class:`ReadFds`; 0 = none).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: bool,
        block_size: int,
        reserved_bytes: int = 0,
        direct_write: bool = False,
        read_fds: int = READ_FDS,
    ) -> None:
        self.dir = data_dir
        if fsync:
            # every new level fsync'd into its parent: a power cut must not drop the target
            makedirs_durably(self.dir)
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
        self._prefix = str(self.dir) + os.sep
        self.read_fds = ReadFds(self._prefix, read_fds)
        self.fsync = fsync
        self.block_size = block_size
        self.reserved_bytes = reserved_bytes
        self.direct_write = direct_write and fsync and hasattr(os, "O_DIRECT")
        self.direct_writes = 0  # chunk versions written with O_DIRECT (tests, metrics)
        self.direct_reads = 0  # reads served from the disk with O_DIRECT (tests, metrics)
        self._lock = threading.Lock()  # guards _spares, _seq, _spare_round (no I/O under it)
        self._nonce = secrets.token_hex(4)
        self._seq = 0
        self._spares: builtins.list[str] = []  # pre-created empty data files, dir entry durable
        self._spare_lock = threading.Lock()  # one batch creation at a time (I/O threads)
        self._spare_round = 0

    # -- files

    def path(self, rel: str) -> str:
        return self._prefix + rel  # plain concatenation: this is on every read

    def sweep_orphans(self, live: set[str]) -> None:
        """Delete data files not in ``live`` (left by a crash before their row committed)."""
        for sub in self.dir.iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if f"{sub.name}/{f.name}" not in live:
                    f.unlink(missing_ok=True)

    def new_file(self) -> str:
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
        d = self.dir / sub
        made: builtins.list[str] = []
        try:
            if not d.is_dir():
                d.mkdir(exist_ok=True)
                if self.fsync:
                    fsync_dir(self.dir)
            for seq in range(first, first + count):
                rel = f"{sub}/{self._nonce}{seq:x}"
                os.close(os.open(self.path(rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                made.append(rel)
            if self.fsync:
                fsync_dir(d)
        except OSError as e:
            for rel in made:
                self.unlink(rel)
            raise os_error(e, f"create data files in {d}") from None
        return made

    def spare_files(self) -> set[str]:
        """Names of the pre-created empty data files not yet handed out (tests, fsck)."""
        with self._lock:
            return set(self._spares)

    def drop_spares(self) -> None:
        with self._lock:
            spares, self._spares = self._spares, []
        for rel in spares:
            self.unlink(rel)

    def unlink(self, rel: str) -> None:
        try:
            os.unlink(self.path(rel))
        except FileNotFoundError:
            pass
        self.read_fds.forget(rel)  # after the unlink: see ReadFds

    def close(self) -> None:
        """Close the kept read descriptors (the engine is shutting down)."""
        self.read_fds.close()

    def check_room(self, growth: int) -> None:
        """Raise NO_SPACE if growing by ``growth`` bytes would eat into the reserve (a statvfs)."""
        if growth <= 0:
            return
        st = os.statvfs(self.dir)
        free = st.f_bavail * st.f_frsize
        if free - growth < self.reserved_bytes:
            raise no_space(
                f"target {self.dir.parent}: {free} bytes free, need {growth} "
                f"(+{self.reserved_bytes} reserved)"
            )

    def capacity(self) -> tuple[int, int]:
        """(capacity, free) bytes of the disk holding the data files."""
        st = os.statvfs(self.dir)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    # -- staging (I/O threads)

    def _open_for_write(self, rel: str, what: str, direct: bool) -> tuple[int, bool]:
        """Open a data file for writing: (fd, whether O_DIRECT took)."""
        try:
            try:
                return os.open(self.path(rel), os.O_WRONLY | (os.O_DIRECT if direct else 0)), direct
            except OSError as e:
                if not direct or e.errno != _errno.EINVAL:
                    raise
                # a file system without O_DIRECT (tmpfs)
                return os.open(self.path(rel), os.O_WRONLY), False
        except OSError as e:
            raise os_error(e, f"create chunk file for {what}") from None

    def write_version(
        self,
        rel: str,
        what: str,
        data: bytes | bytearray | memoryview,
        offset: int,
        *,
        copy_from: str = "",
        copy_len: int = 0,
        new_len: int,
        sparse_to: int = 0,
        direct: bool = False,
        sync: bool = True,
        fresh: bool = True,
    ) -> None:
        """Write a chunk version into ``rel``: the old version's first ``copy_len`` bytes
        (copy-on-write, in the kernel), a zero gap up to ``sparse_to``, ``data`` at
        ``offset``, then size the file to ``new_len`` and (``sync``) fdatasync it.

        ``direct``: try ``O_DIRECT`` (falls back to buffered where the file system or the
        alignment refuses it). ``fresh``: ``rel`` is a new file, deleted on failure.
        """
        length = len(data)
        fd, direct = self._open_for_write(rel, what, direct)
        try:
            try:
                if copy_len:
                    self.copy_prefix(copy_from, fd, copy_len)
                if sparse_to:
                    os.ftruncate(fd, sparse_to)  # zero-fill the gap (sparse)
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
                if fresh and os.fstat(fd).st_size < new_len:
                    os.ftruncate(fd, new_len)
                if sync and self.fsync:
                    os.fdatasync(fd)
            except OSError as e:
                if fresh:
                    self.unlink(rel)
                raise os_error(e, f"write chunk {what}") from None
            except BaseException:
                if fresh:
                    self.unlink(rel)
                raise
        finally:
            os.close(fd)

    def extend_version(
        self, rel: str, what: str, copy_from: str, copy_len: int, length: int
    ) -> None:
        """Write into the new file ``rel`` the old version's first ``copy_len`` bytes,
        zero-filled (and, with fsync, really allocated) to ``length``; fdatasync it."""
        fd, _ = self._open_for_write(rel, what, False)
        try:
            try:
                if copy_len:
                    self.copy_prefix(copy_from, fd, copy_len)
                os.ftruncate(fd, length)
                if self.fsync:
                    try:
                        os.posix_fallocate(fd, 0, length)  # really reserve the space now
                    except OSError as e:
                        if e.errno in (_errno.ENOSPC, _errno.EDQUOT):
                            raise
                    os.fdatasync(fd)
            except OSError as e:
                self.unlink(rel)
                raise os_error(e, f"extend chunk {what}") from None
        finally:
            os.close(fd)

    def sync(self, rel: str, what: str) -> None:
        """fdatasync the data file ``rel``.

        After a failed fsync the page cache state is unknown, so the error keeps its
        errno (EIO takes the target out of service).
        """
        if not self.fsync or not rel:
            return
        try:
            fd = os.open(self.path(rel), os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise FsError(
                Code.INTERNAL, f"sync staged chunk {what}: {e}", errno=e.errno or _errno.EIO
            ) from None

    def copy_prefix(self, src_rel: str, dst_fd: int, length: int) -> None:
        """Copy the first ``length`` bytes of ``src_rel`` into ``dst_fd`` in the kernel."""
        if length <= 0 or not src_rel:
            return
        src = os.open(self.path(src_rel), os.O_RDONLY)
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

    # -- reads (small ones may run on the event loop)

    def read_file(self, rel: str, offset: int, length: int) -> bytes:
        """Raw bytes of a data file (no verification: staging and checksumming use it)."""
        if length <= 0 or not rel:
            return b""
        fd = os.open(self.path(rel), os.O_RDONLY)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def _open_committed(self, rel: str, what: str) -> int | None:
        """Open a committed version's file for reading; None if it is gone (superseded)."""
        try:
            return os.open(self.path(rel), os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise os_error(e, f"open chunk {what}") from None

    def _hold(self, rel: str, what: str) -> _Fd | None:
        """The kept read descriptor of a committed version's file (:class:`ReadFds`;
        give it back with ``read_fds.release``); None if it is gone (superseded)."""
        try:
            return self.read_fds.acquire(rel)
        except OSError as e:
            raise os_error(e, f"open chunk {what}") from None

    def read_verified(
        self,
        rel: str,
        what: str,
        crcs: bytes,
        length: int,
        offset: int,
        end: int,
        *,
        nowait: bool = False,
    ) -> bytes | None:
        """Bytes [offset, end) of a committed version of ``length`` bytes, every covering
        checksum block verified against ``crcs``; None if the file is gone (superseded).

        ``nowait``: only from the page cache (``RWF_NOWAIT``), else ``BlockingIOError``
        (an event-loop caller then reads in a thread instead of stalling).
        """
        bs = self.block_size
        start = offset // bs * bs
        stop = min(length, -(-end // bs) * bs)
        if stop - start > _SCRATCH_MAX and not nowait:
            # large: one bytes object straight from the kernel (no scratch, no extra copy)
            held = self._hold(rel, what)
            if held is None:
                return None
            try:
                buf = os.pread(held.fd, stop - start, start)
            except OSError as e:
                raise os_error(e, f"read chunk {what}") from None
            finally:
                self.read_fds.release(held)
            if len(buf) != stop - start:
                raise checksum_mismatch(f"chunk {what}: data file truncated")
            _verify(memoryview(buf), crcs, start // bs, bs, what)
            return buf if start == offset and stop == end else buf[offset - start : end - start]
        with _blocks_buffer(stop - start) as blocks:
            if not self._read_blocks(rel, what, start, blocks, nowait):
                return None
            _verify(blocks, crcs, start // bs, bs, what)
            return bytes(blocks[offset - start : end - start])

    def read_verified_into(
        self,
        rel: str,
        what: str,
        crcs: bytes,
        length: int,
        offset: int,
        end: int,
        dest: memoryview,
        *,
        nowait: bool = False,
    ) -> int | None:
        """Bytes [offset, end) of a committed version of ``length`` bytes into ``dest``,
        verified; the byte count, or None if the file is gone (superseded).

        A range on checksum-block boundaries (or ending at the chunk's end) is
        ``preadv``'d straight into ``dest`` and verified there; any other range
        reads its covering blocks into this thread's scratch buffer, verifies them
        and copies the range out (a 4 KiB read of a 64 KiB block: no allocation).
        ``nowait``: as for :meth:`read_verified`. On CHECKSUM_MISMATCH ``dest``
        may hold unverified bytes (the caller reports the error instead).
        """
        bs = self.block_size
        n = end - offset
        if offset % bs == 0 and (end % bs == 0 or end == length):
            view = dest[:n]
            direct = (
                self.direct_write
                and not nowait
                and n >= DIRECT_READ_MIN
                and offset % _DIRECT_ALIGN == 0
                and page_aligned(view)
            )
            if not self._read_blocks(rel, what, offset, view, nowait, direct=direct):
                return None
            _verify(view, crcs, offset // bs, bs, what)
            return n
        start = offset // bs * bs
        stop = min(length, -(-end // bs) * bs)
        with _blocks_buffer(stop - start) as blocks:
            if not self._read_blocks(rel, what, start, blocks, nowait):
                return None
            _verify(blocks, crcs, start // bs, bs, what)
            dest[:n] = blocks[offset - start : end - start]
        return n

    def _read_blocks(
        self,
        rel: str,
        what: str,
        offset: int,
        view: memoryview,
        nowait: bool,
        *,
        direct: bool = False,
    ) -> bool:
        """Fill ``view`` from the committed file at ``offset``; False if the file is gone.

        A short file is CHECKSUM_MISMATCH (truncated); ``nowait`` raises
        ``BlockingIOError`` unless every byte is in the page cache.

        ``direct`` (a large read into page-aligned memory, offset on a page):
        the page cache is asked first (``RWF_NOWAIT``: a cached chunk costs one
        copy, as before); a miss reads the disk with ``O_DIRECT``, so the disk
        DMAs into ``view`` (a client's registered memory) instead of the kernel
        filling page-cache pages and copying them out, which cost the storage
        servers about a CPU-second per GiB of cold chunks (benchmarks/ckpt.py).
        The kernel writes back dirty cached pages of the range first, so the
        bytes are the same. Falls back to a buffered read where the file
        system refuses ``O_DIRECT`` (tmpfs) or the alignment.
        """
        held: _Fd | None = None
        if direct:
            # its own open file: O_DIRECT is a flag of the open file, which the kept
            # descriptor's other readers share
            fd = self._open_committed(rel, what)
            if fd is None:
                return False
        else:
            held = self._hold(rel, what)
            if held is None:
                return False
            fd = held.fd
        try:
            done = 0
            went_direct = False  # counted: the disk was read with O_DIRECT
            if direct:
                cached = _all_cached(fd, offset, len(view))
                if cached is None:  # no cachestat: ask by reading (a miss starts readahead)
                    try:
                        done = _preadv_nowait(fd, view, offset)
                    except BlockingIOError:
                        direct = went_direct = _set_direct(fd, True)
                    else:
                        direct = False  # the page cache had it all (or the rest: buffered)
                elif cached:
                    direct = False
                else:
                    direct = went_direct = _set_direct(fd, True)
            while done < len(view):
                if nowait:
                    k = _preadv_nowait(fd, view[done:], offset + done)
                else:
                    try:
                        k = os.preadv(fd, [view[done:]], offset + done)
                    except OSError as e:
                        if not direct or e.errno != _errno.EINVAL:
                            raise
                        direct = went_direct = _set_direct(fd, False)  # refused: buffered
                        continue
                if k == 0:
                    break
                done += k
                if direct and done % _DIRECT_ALIGN:  # a short direct read (the end of
                    direct = _set_direct(fd, False)  # the file): the rest buffered
        except BlockingIOError:
            raise
        except OSError as e:
            raise os_error(e, f"read chunk {what}") from None
        finally:
            if held is None:
                os.close(fd)
            else:
                self.read_fds.release(held)
        if done != len(view):
            raise checksum_mismatch(f"chunk {what}: data file truncated")
        if went_direct:
            self.direct_reads += 1
        return True


# Covering blocks of a read up to this size go through a per-thread scratch buffer
# (the event loop's and each I/O thread's): small reads allocate nothing per read.
_SCRATCH_MAX = 256 << 10
_scratch = threading.local()


class _blocks_buffer:  # noqa: N801 - used as a context manager, like a function
    """A writable view of ``size`` bytes: the thread's scratch buffer when small and
    free, else a fresh one. The view is released on exit, so nothing keeps the
    scratch exported (and a nested user on the same thread gets a fresh buffer)."""

    __slots__ = ("_size", "_view", "_own")

    def __init__(self, size: int) -> None:
        self._size = size

    def __enter__(self) -> memoryview:
        buf: bytearray | None = None
        if self._size <= _SCRATCH_MAX and not getattr(_scratch, "busy", False):
            buf = getattr(_scratch, "buf", None)
            if buf is None:
                buf = _scratch.buf = bytearray(_SCRATCH_MAX)
            _scratch.busy = self._own = True
        else:
            buf = bytearray(self._size)
            self._own = False
        self._view = memoryview(buf)[: self._size]
        return self._view

    def __exit__(self, *exc: object) -> None:
        self._view.release()
        if self._own:
            _scratch.busy = False


def _verify(view: memoryview, crcs: bytes, first: int, bs: int, what: str) -> None:
    """Check ``view`` (blocks ``first``, ``first + 1``, ... of a chunk) against ``crcs``."""
    for j, lo in enumerate(range(0, len(view), bs)):
        i = first + j
        if 4 * i + 4 > len(crcs) or crc32c(view[lo : lo + bs]) != _CRC.unpack_from(crcs, 4 * i)[0]:
            raise checksum_mismatch(f"chunk {what}: checksum mismatch in block {i}")


_CRC = struct.Struct("<I")


_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


class _CacheStatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [
        ("nr_cache", ctypes.c_uint64),
        ("nr_dirty", ctypes.c_uint64),
        ("nr_writeback", ctypes.c_uint64),
        ("nr_evicted", ctypes.c_uint64),
        ("nr_recently_evicted", ctypes.c_uint64),
    ]


# cachestat(2) (Linux 6.5; the same number on every architecture since 6.x's
# unified syscall table). 0 once the kernel said ENOSYS (or a seccomp filter EPERM):
# then _all_cached cannot tell.
_SYS_CACHESTAT = 451 if sys.platform == "linux" else 0
_PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(None, use_errno=True) if _SYS_CACHESTAT else None


def _all_cached(fd: int, offset: int, length: int) -> bool | None:
    """Whether the page cache holds every page of [offset, offset + length) of ``fd``;
    None where the kernel cannot tell without reading (no ``cachestat``).

    Why not ``preadv(RWF_NOWAIT)``: on a miss it still starts the file's readahead
    before failing, so the O_DIRECT read that follows reads the range a second time
    and the readahead reads up to the disk's ``read_ahead_kb`` more (measured: 2.5x
    the bytes asked from the disk). ``cachestat`` only counts pages.
    """
    global _SYS_CACHESTAT
    if not _SYS_CACHESTAT or _libc is None:
        return None
    rng = _CacheStatRange(offset, length)
    st = _CacheStat()
    args = (ctypes.c_long(_SYS_CACHESTAT), ctypes.c_uint(fd), ctypes.byref(rng), ctypes.byref(st))
    if _libc.syscall(*args, ctypes.c_uint(0)) != 0:
        if ctypes.get_errno() in (_errno.ENOSYS, _errno.EPERM):
            _SYS_CACHESTAT = 0  # not in this kernel, or refused (seccomp): never asked again
        return None
    pages = (offset + length - 1) // _PAGE - offset // _PAGE + 1
    return int(st.nr_cache) >= pages


def _set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for ``fd``; whether it is on now (False where refused)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | flag if on else flags & ~flag)
    except OSError:
        return False
    return on


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


__all__ = [
    "READ_FDS",
    "read_fds_per_target",
    "SPARE_BATCH",
    "ChunkDataStore",
    "ReadFds",
    "block_crcs",
    "crc32c",
    "os_error",
    "pack_crcs",
    "page_aligned",
    "unpack_crcs",
]
