"""Process supervision for the launcher: find, signal, reap and stop exactly the processes it started.

A pid is only signalled when ``/proc/<pid>/cmdline`` is the recorded command and
``/proc/<pid>/stat`` has the recorded start time (see :mod:`fs3.launcher`), so a
reused pid never gets a signal meant for a process that is gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fs3.launcher.layout import FUSERMOUNT, LauncherError, Out, ProcRecord
from fs3.mounts import mount_fstype

# --------------------------------------------------------------------------- process helpers

_CHILDREN: dict[
    int, subprocess.Popen[bytes]
] = {}  # processes this Python process started (to reap)


_EXIT_CODES: dict[int, int] = {}  # pid -> exit status of children reaped by _reap


def _reap(pid: int) -> None:
    """Collect a child of ours that exited, so it does not linger as a zombie."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)
        _EXIT_CODES[pid] = child.returncode


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start ticks) of a pid, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = raw[raw.rfind(")") + 2 :].split()
    # after "pid (comm) " fields start at field 3 (state); starttime is field 22
    return rest[0], int(rest[19])


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return [p.decode(errors="surrogateescape") for p in parts]


def _find_process(command: list[str]) -> tuple[int, int]:
    """(pid, start ticks) of a running process with exactly this command line, or (0, 0)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if _cmdline(pid) == command:
            st = _proc_stat(pid)
            if st is not None and st[0] not in ("Z", "X", "x"):
                return pid, st[1]
    return 0, 0


def is_alive(rec: ProcRecord) -> bool:
    """True when the recorded pid is running and still is the process we started."""
    if rec.pid <= 0:
        return False
    _reap(rec.pid)
    st = _proc_stat(rec.pid)
    if st is None or st[0] in ("Z", "X", "x"):
        return False
    if rec.start_ticks and st[1] != rec.start_ticks:
        return False
    return _cmdline(rec.pid) == rec.command


def _exiting(pid: int) -> bool:
    """True while a killed process is half gone: its main thread a zombie, others still exiting.

    /proc shows the main thread as a zombie (no command line) as soon as it
    exits, but the process's open files, its listening sockets among them, are
    only released when its last thread is gone; a thread stuck in a file system
    call (a FUSE request, say) can take a moment. Until then its ports are taken.
    """
    st = _proc_stat(pid)
    if st is None or st[0] != "Z":
        return False
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def is_gone(rec: ProcRecord) -> bool:
    """True when the recorded process is not running and none of its threads is left."""
    return not is_alive(rec) and not (rec.pid > 0 and _exiting(rec.pid))


def _signal(rec: ProcRecord, sig: int) -> bool:
    """Send ``sig`` to the recorded process if it is still ours; True if sent."""
    if not is_alive(rec):
        return False
    try:
        os.kill(rec.pid, sig)
    except ProcessLookupError:
        return False
    return True


def _wait_dead(recs: Sequence[ProcRecord], timeout_s: float) -> list[ProcRecord]:
    """Poll until every one of ``recs`` is gone or the deadline passes; returns the survivors."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [r for r in recs if not is_gone(r)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def stop_processes(recs: Sequence[ProcRecord], grace_s: float) -> list[str]:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL; returns names that needed SIGKILL."""
    for r in recs:
        _signal(r, signal.SIGTERM)
    survivors = _wait_dead(recs, grace_s)
    for r in survivors:
        _signal(r, signal.SIGKILL)
    still = _wait_dead(survivors, 5.0)
    if still:
        raise LauncherError(
            "could not stop "
            + ", ".join(f"{r.name} (pid {r.pid})" for r in still)
            + " even with SIGKILL"
        )
    return [r.name for r in survivors]


def log_tail(path: str | os.PathLike[str], lines: int = 25) -> str:
    """The last ``lines`` lines of a log written since the process's last start."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return "(no log file)"
    marker = text.rfind("\n=== fs3 cluster: starting ")
    if marker >= 0:
        text = text[marker + 1 :]
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


def port_accepts(address: str, timeout_s: float = 0.5) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- mounts


def fuse_unmount(path: str, out: Out) -> bool:
    """Unmount a FUSE mount: ``fusermount3 -u``, lazily (``-z``) if it is busy. True if gone."""
    exe = shutil.which(FUSERMOUNT)
    if mount_fstype(path) is None:
        return True
    if exe is None:
        out(f"cannot unmount {path}: {FUSERMOUNT} not found (apt-get install fuse3)")
        return False
    r = subprocess.run([exe, "-u", path], capture_output=True, text=True, timeout=30, check=False)
    if r.returncode != 0:
        r2 = subprocess.run(
            [exe, "-u", "-z", path], capture_output=True, text=True, timeout=30, check=False
        )
        if r2.returncode != 0:
            out(f"cannot unmount {path}: {r.stderr.strip()} / {r2.stderr.strip()}")
            return False
        out(f"unmounted {path} lazily ({FUSERMOUNT} -u -z): it was busy ({r.stderr.strip()})")
    return mount_fstype(path) is None


# --------------------------------------------------------------------------- commands


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    """The launcher's environment without FS3_* overrides (the config files are the truth), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FS3_")}
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def service_command(role: str, config_path: str) -> list[str]:
    return [sys.executable, "-m", "fs3.cli.main", role, "--config", config_path]


def mount_command(cluster_file: str, config_path: str, mountpoint: str) -> list[str]:
    """The FUSE daemon in the foreground (so its pid is the one recorded); mountpoint is argv[-2]."""
    return [
        sys.executable,
        "-m",
        "fs3.cli.main",
        "mount",
        "--cluster",
        cluster_file,
        "--config",
        config_path,
        mountpoint,
        "--foreground",
    ]
