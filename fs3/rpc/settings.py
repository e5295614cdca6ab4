"""The process's RPC settings (its config's ``[rpc]`` section).

One process, one choice: the entry point of every fs3 process (services,
FUSE daemon, CLI) calls :func:`configure` with its ``[rpc]`` section before
it makes a call; channel pools and servers created afterwards follow it.
Library users (and test processes) who never call it get the defaults with
the environment's ``FS3_RPC_*`` overrides applied (``FS3_RPC_TRANSPORT=grpc``
switches them too), exactly as a config file without an ``[rpc]`` section.
"""

from __future__ import annotations

from typing import Any

from fs3 import config as fs3config
from fs3.config import RpcSection

_current: RpcSection | None = None


def configure(section: Any) -> None:
    """Adopt ``section`` (an :class:`fs3.config.RpcSection`) for this process."""
    global _current
    _current = section


def current() -> RpcSection:
    global _current
    if _current is None:
        _current = fs3config.load(fs3config.ClientConfig, None).rpc
    return _current
