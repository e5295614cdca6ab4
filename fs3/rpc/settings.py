"""The process's RPC settings (its config's ``[rpc]`` section).

One process, one choice: the entry point of every fs3 process (services,
FUSE daemon, CLI) calls :func:`configure` with its ``[rpc]`` section before
it makes a call; channel pools and servers created afterwards follow it.
Library users who never call it get the defaults (native transport, Unix
sockets for same-host peers).
"""

from __future__ import annotations

from typing import Any

from fs3.config import RpcSection

_current = RpcSection()


def configure(section: Any) -> None:
    """Adopt ``section`` (an :class:`fs3.config.RpcSection`) for this process."""
    global _current
    _current = section


def current() -> RpcSection:
    return _current
