"""How often to checkpoint: the optimal interval T* = sqrt(2 · t_save · MTBF) (Young's approximation).

With an interval T, a job loses ``t_save / T`` of its time to saving and, per
failure, on average ``T / 2`` of work since the last checkpoint; with failures
every ``MTBF`` seconds the waste fraction is ``t_save/T + T/(2·MTBF)``, smallest
at ``T* = sqrt(2 · t_save · MTBF)``, where both terms equal ``sqrt(t_save / (2·MTBF))``.
The MTBF that matters is the *job's*: with ``gpus`` devices that each fail every
``mtbf`` on average, the job fails every ``mtbf / gpus``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

DAY_S = 86400.0


@dataclass(frozen=True)
class Advice:
    interval_s: float  # T*
    job_mtbf_s: float
    saves_per_day: float
    overhead_fraction: float  # time spent saving
    overhead_s_per_day: float
    failures_per_day: float
    lost_work_s_per_day: float  # recomputation after failures (expected)
    gpus: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def advise(save_seconds: float, mtbf_hours: float, gpus: int = 1) -> Advice:
    """T* and the expected daily costs for saves taking ``save_seconds`` (blocking time)."""
    if not save_seconds > 0:
        raise ValueError(f"save time must be > 0 seconds, got {save_seconds}")
    if not mtbf_hours > 0:
        raise ValueError(f"MTBF must be > 0 hours, got {mtbf_hours}")
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    mtbf = mtbf_hours * 3600.0 / gpus
    t = math.sqrt(2.0 * save_seconds * mtbf)
    per_day = DAY_S / t
    failures = DAY_S / mtbf
    return Advice(
        interval_s=t,
        job_mtbf_s=mtbf,
        saves_per_day=per_day,
        overhead_fraction=save_seconds / t,
        overhead_s_per_day=per_day * save_seconds,
        failures_per_day=failures,
        lost_work_s_per_day=failures * t / 2.0,
        gpus=gpus,
    )
