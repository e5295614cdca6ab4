"""A full disk refuses writes with NO_SPACE and leaves nothing half-written.

Runs the chunk engine on a real 8 MiB tmpfs (needs root to mount; skipped
otherwise). Both the engine's free-space pre-check and the raw ENOSPC path
(pre-check disabled) are exercised.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fs3.errors import Code, FsError
from fs3.storage.chunk_engine import ChunkKey, FileChunkEngine, crc32c

pytestmark = pytest.mark.timeout(30)

CS = 1 << 20


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root / "data")) for p in (root / "data").rglob("*") if p.is_file()}


@pytest.mark.parametrize("precheck", [True, False])
def test_full_disk_refuses_cleanly(
    small_fs: Path, precheck: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = FileChunkEngine(small_fs / "t", fsync=True)
    if not precheck:
        monkeypatch.setattr(e, "_check_room", lambda growth: None)
    try:
        written: dict[ChunkKey, bytes] = {}
        err: FsError | None = None
        for i in range(20):
            k = ChunkKey(1, i)
            data = os.urandom(CS)
            try:
                e.commit(e.stage_write(k, 0, data, update_ver=1, chain_ver=1, chunk_size=CS))
            except FsError as exc:
                err = exc
                break
            written[k] = data
        assert err is not None, "8 MiB filesystem never filled"
        assert err.code == Code.NO_SPACE and err.errno == 28
        assert len(written) >= 3
        # nothing half-written: no pending state, only committed files (and empty spares) on disk
        assert all(e.pending(k) is None for k in [*written, ChunkKey(1, len(written))])
        spares = e.spare_files()
        assert all(os.path.getsize(small_fs / "t" / "data" / f) == 0 for f in spares)
        assert _files(small_fs / "t") - spares == {m.file for m in e.list()}
        # a partial overwrite of an existing chunk needs a COW copy: refused too, old data intact
        k0 = next(iter(written))
        with pytest.raises(FsError) as ei:
            for _ in range(3):  # fill any slack first
                e.commit(
                    e.stage_write(
                        ChunkKey(2, 0),
                        0,
                        os.urandom(CS // 2),
                        update_ver=1,
                        chain_ver=1,
                        chunk_size=CS,
                    )
                )
                e.commit(e.stage_remove(ChunkKey(2, 0), update_ver=2, chain_ver=1))
            e.commit(e.stage_write(k0, 10, b"x" * 1000, update_ver=2, chain_ver=1, chunk_size=CS))
        assert ei.value.code == Code.NO_SPACE
        for k, data in written.items():
            meta, got = e.read(k, 0, CS)
            assert got == data and crc32c(got) == meta.checksum and meta.commit_ver == 1
        # freeing space makes writes work again
        for k in list(written)[:2]:
            e.commit(e.stage_remove(k, update_ver=2, chain_ver=1))
        e.commit(
            e.stage_write(ChunkKey(3, 0), 0, b"fits now", update_ver=1, chain_ver=1, chunk_size=CS)
        )
        assert e.read(ChunkKey(3, 0), 0, 100)[1] == b"fits now"
    finally:
        e.close()


def test_extend_allocates_and_refuses_on_a_full_disk(small_fs: Path) -> None:
    """EXTEND (fallocate's allocation) takes real space: on a full disk it fails with NO_SPACE."""
    e = FileChunkEngine(small_fs / "t", fsync=True)
    try:
        err: FsError | None = None
        extended = 0
        for i in range(20):
            try:
                e.commit(
                    e.stage_truncate(
                        ChunkKey(7, i),
                        CS,
                        update_ver=1,
                        chain_ver=1,
                        chunk_size=CS,
                        only_extend=True,
                    )
                )
            except FsError as exc:
                err = exc
                break
            extended += 1
        assert err is not None and err.code == Code.NO_SPACE and err.errno == 28
        assert 3 <= extended < 8  # the 8 MiB filesystem filled with allocated (zero) chunks
        meta, got = e.read(ChunkKey(7, 0), 0, CS)
        assert got == bytes(CS) and meta.length == CS
    finally:
        e.close()
