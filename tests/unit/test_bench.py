"""Smoke test of ``fs3 bench`` on a plain temporary directory (no cluster needed)."""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from fs3.cli import bench


@pytest.mark.timeout(60)
def test_bench_json_on_temp_dir(tmp_path: Path) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        rc = bench.main(
            [
                str(tmp_path),
                "--big-file-size",
                "2M",
                "--block-size",
                "256K",
                "--small-files",
                "30",
                "--small-file-size",
                "4K",
                "--small-fsync",
                "--threads",
                "2",
                "--rand-read-seconds",
                "0.2",
                "--no-drop-caches",
                "--json",
                "--quiet",
            ]
        )
    assert rc == 0
    res = json.loads(out.getvalue())
    ph = res["phases"]
    assert list(ph) == [
        "big_write",
        "big_read",
        "rand_read",
        "small_write",
        "small_write_fsync",
        "small_read",
        "stat",
        "readdir",
        "unlink",
    ]
    assert ph["big_write"]["bytes"] == ph["big_read"]["bytes"] == 2 * (2 << 20)
    assert ph["big_write"]["ops"] == ph["big_read"]["ops"] == 2 * 8
    assert ph["small_read"]["bytes"] == 30 * 4096
    for name in ("small_write", "small_write_fsync", "small_read", "stat", "readdir", "unlink"):
        assert ph[name]["ops"] == 30, name
    assert ph["rand_read"]["ops"] > 0 and ph["rand_read"]["bytes"] == ph["rand_read"]["ops"] * 4096
    for s in ph.values():
        assert s["seconds"] > 0 and s["p99_ms"] >= s["p50_ms"] >= 0
    assert ph["big_write"]["mib_s"] > 0 and ph["stat"]["ops_s"] > 0
    assert os.listdir(tmp_path) == []  # everything it created is gone


@pytest.mark.timeout(30)
def test_bench_table_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        bench.main(
            [
                str(tmp_path),
                "--big-file-size",
                "0",
                "--small-files",
                "5",
                "--small-file-size",
                "0",
                "--quiet",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "Stat file" in text and "Unlink file" in text and "Read big file" not in text
    assert bench.main([str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert bench.main([str(tmp_path), "--phases", "nope"]) == 2
    assert bench.main([str(tmp_path), "--threads", "0"]) == 2
    assert os.listdir(tmp_path) == []


def test_parse_size_and_percentile() -> None:
    assert bench.parse_size("4K") == 4096
    assert bench.parse_size("1MiB") == 1 << 20
    assert bench.parse_size("1.5G") == 3 << 29
    assert bench.parse_size("512") == 512
    with pytest.raises(ValueError):
        bench.parse_size("1X")
    vals = sorted(float(i) for i in range(1, 101))
    assert bench.percentile(vals, 50) == 50.0
    assert bench.percentile(vals, 99) == 99.0
    assert bench.percentile([], 99) == 0.0
