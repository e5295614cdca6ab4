"""Group commit: requests of many threads share one durable write.

Why: a store that fsyncs its log on every commit (SQLite with
``synchronous=FULL``: meta's KV in :mod:`fs3.kv.sqlite`, a storage target's
chunk rows in :mod:`fs3.storage.chunk_meta`) is bounded by the fsync, not by
the work of a commit. Requests that arrive while a write is in progress can
wait for the next one and share its transaction and its fsync.

How (the leader/follower scheme of database group commit): :meth:`GroupCommit.submit`
queues a request. If no batch is being written, the submitting thread becomes
the *leader*: it takes the queue (at most ``max_batch`` requests, oldest first),
calls ``write_batch`` once for all of them (one transaction, one fsync) and
wakes the others. Threads that queued meanwhile sleep; when the batch ends,
the members of the batch return and one of the rest leads the next batch. A
request is acknowledged - its ``submit`` returns - only after the batch that
holds it has returned from ``write_batch``, so only after its fsync.

Failures. ``write_batch`` returns one outcome per request (None: written) for
the failures it isolates itself (the KV engine validates each transaction
under its own savepoint, so a conflicting one aborts alone), or raises when
the batch as a whole failed. Then, if ``retry_alone(error)`` allows and the
batch held more than one request, each request is written again in a batch of
its own, so one bad request (a superseded chunk update, one row that does not
fit) fails alone and the others are written; otherwise every request of the
batch fails with the error. Each waiting thread raises an exception object of
its own (one object raised in several threads at once would have its traceback
rewritten under the others).

Threads only: ``submit`` blocks, so event-loop code calls it through a worker
thread.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

#: What ``write_batch`` returns: one error (or None) per request, or None if all were written.
Outcomes = Sequence[BaseException | None] | None


@dataclass(eq=False)
class _Ticket(Generic[T]):
    """A queued request and, once its batch ended, its outcome."""

    item: T
    done: bool = False
    error: BaseException | None = None


def _own_copy(e: BaseException) -> BaseException:
    """A copy of ``e`` for one more waiting thread to raise (``e`` itself if it cannot be copied)."""
    try:
        c = copy.copy(e)  # the attributes; a constructor may have rewritten args
        c.args = e.args
    except Exception:  # an exception type whose constructor its args do not fit
        return e
    return c


class GroupCommit(Generic[T]):
    """Batches concurrent requests into single calls of ``write_batch``.

    Args:
        write_batch: writes a batch durably in one transaction; returns the outcome of
            each request (see the module docstring) or raises for the whole batch.
        max_batch: the most requests one batch takes (0: no limit).
        retry_alone: whether a batch that raised this error is retried one request at a
            time (default: always). A store whose batch failure cannot be caused by one
            request (lock contention) says no, so it does not wait once per request.
    """

    def __init__(
        self,
        write_batch: Callable[[list[T]], Outcomes],
        *,
        max_batch: int = 0,
        retry_alone: Callable[[BaseException], bool] = lambda _e: True,
    ) -> None:
        if max_batch < 0:
            raise ValueError(f"max_batch must be >= 0, not {max_batch}")
        self._write_batch = write_batch
        self._max_batch = max_batch
        self._retry_alone = retry_alone
        self._cv = threading.Condition()
        self._queue: list[_Ticket[T]] = []
        self._leading = False  # a thread is writing a batch (or holds :meth:`exclusive`)
        self.batches = 0  # calls of write_batch (retries of single requests included)

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (not those being written)."""
        with self._cv:
            return len(self._queue)

    def submit(self, item: T) -> None:
        """Write ``item`` in a batch; return once its batch is durable, or raise its error."""
        ticket = _Ticket(item)
        with self._cv:
            self._queue.append(ticket)
        while True:
            with self._cv:
                while not ticket.done and self._leading:
                    self._cv.wait()
                if ticket.done:
                    break
                self._leading = True
                n = self._max_batch or len(self._queue)
                batch, self._queue = self._queue[:n], self._queue[n:]
            try:
                self._run(batch)
            finally:
                with self._cv:
                    for t in batch:
                        t.done = True
                    self._leading = False
                    self._cv.notify_all()
            # with max_batch the queue may have held more than a batch ahead of us: lead again
        if ticket.error is not None:
            raise ticket.error

    def try_exclusive(self) -> bool:
        """Take the store for a request of one's own if it is idle with nothing queued.

        A fast path for a request that can commit on its own (no waiting, no
        batch): True means no batch starts until :meth:`end_exclusive`, and
        requests submitted meanwhile wait for it as for a batch; False means the
        store is busy and the request should be submitted.
        """
        with self._cv:
            if self._leading or self._queue:
                return False
            self._leading = True
            return True

    def end_exclusive(self) -> None:
        """End what :meth:`try_exclusive` (True) or :meth:`exclusive` began."""
        with self._cv:
            self._leading = False
            self._cv.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Wait for the batch in progress and hold off new ones for the block (closing the
        store under the batches)."""
        with self._cv:
            while self._leading:
                self._cv.wait()
            self._leading = True
        try:
            yield
        finally:
            self.end_exclusive()

    def _run(self, batch: list[_Ticket[T]]) -> None:
        """Write ``batch`` and record every member's outcome (never raises)."""
        try:
            self._write(batch)
        except BaseException as e:
            if len(batch) > 1 and self._retry_alone(e):
                for t in batch:
                    try:
                        self._write([t])
                    except BaseException as alone:
                        t.error = alone
            else:
                batch[0].error = e
                for t in batch[1:]:
                    t.error = _own_copy(e)

    def _write(self, batch: list[_Ticket[T]]) -> None:
        self.batches += 1
        outcomes = self._write_batch([t.item for t in batch])
        if outcomes is None:
            return
        if len(outcomes) != len(batch):
            raise RuntimeError(
                f"group commit: write_batch answered {len(outcomes)} outcomes for {len(batch)}"
            )
        for t, err in zip(batch, outcomes, strict=True):
            t.error = err


__all__ = ["GroupCommit", "Outcomes"]
