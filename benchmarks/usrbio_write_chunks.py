#!/usr/bin/env python3
"""USRBIO sequential write (1 MiB x 8 in flight) with 1 MiB vs 4 MiB chunks, clusters alternating.

Why: the quiet suite's USRBIO write fell from ~120 to ~72 MiB/s when meta's default
chunk size went from 1 MiB to 4 MiB; this isolates that one setting. Each round
starts one ``ProcessCluster`` (3 storage nodes x 2 targets, 3 replicas, transport
``auto``, FUSE mount) per chunk size, differing only in ``[meta]
default_chunk_size``, runs run_all's USRBIO workload on it (write, read, random
read) and prints the write and read rates and each process's CPU seconds.

Usage: python benchmarks/usrbio_write_chunks.py [--size 256M] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_all import usrbio_workload  # noqa: E402
from storage_io import cpu_seconds  # noqa: E402

from fs3.cli.bench import parse_size  # noqa: E402
from fs3.testing.cluster import ProcessCluster  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", default="/var/tmp")
    a = ap.parse_args()
    size = parse_size(a.size)
    for _ in range(a.rounds):
        for cs in (1 << 20, 4 << 20):
            base = Path(tempfile.mkdtemp(prefix="fs3-usrbio-chunks-", dir=a.workdir))
            mnt = base / "mnt"
            mnt.mkdir()
            c = ProcessCluster(
                base / "c",
                storage_nodes=3,
                replicas=3,
                transport="auto",
                mount=str(mnt),
                start_timeout_s=180,
                overrides={"meta": {"meta": {"default_chunk_size": cs}}},
            )
            try:
                c.start()
                pids = {n: c.pid(n) for n in c.names if n.startswith(("storage", "fuse"))}
                before = {k: cpu_seconds(p) for k, p in pids.items()}
                f = usrbio_workload(str(mnt), size, 1.0)
                used = {k: cpu_seconds(p) - before[k] for k, p in pids.items()}
                print(
                    f"chunk {cs >> 20} MiB: seq write {f.get('usrbio_seq_write', 0):.1f} MiB/s, "
                    f"seq read {f.get('usrbio_seq_read', 0):.1f} MiB/s; CPU s (all phases) "
                    + " ".join(f"{k}={v:.2f}" for k, v in used.items())
                    + f"; load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            finally:
                c.close()
                shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
