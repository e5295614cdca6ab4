"""Shared-memory regions and raw buffer addresses.

A :class:`ShmRegion` is a file under ``/dev/shm`` mapped into this process. It
is the unit the ``shm`` transport registers with storage servers (the local
stand-in for an RDMA memory registration) and the unit USRBIO uses for its
Iovs and rings. Both sides map the *same file*, so bytes written by one process
are visible to the other without any copy through a socket.

:func:`buffer_address` returns the address of any contiguous buffer (also a
read-only one) so a transport can tell whether a caller's ``memoryview`` lies
inside a registered region and, if so, at which offset — the check 3FS does
with ``ptr - iov.base``.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import stat
import uuid

from fs3.errors import Code, FsError, invalid
from fs3.rpc.native.pool import BufferPool

SHM_DIR = "/dev/shm"


class _PyBuffer(ctypes.Structure):
    """``Py_buffer`` (CPython's buffer-protocol view), enough to read ``buf``."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None
_PyBUF_SIMPLE = 0


def buffer_address(buf: object) -> tuple[int, int]:
    """``(address, length)`` of a C-contiguous buffer (bytes, bytearray, mmap, memoryview).

    Works for read-only buffers too (``ctypes.c_char.from_buffer`` does not).
    The address is only meaningful while the underlying object stays alive.

    A writable buffer (every read destination, e.g. a USRBIO Iov slice) takes
    ``ctypes.c_char.from_buffer``, a single C call: the transports ask this once
    per I/O, and the generic ``PyObject_GetBuffer`` round trip through ctypes
    costs several times more.
    """
    try:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))  # type: ignore[arg-type]
    except (TypeError, ValueError):  # read-only or empty: the generic path below
        pass
    else:
        return addr, (buf.nbytes if type(buf) is memoryview else memoryview(buf).nbytes)  # type: ignore[arg-type]
    view = _PyBuffer()
    if _get_buffer(buf, ctypes.byref(view), _PyBUF_SIMPLE) != 0:  # raises on failure
        raise invalid("object does not expose a contiguous buffer")
    try:
        return int(view.buf or 0), int(view.len)
    finally:
        _release_buffer(ctypes.byref(view))


_MADV_POPULATE_WRITE = 23  # Linux >= 5.14 (Python 3.11's mmap module does not name it)
_libc = ctypes.CDLL(None, use_errno=True)


def populate_range(addr: int, n: int, step: int = 0) -> bool:
    """Fault in the ``n`` bytes at ``addr`` (memory of this process) writable, bytes unchanged.

    One ``madvise(MADV_POPULATE_WRITE)`` per ``step`` bytes (0: one call) maps
    the pages without a trap per page; a page already mapped costs a
    page-table walk. False where the kernel lacks it (the pages are then
    faulted in on first write, as without this call) or the range is not mapped.
    """
    page = mmap.PAGESIZE
    lo, hi = addr // page * page, addr + n
    step = step or hi - lo
    for a in range(lo, hi, step):
        if _libc.madvise(
            ctypes.c_void_p(a), ctypes.c_size_t(min(step, hi - a)), _MADV_POPULATE_WRITE
        ):
            return False
    return True


class PrivateCopies:
    """Copies of one-sided payloads into private memory that no other process can change.

    Why: a one-sided payload sits in the sender's shared memory, which the
    sender may reuse as soon as it gives up on the request; everything the
    receiver verifies and stores must come from one private copy (see
    :meth:`fs3.transport.server.ServerTransport.fetch`). Copies live in
    anonymous mappings, so they are page aligned and an ``O_DIRECT`` write can
    still DMA from them. Mappings are pooled (up to ``cache_bytes``) and
    reused only once no view of them is left anywhere (every memoryview of a
    mapping holds a reference to it), so there is no release call to forget
    and no per-write ``mmap``/``munmap`` or page zeroing; beyond the cap a copy
    gets a mapping of its own, unmapped when its last view goes.
    ``ctypes.memmove`` copies without holding the GIL, so a worker thread can
    run :meth:`copy` off the event loop.
    """

    def __init__(self, cache_bytes: int = 64 << 20) -> None:
        self._mappings = BufferPool(cache_bytes)

    def copy(self, src: memoryview) -> memoryview:
        """A private, page-aligned copy of ``src`` (valid while the caller keeps it)."""
        n = src.nbytes
        if n == 0:
            return memoryview(b"")
        dst = self._mappings.take(n)
        ctypes.memmove(buffer_address(dst)[0], buffer_address(src)[0], n)
        return dst

    @property
    def cached_bytes(self) -> int:
        """Bytes of pooled mappings (tests, metrics)."""
        return self._mappings.cached_bytes


