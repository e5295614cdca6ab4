"""The write path alone: FUSE sequential and checkpoint writes vs the local disk, with CPU cost.

Runs the two write workloads of ``benchmarks/run_all.py`` (fio ``seq_write``:
one file in 1 MiB blocks, ``end_fsync``; ``ckpt_write``: 4 jobs in 4 MiB
blocks, each file fsync'd) on the local disk and on an fs3 FUSE mount of a
local cluster (3 storage nodes x 2 targets, 3 replicas, fsync before
acknowledge), *interleaved* run by run (local, fs3, local, fs3, ...) so the
machine's swings hit both alike, and reports medians and the fs3 / local
ratio. For every fs3 run it also reads each cluster process's CPU time
(``/proc/<pid>/stat`` utime + stime, all threads) before and after, and
reports CPU seconds per GiB written: the daemon (``fuse``), each storage
node, meta and mgmtd; the process that spends most per GiB is the next
bottleneck. The figures are net of each process's idle CPU (measured for
``--idle-seconds`` on the idle cluster, times the run's duration), which
would otherwise make a slow run look expensive.

    .venv/bin/python benchmarks/write_path.py --size 256M --ckpt-size 64M --runs 3

``--py-spy DIR`` records a py-spy profile (``--format raw``, folded stacks)
of the daemon and of storage-1 during the first fs3 seq_write run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from run_all import Workloads, machine_info, say  # noqa: E402

GiB = 1 << 30
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (every thread), in seconds; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of stat(5)


def role_pids(cluster: Any) -> dict[str, int]:
    """Process name -> pid for every cluster process, the FUSE daemon included."""
    out: dict[str, int] = {}
    for name in cluster.names:
        try:
            pid = cluster.pid(name)
        except Exception:  # noqa: BLE001 - a process without a pid (not started)
            continue
        if pid:
            out[name] = pid
    return out


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    from fs3.cli.bench import parse_size
    from fs3.testing.cluster import ProcessCluster

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--size", default="1G", help="seq_write file size")
    p.add_argument("--ckpt-size", default="256M", help="per checkpoint job (4 jobs)")
    p.add_argument("--transport", default="shm", choices=["auto", "grpc", "tcp", "shm"])
    p.add_argument("--workloads", default="seq_write,ckpt_write")
    p.add_argument("--workdir", help="scratch dir on the measured disk (default: temp in /var/tmp)")
    p.add_argument("--py-spy", dest="py_spy", help="directory for py-spy profiles of run 1")
    p.add_argument("--label", default="", help="a name for this build in the output")
    p.add_argument("--idle-seconds", type=float, default=5.0, help="idle CPU sample length")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        help="config override role.section.key=value (e.g. fuse.fuse.writeback_cache=true)",
    )
    p.add_argument("--out", help="write the JSON result here")
    a = p.parse_args(argv)
    size, ckpt = parse_size(a.size), parse_size(a.ckpt_size)
    names = [w.strip() for w in a.workloads.split(",") if w.strip()]
    moved = {"seq_write": size, "ckpt_write": 4 * ckpt}

    base = (
        Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="fs3-wp-", dir="/var/tmp"))
    )
    base.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(SystemExit(128 + s)))
    local_dir, cdir, mnt = base / "local", base / "fs3", base / "fs3-mnt"
    local_dir.mkdir(exist_ok=True)
    mnt.mkdir(exist_ok=True)
    machine = machine_info(base)
    figures: dict[str, dict[str, list[float]]] = {"local": {}, "fs3": {}}
    cpu: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    load: list[str] = [loadavg()]
    max_write = "?"
    overrides: dict[str, dict[str, dict[str, Any]]] = {}
    for item in a.set:
        path, value = item.split("=", 1)
        role, section, key = path.split(".")
        overrides.setdefault(role, {}).setdefault(section, {})[key] = json.loads(value)
    cluster = ProcessCluster(
        cdir,
        storage_nodes=3,
        replicas=3,
        transport=a.transport,
        mount=str(mnt),
        start_timeout_s=180,
        overrides=overrides,
    )
    try:
        say(f"cluster up in {cdir} (transport {a.transport}), mount {mnt}")
        cluster.start()
        fs3_dir = mnt / "bench"
        fs3_dir.mkdir(exist_ok=True)
        wl = Workloads(str(local_dir), size, 1, 0, 0, ckpt)
        wf = Workloads(str(fs3_dir), size, 1, 0, 0, ckpt)
        pids = role_pids(cluster)
        say(f"processes: {pids}")
        # Background CPU (heartbeats, polls) grows with a run's duration, not with the
        # bytes moved: measured on the idle cluster and subtracted ("net").
        t0, c0 = time.monotonic(), {k: cpu_seconds(v) for k, v in pids.items()}
        time.sleep(a.idle_seconds)
        idle_s = time.monotonic() - t0
        idle = {k: (cpu_seconds(v) - c0[k]) / idle_s for k, v in pids.items()}
        say("idle CPU (cores): " + ", ".join(f"{k} {v:.3f}" for k, v in idle.items()))
        for i in range(a.runs):
            for n in names:
                r = getattr(wl, n)()
                figures["local"].setdefault(n, []).append(r[n])
                say(f"run {i + 1} local {n}: {r[n]:.1f} MiB/s (load {loadavg()})")
                before = {k: cpu_seconds(v) for k, v in pids.items()}
                started = time.monotonic()
                spy: list[subprocess.Popen[bytes]] = []
                if a.py_spy and i == 0 and n == "seq_write":
                    os.makedirs(a.py_spy, exist_ok=True)
                    for role in ("fuse", "storage-1"):
                        if role in pids:
                            spy.append(
                                subprocess.Popen(
                                    [
                                        str(Path(sys.executable).parent / "py-spy"),
                                        "record",
                                        "--pid",
                                        str(pids[role]),
                                        "--rate",
                                        "200",
                                        "--format",
                                        "raw",
                                        "--output",
                                        os.path.join(a.py_spy, f"{a.label or 'run'}-{role}.txt"),
                                    ],
                                    stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL,
                                )
                            )
                r = getattr(wf, n)()
                for sp in spy:
                    sp.send_signal(signal.SIGINT)
                    sp.wait(timeout=60)
                after = {k: cpu_seconds(v) for k, v in pids.items()}
                took = time.monotonic() - started
                gib = moved[n] / GiB
                per = {
                    k: round(max(0.0, after[k] - before[k] - idle[k] * took) / gib, 2) for k in pids
                }
                cpu[n].append(per)
                figures["fs3"].setdefault(n, []).append(r[n])
                say(f"run {i + 1} fs3 {n}: {r[n]:.1f} MiB/s; CPU s/GiB {per}")
        load.append(loadavg())
        try:
            sizes = [
                line.rsplit(":", 1)[1].strip()
                for line in cluster.log_path("fuse").read_text().splitlines()
                if "largest write request" in line
            ]
            max_write = sizes[-1] if sizes else "?"
        except OSError:
            max_write = "?"
        say(f"largest FUSE write request: {max_write}")
    finally:
        cluster.close()
        shutil.rmtree(local_dir, ignore_errors=True)
        if not a.workdir:
            shutil.rmtree(base, ignore_errors=True)
    out: dict[str, Any] = {
        "label": a.label,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": "benchmarks/write_path.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine,
        "load": load,
        "figures": figures,
        "cpu_s_per_gib": cpu,
        "fuse_max_write": max_write,
    }
    print(f"\n## {a.label or 'write path'} (load {load[0]} -> {load[-1]})")
    print("| workload | local MiB/s | fs3 MiB/s | fs3 / local |")
    print("|---|---:|---:|---:|")
    for n in names:
        lo, fs = statistics.median(figures["local"][n]), statistics.median(figures["fs3"][n])
        out.setdefault("medians", {})[n] = {"local": lo, "fs3": fs, "ratio": round(fs / lo, 3)}
        print(
            f"| {n} | {lo:.1f} ({min(figures['local'][n]):.0f}-{max(figures['local'][n]):.0f}) "
            f"| {fs:.1f} ({min(figures['fs3'][n]):.0f}-{max(figures['fs3'][n]):.0f}) | {fs / lo:.2f} |"
        )
    for n in names:
        med = {k: statistics.median(run[k] for run in cpu[n]) for k in cpu[n][0]} if cpu[n] else {}
        out.setdefault("cpu_medians", {})[n] = med
        print(f"CPU s/GiB {n} (median): " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
