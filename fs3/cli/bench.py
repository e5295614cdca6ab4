"""``fs3 bench``: a quick, honest benchmark of a directory (like ``juicefs bench``).

    fs3 bench PATH [--big-file-size 1G] [--small-files 1000] [--threads N] [--json]
    fs3 bench --cluster FILE [PATH]      # the Python API (fs3.connect), no mount needed
    fs3 bench PATH --usrbio              # big files through USRBIO rings on an fs3 mount

Phases, each timed on its own (``--threads`` workers, started together):

``big_write``   every thread writes its own file of ``--big-file-size`` in
                ``--block-size`` writes, then fsync + close (so the figure
                includes making the data durable, as a checkpoint writer must);
``big_read``    reads them back sequentially (page cache dropped first);
``rand_read``   ``--rand-read-seconds`` of ``--rand-read-size`` reads at random
                aligned offsets of the big files (off by default);
``small_write`` creates ``--small-files`` files of ``--small-file-size``
                (create + write + close), spread over the threads;
``small_write_fsync`` the same with an fsync per file (``--small-fsync``);
``small_read``  reads every small file (page cache dropped first);
``stat``        stats every small file;
``readdir``     lists the small-file directory (ops are entries);
``unlink``      removes every small file.

Every phase reports operations, bytes, wall time, throughput (MiB/s), ops/s
and the p50/p99 latency of one operation (one block for big files, one whole
file for small ones, one call for stat/unlink). The page cache is dropped with
``echo 3 > /proc/sys/vm/drop_caches`` before read phases when that is allowed
(root), so reads measure the file system and not memory; the output says when
it was not possible. Everything is created under a fresh
``PATH/fs3-bench-<id>`` directory that is removed at the end.

The workload functions (:func:`run_bench` with :class:`BenchOptions`) are used
by ``benchmarks/run_all.py`` too, so the suite and the tool measure the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import mmap
import os
import platform
import random
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

PHASES = (
    "big_write",
    "big_read",
    "rand_read",
    "small_write",
    "small_write_fsync",
    "small_read",
    "stat",
    "readdir",
    "unlink",
)

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"1G"``, ``"64K"``, ``"1MiB"``, ``"4096"`` -> bytes (binary units: K = 1024)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"bad size {text!r} (examples: 4096, 64K, 1M, 1G)")
    mult = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": GiB * KiB}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} B"


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


def drop_caches() -> bool:
    """Write back dirty pages and drop the page cache; False when not allowed (not root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------- results


@dataclass
class PhaseResult:
    """What one phase did; latencies are per operation, in seconds."""

    name: str
    ops: int = 0
    bytes: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    note: str = ""

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        secs = self.seconds if self.seconds > 0 else float("nan")
        return {
            "ops": self.ops,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 6),
            "mib_s": round(self.bytes / MiB / secs, 3) if self.bytes else 0.0,
            "ops_s": round(self.ops / secs, 3),
            "p50_ms": round(percentile(lat, 50) * 1000, 4),
            "p99_ms": round(percentile(lat, 99) * 1000, 4),
            "note": self.note,
        }


class Progress:
    """A one-line progress display on stderr (a tty), or a line per phase otherwise."""

    def __init__(self, enabled: bool, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._lock = threading.Lock()
        self._done = 0
        self._bytes = 0
        self._total = 0
        self._name = ""
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, ops: int, nbytes: int = 0) -> None:
        with self._lock:
            self._done += ops
            self._bytes += nbytes

    def _line(self) -> str:
        el = max(time.perf_counter() - self._t0, 1e-9)
        with self._lock:
            done, nbytes, total = self._done, self._bytes, self._total
        if total > 0:
            frac = min(done / total, 1.0)
            bar = "#" * int(frac * 20)
            head = f"{self._name:<18} [{bar:<20}] {frac * 100:5.1f}% {done}/{total}"
        else:
            head = f"{self._name:<18} {done} ops"
        rate = f"{nbytes / MiB / el:8.1f} MiB/s" if nbytes else f"{done / el:8.0f} ops/s"
        return f"{head}  {rate}  {el:6.1f}s"

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            self.stream.write("\r" + self._line() + "\x1b[K")
            self.stream.flush()

    def start(self, name: str, total: int) -> None:
        self._name, self._total, self._done, self._bytes = name, total, 0, 0
        self._t0 = time.perf_counter()
        if self.tty:
            self._stop.clear()
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def finish(self, summary: str) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.tty:
            self.stream.write("\r\x1b[K")
        if self.enabled:
            self.stream.write(f"{self._name:<18} {summary}\n")
            self.stream.flush()


