"""Scoped fault injection: deterministic, bounded, and confined to its scope."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fs3 import faults
from fs3.errors import Code, FsError


@pytest.mark.timeout(5)
def test_no_scope_never_fails() -> None:
    assert faults.active() is None
    for _ in range(1000):
        faults.maybe_fail("kv.get")
    assert not faults.should_fail("x")


@pytest.mark.timeout(5)
def test_probability_extremes_and_counting() -> None:
    with faults.inject(0.0) as scope:
        assert not any(faults.should_fail("a") for _ in range(500))
        assert scope.total == 0
    with faults.inject(1.0) as scope:
        for point in ("a", "a", "b"):
            with pytest.raises(FsError) as ei:
                faults.maybe_fail(point)
            assert ei.value.code == Code.KV_CONFLICT and ei.value.retryable
            assert point in ei.value.message
        assert scope.injected == {"a": 2, "b": 1} and scope.total == 3
    with faults.inject(1.0), pytest.raises(FsError) as ei:
        faults.maybe_fail("c", Code.UNAVAILABLE)
    assert ei.value.code == Code.UNAVAILABLE and ei.value.retryable


@pytest.mark.timeout(5)
def test_same_seed_same_faults_and_rate_near_prob() -> None:
    def pattern(seed: int) -> list[bool]:
        with faults.inject(0.3, seed=seed):
            return [faults.should_fail("p") for _ in range(2000)]

    a, b, c = pattern(7), pattern(7), pattern(8)
    assert a == b and a != c
    assert 0.25 < sum(a) / len(a) < 0.35


@pytest.mark.timeout(5)
def test_points_filter_and_max_faults() -> None:
    with faults.inject(1.0, points={"kv.commit"}) as scope:
        faults.maybe_fail("kv.get")  # not selected: passes
        with pytest.raises(FsError):
            faults.maybe_fail("kv.commit")
    assert scope.injected == {"kv.commit": 1}
    with faults.inject(1.0, max_faults=3) as scope:
        fired = sum(faults.should_fail("x") for _ in range(10))
    assert fired == 3 and scope.total == 3


@pytest.mark.timeout(5)
def test_nested_scopes_restore_the_outer_one() -> None:
    with faults.inject(0.0) as outer:
        with faults.inject(1.0) as inner:
            assert faults.active() is inner
            assert faults.should_fail("x")
        assert faults.active() is outer
        assert not faults.should_fail("x")
    assert faults.active() is None


@pytest.mark.timeout(5)
def test_scope_does_not_leak_into_other_threads_or_after_exit() -> None:
    seen: list[object] = []
    with faults.inject(1.0):
        t = threading.Thread(target=lambda: seen.append(faults.active()))
        t.start()
        t.join(timeout=5)
    assert seen == [None]  # a new thread starts with an empty context
    with pytest.raises(RuntimeError), faults.inject(1.0):
        raise RuntimeError("leaves the scope")
    assert faults.active() is None


@pytest.mark.timeout(5)
def test_scope_follows_to_thread_but_not_other_tasks() -> None:
    async def main() -> tuple[bool, object]:
        other_seen: list[object] = []
        ready = asyncio.Event()

        async def other() -> None:
            await ready.wait()
            other_seen.append(faults.active())

        task = asyncio.create_task(other())  # created outside the scope
        with faults.inject(1.0):
            in_thread = await asyncio.to_thread(faults.should_fail, "t")
            ready.set()
            await task
        return in_thread, other_seen[0]

    in_thread, other = asyncio.run(main())
    assert in_thread is True
    assert other is None
