#!/usr/bin/env python3
"""The read half of the benchmark suite, interleaved, with each process's CPU per GiB.

Why beside ``run_all.py``: the read targets (FUSE sequential read >= 1.0x
JuiceFS, FUSE 4 KiB random read >= 0.5x JuiceFS IOPS, USRBIO sequential read >=
0.8x the local disk, USRBIO 4 KiB random read with 64 in flight >= 0.5x the
local disk's O_DIRECT IOPS) need many short rounds on a shared host, and the
next bottleneck shows in CPU, not in throughput. It reuses run_all's pieces
(fio jobs, cache dropping, mounts, the USRBIO workload) on the same setup: fs3
``ProcessCluster`` with 3 storage nodes x 2 targets, 3 replicas, fsync on and
the shipped default transport, mounted with FUSE; JuiceFS on SQLite with
local-directory object storage; a plain directory on the same disk.

Each round runs, in turn for local / fs3 FUSE / JuiceFS: a sequential read of
the file (1 MiB blocks) and 4 KiB random reads (4 jobs, O_DIRECT) after dropping
the page cache; then the USRBIO workload through the fs3 mount (sequential write
and read with 1 MiB x 8 in flight, 4 KiB random reads with 64 in flight). Every
figure is the median of ``--runs`` rounds. For the fs3 workloads the CPU seconds
each process (FUSE daemon with the USRBIO agent, each storage node, meta)
spent, divided by the GiB the workload moved, come from /proc/<pid>/stat.

Usage: python benchmarks/read_path.py [--size 1G] [--runs 3] [--rand-seconds 10]
       [--transport auto] [--out benchmarks/results/read-path-DATE.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_all import (  # noqa: E402
    Cleanup,
    Workloads,
    juicefs_up,
    machine_info,
    say,
    usrbio_workload,
)
from storage_io import cpu_seconds  # noqa: E402

from fs3.cli.bench import parse_size  # noqa: E402

GiB = 1 << 30


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def measured(
    fn: Any, pids: dict[str, int], moved: Any
) -> tuple[dict[str, float], dict[str, float]]:
    """Run ``fn`` and return (its figures, CPU seconds per GiB moved per process)."""
    before = cpu_snapshot(pids)
    figs = fn()
    after = cpu_snapshot(pids)
    gib = moved(figs) / GiB
    return figs, {k: (after[k] - before[k]) / gib for k in pids if gib > 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rand-seconds", type=float, default=10.0)
    ap.add_argument("--transport", default="auto", choices=["auto", "grpc", "tcp", "shm"])
    ap.add_argument("--workdir", default="/var/tmp")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    size = parse_size(a.size)
    base = Path(tempfile.mkdtemp(prefix="fs3-read-bench-", dir=a.workdir))
    machine = machine_info(base)
    load_start = os.getloadavg()
    cleanup = Cleanup()
    runs: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}

    def add(system: str, figs: dict[str, float]) -> None:
        for k, v in figs.items():
            runs.setdefault(system, {}).setdefault(k, []).append(round(float(v), 3))
        say(f"{system}: " + ", ".join(f"{k}={v:.1f}" for k, v in figs.items()))

    def add_cpu(fig: str, per: dict[str, float]) -> None:
        for k, v in per.items():
            cpu.setdefault(fig, {}).setdefault(k, []).append(round(v, 3))

    def wl(d: Path) -> Workloads:
        d.mkdir(parents=True, exist_ok=True)
        return Workloads(str(d), size, a.rand_seconds, 0, 0, 0)

    try:
        from fs3.testing.cluster import ProcessCluster

        cdir, mnt = base / "fs3", base / "fs3-mnt"
        mnt.mkdir()
        say(f"fs3: cluster up (3 storage nodes x 2 targets, 3 replicas, transport {a.transport})")
        cluster = ProcessCluster(
            cdir,
            storage_nodes=3,
            replicas=3,
            transport=a.transport,
            mount=str(mnt),
            start_timeout_s=180,
        )
        cleanup.push("fs3 cluster", lambda: cluster.close())
        cluster.start()
        pids = {
            n: cluster.pid(n) for n in cluster.names if n.startswith(("storage", "meta", "fuse"))
        }
        jmnt = juicefs_up(base, cleanup)
        systems = {
            "local": wl(base / "local"),
            "fs3_fuse": wl(mnt / "bench"),
            "juicefs": wl(jmnt / "bench"),
        }
        for name, w in systems.items():
            say(f"{name}: writing the {a.size} file")
            w.seq_write()
        for r in range(a.runs):
            say(f"round {r + 1}/{a.runs} (load {os.getloadavg()[0]:.2f})")
            for name, w in systems.items():
                if name == "fs3_fuse":
                    figs, per = measured(w.seq_read, pids, lambda f: size)
                    add_cpu("fuse_seq_read", per)
                    add(name, figs)
                    figs, per = measured(
                        w.rand_read, pids, lambda f: f["rand_read_4k"] * a.rand_seconds * 4096
                    )
                    add_cpu("fuse_rand_read_4k", per)
                    add(name, figs)
                else:
                    add(name, w.seq_read())
                    add(name, w.rand_read())
            before = cpu_snapshot(pids)
            t0 = time.monotonic()
            figs = usrbio_workload(str(mnt), size, a.rand_seconds)
            after = cpu_snapshot(pids)
            add("fs3_usrbio", figs)
            # the USRBIO run writes, reads and random-reads: CPU per GiB over all it moved
            moved = 2 * size + figs["usrbio_rand_read_4k"] * a.rand_seconds * 4096
            add_cpu("usrbio_all_phases", {k: (after[k] - before[k]) / (moved / GiB) for k in pids})
            say(f"usrbio round took {time.monotonic() - t0:.0f}s")
        for w in systems.values():
            w.finish()
    finally:
        cleanup.run_all()
        shutil.rmtree(base, ignore_errors=True)
    load_end = os.getloadavg()

    def med(system: str, fig: str) -> float | None:
        v = runs.get(system, {}).get(fig)
        return statistics.median(v) if v else None

    def cell(system: str, fig: str) -> str:
        v = runs.get(system, {}).get(fig)
        if not v:
            return "—"
        return f"{statistics.median(v):,.1f} ({min(v):,.1f}–{max(v):,.1f})"

    def ratio(x: float | None, y: float | None) -> str:
        return "—" if x is None or not y else f"{x / y:.2f}"

    lines = [
        f"# fs3 read path — {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        "",
        "Command: `python benchmarks/read_path.py "
        + " ".join(argv if argv is not None else sys.argv[1:])
        + "`",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores; disk `{machine['disk']}`; "
        f"fs3 {machine.get('fs3_commit', '?')}. Load average (1/5/15 min) at start "
        f"{' '.join(f'{x:.2f}' for x in load_start)}, at end {' '.join(f'{x:.2f}' for x in load_end)}.",
        "",
        f"Setup: fs3 with 3 storage nodes x 2 targets and **3 replicas** (fsync before ack), transport "
        f"`{a.transport}`, FUSE mount; JuiceFS and the local disk keep **one** copy. Each cell: median "
        f"of {a.runs} (min–max); page cache dropped before every FUSE/local read; 4 KiB random reads "
        "with O_DIRECT (4 jobs); USRBIO: 1 MiB x 8 in flight, 4 KiB x 64 in flight.",
        "",
        "| workload | unit | local disk | fs3 | JuiceFS | fs3 / local | fs3 / JuiceFS |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for fig, unit, what in (
        ("seq_read", "MiB/s", f"FUSE seq read {a.size}, 1 MiB blocks"),
        ("rand_read_4k", "IOPS", f"FUSE 4 KiB random read, 4 jobs, {a.rand_seconds:g}s"),
    ):
        f3 = med("fs3_fuse", fig)
        lines.append(
            f"| {what} | {unit} | {cell('local', fig)} | {cell('fs3_fuse', fig)} | "
            f"{cell('juicefs', fig)} | {ratio(f3, med('local', fig))} | {ratio(f3, med('juicefs', fig))} |"
        )
    for fig, base_fig, unit, what in (
        ("usrbio_seq_read", "seq_read", "MiB/s", f"USRBIO seq read {a.size}, 1 MiB x 8"),
        ("usrbio_rand_read_4k", "rand_read_4k", "IOPS", "USRBIO 4 KiB random read, 64 in flight"),
        ("usrbio_seq_write", "", "MiB/s", f"USRBIO seq write {a.size}, 1 MiB x 8 (3 replicas)"),
    ):
        f3 = med("fs3_usrbio", fig)
        loc = med("local", base_fig) if base_fig else None
        lines.append(
            f"| {what} | {unit} | {cell('local', base_fig) if base_fig else '—'} | "
            f"{cell('fs3_usrbio', fig)} | — | {ratio(f3, loc)} | — |"
        )
    lines += ["", "CPU seconds per GiB moved, per process (median of the rounds):", ""]
    procs = sorted({p for per in cpu.values() for p in per})
    lines.append("| workload | " + " | ".join(procs) + " |")
    lines.append("|---|" + "---:|" * len(procs))
    for fig, per in cpu.items():
        lines.append(
            f"| {fig} | "
            + " | ".join(f"{statistics.median(per[p]):.2f}" if p in per else "—" for p in procs)
            + " |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)
        Path(a.out).with_suffix(".json").write_text(
            json.dumps({"runs": runs, "cpu_s_per_GiB": cpu, "machine": machine}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
