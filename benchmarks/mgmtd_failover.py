#!/usr/bin/env python3
"""mgmtd failover time: kill -9 of the leader -> first routing answer from the new leader.

Starts ``--mgmtds`` real ``fs3 mgmtd`` processes on one fresh SQLite KV file
(short timings, as in the tests), then for each trial:

1. find the leader and take its routing version;
2. ``kill -9`` it and start the clock;
3. ask for routing through :class:`MgmtdClient` (every address, redirects,
   backoff: what storage, meta and clients do) until an answer comes from
   another mgmtd; stop the clock;
4. restart the killed process so every trial starts with all mgmtds up.

The failover time is bounded by the lease length (the dead leader's lease must
expire; followers retry exactly at expiry) plus the client's retry backoff.

Usage: python benchmarks/mgmtd_failover.py [--trials 10] [--mgmtds 3]
           [--lease 2.0] [--renew 0.5] [--margin 0.5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fs3.client.mgmtd_client import MgmtdClient
from fs3.errors import FsError

CLUSTER = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Procs:
    def __init__(self, tmp: Path, n: int, lease: float, renew: float, margin: float) -> None:
        self.tmp = tmp
        self.ports = [free_port() for _ in range(n)]
        self.addresses = [f"127.0.0.1:{p}" for p in self.ports]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        for i in range(n):
            (tmp / f"m{i + 1}.toml").write_text(
                f'[node]\nid = {i + 1}\nport = {self.ports[i]}\n[cluster]\nid = "{CLUSTER}"\n'
                f'[kv]\nurl = "sqlite://{tmp / "kv.db"}"\n[log]\nfile = "{tmp / f"m{i + 1}.log"}"\n'
                f"[mgmtd]\nlease_length_s = {lease}\nlease_renew_interval_s = {renew}\n"
                f"lease_safety_margin_s = {margin}\nheartbeat_interval_s = 0.5\n"
                f"heartbeat_timeout_s = 2.0\ncheck_interval_s = 0.2\n"
            )

    def start(self, *ids: int) -> None:
        for i in ids:
            self.procs[i] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fs3.cli.main",
                    "mgmtd",
                    "--config",
                    str(self.tmp / f"m{i + 1}.toml"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        for i in ids:
            out = self.procs[i].stdout
            assert out is not None
            line = out.readline().decode()
            if not line.startswith("fs3-mgmtd listening on"):
                raise SystemExit(f"mgmtd-{i + 1} did not start: {line!r}")

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(timeout=10)

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def trial(procs: Procs) -> tuple[float, int, int]:
    async with MgmtdClient(procs.addresses, CLUSTER, timeout_s=0.5, retry_deadline_s=30) as c:
        leader = await c.get_leader()
        old_id = int(leader.node_id)
        old_idx = procs.addresses.index(leader.address)
        await c.get_routing(0)
        procs.kill(old_idx)
        t0 = time.monotonic()
        while True:
            try:
                info = await c.get_routing(0)
            except FsError:
                continue
            if info is not None and info.leader_node_id != old_id:
                elapsed = time.monotonic() - t0
                new_id = int(info.leader_node_id)
                break
    procs.start(old_idx)
    return elapsed, old_id, new_id


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--mgmtds", type=int, default=3)
    ap.add_argument("--lease", type=float, default=2.0)
    ap.add_argument("--renew", type=float, default=0.5)
    ap.add_argument("--margin", type=float, default=0.5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fs3-failover-") as d:
        procs = Procs(Path(d), args.mgmtds, args.lease, args.renew, args.margin)
        try:
            procs.start(*range(args.mgmtds))
            times: list[float] = []
            for n in range(args.trials):
                elapsed, old, new = asyncio.run(trial(procs))
                times.append(elapsed)
                if not args.json:
                    print(
                        f"trial {n + 1:2d}: mgmtd-{old} killed -> mgmtd-{new} answered in {elapsed:.3f}s",
                        flush=True,
                    )
        finally:
            procs.stop_all()
    result = {
        "trials": args.trials,
        "mgmtds": args.mgmtds,
        "lease_s": args.lease,
        "renew_s": args.renew,
        "median_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
        "min_s": round(min(times), 3),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"failover (kill -9 -> first routing from the new leader), {args.trials} trials, "
            f"{args.mgmtds} mgmtds, lease {args.lease}s / renew {args.renew}s: "
            f"median {result['median_s']:.3f}s, max {result['max_s']:.3f}s, min {result['min_s']:.3f}s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