# --------------------------------------------------------------------------- file system backends


class BenchFile(Protocol):
    def write(self, buf: memoryview) -> None: ...
    def readinto(self, buf: memoryview) -> int: ...
    def pread(self, buf: memoryview, offset: int) -> int: ...
    def fsync(self) -> None: ...
    def close(self) -> None: ...


class PosixFile:
    """An fd: writes loop until everything is written (short writes happen on FUSE)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, buf: memoryview) -> None:
        while buf:
            n = os.write(self.fd, buf)
            buf = buf[n:]

    def readinto(self, buf: memoryview) -> int:
        return os.readv(self.fd, [buf])

    def pread(self, buf: memoryview, offset: int) -> int:
        return os.preadv(self.fd, [buf], offset)

    def fsync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class PosixFS:
    """Any mounted directory (fs3 FUSE, local disk, JuiceFS ...) through the OS."""

    kind = "posix"

    def __init__(self, direct: bool = False) -> None:
        self.direct = direct

    def open_write(self, path: str) -> PosixFile:
        return PosixFile(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))

    def open_read(self, path: str, *, random_access: bool = False) -> PosixFile:
        flags = os.O_RDONLY
        if random_access and self.direct:
            try:
                return PosixFile(os.open(path, flags | os.O_DIRECT))
            except OSError:
                self.direct = False  # not supported here: measured without, and the result says so
        fd = os.open(path, flags)
        if random_access:
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return PosixFile(fd)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def stat(self, path: str) -> int:
        return os.stat(path).st_size

    def listdir(self, path: str) -> int:
        with os.scandir(path) as it:
            return sum(1 for _ in it)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def close(self) -> None:
        pass


class ClientFile:
    """An unbuffered fs3 :class:`fs3.client.file_api.RawFile`."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def write(self, buf: memoryview) -> None:
        while buf:
            n = self.raw.write(buf)
            buf = buf[n:]

    def readinto(self, buf: memoryview) -> int:
        return int(self.raw.readinto(buf))

    def pread(self, buf: memoryview, offset: int) -> int:
        self.raw.seek(offset)
        return int(self.raw.readinto(buf))

    def fsync(self) -> None:
        self.raw.fsync()

    def close(self) -> None:
        self.raw.close()


class ClientFS:
    """fs3 through the Python API (``fs3.connect``); paths are fs3 paths."""

    kind = "client"
    direct = False

    def __init__(self, cluster_file: str, transport: str | None = None) -> None:
        import fs3

        self.client = fs3.connect(cluster_file, transport=transport)

    def open_write(self, path: str) -> ClientFile:
        return ClientFile(self.client.open(path, "wb", buffering=0))

    def open_read(self, path: str, *, random_access: bool = False) -> ClientFile:
        return ClientFile(self.client.open(path, "rb", buffering=0))

    def mkdir(self, path: str) -> None:
        self.client.mkdir(path)

    def rmdir(self, path: str) -> None:
        self.client.rmdir(path)

    def stat(self, path: str) -> int:
        return int(self.client.stat(path).st_size)

    def listdir(self, path: str) -> int:
        return len(self.client.listdir(path))

    def unlink(self, path: str) -> None:
        self.client.unlink(path)

    def exists(self, path: str) -> bool:
        return bool(self.client.lexists(path))

    def close(self) -> None:
        self.client.close()


FS = PosixFS | ClientFS


# --------------------------------------------------------------------------- options and runner


