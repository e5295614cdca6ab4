"""fs3's DCP storage in one process on a local directory (the POSIX data path of fs3.ckpt).

Multi-rank saves and loads on a real cluster are in tests/integration/test_dcp.py.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from fs3.ckpt.datafile import CorruptCheckpoint  # noqa: E402
from fs3.ckpt.dcp import Fs3StorageInfo, Fs3StorageReader, Fs3StorageWriter  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(8, 6, generator=g)
    return {
        "model": {
            "w": torch.randn(64, 33, generator=g),
            "b": torch.randn(33, generator=g).to(torch.bfloat16),
            "ids": torch.randint(0, 1 << 40, (17,), generator=g),
            "mask": torch.rand(5, 5, generator=g) > 0.5,
            "half": torch.randn(3, 4, generator=g).half(),
            "scalar": torch.tensor(float(seed)),
            "empty": torch.empty(0, 4),
            "view": base.t(),  # non-contiguous: only the viewed elements are stored
        },
        "step": seed,
        "meta": {"name": f"run-{seed}", "lr": [0.1, 0.01]},
    }


def _zeros_like(sd: Any) -> Any:
    if isinstance(sd, dict):
        return {k: _zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd)
    return None


def _assert_same(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            _assert_same(got[k], want[k])
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
    else:
        assert got == want


def _save(sd: dict[str, Any], path: Path, **kw: Any) -> None:
    dcp.save(sd, storage_writer=Fs3StorageWriter(path, **kw), no_dist=True)


def _load(sd: dict[str, Any], path: Path, **kw: Any) -> dict[str, Any]:
    dcp.load(sd, storage_reader=Fs3StorageReader(path, **kw), no_dist=True)
    return sd


def test_round_trip_dtypes_views_and_objects(tmp_path: Path) -> None:
    want = _state(1)
    _save(want, tmp_path / "c")
    names = sorted(os.listdir(tmp_path / "c"))
    assert names[0] == ".metadata" and len(names) == 2  # one aggregated data file
    assert names[1].endswith("-rank-00000-0000.data")
    sd = _zeros_like(want)
    sd["step"], sd["meta"] = 0, {"name": "", "lr": []}
    got = _load(sd, tmp_path / "c")
    _assert_same(got, want)


def test_large_ranks_write_several_files(tmp_path: Path) -> None:
    want = _state(5)
    _save(want, tmp_path / "c", max_file_bytes=256)  # model.w alone is 8448 bytes
    data = sorted(n for n in os.listdir(tmp_path / "c") if n.endswith(".data"))
    assert len(data) > 2 and data[0].endswith("-0000.data")
    sd = _zeros_like(want)
    sd["step"], sd["meta"] = 0, {"name": "", "lr": []}
    _assert_same(_load(sd, tmp_path / "c"), want)


def test_metadata_points_into_the_data_file(tmp_path: Path) -> None:
    want = _state(2)
    _save(want, tmp_path / "c")
    md = pickle.loads((tmp_path / "c" / ".metadata").read_bytes())
    infos = list(md.storage_data.values())
    assert all(isinstance(i, Fs3StorageInfo) for i in infos)
    w = next(i for k, i in md.storage_data.items() if k.fqn == "model.w")
    assert (w.dtype, w.shape, w.length) == ("float32", (64, 33), 64 * 33 * 4)
    raw = (tmp_path / "c" / w.file).read_bytes()[w.offset : w.offset + w.length]
    assert raw == want["model"]["w"].numpy().tobytes()  # stored raw, not torch.save'd


def test_loads_into_non_contiguous_and_other_targets(tmp_path: Path) -> None:
    want = {"w": torch.arange(24, dtype=torch.float32).reshape(4, 6)}
    _save(want, tmp_path / "c")
    target = torch.zeros(6, 4).t()  # non-contiguous destination: read into scratch, then copy
    got = _load({"w": target}, tmp_path / "c")
    assert torch.equal(got["w"], want["w"])


def test_corruption_is_detected(tmp_path: Path) -> None:
    _save({"w": torch.ones(1000)}, tmp_path / "c")
    data = next(p for p in (tmp_path / "c").iterdir() if p.name.endswith(".data"))
    b = bytearray(data.read_bytes())
    b[100] ^= 0xFF
    data.write_bytes(bytes(b))
    with pytest.raises(CheckpointException) as e:  # DCP wraps what a rank raised
        _load({"w": torch.zeros(1000)}, tmp_path / "c")
    ((failure, _trace),) = e.value.failures.values()
    assert isinstance(failure, CorruptCheckpoint) and "CRC32C mismatch" in str(failure)
    # ... unless verification is turned off (then the flipped byte is simply loaded)
    got = _load({"w": torch.zeros(1000)}, tmp_path / "c", verify=False)
    assert int((got["w"] != 1).sum()) == 1


def test_overwrite_replaces_and_collects_old_files(tmp_path: Path) -> None:
    _save(_state(1), tmp_path / "c")
    old = {p.name for p in (tmp_path / "c").iterdir()}
    _save(_state(2), tmp_path / "c")
    new = {p.name for p in (tmp_path / "c").iterdir()}
    assert len(new) == 2 and (old - {".metadata"}).isdisjoint(new)  # new name, old one gone
    sd = _zeros_like(_state(2))
    got = _load(sd, tmp_path / "c")
    _assert_same(got["model"], _state(2)["model"])
    with pytest.raises(CheckpointException, match="overwrite=False"):
        _save(_state(3), tmp_path / "c", overwrite=False)


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointException, match="no checkpoint directory"):
        _load({"w": torch.zeros(1)}, tmp_path / "none")
    assert not (tmp_path / "none").exists()  # a load creates nothing
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointException, match="no committed DCP checkpoint"):
        _load({"w": torch.zeros(1)}, tmp_path / "empty")


def test_checkpoint_id_and_validate(tmp_path: Path) -> None:
    w = Fs3StorageWriter(tmp_path / "a")
    dcp.save({"x": torch.ones(3)}, checkpoint_id=tmp_path / "b", storage_writer=w, no_dist=True)
    assert (tmp_path / "b" / ".metadata").exists() and not (tmp_path / "a").exists()
    w.close()
    assert Fs3StorageWriter.validate_checkpoint_id("fs3:///x/y")
    assert Fs3StorageReader.validate_checkpoint_id(str(tmp_path / "new" / "dir"))
    assert not Fs3StorageWriter.validate_checkpoint_id("s3://bucket/x")


def test_async_save(tmp_path: Path) -> None:
    want = _state(4)
    fut = dcp.async_save(
        want, storage_writer=Fs3StorageWriter(tmp_path / "c"), no_dist=True
    )  # staged to host memory by the writer (BlockingAsyncStager), written in the background
    fut.result(timeout=60)
    got = _load(_zeros_like(want) | {"step": 0, "meta": {}}, tmp_path / "c")
    _assert_same(got["model"], want["model"])
    assert got["step"] == 4


def test_non_collective_save_writes_rank_metadata(tmp_path: Path) -> None:
    want = {"w": torch.arange(10.0), "step": 2}
    dcp.save(
        want,
        storage_writer=Fs3StorageWriter(tmp_path / "c"),
        no_dist=True,
        use_collectives=False,
    )
    names = os.listdir(tmp_path / "c")
    assert "__0.metadata" in names and ".metadata" not in names
    got = _load({"w": torch.zeros(10), "step": 0}, tmp_path / "c")  # falls back to __0.metadata
    assert torch.equal(got["w"], want["w"]) and got["step"] == 2
