"""The exit guard of tests/conftest.py, run on throwaway test files in a child pytest.

A leaked non-daemon thread must fail the run loudly (named on stderr, exit
status 1 although the test passed); grpc.aio's poller thread, the one thing the
guard hides, must not fail it or hang it; a clean run keeps pytest's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

TESTS_DIR = Path(__file__).resolve().parents[2]  # holds conftest.py

LEAK = """
import threading

def test_leaks_a_thread():
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="leaky-worker").start()
"""

GRPC = """
import asyncio
import grpc

def test_uses_grpc_aio():
    async def main():
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        await ch.channel_ready()
        await ch.close()
        await server.stop(None)
    asyncio.run(main())
"""

CLEAN = """
def test_nothing_left():
    assert True
"""


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_child.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_child.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_a_leaked_thread_fails_the_run_and_is_named(tmp_path: Path) -> None:
    r = _run(tmp_path, LEAK)
    assert "1 passed" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 1
    assert "leaked non-daemon thread" in r.stderr and "leaky-worker" in r.stderr


def test_the_grpc_poller_is_hidden_and_the_status_kept(tmp_path: Path) -> None:
    r = _run(tmp_path, GRPC)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "leaked" not in r.stderr


def test_a_clean_run_keeps_pytests_status(tmp_path: Path) -> None:
    r = _run(tmp_path, CLEAN)
    assert r.returncode == 0, r.stdout + r.stderr
