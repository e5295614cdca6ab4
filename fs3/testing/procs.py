"""Minimal helpers to run real ``fs3 <service>`` processes in tests.

Start a service from a config object, wait until it prints its bound address
(``fs3-<service> listening on HOST:PORT``), kill it (SIGKILL) or stop it
(SIGTERM). Output goes to a log file next to the config. The full launcher
(``fs3 cluster``, :mod:`fs3.testing.cluster`) builds on the CLI instead; these
helpers are for tests that need direct control of single processes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fs3.config import to_toml

_LISTEN = re.compile(r"fs3-(\w+) listening on (\S+)")


@dataclass
class Proc:
    """A running service process."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    config_path: Path
    log_path: Path
    address: str = ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def start(role: str, cfg: Any, workdir: Path, name: str, *, timeout_s: float = 30.0,
          env: dict[str, str] | None = None) -> Proc:
    """Write ``cfg`` as TOML under ``workdir`` and start ``fs3 <role> --config`` on it."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / f"{name}.toml"
    cfg_path.write_text(to_toml(cfg))
    log_path = workdir / f"{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the child's lifetime
    cmd = [sys.executable, "-c", "import sys; from fs3.cli.main import main; sys.exit(main())",
           role, "--config", str(cfg_path)]
    popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                             start_new_session=True)
    log.close()
    proc = Proc(name, role, popen, cfg_path, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = _LISTEN.search(log_path.read_text(errors="replace"))
        if m:
            proc.address = m.group(2)
            return proc
        if not proc.alive():
            raise RuntimeError(f"{name} exited with {popen.returncode}:\n{proc.log_tail()}")
        time.sleep(0.02)
    kill(proc)
    raise RuntimeError(f"{name} did not report its address within {timeout_s}s:\n{proc.log_tail()}")


def kill(proc: Proc) -> None:
    """SIGKILL the process (a crash: no clean-up, no last heartbeat) and reap it."""
    if proc.alive():
        os.kill(proc.pid, signal.SIGKILL)
    proc.popen.wait(timeout=10)


def stop(proc: Proc, timeout_s: float = 10.0) -> int:
    """SIGTERM and wait (SIGKILL after ``timeout_s``); returns the exit status."""
    if proc.alive():
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill(proc)
    return int(proc.popen.returncode)
