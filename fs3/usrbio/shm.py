"""How applications find and talk to the USRBIO agent of a mount point.

Registration (decision): a **Unix socket the agent listens on**, at a path
derived from the mount point (:func:`agent_socket_path`), not 3FS's symlinks in
a virtual directory. Why: the socket gives the agent the peer's pid/uid
(``SO_PEERCRED``) for access checks, its closing tells the agent that the
application is gone (crash included) so it can reclaim rings and buffers at
once, and the application sees EOF when the agent dies, so ``wait_for_ios``
fails instead of hanging. It needs nothing from the FUSE file system itself.

Every Iov and every Ior has its own connection::

    app -> agent   u32 length + JSON  {"op": "iov", "id": hex, "path": "/dev/shm/fs3-iov-...", "size": n}
                                      {"op": "ior", "path": "/dev/shm/fs3-ior-...", "size": n}
    agent -> app   u32 length + JSON  {"ok": true} | {"ok": false, "errno": e, "message": "..."}

after which the connection carries only wake-up bytes: the application sends
one on ``submit_ios``, the agent one after posting completions. Both sides send
them non-blocking and drop them when the socket buffer is full (the peer has
unread wake-ups then, so nothing is lost). Closing the connection deregisters.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
from typing import Any

SOCKET_DIR = "/run/fs3"
IOV_PREFIX = "fs3-iov"
IOR_PREFIX = "fs3-ior"
LEN = struct.Struct("<I")
MAX_MSG = 64 << 10


def agent_socket_path(mountpoint: str) -> str:
    """The Unix socket of the USRBIO agent serving ``mountpoint``.

    Both sides compute it from the mount point's absolute path (parent
    directory symlinks resolved). The mount root itself is never stat'ed, so
    the FUSE daemon can call this for its own mount without calling into itself.
    """
    absolute = os.path.abspath(mountpoint)
    parent, name = os.path.split(absolute)
    canonical = os.path.join(os.path.realpath(parent), name) if name else absolute
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:24]
    return os.path.join(SOCKET_DIR, f"usrbio-{digest}.sock")


def encode(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    return LEN.pack(len(body)) + body


def decode_len(header: bytes) -> int:
    (n,) = LEN.unpack(header)
    if n > MAX_MSG:
        raise ValueError(f"control message of {n} bytes is too large")
    return n


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid
