"""The one bridge between the asyncio client core and its callers.

The client core (:mod:`fs3.client.core`) is asyncio code: grpc.aio channels,
the transport connections and the routing watcher all belong to one asyncio
event loop. Its callers are not all asyncio: plain Python programs call a
synchronous file API, and trio programs may use the core too. (The FUSE daemon
no longer needs this bridge: it runs pyfuse3 in its asyncio mode on the core's
own loop, which saved 0.15–0.25 ms of daemon CPU per FUSE request; see
:mod:`fs3.fuse.main`.)
Rather than making the core runtime-agnostic (anyio over grpc.aio is not
possible: grpc.aio is asyncio-only) or using sync gRPC from worker threads (a
thread per in-flight call, and no shared channel/transport state), fs3 runs the
core on **an asyncio loop in one dedicated daemon thread** and offers two thin
entries:

* :meth:`Bridge.run` — synchronous: submit the coroutine with
  ``asyncio.run_coroutine_threadsafe`` and block on the concurrent future.
* :meth:`Bridge.trio_run` — trio: submit the coroutine with
  ``loop.call_soon_threadsafe`` and park the calling trio task with
  ``trio.lowlevel.wait_task_rescheduled``; the asyncio task's done-callback
  wakes it through ``TrioToken.run_sync_soon(reschedule, ...)``. No thread per
  call, no ``trio.to_thread``. Cancelling the trio task cancels the asyncio task.

Measured per-call overhead (round trip of a coroutine that returns at once;
``python -m fs3.client.bridge``: 3 runs of 5,000 calls; 2 cores, Python 3.11):

* idle machine (load average 0.3):
  sync ``run`` 60–125 µs per call (8,000–16,000 calls/s);
  trio ``trio_run`` 120–175 µs per call (5,700–8,400 calls/s);
  a direct ``await`` inside asyncio: 0.1–0.2 µs.
* busy machine (load average ~18 on the 2 cores, other test suites running):
  0.7–1.3 ms (sync) and 1.3–2 ms (trio): each call needs two cross-thread
  wake-ups (submit, then completion), and with a long run queue each one
  waits for a time slice.

So on an idle host the bridge costs about a tenth of a millisecond per
operation, small next to a meta RPC (~2–5 ms here) or a chunk write; that is
why the rule is one bridge call per file operation (never per chunk): chunk
pieces fan out inside the asyncio core.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Bridge:
    """An asyncio event loop running in a dedicated daemon thread.

    Create one per process (see :func:`default_bridge`) or per client; every
    asyncio object of the client core must be created and used on
    :attr:`loop`, i.e. inside coroutines submitted through the bridge.
    """

    def __init__(self, name: str = "fs3-client-loop", event_loop: str | None = None) -> None:
        # uvloop unless [rpc] event_loop = "asyncio" (fs3.rpc.loop says why)
        from fs3.rpc import settings
        from fs3.rpc.loop import new_event_loop

        self._loop = new_event_loop(event_loop or settings.current().event_loop)
        self._ready = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        try:
            self._loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            finally:
                self._loop.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The asyncio loop the client core lives on."""
        return self._loop

    @property
    def closed(self) -> bool:
        return self._closed

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _check(self, coro: Coroutine[Any, Any, Any]) -> None:
        if self._closed or not self._thread.is_alive():
            coro.close()
            raise RuntimeError("bridge is closed")
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError(
                "Bridge.run called from the bridge's own loop thread (would deadlock)"
            )

    # ------------------------------------------------------------------ sync entry

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the bridge loop and block until it finishes.

        Exceptions propagate unchanged. ``timeout`` (seconds) cancels the
        coroutine and raises ``TimeoutError``. A KeyboardInterrupt while waiting
        cancels the coroutine too, so no work is left running behind the caller.
        """
        self._check(coro)
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"operation did not finish within {timeout} s") from None
        except BaseException:
            if not fut.done():
                fut.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the bridge loop without waiting (background work)."""
        self._check(coro)
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    # ------------------------------------------------------------------ trio entry

    async def trio_run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` (an asyncio coroutine) from a trio task.

        The trio task sleeps in ``wait_task_rescheduled`` until the asyncio task
        finishes; the wake-up arrives through the trio token, so no thread is
        spent per call. If the trio task is cancelled, the asyncio task is
        cancelled and the trio ``Cancelled`` is raised once it has stopped.
        """
        import outcome
        import trio

        self._check(coro)
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()
        loop = self._loop
        state: dict[str, Any] = {"task": None, "cancel": False}

        def wake(fut: asyncio.Future[T]) -> None:
            if fut.cancelled():
                res: outcome.Outcome[T] = outcome.Error(asyncio.CancelledError())
            elif fut.exception() is not None:
                exc = fut.exception()
                assert exc is not None
                res = outcome.Error(exc)
            else:
                res = outcome.Value(fut.result())
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task, res)
            except trio.RunFinishedError:
                pass

        def start() -> None:
            t = loop.create_task(coro)
            state["task"] = t
            t.add_done_callback(wake)
            if state["cancel"]:
                t.cancel()

        def cancel() -> None:
            state["cancel"] = True
            t = state["task"]
            if t is not None:
                t.cancel()

        def abort(_raise_cancel: Any) -> Any:
            # Do not abandon the asyncio task: ask it to stop and wait for wake().
            loop.call_soon_threadsafe(cancel)
            return trio.lowlevel.Abort.FAILED

        loop.call_soon_threadsafe(start)
        try:
            return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            if state["cancel"]:
                await trio.lowlevel.checkpoint()  # raises trio.Cancelled
            raise

    # ------------------------------------------------------------------ lifecycle

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop (cancelling leftover tasks) and join the thread."""
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    def __enter__(self) -> Bridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default: Bridge | None = None
_default_lock = threading.Lock()


def default_bridge() -> Bridge:
    """The process-wide bridge, created on first use."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Bridge()
        return _default


# ---------------------------------------------------------------------- measurement


async def _noop() -> None:
    return None


def measure_sync(bridge: Bridge, n: int) -> float:
    """Seconds per call of ``bridge.run`` on a coroutine that returns at once."""
    t0 = time.perf_counter()
    for _ in range(n):
        bridge.run(_noop())
    return (time.perf_counter() - t0) / n


def measure_trio(bridge: Bridge, n: int) -> float:
    """Seconds per call of ``await bridge.trio_run`` from a trio task."""
    import trio

    async def main() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            await bridge.trio_run(_noop())
        return (time.perf_counter() - t0) / n

    return trio.run(main)


def measure_direct(n: int) -> float:
    """Seconds per direct ``await`` inside asyncio (the floor)."""

    async def main() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            await _noop()
        return (time.perf_counter() - t0) / n

    return asyncio.run(main())


def main() -> None:  # pragma: no cover - measurement script
    import statistics

    n = 5000
    with Bridge() as b:
        sync = statistics.median(measure_sync(b, n) for _ in range(3))
        tr = statistics.median(measure_trio(b, n) for _ in range(3))
    direct = statistics.median(measure_direct(n) for _ in range(3))
    print(f"sync run:  {sync * 1e6:7.1f} us/call  {1 / sync:9.0f} calls/s")
    print(f"trio_run:  {tr * 1e6:7.1f} us/call  {1 / tr:9.0f} calls/s")
    print(f"direct:    {direct * 1e6:7.1f} us/call")


if __name__ == "__main__":  # pragma: no cover
    main()
