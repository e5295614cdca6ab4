"""Pure parts of the Python file API: mode parsing, stat conversion."""

from __future__ import annotations

import os
import stat

import pytest

from fs3.client.file_api import _parse_mode, _raw_mode, _stat_result
from fs3.proto import common_pb2, meta_pb2

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    "mode,flags,r,w,a,b",
    [
        ("r", os.O_RDONLY, True, False, False, False),
        ("rb", os.O_RDONLY, True, False, False, True),
        ("w", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, False, True, False, False),
        ("wb+", os.O_RDWR | os.O_CREAT | os.O_TRUNC, True, True, False, True),
        ("x", os.O_WRONLY | os.O_CREAT | os.O_EXCL, False, True, False, False),
        ("ab", os.O_WRONLY | os.O_CREAT | os.O_APPEND, False, True, True, True),
        ("a+", os.O_RDWR | os.O_CREAT | os.O_APPEND, True, True, True, False),
        ("r+b", os.O_RDWR, True, True, False, True),
    ],
)
def test_parse_mode(mode: str, flags: int, r: bool, w: bool, a: bool, b: bool) -> None:
    assert _parse_mode(mode, -1, None, None, None) == (flags, r, w, a, b)


@pytest.mark.parametrize("mode", ["", "rw", "rr", "q", "rbt", "b", "+", "wx"])
def test_parse_mode_rejects_like_builtin(mode: str, tmp_path) -> None:
    with pytest.raises(ValueError):
        open(tmp_path / "f", mode)  # noqa: SIM115 - the builtin must reject it too
    with pytest.raises(ValueError):
        _parse_mode(mode, -1, None, None, None)


def test_parse_mode_argument_combinations() -> None:
    with pytest.raises(ValueError):
        _parse_mode("r", 0, None, None, None)  # unbuffered text
    with pytest.raises(ValueError):
        _parse_mode("rb", -1, "utf-8", None, None)
    with pytest.raises(TypeError):
        _parse_mode(1, -1, None, None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["rb", "wb", "ab", "xb", "rb+", "wb+", "ab+", "xb+"])
def test_raw_mode_matches_fileio(mode: str, tmp_path) -> None:
    p = tmp_path / "f"
    if "x" not in mode:
        p.write_bytes(b"")
    with open(p, mode, buffering=0) as f:
        expected = f.mode
    p.unlink()
    flags, r, w, a, _b = _parse_mode(mode, 0, None, None, None)
    assert _raw_mode(flags, r, w, a) == expected


def test_stat_result_fields() -> None:
    a = meta_pb2.Attr(
        inode=42,
        mode=stat.S_IFREG | 0o640,
        nlink=2,
        uid=7,
        gid=8,
        size=12345,
        blocks=25,
        blksize=1 << 20,
        atime=common_pb2.Timespec(sec=10, nsec=5),
        mtime=common_pb2.Timespec(sec=20, nsec=999_999_999),
        ctime=common_pb2.Timespec(sec=30, nsec=0),
        rdev=0,
    )
    s = _stat_result(a)
    assert (s.st_mode, s.st_ino, s.st_nlink, s.st_uid, s.st_gid, s.st_size) == (
        a.mode,
        42,
        2,
        7,
        8,
        12345,
    )
    assert s.st_atime_ns == 10_000_000_005 and s.st_mtime_ns == 20_999_999_999
    assert s[stat.ST_MTIME] == 20 and s.st_ctime == 30.0
    assert s.st_blksize == 1 << 20 and s.st_blocks == 25
