#!/usr/bin/env python3
"""Where a FUSE read's cost goes: CPU per read in each process, the kernel's requests, the disk.

Why beside ``read_path.py``: that one compares fs3 with JuiceFS and the local
disk; this one looks inside fs3 only, for iterating on the read path. It starts
one fs3 ``ProcessCluster`` (3 storage nodes x 2 targets, 3 replicas, transport
``auto``, FUSE mount), writes one file through the mount, then runs rounds of
fio phases on it, page cache dropped before each:

* ``seq``: a sequential read in 1 MiB blocks (the suite's ``seq_read``);
* ``rand``: 4 KiB random reads, 4 jobs, O_DIRECT (the suite's ``rand_read_4k``);
* ``idle``: nothing (what the processes spend on their own).

Per phase it prints the figure, each process's CPU per read (rand) or per GiB
(seq), split into user and system seconds, the bytes each process read from
disk per I/O (``/proc/<pid>/io``), and how busy the machine was (``/proc/stat``:
busy and iowait). ``--readahead KB,KB,...`` sets the mount's BDI
``read_ahead_kb`` per round, cycling (the daemon sets 16384 at mount).
``--py-spy PHASE`` records the FUSE daemon and storage-1 during that phase of
the first round (raw collapsed stacks, 200 Hz, ``--nonblocking``; note that a
process woken peer preempts shows as "active" at its send). At the end the
daemon's own counters are printed from its log, if it wrote them before it was stopped (FUSE read sizes, reads in
flight, staged reads, one-sided I/Os, read batches).

Usage: python benchmarks/fuse_read_cost.py [--size 256M] [--rounds 2] [--seconds 8]
       [--phases seq,rand] [--readahead 16384,4096] [--py-spy rand] [--out-dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_all import drop_caches, fio  # noqa: E402
from storage_io import cpu_seconds  # noqa: E402

from fs3.testing.cluster import ProcessCluster  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def user_sys(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def disk_read_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def cpu_totals() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def phase_run(phase: str, d: str, size: str, seconds: float) -> tuple[dict[str, Any], str, int]:
    """Run one phase; (fio's read section, the figure, I/Os)."""
    if phase == "idle":
        time.sleep(seconds)
        return {"io_bytes": 0}, "idle", 1
    if phase == "rand":
        j = fio(
            d,
            "rand",
            [
                "--filename=f",
                "--rw=randread",
                "--bs=4k",
                f"--size={size}",
                "--numjobs=4",
                "--time_based",
                f"--runtime={seconds:g}",
                "--group_reporting",
                "--randrepeat=1",
                "--direct=1",
            ],
        )["read"]
        return j, f"{j['iops']:.0f} IOPS", int(j["total_ios"])
    j = fio(d, "seq", ["--filename=f", "--rw=read", "--bs=1M", f"--size={size}"])["read"]
    return j, f"{j['bw_bytes'] / 2**20:.0f} MiB/s", int(j["total_ios"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--phases", default="seq,rand")
    ap.add_argument("--readahead", default="")
    ap.add_argument("--py-spy", default="", dest="py_spy")
    ap.add_argument("--out-dir", default=tempfile.gettempdir())
    ap.add_argument("--workdir", default="/var/tmp")
    a = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="fs3-read-cost-", dir=a.workdir))
    mnt = base / "mnt"
    mnt.mkdir()
    c = ProcessCluster(
        base / "c",
        storage_nodes=3,
        replicas=3,
        transport="auto",
        mount=str(mnt),
        start_timeout_s=180,
    )
    log_path: Path | None = None
    try:
        c.start()
        log_path = c.log_path("fuse")
        pids = {n: c.pid(n) for n in c.names if n.startswith(("storage", "fuse"))}
        d = str(mnt)
        fio(d, "w", ["--filename=f", "--rw=write", "--bs=1M", f"--size={a.size}", "--end_fsync=1"])
        dev = os.stat(d).st_dev
        bdi = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        print(f"mount bdi {bdi}: read_ahead_kb {bdi.read_text().strip()}", flush=True)
        ras = [r for r in a.readahead.split(",") if r]
        for rnd in range(a.rounds):
            for phase in a.phases.split(","):
                if ras:
                    bdi.write_text(ras[rnd % len(ras)])
                drop_caches()
                spies = []
                if a.py_spy == phase and rnd == 0:
                    for n in ("fuse", "storage-1"):
                        out = Path(a.out_dir) / f"fuse-read-cost-{phase}-{n}.txt"
                        spies.append(
                            subprocess.Popen(
                                [
                                    shutil.which("py-spy")
                                    or str(Path(sys.executable).parent / "py-spy"),
                                    "record",
                                    "-r",
                                    "200",
                                    "--nonblocking",
                                    "-f",
                                    "raw",
                                    "-o",
                                    str(out),
                                    "-p",
                                    str(pids[n]),
                                    "-d",
                                    str(int(a.seconds)),
                                ],
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                            )
                        )
                st0, io0 = cpu_totals(), {k: disk_read_bytes(p) for k, p in pids.items()}
                cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
                us0 = {k: user_sys(p) for k, p in pids.items()}
                j, fig, ios = phase_run(phase, d, a.size, a.seconds)
                cpu1 = {k: cpu_seconds(p) for k, p in pids.items()}
                us1 = {k: user_sys(p) for k, p in pids.items()}
                st1, io1 = cpu_totals(), {k: disk_read_bytes(p) for k, p in pids.items()}
                for s in spies:
                    s.wait()
                dd = [y - x for x, y in zip(st0, st1, strict=True)]
                total = sum(dd) or 1
                ra = f" read_ahead_kb {ras[rnd % len(ras)]}" if ras else ""
                if phase == "seq":
                    gib = j["io_bytes"] / 2**30
                    per = " ".join(f"{k}={(cpu1[k] - cpu0[k]) / gib:.2f}" for k in pids)
                    print(f"{phase} round {rnd + 1}{ra}: {fig}; CPU s/GiB {per}", flush=True)
                else:
                    per = " ".join(f"{k}={(cpu1[k] - cpu0[k]) / ios * 1e6:.0f}" for k in pids)
                    print(f"{phase} round {rnd + 1}{ra}: {fig}; CPU us/read {per}", flush=True)
                print(
                    "  user/sys s: "
                    + " ".join(
                        f"{k}={us1[k][0] - us0[k][0]:.2f}/{us1[k][1] - us0[k][1]:.2f}" for k in pids
                    )
                    + "; disk KiB read per I/O: "
                    + " ".join(f"{k}={(io1[k] - io0[k]) / 1024 / ios:.1f}" for k in pids)
                    + f"; machine busy {100 * (1 - (dd[3] + dd[4]) / total):.0f}%"
                    + f" iowait {100 * dd[4] / total:.0f}%; load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    finally:
        c.close()
        if log_path is not None and log_path.exists():
            for line in log_path.read_text().splitlines():
                if "stats:" in line:
                    print("daemon " + line[line.index("stats:") :], flush=True)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
