"""``fs3 ckpt`` on a local directory, and the interval advisor's arithmetic."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import fs3.ckpt as ckpt
from fs3.ckpt.interval import advise
from fs3.cli.main import main

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(60)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["ckpt", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_interval_formula(capsys: pytest.CaptureFixture[str]) -> None:
    a = advise(30, 50000, gpus=1000)
    mtbf = 50000 * 3600 / 1000
    assert math.isclose(a.interval_s, math.sqrt(2 * 30 * mtbf))
    # at T* the save overhead equals the expected lost work
    assert math.isclose(a.overhead_s_per_day, a.lost_work_s_per_day)
    rc, out, _ = _run(capsys, "interval", "--save-seconds", "30", "--mtbf-hours", "50000",
                      "--gpus", "1000", "--json")  # fmt: skip
    assert rc == 0 and math.isclose(json.loads(out)["interval_s"], a.interval_s)
    rc, out, _ = _run(capsys, "interval", "--save-seconds", "10", "--mtbf-hours", "24")
    assert rc == 0 and "optimal interval T*" in out and "lost work" in out
    with pytest.raises(ValueError):
        advise(0, 1)
    rc, _, err = _run(capsys, "interval", "--save-seconds", "-1", "--mtbf-hours", "24")
    assert rc == 1 and "save time" in err


def test_ls_verify_rm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tmp_path)
    c = ckpt.Checkpointer(root, policy=ckpt.Incremental(baseline_every=10, block_bytes=4096))
    for s in range(3):
        c.save({"w": torch.full((4096,), float(s))}, step=s).wait()
    c.close()
    (tmp_path / "step-000000000007").mkdir()  # an interrupted save
    rc, out, _ = _run(capsys, "ls", root, "--json")
    rows = {r["step"]: r for r in json.loads(out)}
    assert rc == 0 and [rows[s]["valid"] for s in (0, 1, 2, 7)] == [True, True, True, False]
    assert rows[1]["kind"] == "incr" and rows[1]["bases"] == [0] and rows[0]["bytes"] == 16384
    rc, out, _ = _run(capsys, "ls", root)
    assert rc == 0 and "incr" in out and "NO" in out
    rc, out, _ = _run(capsys, "verify", root, "--step", "2")
    assert rc == 0 and "step 2: ok" in out
    p = tmp_path / "step-000000000002" / "rank-00000.data"
    b = bytearray(p.read_bytes())
    b[0] ^= 1
    p.write_bytes(b)
    rc, out, _ = _run(capsys, "verify", root, "--step", "2")
    assert rc == 1 and "CRC32C mismatch" in out
    rc, _, err = _run(capsys, "rm", root, "--step", "1")
    assert rc == 1 and "base of [2]" in err
    rc, out, _ = _run(capsys, "rm", root, "--step", "2")
    assert rc == 0 and "removed: 2" in out
    rc, out, _ = _run(capsys, "rm", root, "--keep-last", "1")
    assert rc == 0 and "removed: nothing" in out  # 1 needs 0
    rc, out, _ = _run(capsys, "rm", root, "--invalid")
    assert rc == 0 and "removed: nothing" in out  # 7 is newer than the latest valid: kept
    rc, _, err = _run(capsys, "ls", str(tmp_path / "missing"))
    assert rc == 1 and "no such checkpoint directory" in err
    assert not (tmp_path / "missing").exists()
