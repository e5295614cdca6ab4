"""``fs3 ckpt``: list, verify and remove checkpoints written by :mod:`fs3.ckpt`; advise the interval.

    fs3 ckpt ls PATH [--cluster FILE] [--json]      checkpoints, valid or not, sizes, kind, base
    fs3 ckpt verify PATH [--step N] [--cluster FILE] read every piece and check its CRC32C
    fs3 ckpt rm PATH (--step N ... | --invalid | --keep-last N) [--cluster FILE]
    fs3 ckpt interval --save-seconds S --mtbf-hours H [--gpus N]

PATH is a directory (an fs3 mount or any other), or with ``--cluster`` an fs3
path reached through the client API (no mount).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _fmt_bytes(n: float) -> str:
    from fs3.cli.bench import fmt_bytes

    return fmt_bytes(n)


def _fmt_s(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.2f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def _store(a: argparse.Namespace) -> tuple[Any, Any]:
    from fs3.ckpt.store import open_store

    client = None
    if a.cluster:
        import fs3

        client = fs3.connect(a.cluster)
    return (
        open_store(a.path, client=client, usrbio=False if a.no_usrbio else None, create=False),
        client,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fs3 ckpt", description="Manage fs3.ckpt checkpoints.")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("path", help="checkpoint root directory (with --cluster: an fs3 path)")
        sp.add_argument("--cluster", help="cluster file: reach PATH through the client API")
        sp.add_argument("--no-usrbio", action="store_true", help="plain POSIX I/O on a mount")
        sp.add_argument("--json", action="store_true", help="machine-readable output")

    common(sub.add_parser("ls", help="list checkpoints (valid or not), size, kind, base"))
    v = sub.add_parser("verify", help="read every piece and check CRC32Cs")
    common(v)
    v.add_argument("--step", type=int, action="append", help="only this step (repeatable)")
    r = sub.add_parser("rm", help="remove checkpoints (marker first)")
    common(r)
    r.add_argument("--step", type=int, action="append", help="remove this step (repeatable)")
    r.add_argument("--invalid", action="store_true", help="remove invalid ones older than latest")
    r.add_argument("--keep-last", type=int, help="keep the newest N valid (and their baselines)")
    r.add_argument("--force", action="store_true", help="remove a step even if others need it")
    i = sub.add_parser("interval", help="the optimal checkpoint interval T* = sqrt(2·t_save·MTBF)")
    i.add_argument("--save-seconds", type=float, required=True, help="time a save blocks training")
    i.add_argument("--mtbf-hours", type=float, required=True, help="mean time between failures")
    i.add_argument("--gpus", type=int, default=1, help="devices, each with that MTBF (default 1)")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.cmd == "interval":
            return _interval(a)
        store, client = _store(a)
        try:
            return {"ls": _ls, "verify": _verify, "rm": _rm}[a.cmd](a, store)
        finally:
            store.close()
            if client is not None:
                client.close()
    except (OSError, ValueError) as e:
        print(f"fs3 ckpt {a.cmd}: {e}", file=sys.stderr)
        return 1


def _interval(a: argparse.Namespace) -> int:
    from fs3.ckpt.interval import advise

    adv = advise(a.save_seconds, a.mtbf_hours, a.gpus)
    if a.json:
        print(json.dumps(adv.to_json()))
        return 0
    g = f" x {a.gpus} GPUs" if a.gpus > 1 else ""
    print(f"save time {a.save_seconds:g} s, MTBF {a.mtbf_hours:g} h per device{g}")
    print(f"job MTBF:            {_fmt_s(adv.job_mtbf_s)}")
    print(f"optimal interval T*: {_fmt_s(adv.interval_s)}  ({adv.saves_per_day:.1f} saves/day)")
    print(
        f"expected overhead:   {adv.overhead_fraction * 100:.2f} % "
        f"({_fmt_s(adv.overhead_s_per_day)}/day saving)"
    )
    lost = adv.lost_work_s_per_day
    gh = f", {lost * a.gpus / 3600:.1f} GPU-hours" if a.gpus > 1 else ""
    print(f"expected lost work:  {_fmt_s(lost)}/day ({adv.failures_per_day:.2f} failures/day{gh})")
    return 0


def _ls(a: argparse.Namespace, store: Any) -> int:
    from fs3.ckpt import layout

    infos = layout.list_checkpoints(store)
    if a.json:
        print(json.dumps([i.to_json() for i in infos]))
        return 0
    print(
        f"{'STEP':>12}  {'VALID':<5}  {'KIND':<4}  {'BASE':>12}  {'RANKS':>5}  {'SIZE':>10}  NOTE"
    )
    for i in infos:
        base = ",".join(str(b) for b in i.bases) or "-"
        size = _fmt_bytes(i.bytes) if i.bytes else "-"
        print(
            f"{i.step:>12}  {'yes' if i.valid else 'NO':<5}  {i.kind:<4}  {base:>12}  "
            f"{i.world_size or '-':>5}  {size:>10}  {i.reason}"
        )
    return 0


def _verify(a: argparse.Namespace, store: Any) -> int:
    from fs3.ckpt import layout

    todo = a.step or [i.step for i in layout.list_checkpoints(store)]
    bad = 0
    out = []
    for s in todo:
        problems = layout.verify(store, s)
        bad += bool(problems)
        out.append({"step": s, "ok": not problems, "problems": problems})
        if not a.json:
            print(f"step {s}: " + ("ok" if not problems else "; ".join(problems)))
    if a.json:
        print(json.dumps(out))
    return 1 if bad else 0


def _rm(a: argparse.Namespace, store: Any) -> int:
    from fs3.ckpt import layout

    if not (a.step or a.invalid or a.keep_last):
        print("fs3 ckpt rm: give --step N, --invalid or --keep-last N", file=sys.stderr)
        return 2
    removed: list[int] = []
    if a.step:
        infos = layout.list_checkpoints(store)
        have = {i.step for i in infos}
        for s in a.step:
            if s not in have:
                print(f"fs3 ckpt rm: no checkpoint at step {s}", file=sys.stderr)
                return 1
            users = [i.step for i in infos if s in i.bases and i.step not in a.step]
            if users and not a.force:
                print(
                    f"fs3 ckpt rm: step {s} is the base of {users}; remove those too or --force",
                    file=sys.stderr,
                )
                return 1
        for s in a.step:
            layout.remove(store, s)
            removed.append(s)
    if a.keep_last:
        removed += layout.retain(store, a.keep_last)
    if a.invalid:
        removed += layout.gc(store)
    if a.json:
        print(json.dumps({"removed": sorted(set(removed))}))
    else:
        print("removed: " + (", ".join(str(s) for s in sorted(set(removed))) or "nothing"))
    return 0
