"""Scoped fault injection, 3FS style.

Inside ``with inject(prob, seed=...)`` the KV engines (and any other component
that calls :func:`maybe_fail`) fail at random with *retryable* errors, so tests can
prove every operation is retry-safe and takes effect exactly once. The scope is a
context variable: it follows the calling task (and ``asyncio.to_thread``) and
never leaks into unrelated tasks or processes.
"""

from __future__ import annotations

import contextlib
import contextvars
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from fs3.errors import Code, FsError


@dataclass
class FaultScope:
    """One active injection scope: probability, RNG and what was injected."""

    prob: float
    rng: random.Random
    points: frozenset[str] | None = None
    max_faults: int | None = None
    injected: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.injected.values())


_scope: contextvars.ContextVar[FaultScope | None] = contextvars.ContextVar(
    "fs3_fault_scope", default=None
)


@contextlib.contextmanager
def inject(
    prob: float,
    *,
    seed: int = 0,
    points: set[str] | None = None,
    max_faults: int | None = None,
) -> Iterator[FaultScope]:
    """Make :func:`maybe_fail` fail with probability ``prob`` inside the block.

    Args:
        prob: chance that one call of :func:`maybe_fail` raises.
        seed: RNG seed, so a failing run can be replayed.
        points: only these injection points fail (all when None).
        max_faults: stop injecting after this many faults.
    """
    scope = FaultScope(prob, random.Random(seed), frozenset(points) if points else None, max_faults)
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


def active() -> FaultScope | None:
    """The injection scope of the current context, if any."""
    return _scope.get()


def should_fail(point: str) -> bool:
    """Decide whether the injection point ``point`` fails now (and count it)."""
    scope = _scope.get()
    if scope is None or (scope.points is not None and point not in scope.points):
        return False
    if scope.max_faults is not None and scope.total >= scope.max_faults:
        return False
    if scope.rng.random() >= scope.prob:
        return False
    scope.injected[point] = scope.injected.get(point, 0) + 1
    return True


def maybe_fail(point: str, code: Code = Code.KV_CONFLICT) -> None:
    """Raise a retryable :class:`FsError` at ``point`` if the scope says so."""
    if should_fail(point):
        raise FsError(code, f"injected fault at {point}", retryable=True)
