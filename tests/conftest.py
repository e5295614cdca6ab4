"""Session-wide test plumbing.

grpc.aio leaves a completion-queue poller thread ("_poll_wrapper") behind once an
event loop that used it is gone; at the very end pytest's ``gc.collect()`` (and the
interpreter's own shutdown) can then wait for that thread forever, *after* the
summary was printed. A CI run must never hang there: once every test has run and
the report is written, exit with pytest's status if non-daemon threads are left.
"""

from __future__ import annotations

import os
import sys
import threading

import pytest

_status: list[int] = [0]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _status[0] = int(exitstatus)


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    stragglers = [
        t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon
    ]
    if stragglers:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_status[0])
