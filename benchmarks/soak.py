"""Random-fault soak: kills, restarts and partitions under the verifying workload.

    python benchmarks/soak.py --minutes 10 --seed 1

Starts a local cluster (3 storage nodes x 2 targets, 3 replicas, 2 meta, 2
mgmtd, FUSE mount; storage-3 inside its own network namespace so it can be
partitioned), runs the verifying workload (Python API + FUSE writers/readers)
and a namespace storm, and for ``--minutes`` injects one random fault at a time:

* ``kill-storage``  kill -9 a storage node, restart it after a random delay
* ``kill-mgmtd``    kill -9 the mgmtd leader, restart it
* ``kill-meta``     kill -9 a meta server, restart it
* ``kill-fuse``     kill -9 the FUSE daemon, remount
* ``partition``     cut storage-3's veth for a while, heal, restart it (3FS fencing)

After each fault it waits (bounded) until every target serves again; a bound
missed counts as a violation. At the end it checks every invariant (nothing
acknowledged lost, no stale/torn/never-written read, replicas byte-identical,
fsck, namespace outcomes) and prints faults injected, operations done and
invariant violations (must be 0; the exit status is 1 otherwise).
The fault sequence is a function of ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fs3.testing.faults import netns_unavailable  # noqa: E402
from fs3.testing.invariants import fault_cluster  # noqa: E402
from fs3.testing.workload import NamespaceStorm, WorkloadConfig  # noqa: E402

RECOVER_BOUND_S = 120.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-mount", action="store_true", help="Python API only (no FUSE)")
    ap.add_argument("--no-partition", action="store_true", help="no network namespace faults")
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    why = None if args.no_partition else netns_unavailable()
    kinds = ["kill-storage", "kill-storage", "kill-mgmtd", "kill-meta"]
    if not args.no_mount:
        kinds.append("kill-fuse")
    if not args.no_partition and why is None:
        kinds.append("partition")
    netns = {"storage-3": 21} if "partition" in kinds else None
    faults: Counter[str] = Counter()
    missed: list[str] = []
    t_start = time.monotonic()
    with fault_cluster("soak", mount=not args.no_mount, netns=netns, seed=args.seed) as sc:
        if why and not args.no_partition:
            sc.say(f"partitions disabled: {why}")
        pc = sc.pc
        sc.start_workload(config=WorkloadConfig(max_blocks=24, files_per_writer=2, pause_s=0.01))
        storm = NamespaceStorm([sc.api("ns0"), sc.api("ns1")], seed=args.seed, pause_s=0.02).start()
        deadline = time.monotonic() + args.minutes * 60
        link = sc.links[0] if sc.links else None

        def recover(what: str) -> None:
            try:
                sc.wait_all_serving(RECOVER_BOUND_S, f"recovered from {what}")
            except TimeoutError as e:
                missed.append(f"{what}: {e}")
                sc.say(f"BOUND MISSED: {what}: {e}")

        while time.monotonic() < deadline:
            kind = rng.choice(kinds)
            down_s = rng.uniform(1.0, 8.0)
            faults[kind] += 1
            try:
                if kind == "kill-storage":
                    victim = f"storage-{rng.randint(1, 3)}"
                    sc.say(
                        f"fault #{sum(faults.values())}: kill -9 {victim}, back in {down_s:.1f}s"
                    )
                    pc.kill(victim)
                    time.sleep(down_s)
                    pc.restart(victim)
                elif kind == "kill-mgmtd":
                    leader = pc.status()["leader"] or "mgmtd-1"
                    sc.say(
                        f"fault #{sum(faults.values())}: kill -9 mgmtd leader {leader}, back in {down_s:.1f}s"
                    )
                    pc.kill(leader)
                    time.sleep(down_s)
                    pc.restart(leader)
                elif kind == "kill-meta":
                    victim = f"meta-{rng.randint(1, 2)}"
                    sc.say(
                        f"fault #{sum(faults.values())}: kill -9 {victim}, back in {down_s:.1f}s"
                    )
                    pc.kill(victim)
                    time.sleep(down_s)
                    pc.restart(victim)
                elif kind == "kill-fuse":
                    sc.say(
                        f"fault #{sum(faults.values())}: kill -9 the FUSE daemon, remount in {down_s:.1f}s"
                    )
                    pc.kill("fuse")
                    time.sleep(down_s)
                    pc.restart("fuse")
                elif kind == "partition" and link is not None:
                    sc.say(
                        f"fault #{sum(faults.values())}: partition storage-3 for {down_s + 3:.1f}s"
                    )
                    link.partition()
                    time.sleep(down_s + 3)
                    link.heal()
                    pc.restart(
                        "storage-3"
                    )  # a target declared offline stays fenced until restart (3FS)
            except Exception as e:  # a harness step failed (e.g. restart): count it, go on
                missed.append(f"{kind}: {type(e).__name__}: {e}")
                sc.say(f"FAULT STEP FAILED: {kind}: {e}")
            recover(kind)
            time.sleep(rng.uniform(1.0, 4.0))
        sc.say("soak time over; stopping the workload")
        storm.stop(90)
        summary = sc.stop_workload(90)
        problems = sc.final_checks(replica_timeout_s=90)
        ns_bad = storm.verify(sc.api("final-ns"))
        result = {
            "minutes": args.minutes,
            "seed": args.seed,
            "elapsed_s": round(time.monotonic() - t_start, 1),
            "faults_injected": dict(faults),
            "faults_total": sum(faults.values()),
            "acknowledged_writes": summary.get("acked_writes", 0),
            "reads_checked": summary.get("reads_checked", 0),
            "client_errors_during_faults": summary.get("op_errors", 0),
            "namespace_ops": storm.ops,
            "namespace_retry_anomalies": len(storm.anomalies),
            "recovery_bounds_missed": len(missed),
            "invariant_violations": len(problems) + len(ns_bad) + len(missed),
        }
        print("\n=== soak summary ===")
        for k, v in result.items():
            print(f"{k:>30}: {v}")
        for p in (problems + [str(v) for v in ns_bad] + missed)[:50]:
            print(f"  VIOLATION {p}")
        for a in storm.anomalies[:10]:
            print(f"  anomaly: {a}")
        print(json.dumps(result))
        if result["invariant_violations"]:
            raise SystemExit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
