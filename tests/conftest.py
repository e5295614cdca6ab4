"""Session-wide test plumbing: the exit guard, the one place that says what it hides.

What it hides: grpc.aio's completion-queue poller thread (target
``PollerCompletionQueue._poll_wrapper``, named ``Thread-N (_poll_wrapper)``). grpc
starts one per process for asyncio channels and servers and leaves it behind
once the event loop that used it is gone; at the very end pytest's
``gc.collect()`` and the interpreter's shutdown can then wait on it forever,
*after* the summary was printed. So when that thread is still alive at
``pytest_unconfigure`` (the report is written by then), the run ends with
``os._exit`` and pytest's own exit status. Nothing else is hidden.

What it does not hide: any other thread still alive that is not a daemon (a
``Thread``, executor or bridge a test or fs3 forgot to stop) would also keep
the interpreter from exiting. It is a leak, so the guard names every such
thread with its target and current stack on stderr and fails the run (exit
status 1 if the tests passed), instead of hanging or exiting silently.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

import pytest

_status: list[int] = [0]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _status[0] = int(exitstatus)


def _is_grpc_poller(t: threading.Thread) -> bool:
    target = getattr(t, "_target", None)
    return "_poll_wrapper" in (getattr(target, "__qualname__", "") or t.name)


def _describe(t: threading.Thread) -> str:
    target = getattr(t, "_target", None)
    frame = sys._current_frames().get(t.ident or -1)
    stack = "".join(traceback.format_stack(frame)) if frame is not None else "  (no frame)\n"
    return f"thread {t.name!r} (target {target!r}):\n{stack}"


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    leaked = [t for t in others if not t.daemon and not _is_grpc_poller(t)]
    if leaked:
        sys.stdout.flush()
        sys.stderr.write(
            f"\nexit guard (tests/conftest.py): {len(leaked)} leaked non-daemon thread(s) "
            "would keep the interpreter from exiting:\n"
        )
        for t in leaked:
            sys.stderr.write(_describe(t))
        sys.stderr.flush()
        os._exit(_status[0] or 1)
    if any(_is_grpc_poller(t) for t in others):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_status[0])
