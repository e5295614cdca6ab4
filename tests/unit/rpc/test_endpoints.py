"""Where same-host peers find a server's Unix socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from fs3.rpc.native import endpoints


def test_path_is_a_function_of_address_and_namespace(tmp_path: object) -> None:
    a = endpoints.uds_path("127.0.0.1:8000", "/tmp/x")
    assert a == endpoints.uds_path("127.0.0.1:8000", "/tmp/x")
    assert a != endpoints.uds_path("127.0.0.1:8001", "/tmp/x")
    assert a != endpoints.uds_path("127.0.0.2:8000", "/tmp/x")
    assert os.path.basename(os.path.dirname(a)) == f"n{endpoints.netns_id()}"
    v6 = endpoints.uds_path("[::1]:9000", "/tmp/x")
    assert "/" not in os.path.basename(v6) and v6.endswith("_9000.sock")


def test_namespace_id_is_the_kernels() -> None:
    assert endpoints.netns_id() == str(os.stat("/proc/self/ns/net").st_ino)
    # a child in the same namespace computes the same path (what a client does)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from fs3.rpc.native import endpoints as e; print(e.uds_path('h:1'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == endpoints.uds_path("h:1")


def test_prepare_removes_a_stale_socket_only(tmp_path: os.PathLike[str]) -> None:
    path = endpoints.uds_path("127.0.0.1:1234", str(tmp_path))
    endpoints.prepare(path)
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # a dead server's socket file
    assert endpoints.exists(path)
    endpoints.prepare(path)
    assert not os.path.exists(path)
    with open(path, "w") as f:  # not a socket: left alone
        f.write("x")
    endpoints.prepare(path)
    assert os.path.exists(path) and not endpoints.exists(path)
