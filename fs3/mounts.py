"""What is mounted where: shared by ``fs3 mount`` and the cluster launcher.

``mount_state`` tells a live FUSE mount from a stale one (its daemon is gone:
every call fails with ENOTCONN). It probes with ``statvfs``, which the kernel
always forwards to the daemon; ``stat`` of the mount root can be answered from
the attribute cache for a while after the daemon died and would call a dead
mount "mounted".
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def _unescape(s: str) -> str:
    """Undo /proc/self/mountinfo's octal escapes (``\\040`` for a space ...)."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) + 1 and s[i + 1 : i + 4].isdigit():
            out.append(chr(int(s[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mount_fstype(path: str) -> str | None:
    """The file system type mounted exactly at ``path`` (the last mount wins), or None."""
    path = os.path.abspath(path)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        left, _, right = line.partition(" - ")
        parts = left.split()
        if len(parts) >= 5 and _unescape(parts[4]) == path:
            found = right.split()[0] if right else "?"
    return found


def mount_state(path: str) -> str:
    """'absent', 'mounted' (answers), 'stale' (ENOTCONN: daemon gone) or 'other' (not FUSE)."""
    fstype = mount_fstype(path)
    if fstype is None:
        return "absent"
    if not fstype.startswith("fuse"):
        return "other"
    try:
        os.statvfs(path)
    except OSError as e:
        if e.errno in (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO):
            return "stale"
    return "mounted"