@dataclass
class BenchOptions:
    path: str = "."
    big_file_size: int = 1 * GiB  # per thread
    block_size: int = 1 * MiB
    small_files: int = 1000  # in total, spread over the threads
    small_file_size: int = 128 * KiB
    small_fsync: bool = False
    threads: int = 1
    rand_read_seconds: float = 0.0
    rand_read_size: int = 4 * KiB
    direct: bool = False  # O_DIRECT for random reads (POSIX) where supported
    drop_caches: bool = True
    cluster: str | None = None  # bench the Python API of this cluster instead of the OS
    transport: str | None = None  # Python API transport (grpc | tcp | shm)
    usrbio: bool = False  # big files through USRBIO rings (PATH must be on an fs3 mount)
    mountpoint: str | None = None  # USRBIO: the mount point (default: found from PATH)
    iodepth: int = 8  # USRBIO: sequential blocks in flight per thread
    rand_iodepth: int = 64  # USRBIO: random reads in flight per thread
    keep: bool = False
    phases: tuple[str, ...] = PHASES
    seed: int = 42

    def validate(self) -> None:
        if self.threads < 1:
            raise ValueError("--threads must be >= 1")
        if self.big_file_size < 0 or self.small_files < 0 or self.small_file_size < 0:
            raise ValueError("sizes and counts must be >= 0")
        if self.block_size <= 0 or self.rand_read_size <= 0:
            raise ValueError("--block-size and --rand-read-size must be > 0")
        if self.iodepth < 1 or self.rand_iodepth < 1:
            raise ValueError("--iodepth and --rand-iodepth must be >= 1")
        bad = [p for p in self.phases if p not in PHASES]
        if bad:
            raise ValueError(f"unknown phase(s) {', '.join(bad)}; known: {', '.join(PHASES)}")
        if self.usrbio and self.cluster:
            raise ValueError(
                "--usrbio works on a mount point; it cannot be combined with --cluster"
            )


