"""fs3.ckpt host memory: the process arena (reuse, huge pages, fallbacks, release) and prepare()."""

from __future__ import annotations

import gc
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fs3.ckpt as ckpt
from fs3.ckpt import store
from fs3.ckpt.store import HostArena, huge_bytes, populate_memory
from fs3.transport import region

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unsupported"
    return text.split("[", 1)[1].split("]", 1)[0]


def _addr(mv: Any) -> int:
    if isinstance(mv, memoryview):
        return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data)
    return int(mv.data_ptr())


@pytest.fixture
def arena(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh process arena for the test (the real one is process-wide)."""
    a = HostArena()
    monkeypatch.setattr(store, "_arena", (os.getpid(), a))
    yield a
    a.close()


@pytest.fixture(autouse=True)
def _close_registry() -> Any:
    yield
    ckpt.close_all()


def _state(seed: int, n: int = 8, big: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, Any] = {f"w{i}": torch.randn(1000 + 37 * i, generator=g) for i in range(n)}
    sd["h"] = torch.randn(333, generator=g).to(torch.bfloat16)
    sd["np"] = np.arange(1001, dtype=np.int32) + seed
    if big:
        sd["big"] = torch.randn(big // 4, generator=g)
    return sd


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k])
        else:
            assert torch.equal(a[k], b[k]), k


def test_arena_reuses_memory_only_once_released(arena: HostArena) -> None:
    a = arena.take(3 * MiB)
    a[:4] = b"abcd"
    b = arena.take(3 * MiB)  # ``a`` is lent: never handed out twice
    assert _addr(a) != _addr(b)
    assert arena.sizes() == ([4 * MiB, 4 * MiB], [])
    first = _addr(a)
    view = a[10:20]
    del a
    assert len(arena.sizes()[0]) == 2  # a view keeps it lent
    del view
    assert arena.sizes() == ([4 * MiB], [4 * MiB])
    c = arena.take(3 * MiB + 5)
    assert _addr(c) == first and bytes(c[:4]) == b"abcd"  # the same pages, not zeroed again
    del b, c
    assert arena.sizes() == ([], [4 * MiB, 4 * MiB])
    arena.idle_s = 0.0
    assert arena.expire() == 2 and arena.sizes() == ([], [])


def test_arena_bounds_idle_memory() -> None:
    a = HostArena(idle_max=1)
    x, y = a.take(MiB), a.take(5 * MiB)
    del x
    assert a.sizes() == ([6 * MiB], [2 * MiB])
    del y  # the newest idle one is kept, the older unmapped at once
    assert a.sizes() == ([], [6 * MiB])
    a.close()
    assert a.sizes() == ([], [])
    with pytest.raises(ValueError, match="closed"):
        a.take(MiB)


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="THP off here")
def test_arena_memory_is_in_huge_pages(arena: HostArena) -> None:
    buf = arena.take(16 * MiB, populate=True)
    # /proc/self/smaps: the kernel gave the mapping huge pages (all but a ragged edge)
    assert huge_bytes(buf) >= 8 * MiB


def test_hugepage_advice_unsupported_falls_back_to_small_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a Python or platform without MADV_HUGEPAGE: 4 KiB pages, same behaviour
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE")
    arena = HostArena()
    mv = arena.take(8 * MiB, populate=True)
    if _thp_mode() == "madvise":
        assert huge_bytes(mv) == 0  # no advice, no huge pages
    mv[-3:] = b"xyz"
    assert bytes(mv[-3:]) == b"xyz" and not any(mv[:4096])
    del mv
    arena.close()


def test_populate_unsupported_falls_back_to_faults_on_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a kernel without MADV_POPULATE_WRITE rejects the advice: pages then fault on first write
    monkeypatch.setattr(region, "_MADV_POPULATE_WRITE", 0x7FFF)
    arena = HostArena()
    mv = arena.take(2 * MiB, populate=True)
    assert populate_memory(mv) is False
    mv[: 1 << 20] = b"\x01" * (1 << 20)
    assert mv[(1 << 20) - 1] == 1 and mv[1 << 20] == 0
    del mv
    arena.close()


def test_populate_keeps_contents(arena: HostArena) -> None:
    buf = arena.take(4 * MiB)
    buf[:5] = b"hello"
    buf[-5:] = b"world"
    assert populate_memory(buf, step=MiB)
    assert bytes(buf[:5]) == b"hello" and bytes(buf[-5:]) == b"world"


def test_snapshot_buffers_go_back_to_the_arena_on_close(arena: HostArena, tmp_path: Path) -> None:
    sd = _state(1)
    c = ckpt.Checkpointer(str(tmp_path / "a"))
    c.save(sd, step=1).wait()
    assert c._snap is not None
    where = _addr(c._snap.mem)
    assert len(arena.sizes()[0]) == 1
    c.close()
    gc.collect()
    assert arena.sizes()[0] == [] and len(arena.sizes()[1]) == 1  # released, kept idle
    # a later checkpointer (a new run, a changed policy) snapshots into the same pages
    c2 = ckpt.Checkpointer(str(tmp_path / "b"))
    c2.save(sd, step=1).wait()
    assert c2._snap is not None and _addr(c2._snap.mem) == where
    _same(sd, c2.load(1))
    c2.close()


def test_loaded_memory_becomes_the_next_snapshot(arena: HostArena, tmp_path: Path) -> None:
    """A resumed job: load, copy into the model, drop the load, save: no fresh memory for the save."""
    sd = _state(2)
    c = ckpt.Checkpointer(str(tmp_path))
    c.save(sd, step=1).wait()
    c.close()
    got = ckpt.load(str(tmp_path))
    _same(sd, got)
    where = _addr(got["w0"])  # the load's buffer starts with the first tensor
    assert len(arena.sizes()[0]) == 1
    del got
    gc.collect()
    c = ckpt.Checkpointer(str(tmp_path))
    c.save(sd, step=2).wait()
    assert c._snap is not None and _addr(c._snap.mem) == where
    _same(sd, c.load(2))


def test_prepare_makes_the_buffer_the_first_save_uses(arena: HostArena, tmp_path: Path) -> None:
    sd = _state(3, big=12 * MiB)  # past the threaded-copy threshold
    c = ckpt.Checkpointer(str(tmp_path))
    fut = c.prepare(sd)
    assert fut.result(timeout=60) is None
    assert c._prepared is not None
    made = c._prepared[1].result()
    h = c.save(sd, step=1)
    assert c._snap is made and c._prepared is None  # the save copied into the prepared buffer
    h.wait()
    _same(sd, c.load(1))
    # prepared again for the same layout: nothing to do
    assert c.prepare(sd).done() and c._prepared is None
    # a prepared buffer for another layout is not used by a save of this one
    other = _state(3, n=3)
    c.prepare(other).result(timeout=60)
    sd["w0"].add_(1)
    c.save(sd, step=2).wait()
    assert c._snap is made
    _same(sd, c.load(2))
    # ... and is used when that layout comes
    assert c._prepared is not None
    made2 = c._prepared[1].result()
    c.save(other, step=3).wait()
    assert c._snap is made2
    _same(other, c.load(3))
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.prepare(sd)


def test_prepare_error_surfaces_in_the_future_and_the_save(
    arena: HostArena, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sd = _state(4)
    c = ckpt.Checkpointer(str(tmp_path))

    def boom(*a: Any, **k: Any) -> Any:
        raise MemoryError("no memory for the snapshot")

    monkeypatch.setattr(arena, "take", boom)
    with pytest.raises(MemoryError):
        c.prepare(sd).result(timeout=60)
    with pytest.raises(MemoryError):
        c.save(sd, step=1)
    monkeypatch.undo()
    c.save(sd, step=1).wait()  # nothing was left half made
    _same(sd, c.load(1))


def test_snapshot_copies_every_kind_of_source(arena: HostArena, tmp_path: Path) -> None:
    """memcpy for contiguous host tensors (threaded past 8 MiB), copy_ for the rest."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(300, 200, generator=g)
    sd: dict[str, Any] = {
        "big": torch.randn(5 * MiB, generator=g),  # 20 MiB: split over the copy threads
        "big2": torch.randn(3 * MiB + 7, generator=g),
        "transposed": base.t(),  # not contiguous
        "sliced": base[:, 5:9],
        "offset": base.reshape(-1)[17:1017],  # contiguous, storage offset
        "conj": torch.randn(64, dtype=torch.complex64, generator=g).conj(),  # lazy conjugate
        "np_strided": np.arange(4000, dtype=np.float64)[::3],
        "np": np.arange(4000, dtype=np.int16),
        "param": torch.nn.Parameter(torch.randn(77, generator=g)),
        "empty": torch.empty(0),
    }
    c = ckpt.Checkpointer(str(tmp_path))
    c.save(sd, step=1).wait()
    got = c.load(1)
    for k, v in sd.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, got[k])
        else:
            assert torch.equal(v.detach().resolve_conj(), got[k]), k
    # the reused buffer takes the new values (every byte rewritten)
    sd["big"].mul_(-1)
    sd["offset"].add_(1)
    c.save(sd, step=2).wait()
    got = c.load(2)
    assert torch.equal(got["big"], sd["big"]) and torch.equal(got["offset"], sd["offset"])
    c.close()
