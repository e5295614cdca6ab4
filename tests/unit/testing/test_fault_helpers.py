"""The fault helpers on their own: namespace NAT + partition + cleanup, small fs, chunk corruption.

No fs3 cluster: a plain TCP echo server inside the namespace stands for a service.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fs3.errors import Code, FsError
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine
from fs3.testing.faults import (
    NetnsLink,
    SmallFs,
    corrupt_chunk,
    leftover_netns,
    list_chunk_files,
    netns_command,
    netns_unavailable,
    qdisc_kinds,
    read_chunk_bytes,
)

_why = netns_unavailable()
needs_netns = pytest.mark.skipif(_why is not None, reason=f"network namespaces unavailable: {_why}")

ECHO = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(8); print('ready', flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(c.recv(100)); c.close()\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _echo(port: int, timeout: float = 2.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.settimeout(timeout)
        c.sendall(b"ping")
        return c.recv(100)


def test_netns_command_rewrites_only_service_commands() -> None:
    cmd = [sys.executable, "-m", "fs3.cli.main", "storage", "--config", "/x.toml"]
    assert netns_command("ns1", cmd) == [sys.executable, "-m", "fs3.testing.faults", "netns-exec", "ns1",
                                         "storage", "--config", "/x.toml"]
    with pytest.raises(ValueError):
        netns_command("ns1", ["sleep", "1"])


@needs_netns
@pytest.mark.timeout(60)
def test_netns_link_is_transparent_partitionable_and_cleaned_up() -> None:
    port = _free_port()
    link = NetnsLink(240)
    try:
        link.setup([port])
        assert link.ns in leftover_netns()
        p = subprocess.Popen(["ip", "netns", "exec", link.ns, sys.executable, "-c", ECHO, str(port)],
                             stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            # the host reaches 127.0.0.1:port although the listener is in the namespace
            assert _echo(port) == b"ping"
            link.partition()
            t = time.monotonic()
            with pytest.raises(OSError):
                _echo(port, timeout=1.0)
            assert time.monotonic() - t < 5
            assert p.poll() is None  # cut off, not killed
            link.heal()
            assert _echo(port) == b"ping"
            kinds = qdisc_kinds()
            if any(kinds.values()):
                what = link.slow(delay_ms=20, rate_mbit=8)
                assert "netem" in what or "tbf" in what
                assert _echo(port) == b"ping"
                link.unslow()
        finally:
            p.kill()
            p.wait(5)
    finally:
        link.cleanup()
    assert link.ns not in leftover_netns()
    nat = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True, check=True).stdout
    assert link.comment not in nat
    assert subprocess.run(["ip", "link", "show", link.host_if], capture_output=True).returncode != 0


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
@pytest.mark.timeout(30)
def test_small_fs_fills_and_frees(tmp_path: Path) -> None:
    fs = SmallFs(tmp_path / "t", 4)
    try:
        fs.mount()
        assert fs.free_bytes() <= 4 << 20
        ballast = fs.fill(leave_bytes=256 << 10)
        assert fs.free_bytes() <= 300 << 10
        with pytest.raises(OSError), open(fs.path / "x", "wb") as f:
            f.write(b"\1" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
        ballast.unlink()
        (fs.path / "x").unlink(missing_ok=True)
        assert fs.free_bytes() > 3 << 20
        fs.resize(8)
        assert fs.free_bytes() > 7 << 20
    finally:
        fs.unmount()
    assert not fs.mounted


def test_corrupt_chunk_is_caught_by_the_engine(tmp_path: Path) -> None:
    eng = FileChunkEngine(tmp_path / "t1", fsync=False)
    try:
        data = os.urandom(200_000)
        key = ChunkKey(77, 0)
        eng.commit(eng.stage_write(key, 0, data, update_ver=1, chain_ver=1, chunk_size=1 << 20))
        [cf] = list_chunk_files(tmp_path / "t1", 101, 77)
        assert (cf.inode, cf.index, cf.length) == (77, 0, len(data))
        assert read_chunk_bytes(cf) == data
        off, orig = corrupt_chunk(cf, nbytes=8)
        assert read_chunk_bytes(cf)[off : off + 8] == bytes(b ^ 0xFF for b in orig)
        with pytest.raises(FsError) as ei:
            eng.read(key, 0, len(data))
        assert ei.value.code == Code.CHECKSUM_MISMATCH
    finally:
        eng.close()
