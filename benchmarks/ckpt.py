#!/usr/bin/env python
"""Checkpoint benchmark: ``fs3.ckpt`` against ``torch.save``/``torch.load`` and DCP, in one run.

A synthetic state dict of SIZE (default 1 GiB; hundreds of float32/bfloat16
tensors whose sizes are log-uniform between 4 KiB and 32 MiB) is

* saved and loaded with ``fs3.ckpt`` on the cluster's FUSE mount (data through
  USRBIO), synchronously and asynchronously; the async row reports the
  *stall*: the time until ``save`` returns (snapshot into the reused host
  buffer), next to the time of copying the state dict in memory
  (``Tensor.copy_`` into preallocated tensors);
* saved with ``torch.save`` to the local disk and to the fs3 mount (fsync'd),
  and loaded back with ``torch.load``;
* saved and loaded with PyTorch DCP through ``fs3.ckpt.dcp`` (when that module
  is present) on the mount;
* read raw with USRBIO (the ``fs3.ckpt`` data file, with fs3.ckpt's I/O size and depth):
  the rate the load is compared with;
* saved with ``Incremental`` after changing 10 % of the tensors: bytes written
  against a full checkpoint.

The page cache is dropped before every load (when root). The cluster is the
launcher's default local cluster (:class:`fs3.testing.cluster.ProcessCluster`,
3 storage nodes, 3 replicas, storage fsync on) with a FUSE mount; every
process and mount it starts is stopped on exit. Targets (evaluated in the
report): fs3.ckpt load >= 1.5x torch.load from the mount and >= 0.8x the raw
USRBIO read; async stall <= 1.5x the in-memory copy; incremental <= 15 % of full.

    .venv/bin/python benchmarks/ckpt.py                     # 1 GiB
    .venv/bin/python benchmarks/ckpt.py --size-mib 256 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fs3.ckpt as ckpt
from fs3.ckpt import layout
from fs3.ckpt.store import INFLIGHT, IO_BYTES
from fs3.cli.bench import drop_caches
from fs3.testing.cluster import ProcessCluster

MiB = 1 << 20
GB = 1e9


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def synthetic_state(total: int, seed: int = 0) -> dict[str, Any]:
    """Hundreds of tensors of mixed sizes (log-uniform 4 KiB..32 MiB) adding up to ~``total`` bytes."""
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    while sum(sizes) < total:
        sizes.append(int(np.exp(rng.uniform(np.log(4096), np.log(32 * MiB)))))
    sizes[-1] -= sum(sizes) - total
    if sizes[-1] < 4096:
        sizes.pop()
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, Any] = {}
    for i, n in enumerate(sizes):
        if i % 3 == 2:
            sd[f"layer{i}.weight"] = torch.randn(n // 2, generator=g).to(torch.bfloat16)
        else:
            sd[f"layer{i}.weight"] = torch.randn(n // 4, generator=g)
    return sd


def nbytes(sd: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def fsync_path(p: str) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def usrbio_read(mount: str, path: str, io: int = IO_BYTES, depth: int = INFLIGHT) -> float:
    """Seconds to read ``path`` once with USRBIO (``depth`` I/Os of ``io`` bytes in flight)."""
    from fs3.usrbio import Ior, Iov, dereg_fd, prep_io, reg_fd, submit_ios, wait_for_ios

    size = os.path.getsize(path)
    iov = Iov(mount, io * depth)
    ior = Ior(mount, entries=depth, for_read=True)
    fd = os.open(path, os.O_RDONLY)
    reg_fd(fd)
    try:
        t0 = time.perf_counter()
        off, free, pending = 0, list(range(depth)), 0
        while off < size or pending:
            while off < size and free:
                k = free.pop()
                n = min(io, size - off)
                prep_io(ior, iov, k * io, fd, off, n, userdata=(k, n))
                off += n
                pending += 1
            submit_ios(ior)
            for c in wait_for_ios(ior, max_results=depth, min_results=1):
                k, n = c.userdata
                if c.result != n:
                    raise OSError(f"usrbio read returned {c.result}, wanted {n}")
                free.append(k)
                pending -= 1
        return time.perf_counter() - t0
    finally:
        dereg_fd(fd)
        os.close(fd)
        ior.close()
        iov.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    size = args.size_mib * MiB
    work = Path(tempfile.mkdtemp(prefix="fs3-ckpt-bench-", dir=args.workdir))
    res: dict[str, Any] = {"size_bytes": size, "rows": {}}
    rows = res["rows"]
    cluster = ProcessCluster(
        work / "cluster",
        storage_nodes=3,
        targets_per_node=1,
        meta=1,
        mgmtd=1,
        mount=str(work / "mnt"),
    )
    try:
        say("starting cluster + mount")
        cluster.start()
        mnt = str(work / "mnt")
        sd = synthetic_state(size)
        total = nbytes(sd)
        res["tensors"] = len(sd)
        res["state_bytes"] = total
        say(f"state dict: {len(sd)} tensors, {total / MiB:.0f} MiB")

        # in-memory copy: Tensor.copy_ into preallocated (already touched) tensors
        dst = {k: torch.empty_like(v) for k, v in sd.items()}
        for k in sd:
            dst[k].copy_(sd[k])
        copies = []

        def copy_all(dst: dict[str, Any] = dst) -> None:
            for k, v in sd.items():
                dst[k].copy_(v)

        for _ in range(3):
            t, _ = timed(copy_all)
            copies.append(t)

        # fs3.ckpt on the mount (USRBIO)
        root = os.path.join(mnt, "ckpt")
        c = ckpt.Checkpointer(root)
        assert c.store.kind == "usrbio", c.store.kind
        say("fs3.ckpt warm-up save (allocates the snapshot buffer)")
        c.save(sd, step=0, asynchronous=False)
        say("fs3.ckpt sync save")
        t, h = timed(lambda: c.save(sd, step=1, asynchronous=False))
        rows["fs3.ckpt save (sync)"] = {"seconds": t, "bytes": h.stats["bytes"]}
        say("fs3.ckpt async save")
        t, _ = timed(copy_all)  # the copy again, right before the stall it is compared with
        copies.append(t)
        res["memcopy_s"] = min(copies)
        stalls = []
        for step in (2, 3):  # two async saves: the machine is shared, the stall is short
            t0 = time.perf_counter()
            h = c.save(sd, step=step, asynchronous=True)
            stalls.append(time.perf_counter() - t0)
            h.wait()
            t = time.perf_counter() - t0
            t2, _ = timed(copy_all)
            copies.append(t2)
        res["memcopy_s"] = min(copies)
        res["stalls_s"] = stalls
        stall = min(stalls)
        rows["fs3.ckpt save (async)"] = {"seconds": t, "bytes": h.stats["bytes"], "stall_s": stall}
        del dst, copy_all
        data = os.path.join(root, layout.step_dir(3), layout.data_name(0))
        drop_caches()
        say("fs3.ckpt load")
        t, loaded = timed(lambda: c.load(3))
        assert all(torch.equal(loaded[k], sd[k]) for k in list(sd)[:5])
        rows["fs3.ckpt load"] = {"seconds": t, "bytes": total}
        into = loaded
        drop_caches()
        say("fs3.ckpt load into preallocated")
        t, _ = timed(lambda: c.load(3, into=into))
        rows["fs3.ckpt load (into)"] = {"seconds": t, "bytes": total}
        del loaded, into
        drop_caches()
        say("raw USRBIO read of the data file")
        t = usrbio_read(mnt, data)
        rows["USRBIO raw read"] = {"seconds": t, "bytes": os.path.getsize(data)}
        c.close()

        # torch.save / torch.load: local disk and the fs3 mount
        local = work / "local"
        local.mkdir()
        for where, d in (("local disk", str(local)), ("fs3 mount", mnt)):
            p = os.path.join(d, "torch.pt")
            say(f"torch.save to {where}")

            def save_torch(p: str = p) -> None:
                torch.save(sd, p)
                fsync_path(p)

            t, _ = timed(save_torch)
            rows[f"torch.save ({where})"] = {"seconds": t, "bytes": os.path.getsize(p)}
            drop_caches()
            say(f"torch.load from {where}")
            t, _ = timed(lambda p=p: torch.load(p))
            rows[f"torch.load ({where})"] = {"seconds": t, "bytes": os.path.getsize(p)}
            os.unlink(p)

        # DCP through fs3.ckpt.dcp (when present)
        try:
            import torch.distributed.checkpoint as dcp

            from fs3.ckpt.dcp import Fs3StorageReader, Fs3StorageWriter
        except ImportError as e:
            res["dcp"] = f"not run: {e}"
        else:
            d = os.path.join(mnt, "dcp")
            say("DCP save")
            t, _ = timed(lambda: dcp.save(sd, storage_writer=Fs3StorageWriter(d), no_dist=True))
            rows["DCP save (fs3.ckpt.dcp)"] = {"seconds": t, "bytes": total}
            into = {k: torch.empty_like(v) for k, v in sd.items()}
            drop_caches()
            say("DCP load")
            t, _ = timed(lambda: dcp.load(into, storage_reader=Fs3StorageReader(d), no_dist=True))
            rows["DCP load (fs3.ckpt.dcp)"] = {"seconds": t, "bytes": total}
            del into

        # incremental: 10 % of the tensors change
        say("incremental: full, then 10 % of tensors changed")
        inc = ckpt.Checkpointer(
            os.path.join(mnt, "inc"), policy=ckpt.Incremental(baseline_every=10)
        )
        full = inc.save(sd, step=0).wait()
        # every 10th tensor in size order: 10 % of the tensors, spread over all sizes
        by_size = sorted(sd, key=lambda k: (sd[k].numel() * sd[k].element_size(), k))
        changed = by_size[5::10]
        for k in changed:
            sd[k].add_(1)
        t0 = time.perf_counter()
        h = inc.save(sd, step=1)
        st = h.wait()
        t = time.perf_counter() - t0
        rows["fs3.ckpt save (incremental, 10 % changed)"] = {
            "seconds": t,
            "bytes": st["bytes"],
            "stall_s": h.stall_s,
        }
        res["incremental"] = {
            "changed_tensors": len(changed),
            "changed_bytes": sum(sd[k].numel() * sd[k].element_size() for k in changed),
            "full_bytes": full["bytes"],
            "incremental_bytes": st["bytes"],
        }
        got = inc.load(1)
        assert all(torch.equal(got[k], sd[k]) for k in changed)
        inc.close()
    finally:
        say("stopping cluster")
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    for r in rows.values():
        r["GB_s"] = r["bytes"] / r["seconds"] / GB
    return res


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    rows = res["rows"]
    g = {k: v["GB_s"] for k, v in rows.items()}
    load = g["fs3.ckpt load"]
    inc = res["incremental"]
    stall = rows["fs3.ckpt save (async)"]["stall_s"]
    out = [
        {"target": "fs3.ckpt load >= 1.5x torch.load from the fs3 mount",
         "value": load / g["torch.load (fs3 mount)"], "need": 1.5},
        {"target": "fs3.ckpt load >= 0.8x raw USRBIO read",
         "value": load / g["USRBIO raw read"], "need": 0.8},
        {"target": "async stall <= 1.5x in-memory copy",
         "value": stall / res["memcopy_s"], "need": 1.5, "lower": True},
        {"target": "incremental (10 % changed) <= 15 % of full",
         "value": inc["incremental_bytes"] / inc["full_bytes"], "need": 0.15, "lower": True},
    ]  # fmt: skip
    for t in out:
        t["met"] = t["value"] <= t["need"] if t.get("lower") else t["value"] >= t["need"]
    return out


def render(res: dict[str, Any]) -> str:
    lines = [
        f"# fs3.ckpt benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"State dict: {res['tensors']} tensors, {res['state_bytes'] / MiB:.0f} MiB "
        f"(float32 + bfloat16, 4 KiB..32 MiB each). Machine: {platform.node()}, "
        f"{os.cpu_count()} CPUs, load average at start {res['loadavg']}.",
        f"Command: `{res['command']}`",
        "",
        "| operation | seconds | bytes | GB/s | stall (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, v in res["rows"].items():
        stall = f"{v['stall_s']:.3f}" if "stall_s" in v else ""
        lines.append(f"| {k} | {v['seconds']:.2f} | {v['bytes']:,} | {v['GB_s']:.3f} | {stall} |")
    lines += [
        "",
        f"In-memory copy of the state dict (`Tensor.copy_` into preallocated tensors, best of 6, "
        f"three of them next to the two async saves): "
        f"{res['memcopy_s']:.3f} s. Async stalls: "
        + ", ".join(f"{x:.3f} s" for x in res["stalls_s"])
        + " (the table has the smaller).",
    ]
    if "dcp" in res:
        lines.append(f"DCP: {res['dcp']}")
    inc = res["incremental"]
    lines += [
        f"Incremental: {inc['changed_tensors']} of {res['tensors']} tensors changed (every 10th "
        f"in size order: {inc['changed_bytes'] / MiB:.0f} MiB); wrote {inc['incremental_bytes'] / MiB:.0f} MiB "
        f"vs {inc['full_bytes'] / MiB:.0f} MiB full.",
        "",
        "| target | measured | needed | met |",
        "|---|---:|---:|---|",
    ]
    for t in res["targets"]:
        op = "<=" if t.get("lower") else ">="
        lines.append(
            f"| {t['target']} | {t['value']:.2f} | {op} {t['need']} | {'yes' if t['met'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size-mib", type=int, default=1024, help="state dict size (default 1024)")
    p.add_argument(
        "--workdir", default=None, help="where the cluster and local files go (default: tmp)"
    )
    p.add_argument("--out", default=None, help="directory for ckpt-<time>.md/.json")
    a = p.parse_args(argv)
    loadavg = " ".join(f"{x:.1f}" for x in os.getloadavg())
    res = run(a)
    res["loadavg"] = loadavg
    res["command"] = " ".join([os.path.relpath(sys.executable), *sys.argv])
    res["targets"] = targets(res)
    md = render(res)
    print(md)
    if a.out:
        stem = Path(a.out) / f"ckpt-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
        stem.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
        stem.with_suffix(".md").write_text(md)
        say(f"wrote {stem}.md/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
