"""What chunk capabilities cost on the data path: the same bench with and without a secret.

Two local clusters run side by side (same shape, one with ``fs3.secret`` so meta
signs capabilities and storage checks them, one without); ``fs3 bench --cluster``
(Python API) runs against each in turn, interleaved, ``--rounds`` times. Reported:
the median of each figure per cluster and the ratio secured/open.

    .venv/bin/python benchmarks/capabilities.py --rounds 3 --out benchmarks/results/capabilities-DATE.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fs3.security.keys import create_secret  # noqa: E402
from fs3.testing.cluster import ProcessCluster  # noqa: E402

BENCH = [
    "--big-file-size", "64M", "--block-size", "1M", "--small-files", "200",
    "--small-file-size", "16K", "--rand-read-seconds", "3", "--rand-read-size", "4K",
    "--phases", "big_write,big_read,rand_read,small_write,small_read", "--json", "--quiet",
]  # fmt: skip


def cluster(secret: bool) -> ProcessCluster:
    d = Path(tempfile.mkdtemp(prefix="fs3-capbench-"))
    if secret:
        create_secret(d / "fs3.secret")
    return ProcessCluster(
        d, storage_nodes=2, targets_per_node=1, replicas=2, meta=1, mgmtd=1,
        overrides={"storage": {"storage": {"fsync": False}}},
    )  # fmt: skip


def bench(c: ProcessCluster) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "fs3.cli.main", "bench", "--cluster", c.cluster_file, *BENCH],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    res = json.loads(out.stdout)
    figures: dict[str, float] = {}
    for phase, r in res["phases"].items():
        figures[f"{phase} ops/s"] = float(r["ops_s"])
        figures[f"{phase} p50 ms"] = float(r["p50_ms"])
    return figures


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"open": [], "secured": []}
    open_c, sec_c = cluster(False), cluster(True)
    try:
        with open_c, sec_c:
            load = os.getloadavg()
            for i in range(args.rounds):  # ABBA order: a drifting load favours neither
                order = [("open", open_c), ("secured", sec_c)]
                for name, c in order if i % 2 == 0 else order[::-1]:
                    runs[name].append(bench(c))
    finally:
        shutil.rmtree(open_c.dir, ignore_errors=True)
        shutil.rmtree(sec_c.dir, ignore_errors=True)
    keys = sorted(runs["open"][0])
    lines = [
        "# Chunk capabilities: secured vs open cluster",
        "",
        f"`{' '.join(sys.argv)}` at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())};"
        f" load average at start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (2 shared cores).",
        f"Bench: `fs3 bench --cluster FILE {' '.join(BENCH)}`, interleaved in ABBA order, median of {args.rounds}.",
        "",
        "| figure | open | secured | secured/open |",
        "| --- | --- | --- | --- |",
    ]
    for k in keys:
        a = statistics.median(r[k] for r in runs["open"])
        b = statistics.median(r[k] for r in runs["secured"])
        lines.append(f"| {k} | {a:.1f} | {b:.1f} | {b / a if a else float('nan'):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
