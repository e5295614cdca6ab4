"""The security tier's cluster: real processes with a cluster secret, shared by the tier.

The secret (``fs3.secret`` beside the cluster file, mode 0600) is created before
the launcher starts, so meta signs chunk capabilities and storage checks them.
Capabilities live 1 s here (the minimum) so refreshes happen during the tests.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fs3.security.keys import create_secret
from fs3.testing.cluster import ProcessCluster

CAP_TTL_S = 1.0
# The tier mounts the cluster (FUSE and USRBIO renew capabilities too) where it can.
HAVE_FUSE = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


def small_cluster(*args: Any, **kw: Any) -> ProcessCluster:
    """The tier's cluster shape: 1 mgmtd, 1 meta, 2 storage nodes of 1 target, 2 replicas."""
    return ProcessCluster(
        *args, storage_nodes=2, targets_per_node=1, replicas=2, meta=1, mgmtd=1, **kw
    )


@pytest.fixture(scope="session")
def secure_cluster() -> Iterator[ProcessCluster]:
    d = Path(tempfile.mkdtemp(prefix="fs3-sec-"))
    create_secret(d / "fs3.secret")
    c = small_cluster(
        d,
        transport="grpc",
        mount=HAVE_FUSE,
        overrides={
            "storage": {"storage": {"fsync": False}},
            # 1 MiB chunks: the capability attacks need a small file of two chunks
            "meta": {
                "security": {"capability_ttl_s": CAP_TTL_S},
                "meta": {"default_chunk_size": 1 << 20},
            },
        },
    )
    failed = True
    try:
        c.start()
        failed = False
        yield c
    finally:
        c.close(failed=failed)
        if not failed:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def secret(secure_cluster: ProcessCluster) -> bytes:
    return (Path(secure_cluster.cluster_file).parent / "fs3.secret").read_bytes()


@pytest.fixture(scope="session")
def client(secure_cluster: ProcessCluster) -> Iterator[Any]:
    c = secure_cluster.connect()
    yield c
    c.close()


def rss_kib(pid: int) -> int:
    """Resident set size of a process (VmRSS, KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def server_pids(c: ProcessCluster) -> dict[str, int]:
    return {n: c.pid(n) for n in c.names if not n.startswith("mount")}


def all_alive(c: ProcessCluster) -> None:
    dead = [n for n in c.names if not c.alive(n)]
    assert not dead, f"servers died: {dead}"


__all__ = ["HAVE_FUSE", "all_alive", "rss_kib", "server_pids", "small_cluster"]
