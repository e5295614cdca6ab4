"""Crash consistency of the chunk engine: kill -9 a writer at random points, many times.

The same rounds run a second time on a lossy mount (fs3.testing.lossyfs) with a
power cut after each kill, which also drops every unsynced write and directory
entry: a missing fsync of a data file or of a directory then loses a commit.

A child process applies a deterministic sequence of updates (version v of chunk c
is always the same operation) and prints ``c v`` after each commit returns. The
parent kills it with SIGKILL at a random moment, reopens the engine and checks
that every chunk's content equals the model of exactly its committed version
(never a mix of two), that its checksums verify, and that no acknowledged
commit was lost. Then a new child continues from the recovered state.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine, crc32c
from fs3.testing.lossyfs import lossy_dir, skip_reason

pytestmark = pytest.mark.timeout(150)

CHUNKS = 6
CS = 256 << 10
SEED = 1234

CHILD = r"""
import random, sys
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine
sys.path.insert(0, sys.argv[2])
from test_crash_consistency import op_for, CHUNKS, CS
e = FileChunkEngine(sys.argv[1], fsync=True, block_size=4096, direct_write=sys.argv[3] == "1")
rng = random.Random()
while True:
    c = rng.randrange(CHUNKS)
    k = ChunkKey(77, c)
    m = e.get(k)
    v = (m.commit_ver if m else 0) + 1
    kind, off, data, n = op_for(c, v)
    if kind == "w":
        p = e.stage_write(k, off, data, update_ver=v, chain_ver=1, chunk_size=CS)
    elif kind == "t":
        p = e.stage_truncate(k, n, update_ver=v, chain_ver=1, chunk_size=CS, only_extend=False)
    else:
        p = e.stage_truncate(k, n, update_ver=v, chain_ver=1, chunk_size=CS, only_extend=True)
    e.commit(p)
    sys.stdout.write(f"{c} {v}\n")
    sys.stdout.flush()
"""


def op_for(c: int, v: int) -> tuple[str, int, bytes, int]:
    """The deterministic update that produces version ``v`` of chunk ``c``."""
    rng = random.Random(SEED * 1_000_003 + c * 10_007 + v)
    r = rng.random()
    if r < 0.75 or v == 1:
        n = rng.choice([1, 100, 4096, 5000, 65536, CS // 2])
        off = rng.choice([0, rng.randrange(0, CS - n + 1)])
        return "w", off, rng.randbytes(n), 0
    if r < 0.9:
        return "t", 0, b"", rng.randrange(0, CS // 2)
    return "e", 0, b"", rng.randrange(0, CS)


def model(c: int, v: int) -> bytes:
    buf = bytearray()
    for i in range(1, v + 1):
        kind, off, data, n = op_for(c, i)
        if kind == "w":
            if off > len(buf):
                buf.extend(bytes(off - len(buf)))
            buf[off : off + len(data)] = data
        elif kind == "t":  # truncate: shrink or zero-extend to n
            del buf[n:]
            buf.extend(bytes(n - len(buf)))
        elif n > len(buf):
            buf.extend(bytes(n - len(buf)))
    return bytes(buf)


def test_kill9_never_leaves_a_mix(tmp_path: Path) -> None:
    _kill_rounds(tmp_path / "target", lambda: None)


@pytest.mark.fuse
@pytest.mark.slow
@pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "o_direct"])
def test_power_cut_loses_no_acknowledged_commit(direct: bool) -> None:
    """Regression: the target directory (and its parents) created by the engine were not
    fsync'd into their parents, so a cut could drop the whole target."""
    with lossy_dir("fs3-engine-lossy-") as m:
        _kill_rounds(m.mountpoint / "node" / "target", m.crash, direct=direct, rounds=3)


def _kill_rounds(
    root: Path, after_kill: Callable[[], object], *, direct: bool = False, rounds: int = 10
) -> None:
    here = str(Path(__file__).parent)
    acked: dict[int, int] = {}
    rng = random.Random(99)
    kills = 0
    cache: dict[tuple[int, int], bytes] = {}
    for _round in range(rounds):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), here, "1" if direct else "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # let it start and commit a few updates, then kill at a random moment
            first = proc.stdout.readline() if proc.stdout else ""
            assert first, proc.stderr.read() if proc.stderr else "child died"
            time.sleep(rng.uniform(0.0, 0.15))
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            out, _err = proc.communicate(timeout=10)
        after_kill()
        kills += 1
        for line in (first + out).splitlines():
            c, v = map(int, line.split())
            acked[c] = max(acked.get(c, 0), v)
        e = FileChunkEngine(root, fsync=True, block_size=4096)
        try:
            for c in range(CHUNKS):
                m = e.get(ChunkKey(77, c))
                got_v = m.commit_ver if m else 0
                assert got_v >= acked.get(c, 0), (
                    f"chunk {c}: acknowledged v{acked[c]} lost (have v{got_v})"
                )
                if m is None:
                    continue
                meta, data = e.read(ChunkKey(77, c), 0, CS)  # verifies every block CRC
                assert crc32c(data) == meta.checksum
                want = cache.get((c, got_v))
                if want is None:
                    want = cache[(c, got_v)] = model(c, got_v)
                assert data == want, f"chunk {c} v{got_v}: content is not that version"
        finally:
            e.close()
    assert kills == rounds and sum(acked.values()) > rounds
