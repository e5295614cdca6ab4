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
    assert netns_command("ns1", cmd) == [
        sys.executable,
        "-m",
        "fs3.testing.faults",
        "netns-exec",
        "ns1",
        "storage",
        "--config",
        "/x.toml",
    ]
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
        p = subprocess.Popen(
            ["ip", "netns", "exec", link.ns, sys.executable, "-c", ECHO, str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
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
    nat = subprocess.run(
        ["iptables", "-t", "nat", "-S"], capture_output=True, text=True, check=True
    ).stdout
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


def test_compare_chain_finds_every_kind_of_replica_difference(tmp_path: Path) -> None:
    from fs3.testing.invariants import compare_chain

    engines = {tid: FileChunkEngine(tmp_path / f"t{tid}", fsync=False) for tid in (101, 201, 301)}
    try:
        a, b = os.urandom(100_000), os.urandom(50_000)
        for eng in engines.values():
            eng.commit(
                eng.stage_write(ChunkKey(5, 0), 0, a, update_ver=1, chain_ver=1, chunk_size=1 << 20)
            )
            eng.commit(
                eng.stage_write(ChunkKey(5, 1), 0, b, update_ver=1, chain_ver=1, chunk_size=1 << 20)
            )
        dirs = {tid: tmp_path / f"t{tid}" for tid in engines}
        assert compare_chain(1, dirs) == []
        # a newer version on one replica only
        e2 = engines[201]
        e2.commit(
            e2.stage_write(
                ChunkKey(5, 1), 0, b"x" * 10, update_ver=2, chain_ver=1, chunk_size=1 << 20
            )
        )
        # a chunk missing on one replica
        e3 = engines[301]
        e3.commit(e3.stage_remove(ChunkKey(5, 0), update_ver=2, chain_ver=1))
        # a corrupt file on the reference replica
        [cf] = [c for c in list_chunk_files(dirs[101], 101, 5) if c.index == 0]
        corrupt_chunk(cf)
        text = "\n".join(compare_chain(1, dirs))
        assert "target 101 chunk 5:0: file content does not match its checksum" in text
        assert "chunk 5:1: target 101 has (ver 1" in text and "target 201 has (ver 2" in text
        assert "targets 101 and 301 hold different chunks (only on 101: [(5, 0)]" in text
        assert "the bytes differ" in text
    finally:
        for eng in engines.values():
            eng.close()
