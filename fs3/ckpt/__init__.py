"""Checkpoints for training jobs on fs3: async sharded/consolidated saves, deltas, verified loads.

See :mod:`fs3.ckpt.api` (save/load), :mod:`fs3.ckpt.layout` (what is on storage and
when a checkpoint is valid), :mod:`fs3.ckpt.datafile` (the aggregated data path)
and :mod:`fs3.ckpt.interval` (how often to save).
"""

from fs3.ckpt.api import (
    Checkpointer,
    Differential,
    Full,
    Incremental,
    SaveHandle,
    Shard,
    checkpointer,
    close_all,
    latest,
    load,
    save,
    wait_all,
)
from fs3.ckpt.datafile import CorruptCheckpoint

__all__ = [
    "Checkpointer",
    "CorruptCheckpoint",
    "Differential",
    "Full",
    "Incremental",
    "SaveHandle",
    "Shard",
    "checkpointer",
    "close_all",
    "latest",
    "load",
    "save",
    "wait_all",
]
