"""fs3.group_commit: batching with real threads, acknowledgment after the write, failure isolation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from fs3.errors import Code, FsError
from fs3.group_commit import GroupCommit, Outcomes

pytestmark = pytest.mark.timeout(60)


class Store:
    """A fake durable store: ``write`` records each batch; items named ``bad*`` fail it."""

    def __init__(self, *, fsync_s: float = 0.0) -> None:
        self.durable: list[str] = []
        self.batches: list[list[str]] = []
        self.fsync_s = fsync_s
        self.lock = threading.Lock()

    def write(self, items: list[str]) -> Outcomes:
        with self.lock:
            self.batches.append(list(items))
        if any(i.startswith("bad") for i in items):
            raise FsError(Code.NO_SPACE, f"no room for {sorted(items)}")
        if self.fsync_s:
            time.sleep(self.fsync_s)  # the disk flush a real store waits for
        with self.lock:
            self.durable.extend(items)
        return None


def submit_all(
    gc: GroupCommit[str], items: list[str], check: Callable[[str], None] | None = None
) -> tuple[list[threading.Thread], dict[str, object]]:
    """Submit each item from its own thread; results: item -> "ok" or the exception."""
    results: dict[str, object] = {}

    def go(item: str) -> None:
        try:
            gc.submit(item)
            if check is not None:
                check(item)
            results[item] = "ok"
        except BaseException as e:
            results[item] = e

    threads = [threading.Thread(target=go, args=(i,)) for i in items]
    for t in threads:
        t.start()
    return threads, results


def wait_queued(gc: GroupCommit[str], n: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (q := gc.queued) < n:
        assert time.monotonic() < deadline, f"only {q} of {n} queued"
        time.sleep(0.005)


def join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(20)
        assert not t.is_alive(), "a submitter never returned"


def test_requests_queued_behind_a_write_share_one_batch_and_return_after_it() -> None:
    store = Store()
    gc: GroupCommit[str] = GroupCommit(store.write)
    items = [f"r{i}" for i in range(8)]

    def acknowledged_only_when_durable(item: str) -> None:
        with store.lock:
            assert item in store.durable, f"{item} acknowledged before its batch was written"

    with gc.exclusive():  # as if a batch were in the middle of its fsync
        threads, results = submit_all(gc, items, acknowledged_only_when_durable)
        wait_queued(gc, len(items))
        assert not results, "nobody is acknowledged before its batch is written"
    join(threads)
    assert results == dict.fromkeys(items, "ok")
    assert len(store.batches) == 1 and sorted(store.batches[0]) == sorted(items)
    assert gc.batches == 1 and gc.queued == 0


def test_many_threads_write_every_item_once_in_fewer_batches() -> None:
    store = Store(fsync_s=0.002)
    gc: GroupCommit[str] = GroupCommit(store.write)
    results: dict[str, object] = {}

    def worker(w: int) -> None:
        for i in range(40):
            item = f"w{w}-{i}"
            gc.submit(item)
            with store.lock:
                assert item in store.durable
            results[item] = "ok"

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    join(threads)
    assert len(results) == 8 * 40
    assert sorted(store.durable) == sorted(results), "every item written exactly once"
    assert len(store.batches) < 8 * 40, "concurrent submitters shared batches"


def test_a_failing_batch_is_retried_one_at_a_time_so_the_bad_request_fails_alone() -> None:
    store = Store()
    gc: GroupCommit[str] = GroupCommit(store.write)
    items = ["a", "bad", "b", "c"]
    with gc.exclusive():
        threads, results = submit_all(gc, items)
        wait_queued(gc, len(items))
    join(threads)
    assert [results[i] for i in ("a", "b", "c")] == ["ok"] * 3
    err = results["bad"]
    assert isinstance(err, FsError) and err.code == Code.NO_SPACE
    assert "['bad']" in err.message, "the error of its own retry, not the batch's"
    assert sorted(store.durable) == ["a", "b", "c"]
    assert len(store.batches) == 1 + 4 and gc.batches == 5  # the batch, then each alone


def test_without_retry_alone_every_member_fails_with_its_own_copy_of_the_error() -> None:
    store = Store()
    gc: GroupCommit[str] = GroupCommit(store.write, retry_alone=lambda _e: False)
    items = ["a", "bad", "b"]
    with gc.exclusive():
        threads, results = submit_all(gc, items)
        wait_queued(gc, len(items))
    join(threads)
    errs = [results[i] for i in items]
    assert all(isinstance(e, FsError) and e.code == Code.NO_SPACE for e in errs)
    assert len({id(e) for e in errs}) == 3, "each waiter raises an object of its own"
    assert len({str(e) for e in errs}) == 1 and "no room for" in str(errs[0])
    assert store.durable == [] and len(store.batches) == 1


def test_per_request_outcomes_fail_only_their_request() -> None:
    def write(items: list[str]) -> Outcomes:
        return [FsError(Code.KV_CONFLICT, f"{i} conflicts") if "x" in i else None for i in items]

    gc: GroupCommit[str] = GroupCommit(write)
    with gc.exclusive():
        threads, results = submit_all(gc, ["a", "x1", "b"])
        wait_queued(gc, 3)
    join(threads)
    assert results["a"] == results["b"] == "ok"
    assert isinstance(results["x1"], FsError) and results["x1"].code == Code.KV_CONFLICT
    assert gc.batches == 1  # a failure the store isolated itself is not retried


def test_max_batch_splits_the_queue_and_nobody_returns_before_its_own_batch() -> None:
    store = Store()
    gc: GroupCommit[str] = GroupCommit(store.write, max_batch=3)
    items = [f"r{i}" for i in range(10)]

    def acknowledged_only_when_durable(item: str) -> None:
        with store.lock:
            assert item in store.durable, f"{item} returned before a batch wrote it"

    with gc.exclusive():
        threads, results = submit_all(gc, items, acknowledged_only_when_durable)
        wait_queued(gc, len(items))
    join(threads)
    assert results == dict.fromkeys(items, "ok")
    assert all(len(b) <= 3 for b in store.batches) and len(store.batches) >= 4
    assert sorted(store.durable) == sorted(items)


def test_try_exclusive_only_when_idle_and_exclusive_waits_for_the_batch() -> None:
    store = Store()
    gate = threading.Event()
    entered = threading.Event()

    def slow(items: list[str]) -> Outcomes:
        entered.set()
        assert gate.wait(10)
        return store.write(items)

    gc: GroupCommit[str] = GroupCommit(slow)
    assert gc.try_exclusive()
    gc.end_exclusive()
    threads, results = submit_all(gc, ["a"])
    assert entered.wait(10)
    assert not gc.try_exclusive(), "a batch is being written"
    closed: list[list[str]] = []

    def close() -> None:
        with gc.exclusive():  # waits for the batch in progress
            closed.append(list(store.durable))

    closer = threading.Thread(target=close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and not closed, "exclusive() must wait for the batch"
    gate.set()
    join(threads + [closer])
    assert results == {"a": "ok"} and closed == [["a"]]
    assert gc.try_exclusive()
    gc.end_exclusive()


def test_a_write_batch_that_answers_the_wrong_number_of_outcomes_fails_loudly() -> None:
    gc: GroupCommit[str] = GroupCommit(lambda items: [None], retry_alone=lambda _e: False)
    with gc.exclusive():
        threads, results = submit_all(gc, ["a", "b"])
        wait_queued(gc, 2)
    join(threads)
    assert all(isinstance(results[i], RuntimeError) for i in ("a", "b"))
    with pytest.raises(ValueError):
        GroupCommit(lambda items: None, max_batch=-1)