def _run_threads(n: int, fn: Callable[[int], list[float]]) -> tuple[float, list[float]]:
    """Run ``fn(i)`` in ``n`` threads released together; wall time and all latencies.

    The first exception of any worker is raised after every worker ended.
    """
    barrier = threading.Barrier(n + 1)
    lats: list[list[float]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait()
            lats[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall, [x for part in lats for x in part]


def _find_mountpoint(path: str) -> str:
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _aligned_buffer(size: int) -> mmap.mmap:
    """Page-aligned anonymous memory (O_DIRECT needs aligned buffers)."""
    return mmap.mmap(-1, max(size, mmap.PAGESIZE))


class Bench:
    """One benchmark run over ``opts``; :meth:`run` returns the JSON-able result."""

    def __init__(self, opts: BenchOptions, progress: Progress | None = None) -> None:
        opts.validate()
        self.o = opts
        self.progress = progress or Progress(False)
        self.fs: FS = (
            ClientFS(opts.cluster, opts.transport) if opts.cluster else PosixFS(direct=opts.direct)
        )
        base = opts.path if (opts.path or not opts.cluster) else "/"
        self.root = os.path.join(base or "/", f"fs3-bench-{uuid.uuid4().hex[:8]}")
        self.big_paths = [os.path.join(self.root, f"big-{i}") for i in range(opts.threads)]
        self.small_dir = os.path.join(self.root, "small")
        self.small_paths = [
            os.path.join(self.small_dir, f"f{i:07d}") for i in range(opts.small_files)
        ]
        self.results: dict[str, PhaseResult] = {}
        self.cache_dropped: bool | None = None
        rng = random.Random(opts.seed)
        self.block = memoryview(rng.randbytes(opts.block_size))
        self.small_data = (
            memoryview(rng.randbytes(opts.small_file_size))
            if opts.small_file_size
            else memoryview(b"")
        )
        self._usrbio_mount: str | None = None

    # ---------------------------------------------------------------- helpers

    def _want(self, phase: str) -> bool:
        return phase in self.o.phases

    def _drop(self) -> None:
        if self.o.drop_caches:
            ok = drop_caches()
            self.cache_dropped = ok if self.cache_dropped is None else (self.cache_dropped and ok)

    def _phase(
        self,
        name: str,
        total: int,
        fn: Callable[[int], list[float]],
        ops: int | None,
        nbytes: int,
        note: str = "",
        *,
        op_bytes: int = 0,
    ) -> PhaseResult:
        """Run ``fn`` in every thread; ``ops=None`` counts latencies (× ``op_bytes`` bytes each)."""
        self.progress.start(name, total)
        wall, lats = _run_threads(self.o.threads, fn)
        n = len(lats) if ops is None else ops
        if ops is None and op_bytes:
            nbytes = n * op_bytes
        r = PhaseResult(name, ops=n, bytes=nbytes, seconds=wall, latencies=lats, note=note)
        self.results[name] = r
        s = r.summary()
        rate = f"{s['mib_s']:.1f} MiB/s" if r.bytes else f"{s['ops_s']:.0f} ops/s"
        self.progress.finish(
            f"{rate:>14}  p50 {s['p50_ms']:.3f} ms  p99 {s['p99_ms']:.3f} ms  ({wall:.2f} s)"
        )
        return r

    def _slice(self, i: int) -> list[str]:
        n = self.o.threads
        return self.small_paths[i::n]

    # ---------------------------------------------------------------- big files (POSIX / Python API)

    def big_write(self) -> None:
        size, bs = self.o.big_file_size, self.o.block_size
        nblocks = -(-size // bs)

        def work(i: int) -> list[float]:
            lat: list[float] = []
            f = self.fs.open_write(self.big_paths[i])
            try:
                left = size
                while left > 0:
                    chunk = self.block[: min(bs, left)]
                    t = time.perf_counter()
                    f.write(chunk)
                    lat.append(time.perf_counter() - t)
                    left -= len(chunk)
                    self.progress.add(1, len(chunk))
                t = time.perf_counter()
                f.fsync()
                lat.append(
                    time.perf_counter() - t
                )  # the fsync is part of the cost, and shows in p99
            finally:
                f.close()
            return lat

        self._phase(
            "big_write",
            nblocks * self.o.threads,
            work,
            nblocks * self.o.threads,
            size * self.o.threads,
            note="fsync at end",
        )

    def big_read(self) -> None:
        size, bs = self.o.big_file_size, self.o.block_size
        nblocks = -(-size // bs)
        self._drop()

        def work(i: int) -> list[float]:
            lat: list[float] = []
            buf = memoryview(bytearray(bs))
            f = self.fs.open_read(self.big_paths[i])
            got = 0
            try:
                while True:
                    t = time.perf_counter()
                    n = f.readinto(buf)
                    if n <= 0:
                        break
                    lat.append(time.perf_counter() - t)
                    got += n
                    self.progress.add(1, n)
            finally:
                f.close()
            if got != size:
                raise OSError(f"big_read: read {got} bytes of {self.big_paths[i]}, expected {size}")
            return lat

        self._phase(
            "big_read",
            nblocks * self.o.threads,
            work,
            nblocks * self.o.threads,
            size * self.o.threads,
        )

    def rand_read(self) -> None:
        size, rs, secs = self.o.big_file_size, self.o.rand_read_size, self.o.rand_read_seconds
        slots = size // rs
        if slots < 1:
            raise ValueError("rand_read needs --big-file-size >= --rand-read-size")
        self._drop()
        total_ops = [0]
        lock = threading.Lock()

        def work(i: int) -> list[float]:
            rng = random.Random(self.o.seed + i)
            lat: list[float] = []
            mm = _aligned_buffer(rs)
            buf = memoryview(mm)[:rs]
            f = self.fs.open_read(self.big_paths[i], random_access=True)
            try:
                end = time.perf_counter() + secs
                while True:
                    t = time.perf_counter()
                    if t >= end:
                        break
                    n = f.pread(buf, rng.randrange(slots) * rs)
                    lat.append(time.perf_counter() - t)
                    if n != rs:
                        raise OSError(f"rand_read: short read {n} of {rs}")
                    self.progress.add(1, n)
            finally:
                f.close()
                buf.release()
                mm.close()
            with lock:
                total_ops[0] += len(lat)
            return lat

        want_direct = bool(getattr(self.fs, "direct", False))
        r = self._phase("rand_read", 0, work, None, 0, op_bytes=rs)
        direct = want_direct and bool(getattr(self.fs, "direct", False))
        r.note = (
            "O_DIRECT"
            if direct
            else ("O_DIRECT not supported here: " if want_direct else "")
            + "buffered, POSIX_FADV_RANDOM, cache dropped"
        )

    # ---------------------------------------------------------------- big files (USRBIO)

    def _usrbio_big(self, write: bool) -> None:
        from fs3.usrbio import Ior, Iov, dereg_fd, prep_io, reg_fd, submit_ios, wait_for_ios

        assert self._usrbio_mount is not None
        mount = self._usrbio_mount
        size, bs, depth = self.o.big_file_size, self.o.block_size, self.o.iodepth
        nblocks = -(-size // bs)
        if not write:
            self._drop()

        def work(i: int) -> list[float]:
            lat: list[float] = []
            path = self.big_paths[i]
            flags = (os.O_RDWR | os.O_CREAT | os.O_TRUNC) if write else os.O_RDONLY
            fd = os.open(path, flags, 0o644)
            iov = Iov(mount, bs * depth)
            ior = Ior(mount, entries=depth, for_read=not write)
            try:
                if write:
                    for k in range(depth):
                        iov.buf[k * bs : (k + 1) * bs] = self.block
                reg_fd(fd)
                try:
                    free = list(range(depth))
                    started: dict[int, float] = {}
                    nxt = 0
                    done = 0
                    while done < nblocks:
                        while free and nxt < nblocks:
                            slot = free.pop()
                            off = nxt * bs
                            ln = min(bs, size - off)
                            prep_io(ior, iov, slot * bs, fd, off, ln, userdata=(slot, nxt, ln))
                            started[nxt] = time.perf_counter()
                            nxt += 1
                        submit_ios(ior)
                        for c in wait_for_ios(ior, max_results=depth, min_results=1, timeout=60.0):
                            slot, blk, ln = c.userdata
                            if c.result != ln:
                                what = (
                                    os.strerror(-c.result) if c.result < 0 else f"{c.result} bytes"
                                )
                                raise OSError(
                                    f"usrbio {'write' if write else 'read'} of block {blk}: {what}"
                                )
                            lat.append(time.perf_counter() - started.pop(blk))
                            free.append(slot)
                            done += 1
                            self.progress.add(1, ln)
                    if write:
                        t = time.perf_counter()
                        os.fsync(fd)
                        lat.append(time.perf_counter() - t)
                finally:
                    dereg_fd(fd)
            finally:
                ior.close()
                iov.close()
                os.close(fd)
            return lat

        name = "big_write" if write else "big_read"
        self._phase(
            name,
            nblocks * self.o.threads,
            work,
            nblocks * self.o.threads,
            size * self.o.threads,
            note=f"usrbio, {depth} x {fmt_bytes(bs)} in flight"
            + (", fsync at end" if write else ""),
        )

    def _usrbio_rand(self) -> None:
        from fs3.usrbio import Ior, Iov, dereg_fd, prep_io, reg_fd, submit_ios, wait_for_ios

        assert self._usrbio_mount is not None
        mount = self._usrbio_mount
        size, rs, secs, depth = (
            self.o.big_file_size,
            self.o.rand_read_size,
            self.o.rand_read_seconds,
            self.o.rand_iodepth,
        )
        slots = size // rs
        if slots < 1:
            raise ValueError("rand_read needs --big-file-size >= --rand-read-size")
        self._drop()

        def work(i: int) -> list[float]:
            rng = random.Random(self.o.seed + i)
            lat: list[float] = []
            fd = os.open(self.big_paths[i], os.O_RDONLY)
            iov = Iov(mount, rs * depth)
            ior = Ior(mount, entries=depth, for_read=True)
            try:
                reg_fd(fd)
                try:
                    free = list(range(depth))
                    end = time.perf_counter() + secs
                    inflight = 0
                    while True:
                        now = time.perf_counter()
                        while free and now < end:
                            slot = free.pop()
                            prep_io(
                                ior,
                                iov,
                                slot * rs,
                                fd,
                                rng.randrange(slots) * rs,
                                rs,
                                userdata=(slot, now),
                            )
                            inflight += 1
                        if inflight == 0:
                            break
                        submit_ios(ior)
                        for c in wait_for_ios(ior, max_results=depth, min_results=1, timeout=60.0):
                            slot, t0 = c.userdata
                            if c.result != rs:
                                what = (
                                    os.strerror(-c.result) if c.result < 0 else f"{c.result} bytes"
                                )
                                raise OSError(f"usrbio random read: {what}")
                            lat.append(time.perf_counter() - t0)
                            free.append(slot)
                            inflight -= 1
                            self.progress.add(1, rs)
                finally:
                    dereg_fd(fd)
            finally:
                ior.close()
                iov.close()
                os.close(fd)
            return lat

        self._phase(
            "rand_read", 0, work, None, 0, note=f"usrbio, {depth} in flight per thread", op_bytes=rs
        )

    # ---------------------------------------------------------------- small files and metadata

    def small_write(self, fsync: bool) -> None:
        name = "small_write_fsync" if fsync else "small_write"
        paths = self.small_paths
        if fsync and self._want("small_write"):
            paths = [
                p + ".s" for p in self.small_paths
            ]  # a second set: fresh creates, not overwrites
        data = self.small_data

        def work(i: int) -> list[float]:
            lat: list[float] = []
            for p in paths[i :: self.o.threads]:
                t = time.perf_counter()
                f = self.fs.open_write(p)
                try:
                    if data:
                        f.write(data)
                    if fsync:
                        f.fsync()
                finally:
                    f.close()
                lat.append(time.perf_counter() - t)
                self.progress.add(1, len(data))
            return lat

        self._phase(
            name,
            len(paths),
            work,
            len(paths),
            len(paths) * len(data),
            note="create+write+fsync+close" if fsync else "create+write+close",
        )
        if fsync and paths is not self.small_paths:
            for p in paths:
                self.fs.unlink(p)

    def small_read(self) -> None:
        size = self.o.small_file_size
        self._drop()

        def work(i: int) -> list[float]:
            lat: list[float] = []
            buf = memoryview(bytearray(max(size, 1) + 1))
            for p in self._slice(i):
                t = time.perf_counter()
                f = self.fs.open_read(p)
                got = 0
                try:
                    while True:
                        n = f.readinto(buf[got:] if got < len(buf) else buf)
                        if n <= 0:
                            break
                        got += n
                finally:
                    f.close()
                lat.append(time.perf_counter() - t)
                if got != size:
                    raise OSError(f"small_read: {p} has {got} bytes, expected {size}")
                self.progress.add(1, got)
            return lat

        self._phase(
            "small_read",
            len(self.small_paths),
            work,
            len(self.small_paths),
            len(self.small_paths) * size,
            note="open+read+close",
        )

    def stat_files(self) -> None:
        def work(i: int) -> list[float]:
            lat: list[float] = []
            for p in self._slice(i):
                t = time.perf_counter()
                self.fs.stat(p)
                lat.append(time.perf_counter() - t)
                self.progress.add(1)
            return lat

        self._phase("stat", len(self.small_paths), work, len(self.small_paths), 0)

    def readdir(self) -> None:
        counts: list[int] = []

        def work(i: int) -> list[float]:
            if i:
                return []  # one listing of the whole directory; ops are its entries
            t = time.perf_counter()
            n = self.fs.listdir(self.small_dir)
            counts.append(n)
            self.progress.add(n)
            return [time.perf_counter() - t]

        self._phase(
            "readdir",
            len(self.small_paths),
            work,
            len(self.small_paths),
            0,
            note="one listing; ops = entries",
        )
        if not counts or counts[0] != len(self.small_paths):
            raise OSError(f"readdir listed {counts} entries, expected {len(self.small_paths)}")

    def unlink(self) -> None:
        def work(i: int) -> list[float]:
            lat: list[float] = []
            for p in self._slice(i):
                t = time.perf_counter()
                self.fs.unlink(p)
                lat.append(time.perf_counter() - t)
                self.progress.add(1)
            return lat

        self._phase("unlink", len(self.small_paths), work, len(self.small_paths), 0)
        self.small_paths = []

    # ---------------------------------------------------------------- run

    def run(self) -> dict[str, Any]:
        o = self.o
        if o.usrbio:
            self._usrbio_mount = o.mountpoint or _find_mountpoint(o.path)
        self.fs.mkdir(self.root)
        big = o.big_file_size > 0
        small = o.small_files > 0
        try:
            if big and self._want("big_write"):
                self._usrbio_big(True) if o.usrbio else self.big_write()
            elif big and (self._want("big_read") or self._want("rand_read")):
                self.big_write_untimed()
            if big and self._want("big_read"):
                self._usrbio_big(False) if o.usrbio else self.big_read()
            if big and self._want("rand_read") and o.rand_read_seconds > 0:
                self._usrbio_rand() if o.usrbio else self.rand_read()
            if small:
                self.fs.mkdir(self.small_dir)
                if self._want("small_write") or not self._want("small_write_fsync"):
                    self.small_write(False)
                if self._want("small_write_fsync") and o.small_fsync:
                    self.small_write(True)
                if self._want("small_read") and o.small_file_size > 0:
                    self.small_read()
                if self._want("stat"):
                    self.stat_files()
                if self._want("readdir"):
                    self.readdir()
                if self._want("unlink"):
                    self.unlink()
        finally:
            if not o.keep:
                self.cleanup()
            self.fs.close()
        return self.report()

    def big_write_untimed(self) -> None:
        """Create the big files when only read phases were asked for."""
        for p in self.big_paths:
            f = self.fs.open_write(p)
            try:
                left = self.o.big_file_size
                while left > 0:
                    chunk = self.block[: min(len(self.block), left)]
                    f.write(chunk)
                    left -= len(chunk)
                f.fsync()
            finally:
                f.close()

    def cleanup(self) -> None:
        """Remove everything this run created (best effort: a failed run still cleans up)."""
        for p in self.small_paths + [p + ".s" for p in self.small_paths] + self.big_paths:
            with contextlib.suppress(OSError):
                if self.fs.exists(p):
                    self.fs.unlink(p)
        for d in (self.small_dir, self.root):
            with contextlib.suppress(OSError):
                if self.fs.exists(d):
                    self.fs.rmdir(d)

    def report(self) -> dict[str, Any]:
        o = self.o
        api = "usrbio" if o.usrbio else ("client" if o.cluster else "posix")
        opts = asdict(o)
        opts["phases"] = list(o.phases)
        return {
            "tool": "fs3 bench",
            "path": o.path,
            "api": api,
            "transport": o.transport,
            "threads": o.threads,
            "options": opts,
            "cache_dropped": self.cache_dropped,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": platform.node(),
            "phases": {name: r.summary() for name, r in self.results.items()},
        }


def run_bench(opts: BenchOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Run one benchmark and return its result (see :meth:`Bench.report`)."""
    return Bench(opts, progress).run()


# --------------------------------------------------------------------------- output

_LABELS = {
    "big_write": "Write big file",
    "big_read": "Read big file",
    "rand_read": "Random read",
    "small_write": "Write small file",
    "small_write_fsync": "Write small (fsync)",
    "small_read": "Read small file",
    "stat": "Stat file",
    "readdir": "Readdir",
    "unlink": "Unlink file",
}


def format_table(result: dict[str, Any]) -> str:
    """The readable table: one row per phase."""
    o = result["options"]
    head = [
        f"fs3 bench {result['path']}  api={result['api']}"
        + (f" transport={result['transport']}" if result.get("transport") else "")
        + f"  threads={result['threads']}",
        f"big file {fmt_bytes(o['big_file_size'])} x {result['threads']} in {fmt_bytes(o['block_size'])} blocks; "
        f"{o['small_files']} small files of {fmt_bytes(o['small_file_size'])}; "
        + (
            "page cache dropped before reads"
            if result.get("cache_dropped")
            else "page cache NOT dropped before reads"
            if result.get("cache_dropped") is False
            else "no read phase"
        ),
    ]
    cols = ["ITEM", "THROUGHPUT", "OPS/S", "P50", "P99", "OPS", "TIME"]
    rows = []
    for name, s in result["phases"].items():
        tp = f"{s['mib_s']:.1f} MiB/s" if s["bytes"] else "-"
        rows.append(
            [
                _LABELS.get(name, name),
                tp,
                f"{s['ops_s']:.1f}",
                f"{s['p50_ms']:.3f} ms",
                f"{s['p99_ms']:.3f} ms",
                str(s["ops"]),
                f"{s['seconds']:.2f} s",
            ]
        )
    widths = [
        max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)
    ]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: list[str]) -> str:
        return (
            "|"
            + "|".join(
                f" {c:<{w}} " if i == 0 else f" {c:>{w}} "
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + "|"
        )

    out = head + [sep, line(cols), sep] + [line(r) for r in rows] + [sep]
    notes = [
        f"  {_LABELS.get(n, n)}: {s['note']}" for n, s in result["phases"].items() if s.get("note")
    ]
    if notes:
        out += ["notes:"] + notes
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fs3 bench",
        description="Benchmark big-file and small-file I/O and metadata on a directory "
        "(an fs3 mount or any other), or on a cluster through the Python API.",
    )
    p.add_argument(
        "path",
        nargs="?",
        default=None,
        help="directory to benchmark in (with --cluster: an fs3 path, default /)",
    )
    p.add_argument(
        "--big-file-size", default="1G", help="size of each thread's big file (default 1G; 0 skips)"
    )
    p.add_argument("--block-size", default="1M", help="I/O size for big files (default 1M)")
    p.add_argument(
        "--small-files",
        type=int,
        default=1000,
        help="number of small files in total (default 1000)",
    )
    p.add_argument(
        "--small-file-size", default="128K", help="size of each small file (default 128K; 0: empty)"
    )
    p.add_argument(
        "--small-fsync", action="store_true", help="also time small-file writes with an fsync each"
    )
    p.add_argument("--threads", "-p", type=int, default=1, help="concurrent workers (default 1)")
    p.add_argument(
        "--rand-read-seconds",
        type=float,
        default=0.0,
        help="time random reads of the big files (0: off)",
    )
    p.add_argument("--rand-read-size", default="4K", help="random read size (default 4K)")
    p.add_argument("--direct", action="store_true", help="O_DIRECT random reads where supported")
    p.add_argument(
        "--no-drop-caches",
        dest="drop_caches",
        action="store_false",
        help="do not drop the page cache before read phases",
    )
    p.add_argument(
        "--cluster", help="cluster file: bench the Python API (fs3.connect) instead of a mount"
    )
    p.add_argument(
        "--transport",
        choices=["auto", "grpc", "tcp", "shm"],
        help="Python API transport (with --cluster)",
    )
    p.add_argument(
        "--usrbio",
        action="store_true",
        help="big files through USRBIO rings (PATH on an fs3 mount)",
    )
    p.add_argument(
        "--iodepth", type=int, default=8, help="USRBIO: sequential blocks in flight (default 8)"
    )
    p.add_argument(
        "--rand-iodepth", type=int, default=64, help="USRBIO: random reads in flight (default 64)"
    )
    p.add_argument("--phases", help=f"comma-separated subset of: {','.join(PHASES)}")
    p.add_argument("--keep", action="store_true", help="keep the files (default: remove them)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress display")
    return p


def options_from_args(a: argparse.Namespace) -> BenchOptions:
    if a.path is None and not a.cluster:
        raise ValueError("give a PATH to benchmark in (or --cluster FILE for the Python API)")
    opts = BenchOptions(
        path=a.path if a.path is not None else "/",
        big_file_size=parse_size(a.big_file_size),
        block_size=parse_size(a.block_size),
        small_files=a.small_files,
        small_file_size=parse_size(a.small_file_size),
        small_fsync=a.small_fsync,
        threads=a.threads,
        rand_read_seconds=a.rand_read_seconds,
        rand_read_size=parse_size(a.rand_read_size),
        direct=a.direct,
        drop_caches=a.drop_caches,
        cluster=a.cluster,
        transport=a.transport,
        usrbio=a.usrbio,
        iodepth=a.iodepth,
        rand_iodepth=a.rand_iodepth,
        keep=a.keep,
        phases=tuple(x.strip() for x in a.phases.split(",") if x.strip()) if a.phases else PHASES,
    )
    if opts.transport and not opts.cluster:
        raise ValueError(
            "--transport applies to --cluster (a mount's transport is chosen when mounting)"
        )
    if not opts.cluster and not os.path.isdir(opts.path):
        raise ValueError(f"{opts.path} is not a directory")
    opts.validate()
    return opts


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        opts = options_from_args(a)
    except ValueError as e:
        print(f"fs3 bench: {e}", file=sys.stderr)
        return 2
    progress = Progress(enabled=not a.quiet)
    try:
        result = run_bench(opts, progress)
    except KeyboardInterrupt:
        print("fs3 bench: interrupted (files removed)", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - one clear line, not a traceback, for an I/O failure
        print(f"fs3 bench: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
