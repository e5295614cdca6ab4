"""FUSE benchmark: fio and metadata ops on an fs3 mount and on a local-disk directory, in one run.

Jobs, each run on the fs3 mount and on the local directory:

* ``seq-write``: 1 GiB sequential write, 1 MiB blocks, fsync at the end;
* ``seq-read``: the same file read back (page cache dropped first when root);
* ``rand-read-4k``: 4 KiB random reads of that file (time-limited);
* ``checkpoint``: 4 jobs × 256 MiB, 4 MiB blocks, fsync at the end (checkpoint-like);
* ``meta``: create / stat / unlink of 5,000 files (one process, ops/s).

Usage::

    python benchmarks/fuse_fio.py --start                 # start a local cluster + mount, then bench
    python benchmarks/fuse_fio.py --mount /mnt/fs3        # an existing mount
    python benchmarks/fuse_fio.py --start --quick         # 256 MiB / 64 MiB per job / 1,000 files

Prints one line per job with MB/s (or IOPS, ops/s) for fs3 and local and the
ratio fs3/local, and writes the same as JSON with ``--json FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


def drop_caches() -> None:
    if os.geteuid() == 0:
        subprocess.run(["sync"], check=False)
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        except OSError:
            pass


def fio(directory: Path, name: str, *args: str) -> dict[str, Any]:
    cmd = [
        "fio",
        f"--name={name}",
        f"--directory={directory}",
        "--output-format=json",
        "--ioengine=psync",
        "--group_reporting",
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"fio {name} failed: {r.stderr or r.stdout}")
    text = r.stdout[r.stdout.index("{") :]
    job = json.loads(text)["jobs"][0]
    return {
        "read_MBps": job["read"]["bw_bytes"] / 1e6,
        "write_MBps": job["write"]["bw_bytes"] / 1e6,
        "read_iops": job["read"]["iops"],
        "write_iops": job["write"]["iops"],
        "runtime_s": max(job["read"]["runtime"], job["write"]["runtime"]) / 1000,
    }


def meta_ops(directory: Path, n: int) -> dict[str, float]:
    d = directory / f"meta-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    for i in range(n):
        os.close(os.open(d / f"f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    t1 = time.perf_counter()
    for i in range(n):
        os.stat(d / f"f{i}")
    t2 = time.perf_counter()
    for i in range(n):
        os.unlink(d / f"f{i}")
    t3 = time.perf_counter()
    d.rmdir()
    out["create_ops"] = n / (t1 - t0)
    out["stat_ops"] = n / (t2 - t1)
    out["unlink_ops"] = n / (t3 - t2)
    return out


def run_suite(
    directory: Path, size_mb: int, ckpt_mb: int, files: int, rand_s: int
) -> dict[str, float]:
    res: dict[str, float] = {}
    w = fio(directory, "seqfile", "--rw=write", "--bs=1m", f"--size={size_mb}m", "--end_fsync=1")
    res["seq_write_MBps"] = w["write_MBps"]
    drop_caches()
    r = fio(directory, "seqfile", "--rw=read", "--bs=1m", f"--size={size_mb}m")
    res["seq_read_MBps"] = r["read_MBps"]
    drop_caches()
    rr = fio(
        directory,
        "seqfile",
        "--rw=randread",
        "--bs=4k",
        f"--size={size_mb}m",
        "--time_based",
        f"--runtime={rand_s}",
        "--randseed=6",
    )
    res["rand_read_4k_iops"] = rr["read_iops"]
    for f in directory.glob("seqfile*"):
        f.unlink()
    c = fio(
        directory,
        "ckpt",
        "--rw=write",
        "--bs=4m",
        f"--size={ckpt_mb}m",
        "--numjobs=4",
        "--end_fsync=1",
    )
    res["checkpoint_4x_MBps"] = c["write_MBps"]
    for f in directory.glob("ckpt*"):
        f.unlink()
    res.update(meta_ops(directory, files))
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mount", help="an existing fs3 mount point")
    p.add_argument(
        "--start", action="store_true", help="start a local cluster with a mount for the run"
    )
    p.add_argument("--transport", default="grpc", help="with --start: grpc | tcp | shm")
    p.add_argument(
        "--local", help="local-disk directory to compare with (default: a temp dir under /var/tmp)"
    )
    p.add_argument(
        "--quick", action="store_true", help="smaller sizes (256 MiB, 4 x 64 MiB, 1,000 files)"
    )
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--ckpt-mb", type=int, default=256)
    p.add_argument("--files", type=int, default=5000)
    p.add_argument("--rand-seconds", type=int, default=15)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.size_mb, args.ckpt_mb, args.files, args.rand_seconds = 256, 64, 1000, 10
    if shutil.which("fio") is None:
        print("fio is not installed", file=sys.stderr)
        return 2
    cluster = None
    if args.start:
        from fs3.testing.cluster import ProcessCluster

        base = Path(tempfile.mkdtemp(prefix="fs3-fuse-bench-"))
        cluster = ProcessCluster(
            base / "cluster", mount=str(base / "mnt"), transport=args.transport
        )
        print(f"starting a local cluster in {base} ...", flush=True)
        cluster.start()
        mount = Path(str(cluster.mountpoint))
    elif args.mount:
        mount = Path(args.mount)
    else:
        p.error("pass --mount DIR or --start")
    local_base = (
        Path(args.local)
        if args.local
        else Path(tempfile.mkdtemp(prefix="fs3-local-bench-", dir="/var/tmp"))
    )
    fs3_dir = mount / f"bench-{uuid.uuid4().hex[:8]}"
    fs3_dir.mkdir()
    local_dir = local_base / f"bench-{uuid.uuid4().hex[:8]}"
    local_dir.mkdir(parents=True)
    results: dict[str, dict[str, float]] = {}
    try:
        for label, d in (("fs3", fs3_dir), ("local", local_dir)):
            print(f"running on {label} ({d}) ...", flush=True)
            t0 = time.monotonic()
            results[label] = run_suite(d, args.size_mb, args.ckpt_mb, args.files, args.rand_seconds)
            print(f"  done in {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        shutil.rmtree(fs3_dir, ignore_errors=True)
        shutil.rmtree(local_dir, ignore_errors=True)
        if not args.local:
            shutil.rmtree(local_base, ignore_errors=True)
        if cluster is not None:
            cluster.close()
            shutil.rmtree(cluster.dir.parent, ignore_errors=True)
    print()
    print(
        f"sizes: seq {args.size_mb} MiB (1 MiB blocks), checkpoint 4 x {args.ckpt_mb} MiB (4 MiB blocks, fsync), "
        f"{args.files} files; {os.cpu_count()} cores"
    )
    print(f"{'job':<22} {'fs3':>12} {'local':>12} {'fs3/local':>10}")
    for key in results["fs3"]:
        a, b = results["fs3"][key], results["local"][key]
        print(f"{key:<22} {a:12.1f} {b:12.1f} {a / b if b else 0:10.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
