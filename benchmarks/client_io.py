#!/usr/bin/env python
"""Client I/O benchmark: every client path of fs3 against the local disk, in one run.

For the same SIZE (default 1 GiB), on one host:

(a) the Python file API (:func:`fs3.connect`), transport shm by default
    (``--transports shm tcp grpc`` adds rows): SIZE written in 1 MiB ``write``
    calls + ``fsync``, read back in 1 MiB ``readinto`` calls, then 4 KiB
    random reads one at a time (``seek`` + ``readinto``) for
    ``--rand-seconds``, and the same with ``--rand-threads`` threads (one
    file handle each, same file);
(b) USRBIO through a FUSE mount of the cluster whose client transport is shm;
(c) USRBIO through a second FUSE mount of the same cluster with
    ``-o transport=tcp``. Both with the suite's workload
    (``benchmarks/run_all.py:usrbio_workload``, i.e. ``fs3 bench --usrbio``):
    1 MiB blocks, 8 in flight, fsync at the end; 4 KiB random reads with 64
    in flight;
(d) ``os.pwrite``/``os.pread`` on a file on the local disk the cluster keeps
    its data on, single-threaded (the reference of every ratio), plus (d')
    ``os.pread`` random reads from ``--rand-threads`` threads, so the ratios of
    the rows that keep several reads in flight can be read honestly.

The page cache is dropped (``sync; echo 3 > /proc/sys/vm/drop_caches``, when
root) before every read phase; the local file is also
``posix_fadvise(DONTNEED)``-ed. fs3's storage servers read their chunk files
through the same page cache, so every row starts cold. Each FUSE mount is up
only while its row runs (2 cores: an idle daemon is not free).

Prints MiB/s (write, read), 4 KiB IOPS and each row's ratio to (d) and (d');
``--json FILE`` writes the same figures. By default it starts its own cluster
(:class:`fs3.testing.cluster.ProcessCluster`: 3 storage nodes x 1 target, 3
replicas, fsync on, storage forwarding over shm); ``--cluster-file`` uses a
running one (then give ``--local-dir`` on the disk that cluster stores on).
Every process and mount it starts is stopped on exit, on error and on SIGTERM.

    /work/venv/bin/python benchmarks/client_io.py                       # 1 GiB, 10 s random reads
    /work/venv/bin/python benchmarks/client_io.py --size-mib 64 --rand-seconds 3
    /work/venv/bin/python benchmarks/client_io.py --transports shm tcp grpc --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# run_all.py (next to this script) owns the FUSE-mount helpers and the USRBIO workload of the
# suite; importing them keeps this script and the suite measuring the same way.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_all import FS3, start_fuse, stop_fuse, usrbio_workload  # noqa: E402

from fs3.cli.bench import ClientFS, _run_threads, drop_caches, percentile  # noqa: E402

MiB = 1 << 20
RAND = 4096


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- file backends


class LocalFile:
    """A local fd driven with os.pwrite/os.pread (the baseline of every client path)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pos = 0

    def write(self, buf: memoryview) -> None:
        while buf:
            n = os.pwrite(self.fd, buf, self.pos)
            self.pos += n
            buf = buf[n:]

    def readinto(self, buf: memoryview) -> int:
        data = os.pread(self.fd, len(buf), self.pos)
        n = len(data)
        buf[:n] = data
        self.pos += n
        return n

    def pread(self, buf: memoryview, offset: int) -> int:
        data = os.pread(self.fd, len(buf), offset)
        buf[: len(data)] = data
        return len(data)

    def fsync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class LocalFS:
    """A directory on the local disk; :meth:`uncache` evicts a file from the page cache."""

    def open_write(self, path: str) -> LocalFile:
        return LocalFile(os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600))

    def open_read(self, path: str, *, random_access: bool = False) -> LocalFile:
        fd = os.open(path, os.O_RDONLY)
        if random_access:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # as `fs3 bench` and fio do
        return LocalFile(fd)

    def uncache(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- workloads


class Run:
    """Shared state of one run: sizes, the data block, whether caches could be dropped."""

    def __init__(self, size: int, rand_s: float, threads: int, seed: int) -> None:
        self.size = size
        self.rand_s = rand_s
        self.threads = threads
        self.seed = seed
        self.block = memoryview(random.Random(seed).randbytes(MiB))
        self.cache_dropped = True

    def cold(self, fs: Any, path: str) -> None:
        """Make the next read cold: drop the page cache (and fadvise the local file)."""
        self.cache_dropped = drop_caches() and self.cache_dropped
        if isinstance(fs, LocalFS):
            fs.uncache(path)

    def seq_write(self, fs: Any, path: str) -> float:
        """MiB/s of SIZE in 1 MiB writes, the final fsync included (close is not timed)."""
        f = fs.open_write(path)
        try:
            t0 = time.perf_counter()
            for _ in range(self.size // MiB):
                f.write(self.block)
            f.fsync()
            secs = time.perf_counter() - t0
        finally:
            f.close()
        return self.size / MiB / secs

    def seq_read(self, fs: Any, path: str) -> float:
        """MiB/s of reading the file back in 1 MiB reads; checks the length and the bytes."""
        self.cold(fs, path)
        buf = memoryview(bytearray(MiB))
        f = fs.open_read(path)
        total = 0
        bad = -1
        try:
            t0 = time.perf_counter()
            while True:
                n = f.readinto(buf)
                if n <= 0:
                    break
                if bad < 0 and buf[:n] != self.block[:n]:  # ~0.1 ms/MiB: noise next to the I/O
                    bad = total
                total += n
            secs = time.perf_counter() - t0
        finally:
            f.close()
        if total != self.size:
            raise OSError(f"read back {total} of {self.size} bytes of {path}")
        if bad >= 0:
            raise OSError(f"{path}: the data read back at offset {bad} is not what was written")
        return total / MiB / secs

    def rand_read(self, fs: Any, path: str, threads: int) -> dict[str, float]:
        """4 KiB reads at random aligned offsets for rand_s, one at a time per thread."""
        self.cold(fs, path)
        slots = self.size // RAND

        def work(i: int) -> list[float]:
            rng = random.Random(self.seed * 1000 + i)
            buf = memoryview(bytearray(RAND))
            lat: list[float] = []
            f = fs.open_read(path, random_access=True)
            try:
                end = time.perf_counter() + self.rand_s
                while True:
                    t = time.perf_counter()
                    if t >= end:
                        break
                    off = rng.randrange(slots) * RAND
                    if f.pread(buf, off) != RAND:
                        raise OSError(f"short 4 KiB read at {off} of {path}")
                    lat.append(time.perf_counter() - t)
                    b = off % MiB
                    if len(lat) <= 64 and buf != self.block[b : b + RAND]:  # spot check
                        raise OSError(f"{path}: wrong bytes at offset {off}")
            finally:
                f.close()
            return lat

        wall, lats = _run_threads(threads, work)
        lats.sort()
        return {
            "iops": len(lats) / wall,
            "p50_ms": percentile(lats, 50) * 1000,
            "p99_ms": percentile(lats, 99) * 1000,
        }

    def file_rows(
        self, fs: Any, path: str, name: str, label: str, threads_name: str, threads_label: str
    ) -> list[dict[str, Any]]:
        """The sequential (+ 1-thread random) row and the threaded random-read row of one path."""
        try:
            say(f"{label}: sequential write")
            w = self.seq_write(fs, path)
            say(f"{label}: sequential read")
            r = self.seq_read(fs, path)
            say(f"{label}: 4 KiB random reads, 1 at a time")
            one = self.rand_read(fs, path, 1)
            say(f"{label}: 4 KiB random reads, {self.threads} threads")
            many = self.rand_read(fs, path, self.threads)
        finally:
            with contextlib.suppress(OSError):
                fs.unlink(path)
        return [
            row(name, label, w, r, one["iops"], 1, "1 thread", one),
            row(
                threads_name,
                threads_label,
                None,
                None,
                many["iops"],
                self.threads,
                f"{self.threads} threads x 1",
                many,
            ),
        ]


def row(
    name: str,
    label: str,
    write: float | None,
    read: float | None,
    iops: float,
    inflight: int,
    how: str,
    lat: dict[str, float] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": name,
        "label": label,
        "write_MiBps": None if write is None else round(write, 2),
        "read_MiBps": None if read is None else round(read, 2),
        "rand4k_iops": round(iops, 1),
        "rand4k_in_flight": inflight,
        "rand4k_how": how,
    }
    if lat:
        out["rand4k_p50_ms"] = round(lat["p50_ms"], 4)
        out["rand4k_p99_ms"] = round(lat["p99_ms"], 4)
    return out


# --------------------------------------------------------------------------- mounts and the cluster


@contextlib.contextmanager
def fuse_mount(cluster_file: str, mountpoint: str, transport: str, log: Path) -> Iterator[str]:
    """``fs3 mount -o transport=T --foreground`` as our child; unmounted and reaped on leaving."""
    os.makedirs(mountpoint, exist_ok=True)
    cmd = [
        FS3,
        "mount",
        "--cluster",
        cluster_file,
        "-o",
        f"transport={transport}",
        "--foreground",
        mountpoint,
    ]
    proc = start_fuse(cmd, mountpoint, log)
    try:
        yield mountpoint
    finally:
        stop_fuse(proc, mountpoint, ["fusermount3", "-u", mountpoint])
        with contextlib.suppress(OSError):
            os.rmdir(mountpoint)


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# --------------------------------------------------------------------------- output


def _f(v: float | None, nd: int = 1) -> str:
    return "—" if v is None else f"{v:,.{nd}f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def add_ratios(rows: list[dict[str, Any]], local_id: str, local_threads_id: str) -> None:
    by = {r["id"]: r for r in rows}
    d, dn = by.get(local_id), by.get(local_threads_id)
    for r in rows:
        r["ratio_to_d"] = {
            k: None if d is None else _r3(_ratio(r[f], d[f]))
            for k, f in (
                ("write", "write_MiBps"),
                ("read", "read_MiBps"),
                ("rand4k_iops", "rand4k_iops"),
            )
        }
        r["iops_ratio_to_d_threads"] = (
            None if dn is None else _r3(_ratio(r["rand4k_iops"], dn["rand4k_iops"]))
        )


def _r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def render(result: dict[str, Any]) -> str:
    p = result["params"]
    th = p["rand_threads"]
    cols = [
        "path",
        "write MiB/s",
        "read MiB/s",
        "4K IOPS",
        "4K in flight",
        "w/(d)",
        "r/(d)",
        "IOPS/(d)",
        "IOPS/(d')",
    ]
    body = []
    for r in result["rows"]:
        rd = r["ratio_to_d"]
        body.append(
            [
                r["label"],
                _f(r["write_MiBps"]),
                _f(r["read_MiBps"]),
                _f(r["rand4k_iops"], 0),
                r["rand4k_how"],
                _f(rd["write"], 3),
                _f(rd["read"], 3),
                _f(rd["rand4k_iops"], 3),
                _f(r["iops_ratio_to_d_threads"], 3),
            ]
        )
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    cache = (
        "page cache dropped before every read phase"
        if result["cache_dropped"]
        else "page cache NOT dropped (not root): reads may come from memory"
    )
    out = [
        "",
        f"fs3 client I/O, {p['size_mib']} MiB sequential in 1 MiB calls (fsync at end of the write), "
        f"4 KiB random reads for {p['rand_seconds']:g} s; {p['replicas']} replicas, one host; {cache}.",
        f"(d) = local os.pwrite/os.pread, 1 thread; (d') = local os.pread, {th} threads. "
        "USRBIO rows: 8 x 1 MiB in flight sequential, 64 in flight random.",
        "Random reads start cold but go through the page cache (local file, and fs3's chunk files on "
        "its storage servers): a file smaller than RAM warms up as the phase runs, so IOPS rise with "
        "--rand-seconds and fall with SIZE; local (d) warms fastest (one copy, no replicas).",
        "",
        line(cols),
        line(["-" * w for w in widths]),
        *(line(b) for b in body),
    ]
    if result["errors"]:
        out += ["", "errors (rows missing above):"] + [f"  {e}" for e in result["errors"]]
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size-mib", type=int, default=1024, help="file size (default 1024 = 1 GiB)")
    ap.add_argument(
        "--rand-seconds", type=float, default=10.0, help="duration of each 4 KiB random-read phase"
    )
    ap.add_argument(
        "--rand-threads",
        type=int,
        default=4,
        help="threads of the threaded random-read rows (file API and local (d'); default 4)",
    )
    ap.add_argument(
        "--transports",
        nargs="+",
        default=["shm"],
        choices=["shm", "tcp", "grpc"],
        help="file API rows (a), one per transport (default: shm)",
    )
    ap.add_argument(
        "--usrbio-transports",
        nargs="*",
        default=["shm", "tcp"],
        choices=["shm", "tcp", "grpc"],
        help="USRBIO rows (b)/(c): one FUSE mount each with -o transport=T (default: shm tcp)",
    )
    ap.add_argument("--cluster-file", help="use this running cluster instead of starting one")
    ap.add_argument(
        "--cluster-transport",
        default="shm",
        choices=["shm", "tcp", "grpc"],
        help="transport of the cluster this script starts (storage-to-storage forwarding; default shm)",
    )
    ap.add_argument(
        "--local-dir",
        help="directory for the local baseline (d) (default: the cluster's directory, on its data disk)",
    )
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    a = ap.parse_args(argv)
    if a.size_mib < 1:
        ap.error("--size-mib must be >= 1")
    if a.rand_seconds <= 0:
        ap.error("--rand-seconds must be > 0")
    if a.rand_threads < 1:
        ap.error("--rand-threads must be >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    size = a.size_mib * MiB
    run = Run(size, a.rand_seconds, a.rand_threads, a.seed)
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    if os.geteuid() != 0:
        say("warning: not root: the page cache cannot be dropped and FUSE may need permissions")

    def on_term(signum: int, _frame: Any) -> None:
        os.write(2, f"signal {signum}: stopping, unmounting and cleaning up\n".encode())
        raise SystemExit(128 + signum)  # unwinds through every cleanup below

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    tag = uuid.uuid4().hex[:8]

    def attempt(what: str, fn: Callable[[], list[dict[str, Any]]], log: Path | None = None) -> None:
        """A failed row is reported (and the run's exit code says so), the others still run."""
        try:
            rows.extend(fn())
        except Exception as e:  # noqa: BLE001 - one row failing must not hide the others
            msg = f"{what}: {type(e).__name__}: {e}"
            errors.append(msg)
            say(f"FAILED {msg}")
            if log is not None and log.exists():
                print(f"--- last lines of {log} ---\n{_tail(log)}", file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        if a.cluster_file:
            cluster_file = a.cluster_file
            scratch = Path(tempfile.mkdtemp(prefix=f"fs3-client-io-{tag}-"))
            stack.callback(shutil.rmtree, scratch, True)
            local_dir = a.local_dir or str(scratch)
            logs = scratch
        else:
            from fs3.testing.cluster import ProcessCluster

            cluster = ProcessCluster(
                storage_nodes=3,
                targets_per_node=1,
                replicas=a.replicas,
                meta=1,
                mgmtd=1,
                transport=a.cluster_transport,
                start_timeout_s=180,
            )
            say(
                f"starting a cluster in {cluster.dir} (3 storage nodes, {a.replicas} replicas, "
                f"transport {a.cluster_transport}, fsync on)"
            )
            try:
                cluster.start()
            except Exception:
                cluster.close(failed=True)  # keeps the logs and says where
                raise
            except BaseException:
                cluster.close()
                raise
            stack.callback(cluster.close)
            cluster_file = cluster.cluster_file
            scratch = cluster.dir
            local_dir = a.local_dir or str(cluster.dir)
            logs = cluster.dir / "logs"

        # (d) first: the reference, measured while the cluster is idle
        local = LocalFS()
        lpath = os.path.join(local_dir, f"client-io-local-{tag}")
        attempt(
            "(d) local",
            lambda: run.file_rows(
                local,
                lpath,
                "d_local",
                "(d) local os.pwrite/os.pread",
                "d_local_threads",
                f"(d') local os.pread, {a.rand_threads} threads",
            ),
        )

        for kind in a.transports:

            def file_api(kind: str = kind) -> list[dict[str, Any]]:
                fs = ClientFS(cluster_file, kind)
                try:
                    return run.file_rows(
                        fs,
                        f"/client-io-{tag}-{kind}",
                        f"a_file_api_{kind}",
                        f"(a) file API {kind}",
                        f"a_file_api_{kind}_threads",
                        f"(a) file API {kind}, {a.rand_threads} threads",
                    )
                finally:
                    fs.close()

            attempt(f"(a) file API {kind}", file_api)

        for kind in a.usrbio_transports:
            letter = {"shm": "(b) ", "tcp": "(c) "}.get(kind, "")
            label = f"{letter}USRBIO, {kind} mount"
            log = logs / f"client-io-fuse-{kind}.log"

            def usrbio(
                kind: str = kind, label: str = label, log: Path = log
            ) -> list[dict[str, Any]]:
                mnt = str(scratch / f"mnt-{kind}-{tag}")
                say(f"{label}: mounting {mnt} (-o transport={kind})")
                with fuse_mount(cluster_file, mnt, kind, log):
                    say(f"{label}: write, read, random reads (fs3 bench --usrbio workload)")
                    u = usrbio_workload(mnt, size, a.rand_seconds)
                return [
                    row(
                        f"usrbio_{kind}",
                        label,
                        u["usrbio_seq_write"],
                        u["usrbio_seq_read"],
                        u["usrbio_rand_read_4k"],
                        64,
                        "64 in flight",
                    )
                ]

            attempt(label, usrbio, log)
        say("done; cleaning up")

    add_ratios(rows, "d_local", "d_local_threads")
    rows.sort(key=lambda r: bool(r["id"].startswith("d_")))  # stable: (a), (b), (c), then (d), (d')
    result: dict[str, Any] = {
        "tool": "benchmarks/client_io.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "cores": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "command": " ".join(
            [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
        ),
        "params": {
            "size_mib": a.size_mib,
            "rand_seconds": a.rand_seconds,
            "rand_threads": a.rand_threads,
            "replicas": a.replicas,
            "transports": a.transports,
            "usrbio_transports": a.usrbio_transports,
            "cluster": a.cluster_file or f"fresh ProcessCluster, transport {a.cluster_transport}",
            "usrbio_in_flight": {"sequential": 8, "random": 64},
            "seed": a.seed,
        },
        "cache_dropped": run.cache_dropped,
        "rows": rows,
        "errors": errors,
    }
    if rows:
        print(render(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
        say(f"figures written to {a.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
