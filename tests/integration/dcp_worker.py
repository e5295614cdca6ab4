"""One rank of a DCP save or load on fs3 (run by tests/integration/test_dcp.py as a process).

Usage: ``python dcp_worker.py JSON`` with keys ``op`` (save, load or
"save,load": both, one after the other, in the same processes), ``rank``,
``world``, ``rendezvous`` (a FileStore path), ``path`` (``fs3:///...``),
``cluster_file``, ``seed``; for save optionally ``kill_phase``/``kill_rank``
(SIGKILL this process at that phase of :class:`fs3.ckpt.dcp.Fs3StorageWriter`).

The state dict mixes DTensors sharded over every rank (unevenly: 37 rows over
3 or 2 ranks), a replicated tensor and plain Python objects, all derived from
``seed`` so any world size can compute what it must load.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from fs3.ckpt.dcp import Fs3StorageReader, Fs3StorageWriter

SHAPES = {"emb": ((37, 16), 0), "proj": ((8, 30), 1)}  # name: (full shape, sharded dim)


def full_state(seed: int) -> dict[str, Any]:
    """The unsharded values a checkpoint of ``seed`` holds."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {n: torch.randn(*shape, generator=g) for n, (shape, _) in SHAPES.items()}
    out["bias"] = torch.randn(16, generator=g).to(torch.bfloat16)
    out["step"] = seed * 100
    out["hist"] = [seed, seed + 0.5]
    return out


def sharded(full: dict[str, Any], mesh: Any, zero: bool = False) -> dict[str, Any]:
    sd: dict[str, Any] = {"model": {}, "train": {}}
    for n, (_, dim) in SHAPES.items():
        t = torch.zeros_like(full[n]) if zero else full[n]
        sd["model"][n] = distribute_tensor(t, mesh, [Shard(dim)])
    sd["model"]["bias"] = torch.zeros_like(full["bias"]) if zero else full["bias"]
    sd["train"]["step"] = 0 if zero else full["step"]
    sd["train"]["hist"] = [] if zero else full["hist"]
    return sd


class KillAt(Fs3StorageWriter):
    def __init__(self, *a: Any, kill_phase: str, kill_rank: int, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.kill_phase, self.kill_rank = kill_phase, kill_rank

    def _phase(self, name: str) -> None:
        if name == self.kill_phase and self.rank == self.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)


def main(a: dict[str, Any]) -> None:
    rank, world = a["rank"], a["world"]
    store = dist.FileStore(a["rendezvous"], world)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30)
    )
    mesh = init_device_mesh("cpu", (world,))
    full = full_state(a["seed"])
    ops = a["op"].split(",")
    if "save" in ops:
        kw = {"cluster_file": a["cluster_file"]}
        if a.get("kill_phase"):
            w: Fs3StorageWriter = KillAt(
                a["path"], kill_phase=a["kill_phase"], kill_rank=a["kill_rank"], **kw
            )
        else:
            w = Fs3StorageWriter(a["path"], **kw)
        dcp.save(sharded(full, mesh), storage_writer=w)
        w.close()
    if "load" in ops:
        sd = sharded(full, mesh, zero=True)
        r = Fs3StorageReader(a["path"], cluster_file=a["cluster_file"])
        dcp.load(sd, storage_reader=r)
        r.close()
        for n, (_, dim) in SHAPES.items():
            dt = sd["model"][n]
            # this rank's shard of the new layout, and the whole tensor
            want_local = full[n].chunk(world, dim)[rank]  # DTensor Shard: torch.chunk sizes
            assert torch.equal(dt.to_local(), want_local), f"rank {rank}: {n} shard differs"
            assert torch.equal(dt.full_tensor(), full[n]), f"{n} differs"
        assert torch.equal(sd["model"]["bias"], full["bias"])
        assert sd["train"]["step"] == full["step"] and sd["train"]["hist"] == full["hist"]
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} ok", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
