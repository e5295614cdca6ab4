"""Server and client CPU per small-file read, a cluster with capabilities vs one without.

Wall-clock figures on the shared 2-core VM swing 2-3x between runs; CPU time
consumed by each process (utime + stime from /proc) per operation is far
steadier, and it is what capabilities add (HMAC on meta, a check on storage, a
cache lookup in the client). Blocks alternate in ABBA order; medians.

    .venv/bin/python benchmarks/capabilities_cpu.py [--files 200] [--blocks 6]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fs3.security.keys import create_secret  # noqa: E402
from fs3.testing.cluster import ProcessCluster  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def cluster(secret: bool) -> ProcessCluster:
    d = Path(tempfile.mkdtemp(prefix="fs3-capcpu-"))
    if secret:
        create_secret(d / "fs3.secret")
    return ProcessCluster(
        d, storage_nodes=2, targets_per_node=1, replicas=2, meta=1, mgmtd=1,
        overrides={"storage": {"storage": {"fsync": False}}},
    )  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=6)
    args = ap.parse_args()
    n = args.files
    cs = {"open": cluster(False), "secured": cluster(True)}
    res: dict[str, dict[str, list[float]]] = {
        k: {"meta": [], "storage": [], "client": []} for k in cs
    }
    try:
        with cs["open"], cs["secured"]:
            clients = {k: c.connect() for k, c in cs.items()}
            for cl in clients.values():
                for i in range(n):
                    with cl.open(f"/f{i}", "wb") as f:
                        f.write(b"x" * 16384)
            for r in range(args.blocks):
                for k in ("open", "secured") if r % 2 == 0 else ("secured", "open"):
                    c, cl = cs[k], clients[k]
                    pids = {name: c.pid(name) for name in c.names}
                    before = {name: cpu_s(p) for name, p in pids.items()}
                    mine = self_cpu_s()
                    for i in range(n):
                        with cl.open(f"/f{i}", "rb") as f:
                            assert len(f.read()) == 16384
                    after = {name: cpu_s(p) for name, p in pids.items()}
                    res[k]["client"].append((self_cpu_s() - mine) / n * 1000)
                    res[k]["meta"].append((after["meta-1"] - before["meta-1"]) / n * 1000)
                    res[k]["storage"].append(
                        sum(after[x] - before[x] for x in pids if x.startswith("storage"))
                        / n
                        * 1000
                    )
            for cl in clients.values():
                cl.close()
    finally:
        for c in cs.values():
            shutil.rmtree(c.dir, ignore_errors=True)
    print(
        f"CPU ms per open + 16 KiB read + close, {n} files x {args.blocks} blocks (ABBA), medians"
    )
    print("| process | open | secured | secured/open |")
    print("| --- | --- | --- | --- |")
    for part in ("meta", "storage", "client"):
        o, s = statistics.median(res["open"][part]), statistics.median(res["secured"][part])
        print(f"| {part} | {o:.3f} | {s:.3f} | {s / o:.2f} |")
    print("load average at the end:", " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
