"""Where a same-host peer finds a server's Unix socket.

Every fs3 server listens on its advertised ``host:port`` (TCP) and, for peers
on the same host, on a Unix domain socket whose path is a pure function of
that address: ``<socket_dir>/n<netns>/<host>_<port>.sock``. A client that
wants ``host:port`` looks for that path first and connects to it if a server
answers there; otherwise it uses TCP. No routing or proto field has to carry
the path, and a peer on another host simply never finds it.

``<netns>`` is the inode of the process's network namespace: a socket path is
only shared by processes that would also reach each other over loopback, so a
process moved into another namespace (the partition tests do that) is cut off
from the Unix sockets exactly as it is from TCP, and two namespaces that reuse
the same port never meet.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat

DEFAULT_SOCKET_DIR = "/tmp/fs3-rpc"


@functools.cache
def _netns_id() -> str:
    try:
        return str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        return "0"


def netns_id() -> str:
    """Identity of this process's network namespace (cached; a process does not move)."""
    return _netns_id()


def uds_path(address: str, socket_dir: str = DEFAULT_SOCKET_DIR) -> str:
    """The Unix socket path of the server advertising ``address`` (``host:port``)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]").replace("/", "_").replace(":", "_") or "any"
    return os.path.join(socket_dir, f"n{netns_id()}", f"{host}_{port}.sock")


def prepare(path: str) -> None:
    """Create the socket's directory (shared by every user: sticky, like /tmp) and
    remove a stale socket left by a server that died without cleaning up."""
    d = os.path.dirname(path)
    for p in (os.path.dirname(d), d):
        if not os.path.isdir(p):
            with contextlib.suppress(FileExistsError):
                os.makedirs(p, exist_ok=True)
            with contextlib.suppress(OSError):
                os.chmod(p, 0o1777)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


def exists(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
