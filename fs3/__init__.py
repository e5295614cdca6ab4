"""fs3: a 3FS-shaped distributed file system for AI clusters.

``fs3.connect(cluster_file)`` returns a client with file operations; see
``fs3.client``. ``fs3.usrbio`` is the zero-copy ring API on a mount point.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["connect", "__version__"]


def connect(cluster_file: str | None = None, **kwargs: Any) -> Any:
    """Connect to the cluster named by ``cluster_file`` (or ``$FS3_CLUSTER_FILE``)."""
    from fs3.client import connect as _connect

    return _connect(cluster_file, **kwargs)
