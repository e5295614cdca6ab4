"""fs3: a 3FS-shaped distributed file system for AI clusters.

``fs3.connect(cluster_file)`` returns a client with file operations; see
``fs3.client``. ``fs3.usrbio`` is the zero-copy ring API on a mount point.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["connect", "__version__"]


def connect(cluster_file: str | None = None, **kwargs: Any) -> Any:
    """Connect to the cluster named by ``cluster_file`` (or ``$FS3_CLUSTER_FILE``).

    Returns a :class:`fs3.client.file_api.Client` whose methods raise what
    Python's ``open``/``os`` raise for the same errno (``FileNotFoundError``,
    ``FileExistsError``, ``IsADirectoryError``, ``NotADirectoryError``,
    ``PermissionError``, ``OSError(ENOTEMPTY)``...). ``connect`` itself raises
    ``FileNotFoundError``/``PermissionError``/``IsADirectoryError`` when the
    cluster file cannot be read, ``OSError(EINVAL)`` when it is malformed or
    none is named, and ``TimeoutError`` when no mgmtd leader answers within
    ``[client] connect_timeout_s`` (10 s; ``FS3_CLIENT_CONNECT_TIMEOUT_S``).
    """
    from fs3.client import connect as _connect

    return _connect(cluster_file, **kwargs)
