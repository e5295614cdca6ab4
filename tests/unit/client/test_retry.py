"""Retry policy: backoff bounds, permanent vs transient errors, deadlines."""

from __future__ import annotations

import asyncio
import errno
import random

import pytest

from fs3.client.retry import Deadline, RetryPolicy, retrying
from fs3.errors import Code, FsError, posix

pytestmark = pytest.mark.timeout(10)


class FakeTime:
    """Virtual time: sleep advances the clock instantly (deterministic, fast)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_backoff_grows_and_is_capped() -> None:
    p = RetryPolicy(deadline_s=10, initial_backoff_s=0.1, max_backoff_s=1.0)
    rng = random.Random(1)
    for attempt, base in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (12, 1.0)]:
        w = p.backoff(attempt, rng)
        assert base / 2 <= w <= base


def test_transient_errors_are_retried_until_success() -> None:
    t = FakeTime()
    calls = []

    async def fn(n: int) -> str:
        calls.append(n)
        if n < 4:
            raise FsError(Code.CHAIN_VERSION_MISMATCH, "stale")
        return "ok"

    seen = []

    async def on_error(e: FsError, n: int) -> None:
        seen.append((e.code, n))

    r = asyncio.run(
        retrying(fn, RetryPolicy(deadline_s=5), on_error=on_error, sleep=t.sleep, clock=t.clock)
    )
    assert r == "ok"
    assert calls == [1, 2, 3, 4]
    assert seen == [(Code.CHAIN_VERSION_MISMATCH, i) for i in (1, 2, 3)]
    assert len(t.sleeps) == 3


def test_permanent_error_surfaces_at_once() -> None:
    t = FakeTime()
    calls = []

    async def fn(n: int) -> None:
        calls.append(n)
        raise posix(errno.ENOENT)

    with pytest.raises(FsError) as ei:
        asyncio.run(retrying(fn, RetryPolicy(deadline_s=5), sleep=t.sleep, clock=t.clock))
    assert ei.value.errno == errno.ENOENT
    assert calls == [1] and t.sleeps == []


def test_deadline_gives_up_with_last_error() -> None:
    t = FakeTime()

    async def fn(n: int) -> None:
        raise FsError(Code.UNAVAILABLE, "node down")

    with pytest.raises(FsError) as ei:
        asyncio.run(
            retrying(
                fn, RetryPolicy(deadline_s=2.0, max_backoff_s=0.5), sleep=t.sleep, clock=t.clock
            )
        )
    assert ei.value.code == Code.UNAVAILABLE
    assert not ei.value.retryable
    assert "gave up" in ei.value.message
    assert t.now <= 2.0
    assert sum(t.sleeps) > 1.0  # it did keep trying for most of the budget


def test_deadline_object() -> None:
    t = FakeTime()
    d = Deadline(3, t.clock)
    assert d.remaining() == 3 and not d.expired()
    t.now = 5
    assert d.remaining() == 0 and d.expired()
