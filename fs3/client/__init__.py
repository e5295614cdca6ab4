"""fs3 client library.

* :func:`connect` → :class:`~fs3.client.file_api.Client`, the synchronous
  Python API (``open``, ``stat``, ``listdir`` ... like the built-ins).
* :class:`~fs3.client.core.AsyncClient` — the asyncio core shared by the Python
  API, the FUSE daemon and the USRBIO agent (inode-level operations).
* :class:`~fs3.client.bridge.Bridge` — runs the core on an asyncio loop in a
  background thread for synchronous callers (``run``; trio programs may use
  ``trio_run``); the FUSE daemon and USRBIO agent run on the core's own loop.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fs3.client.file_api import Client

__all__ = ["connect"]


def connect(
    cluster_file: str | os.PathLike[str] | None = None,
    *,
    uid: int | None = None,
    gid: int | None = None,
    transport: str | None = None,
    config: Any = None,
    **kwargs: Any,
) -> Client:
    """Connect to an fs3 cluster and return a :class:`~fs3.client.file_api.Client`.

    Args:
        cluster_file: the cluster file (``<id>@host:port,...``); default
            ``[cluster] cluster_file`` of ``config``, then ``$FS3_CLUSTER_FILE``.
        uid, gid: identity for permission checks (default: this process's).
        transport: ``auto`` | ``grpc`` | ``tcp`` | ``shm`` (default: ``config.transport.kind``).
        config: a :class:`fs3.config.ClientConfig` (default: defaults + env overrides).
    """
    from fs3.client.file_api import Client

    return Client.connect(
        cluster_file, uid=uid, gid=gid, transport=transport, config=config, **kwargs
    )
