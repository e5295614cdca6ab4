#!/usr/bin/env python
"""Parallel metadata clients: does create throughput grow with clients?

    python benchmarks/meta_parallel.py [--files 500] [--clients 1,2,4] [--runs 3]

One fresh local cluster (3 storage nodes, 3 replicas, 2 meta servers, SQLite KV,
fsync on), four FUSE mounts of it (the launcher's and three ``fs3 mount
--foreground``), and for each client count k: k client processes started
together (a barrier), each creating ``--files`` empty files (open O_CREAT|O_EXCL
+ close) as fast as it can. Three layouts:

* ``fuse``: client j on FUSE mount j (k <= 4), each in its own directory;
* ``fuse-shared``: the same, all in ONE directory (every create conflicts with
  the others on the parent's entry list and attributes: meta retries them);
* ``api``: k Python API processes (``fs3.connect``), each in its own directory.

Each figure is creates/s over all clients (files / (last finish - first
start)), median of ``--runs`` runs interleaved over the layouts and counts;
with it the meta servers' CPU per create and the errors any client saw (must
be 0: conflicts are retried inside fs3). The files are removed between runs
(untimed). The report goes to ``benchmarks/results/meta-parallel-<date>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run_all import FS3, Cleanup, fs3_up, say, start_fuse, stop_fuse  # noqa: E402

WORKER = r"""
import json, os, sys, time
mode, target, d, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
errors = []
if mode == "api":
    import fs3
    c = fs3.connect(target)
    c.makedirs(d, exist_ok=True)
    def create(p):
        with c.open(p, "xb"):
            pass
    def remove(p):
        c.unlink(p)
else:
    c = None
    d = os.path.join(target, d.lstrip("/"))
    os.makedirs(d, exist_ok=True)
    def create(p):
        os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    def remove(p):
        os.unlink(p)
tag = sys.argv[5]
print("ready", flush=True)
sys.stdin.readline()
t0 = time.time()
for i in range(n):
    try:
        create(f"{d}/{tag}-{i}")
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")
t1 = time.time()
for i in range(n):
    try:
        remove(f"{d}/{tag}-{i}")
    except Exception as e:
        errors.append(f"unlink: {type(e).__name__}: {e}")
print(json.dumps({"t0": t0, "t1": t1, "errors": errors[:5], "n_errors": len(errors)}), flush=True)
if c is not None:
    c.close()
