#!/usr/bin/env python
"""What one metadata operation costs through FUSE, per process: wall time and CPU.

    python benchmarks/fuse_op_cost.py --mount new=/mnt/a:PID --mount old=/mnt/b:PID \\
        [--proc meta-1=PID ...] [--files 1000] [--rounds 3]

For every ``--mount NAME=PATH:DAEMON_PID`` (mounts of any file system: two fs3
daemons of one cluster built from different commits, a no-op pyfuse3 floor, JuiceFS),
one thread runs the suite's metadata phases in a fresh directory: create
(open O_CREAT|O_TRUNC + close), stat, readdir (3 listings; ops = entries),
unlink (after the names' 1 s entry timeout, as in the suite where the
creates take longer than that). The mounts take turns phase by phase within a
round (round i of every mount, then round i+1), so a machine whose speed drifts
skews them alike. Each figure is the median over rounds: ops/s and the CPU
milliseconds per op of the mount's daemon and of every ``--proc`` (e.g. the meta
servers), read from /proc/PID/stat (user + system time), i.e. what each process
spends per op whatever else the machine runs. ``--floor`` names mounts whose file
system has no mkdir (the no-op floor): their files go in the mount's root.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

PHASES = ("create", "stat", "readdir", "unlink")


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def one_round(
    d: str, n: int, watch: list[tuple[str, int]], *, readdir: bool
) -> list[tuple[str, float, dict[str, float]]]:
    """The phases in directory ``d``: (phase, ops/s, {process: CPU ms per op}) each."""
    out: list[tuple[str, float, dict[str, float]]] = []

    def phase(ph: str, fn: Callable[[], None], ops: int) -> None:
        c0 = [cpu_s(pid) for _, pid in watch]
        t = time.perf_counter()
        fn()
        wall = time.perf_counter() - t
        c1 = [cpu_s(pid) for _, pid in watch]
        cpu = {w: 1000 * (b - a) / ops for (w, _), a, b in zip(watch, c0, c1, strict=True)}
        out.append((ph, ops / wall, cpu))

    def create() -> None:
        for i in range(n):
            os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644))

    def stat() -> None:
        for i in range(n):
            os.stat(f"{d}/f{i}")

    def listing() -> None:
        for _ in range(3):
            with os.scandir(d) as it:
                sum(1 for _ in it)

    def unlink() -> None:
        for i in range(n):
            os.unlink(f"{d}/f{i}")

    phase("create", create, n)
    phase("stat", stat, n)
    if readdir:
        phase("readdir", listing, 3 * n)
    time.sleep(1.1)
    phase("unlink", unlink, n)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mount", action="append", required=True, help="NAME=PATH:DAEMON_PID")
    p.add_argument("--proc", action="append", default=[], help="NAME=PID (CPU accounted too)")
    p.add_argument("--floor", action="append", default=[], help="mount NAME without mkdir")
    p.add_argument("--files", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    mounts: list[tuple[str, str, int]] = []
    for m in a.mount:
        name, _, rest = m.partition("=")
        path, _, pid = rest.rpartition(":")
        mounts.append((name, path, int(pid)))
    procs = [(n, int(pid)) for n, _, pid in (x.partition("=") for x in a.proc)]
    n = a.files
    # (mount, phase) -> list of (ops/s, {process: cpu ms/op})
    res: dict[tuple[str, str], list[tuple[float, dict[str, float]]]] = {}
    load0 = Path("/proc/loadavg").read_text().split()[:3]

    for r in range(a.rounds):
        for name, path, dpid in mounts:
            floor = name in a.floor
            d = path if floor else os.path.join(path, f"opcost-{os.getpid()}-{r}")
            if not floor:
                os.mkdir(d)
            for ph, ops_s, cpu in one_round(d, n, [(name, dpid), *procs], readdir=not floor):
                res.setdefault((name, ph), []).append((ops_s, cpu))
            if not floor:
                os.rmdir(d)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    cols = [m[0] for m in mounts]
    print(f"{n} files, median of {a.rounds} rounds; load {' '.join(load0)} -> {' '.join(load1)}\n")
    print("| op | " + " | ".join(f"{c} ops/s" for c in cols) + " | CPU ms per op |")
    print("|---|" + "---:|" * len(cols) + "---|")
    for ph in PHASES:
        cells, cpus = [], []
        for c in cols:
            rs = res.get((c, ph))
            if not rs:
                cells.append("—")
                continue
            cells.append(f"{statistics.median(x[0] for x in rs):,.0f}")
            per = {w: statistics.median(x[1][w] for x in rs) for w in rs[0][1]}
            cpus.append(f"{c}: " + ", ".join(f"{w} {v:.3f}" for w, v in per.items()))
        print(f"| {ph} | " + " | ".join(cells) + " | " + "; ".join(cpus) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