def _check_shm_path(path: str) -> str:
    """Resolve ``path`` and refuse anything that is not a regular file in SHM_DIR.

    Why: a server maps files on behalf of clients; it must never be talked into
    mapping an arbitrary file (a chunk file, /etc/shadow) through a symlink.
    """
    real = os.path.realpath(path)
    if os.path.dirname(real) != SHM_DIR:
        raise invalid(f"shared-memory path {path!r} is not a file directly under {SHM_DIR}")
    return real


def process_start_time(pid: int) -> str | None:
    """Start time of ``pid`` (field 22 of /proc/pid/stat), None if it is gone.

    Comparing it with the value seen at registration tells a dead owner from a
    reused pid.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return ""
    # comm may contain spaces and ')' : split after the last ')'
    rest = data[data.rfind(b")") + 2 :].split()
    return rest[19].decode() if len(rest) > 19 else ""


_swept: set[str] = set()


def sweep_dead_regions(prefix: str) -> int:
    """Unlink ``SHM_DIR/<prefix>-<pid>-*`` files whose creating pid is gone; returns how many."""
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(prefix + "-"):
            continue
        pid_s = name[len(prefix) + 1 :].split("-", 1)[0]
        if not pid_s.isdigit() or os.path.exists(f"/proc/{pid_s}"):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed += 1
        except OSError:
            pass
    return removed


class ShmRegion:
    """A shared-memory file mapped read-write into this process.

    ``create`` makes a new file (this object owns it and unlinks it on close);
    ``open`` maps a file another process created (it is never unlinked here
    unless asked). ``buf`` is a writable memoryview over the whole mapping.
    """

    def __init__(
        self, path: str, size: int, mm: mmap.mmap, *, owner: bool, region_id: str, fd: int = -1
    ) -> None:
        self.path = path
        # The open file, kept so the region can be handed to a server by descriptor
        # (SCM_RIGHTS, :func:`fs3.transport.shm.send_region`), never by name.
        self.fd = fd
        self.size = size
        self.id = region_id
        self.owner = owner
        self._mm: mmap.mmap | None = mm
        self._dead = False
        self.buf = memoryview(mm) if size else memoryview(bytearray())
        self.address = buffer_address(self.buf)[0] if size else 0

    @classmethod
    def create(cls, size: int, prefix: str = "fs3-region", region_id: str = "") -> ShmRegion:
        """Create ``SHM_DIR/<prefix>-<pid>-<id>`` of ``size`` bytes and map it.

        The first call per prefix also removes files of that prefix left by
        processes that no longer exist (a daemon killed with SIGKILL cannot
        unlink its own regions, and /dev/shm is memory).
        """
        if size <= 0:
            raise invalid(f"region size must be > 0, got {size}")
        if prefix not in _swept:
            _swept.add(prefix)
            sweep_dead_regions(prefix)
        rid = region_id or uuid.uuid4().hex
        # The file name is public (anyone can list /dev/shm); the region id is what a
        # data request names, so it must not be guessable from the name.
        path = os.path.join(SHM_DIR, f"{prefix}-{os.getpid()}-{uuid.uuid4().hex}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        return cls(path, size, mm, owner=True, region_id=rid, fd=fd)

    @classmethod
    def open(
        cls, path: str, size: int | None = None, region_id: str = "", *, owner_uid: int = -1
    ) -> ShmRegion:
        """Map an existing file under SHM_DIR; ``size`` (if given) must not exceed it.

        ``owner_uid`` >= 0 (and not root): the opened file must belong to that user,
        checked on the open descriptor, so the file cannot be swapped after a check.
        """
        real = _check_shm_path(path)
        try:
            fd = os.open(real, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as e:
            raise FsError(
                Code.INVALID_ARGUMENT, f"cannot open shared memory {path!r}: {e.strerror}"
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise invalid(f"{path!r} is not a regular file")
            if owner_uid > 0 and st.st_uid != owner_uid:
                raise FsError(
                    Code.PERMISSION_DENIED, f"{path!r} belongs to uid {st.st_uid}, not {owner_uid}"
                )
            if size is None:
                size = st.st_size
            if size <= 0 or size > st.st_size:
                raise invalid(
                    f"region size {size} does not fit file {path!r} of {st.st_size} bytes"
                )
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(
            real, size, mm, owner=False, region_id=region_id or os.path.basename(real), fd=fd
        )

    @classmethod
    def from_fd(cls, fd: int, size: int, region_id: str) -> ShmRegion:
        """Map a file another process handed over by descriptor; takes ownership of ``fd``.

        The descriptor must be open read-write on a regular file of at least
        ``size`` bytes: the kernel already decided the sender may use it, so no
        path is looked up and nothing the sender could not touch gets mapped.
        """
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise invalid("the region descriptor is not a regular file")
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
                raise FsError(
                    Code.PERMISSION_DENIED, "the region descriptor is not open read-write"
                )
            if size <= 0 or size > st.st_size:
                raise invalid(f"region size {size} does not fit its file of {st.st_size} bytes")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(f"fd:{region_id}", size, mm, owner=False, region_id=region_id, fd=fd)

    @property
    def closed(self) -> bool:
        return self._dead

    def populate_allocated(self, step: int = 64 << 20) -> int:
        """Map into this process every page the region's file already holds; returns bytes mapped.

        Why: a process writing into a region it has just mapped (a storage
        server ``preadv``-ing a chunk into a client's Iov) takes one page
        fault per 4 KiB page it has not touched yet, and with reads spread
        over replicas each server keeps meeting untouched pages for several
        passes over the region. A fault costs this VM about 1 us; one
        ``madvise(MADV_POPULATE_WRITE)`` maps a GiB of existing pages in about
        a tenth of the time of touching them (benchmarks/results/ckpt-*).
        Only pages the owner already allocated are mapped (all of them when
        the file is fully allocated, e.g. by ``posix_fallocate``; else the
        written runs ``SEEK_DATA`` finds), so a sparse region never becomes
        memory here. Bytes are not changed.
        Stops early once the region is closed (a view is held meanwhile, so
        a close waits for the mapping's last view as usual); 0 where the
        kernel lacks ``MADV_POPULATE_WRITE`` or ``SEEK_DATA``.
        """
        try:
            keep = self.buf[:] if not self._dead and self.size else None
        except ValueError:  # released by a close just now
            keep = None
        if keep is None:
            return 0
        done = 0
        try:
            whole = (
                os.fstat(self.fd).st_blocks * 512 >= self.size
            )  # fallocate'd: SEEK_DATA skips it
            off = 0
            while off < self.size and not self._dead:
                try:
                    a = 0 if whole else os.lseek(self.fd, off, os.SEEK_DATA)
                    b = self.size if whole else min(os.lseek(self.fd, a, os.SEEK_HOLE), self.size)
                except OSError:  # ENXIO: no data past off (or no SEEK_DATA here)
                    break
                while a < b and not self._dead:
                    n = min(step, b - a)
                    if not populate_range(self.address + a, n):
                        return done
                    done, a = done + n, a + n
                off = max(b, off + mmap.PAGESIZE)
        finally:
            keep.release()
        return done

    def contains(self, address: int, length: int) -> bool:
        return self.address <= address and address + length <= self.address + self.size

    def offset_of(self, view: memoryview) -> int | None:
        """Offset of ``view`` inside this region, or None if it does not lie inside."""
        if self._dead:
            return None
        addr, n = buffer_address(view)
        if n == 0 or not self.contains(addr, n):
            return None
        return addr - self.address

    def unlink(self) -> None:
        """Remove the file of a region this object owns now; the mapping stays usable.

        Why: a process about to close its regions may be killed (a supervisor's
        SIGTERM) while it still waits on peers; unlinked first, its file cannot
        outlive it in /dev/shm (peers keep their own mappings until they unmap).
        """
        if self.owner and not self._dead:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def close(self, unlink: bool | None = None) -> bool:
        """Unmap (and unlink if we own it). False if views are still exported.

        Why it may refuse: an mmap with live memoryviews cannot be closed; the
        caller retries later (servers keep such regions in a graveyard).
        """
        if self._mm is None:
            return True
        if not self._dead:
            self._dead = True
            self.buf.release()
            if unlink if unlink is not None else self.owner:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
        try:
            self._mm.close()
        except BufferError:
            return False
        self._mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        return True

    def __repr__(self) -> str:
        return f"ShmRegion({self.path!r}, size={self.size})"