"""


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far (``/proc/stat``; idle and iowait count as idle)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(f[:8])  # user nice system idle iowait irq softirq steal
    return total - f[3] - f[4], total


def one_run(
    mode: str, k: int, n: int, mounts: list[str], cluster_file: str, meta_pids: list[int], run: int
) -> dict[str, Any]:
    procs = []
    for j in range(k):
        if mode == "api":
            target, d = cluster_file, f"/par/api-r{run}-k{k}-w{j}"
        elif mode == "fuse":
            target, d = mounts[j], f"/par/fuse-r{run}-k{k}-w{j}"
        else:
            target, d = mounts[j], f"/par/shared-r{run}-k{k}"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, mode, target, d, str(n), f"w{j}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for p in procs:  # every client connected and ready before any starts
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"{mode} worker did not start: {line!r}")
        cpu0 = [cpu_s(pid) for pid in meta_pids]
        busy0, total0 = machine_jiffies()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=900)
            outs.append(json.loads(out.strip().splitlines()[-1]))
        cpu1 = [cpu_s(pid) for pid in meta_pids]
        busy1, total1 = machine_jiffies()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    wall = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
    total = k * n
    return {
        "creates_s": total / wall,
        # create and the untimed unlink both land in the CPU window: per create + unlink
        "meta_cpu_ms_per_create_unlink": 1000
        * sum(b - a for a, b in zip(cpu0, cpu1, strict=True))
        / total,
        # how many of the machine's cores were busy (anything: fs3, its clients, other work)
        "busy_cores": (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1),
        "errors": sum(o["n_errors"] for o in outs),
        "error_samples": [e for o in outs for e in o["errors"]][:5],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=500, help="files per client per run")
    p.add_argument("--clients", default="1,2,4")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--modes", default="fuse,fuse-shared,api")
    p.add_argument("--transport", default="shm", choices=["grpc", "tcp", "shm"])
    p.add_argument("--out", default=str(HERE / "results"))
    a = p.parse_args(argv)
    counts = [int(x) for x in a.clients.split(",")]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if max(counts) > 4 and any(m.startswith("fuse") for m in modes):
        p.error("at most 4 FUSE clients (one per mount)")
    base = Path(tempfile.mkdtemp(prefix="fs3-par-", dir="/var/tmp"))
    cleanup = Cleanup()
    results: dict[str, dict[int, list[dict[str, Any]]]] = {
        m: {k: [] for k in counts} for m in modes
    }
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    try:
        cluster, mnt = fs3_up(base, a.transport, cleanup)
        mounts = [str(mnt)]
        for j in range(2, 5):
            m = base / f"mnt{j}"
            m.mkdir()
            proc = start_fuse(
                [FS3, "mount", "--cluster", cluster.cluster_file, "--foreground", str(m)],
                str(m),
                base / f"mnt{j}.log",
            )
            cleanup.push(
                f"mount {j}",
                lambda proc=proc, m=m: stop_fuse(proc, str(m), ["fusermount3", "-u", str(m)]),
            )
            mounts.append(str(m))
        meta_pids = [cluster.pid(n) for n in cluster.names if n.startswith("meta")]
        for run in range(a.runs):
            for k in counts:
                for mode in modes:
                    r = one_run(mode, k, a.files, mounts, cluster.cluster_file, meta_pids, run)
                    results[mode][k].append(r)
                    load = Path("/proc/loadavg").read_text().split()[0]
                    say(
                        f"run {run + 1}/{a.runs} {mode} x{k}: {r['creates_s']:.0f} creates/s, "
                        f"meta CPU {r['meta_cpu_ms_per_create_unlink']:.2f} ms per create+unlink, "
                        f"{r['busy_cores']:.2f} of {os.cpu_count()} cores busy, "
                        f"errors {r['errors']} (load {load})"
                    )
    finally:
        cleanup.run_all()
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    cmd = "python benchmarks/meta_parallel.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"# fs3 parallel metadata clients — {started}",
        "",
        f"Command: `{cmd.strip()}`",
        "",
        f"Load average (1/5/15 min) at start {' '.join(load0)}, at end {' '.join(load1)} "
        "(2 cores shared with other work: the absolute figures swing, compare within a column).",
        "",
        f"Cluster: 3 storage nodes, 3 replicas, 2 meta servers, SQLite KV with fsync, transport "
        f"{a.transport}; 4 FUSE mounts with default options. {a.files} empty files per client per run "
        f"(create = open O_CREAT|O_EXCL + close); median of {a.runs} runs (min–max).",
        "",
        "| layout | clients | creates/s (all clients) | vs 1 client (medians) | vs 1 client (median of same-round ratios) | meta CPU ms per create+unlink | cores busy (machine) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    summary: dict[str, Any] = {}
    for mode in modes:
        one = None
        for k in counts:
            rs = results[mode][k]
            if not rs:
                continue
            v = [r["creates_s"] for r in rs]
            med = statistics.median(v)
            one = med if k == counts[0] else one
            cpu = statistics.median(r["meta_cpu_ms_per_create_unlink"] for r in rs)
            busy = statistics.median(r["busy_cores"] for r in rs)
            firsts = results[mode][counts[0]]
            paired = statistics.median(
                r["creates_s"] / f["creates_s"] for r, f in zip(rs, firsts, strict=False)
            )
            errs = sum(r["errors"] for r in rs)
            ratio = med / one if one else None
            summary.setdefault(mode, {})[k] = {
                "creates_s": med,
                "runs": v,
                "ratio_vs_first": ratio,
                "meta_cpu_ms": cpu,
                "ratio_same_round": paired,
                "busy_cores": busy,
                "errors": errs,
                "error_samples": [e for r in rs for e in r["error_samples"]][:5],
            }
            lines.append(
                f"| {mode} | {k} | {med:,.0f} ({min(v):,.0f}–{max(v):,.0f}) | "
                f"{'—' if ratio is None else f'{ratio:.2f}'} | {paired:.2f} | {cpu:.2f} | "
                f"{busy:.2f} of {os.cpu_count()} | {errs} |"
            )
    md = "\n".join(lines) + "\n"
    print(md)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"meta-parallel-{stamp}.md").write_text(md)
    (out / f"meta-parallel-{stamp}.json").write_text(
        json.dumps({"date": started, "command": cmd, "summary": summary}, indent=2) + "\n"
    )
    say(f"report written to {out}/meta-parallel-{stamp}.md/.json")
    errors = sum(v["errors"] for m in summary.values() for v in m.values())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
