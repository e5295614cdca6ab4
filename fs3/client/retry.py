"""Retry policy shared by the meta and storage clients.

Transient failures (stale routing, a node down, a leader moved, a KV conflict,
a timeout) are retried with exponential backoff until a deadline; permanent
failures (POSIX errors, invalid arguments, checksum refusals of our own
payload) surface at once. The decision is the error's ``retryable`` flag, which
every ``FsError`` carries (set by the server or by ``fs3.rpc.status`` for
connection failures), so the policy lives in one place.

Backoff: ``initial_backoff_s`` doubling up to ``max_backoff_s``, with "equal
jitter" (half fixed, half random) so many clients retrying after one failure
do not retry in lockstep. 3FS waits much longer (10 s initial for storage);
fs3's defaults are scaled for a one-host cluster and tests.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fs3.errors import Code, FsError

T = TypeVar("T")

log = logging.getLogger("fs3.client.retry")


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often to retry a transient failure.

    Attributes:
        deadline_s: total time budget for one operation (all attempts).
        initial_backoff_s: first wait; doubles each retry.
        max_backoff_s: cap of a single wait.
        rpc_timeout_s: timeout of one attempt (never beyond the deadline).
    """

    deadline_s: float = 60.0
    initial_backoff_s: float = 0.02
    max_backoff_s: float = 1.0
    rpc_timeout_s: float = 10.0

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Wait before retry number ``attempt`` (1-based)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * (2 ** max(0, attempt - 1)))
        r = (rng or random).random()
        return base / 2 + base / 2 * r


class Deadline:
    """A monotonic deadline (so a clock step never stretches a retry loop)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.end = clock() + seconds

    def remaining(self) -> float:
        return max(0.0, self.end - self._clock())

    def expired(self) -> bool:
        return self._clock() >= self.end


async def retrying(
    fn: Callable[[int], Awaitable[T]],
    policy: RetryPolicy,
    *,
    what: str = "operation",
    on_error: Callable[[FsError, int], Awaitable[None]] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    deadline: Deadline | None = None,
) -> T:
    """Run ``fn(attempt)`` until it succeeds, fails permanently, or the deadline passes.

    ``on_error(err, attempt)`` runs after each retryable failure before the
    backoff (refresh routing, switch server...). When the deadline expires the
    last error is raised (with its own code, so a caller still sees why), or a
    ``TIMEOUT`` if the budget was already used up. ``deadline``: one that started
    earlier (the caller's first attempt ran before this loop); default: from now.
    """
    if deadline is None:
        deadline = Deadline(policy.deadline_s, clock)
    attempt = 0
    while True:
        attempt += 1
        try:
            return await fn(attempt)
        except FsError as e:
            if not e.retryable:
                raise
            if on_error is not None:
                await on_error(e, attempt)
            wait = policy.backoff(attempt)
            if deadline.remaining() <= wait:
                log.warning("%s: giving up after %d attempts: %s", what, attempt, e)
                raise FsError(
                    e.code,
                    f"{what}: gave up after {attempt} attempts in {policy.deadline_s:g}s: {e.message}",
                    errno=e.errno if e.code != Code.UNAVAILABLE else None,
                    retryable=False,
                ) from e
            log.debug("%s: attempt %d failed (%s); retrying in %.3fs", what, attempt, e, wait)
            await sleep(wait)
