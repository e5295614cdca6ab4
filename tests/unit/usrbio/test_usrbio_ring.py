"""The shared-memory ring layout and queue logic (both sides in one process)."""

from __future__ import annotations

import os

import pytest

from fs3.usrbio.ring import ARGS, CQE, HEADER_SIZE, SQE, IoArgs, Ring, ring_size
from fs3.usrbio.shm import agent_socket_path


def _ring(entries: int) -> tuple[bytearray, Ring]:
    mem = bytearray(ring_size(entries))
    return mem, Ring.init(memoryview(mem), entries, True, 0, -1)


def test_sizes_match_3fs() -> None:
    assert (ARGS.size, CQE.size, SQE.size) == (56, 24, 16)
    assert ring_size(1) % 4096 == 0
    assert ring_size(64) >= HEADER_SIZE + 64 * 56 + 65 * 40


def test_sq_and_cq_wrap_around_and_detect_full() -> None:
    mem, r = _ring(3)  # 4 positions per queue
    seen = []
    for round_ in range(10):  # many wrap-arounds
        for i in range(3):
            r.write_args(i, IoArgs(b"x" * 16, i, 7, round_, 10 + i, i))
            assert r.push_sqe(i, i)
        assert not r.push_sqe(0, 0)  # full: one position stays empty
        assert r.sqes_queued() == 3
        while (s := r.pop_sqe()) is not None:
            idx, ud = s
            a = r.read_args(idx)
            assert a.file_off == round_ and a.io_len == 10 + idx
            assert r.push_cqe(idx, a.io_len, ud)
        assert not r.push_cqe(0, 0, 0)
        while (c := r.pop_cqe()) is not None:
            seen.append(c)
    assert len(seen) == 30 and seen[:3] == [(0, 10, 0), (1, 11, 1), (2, 12, 2)]


def test_second_view_sees_the_same_queues() -> None:
    mem, app = _ring(8)
    agent = Ring(memoryview(mem))  # what the agent builds from the mapped file
    assert agent.entries == 8 and agent.for_read
    app.write_args(5, IoArgs(b"y" * 16, 1, 2, 3, 4, 5))
    app.push_sqe(5, 99)
    assert agent.pop_sqe() == (5, 99)
    assert agent.read_args(5) == IoArgs(b"y" * 16, 1, 2, 3, 4, 5)
    agent.push_cqe(5, -5, 99)
    assert app.pop_cqe() == (5, -5, 99)


def test_corrupt_headers_and_indices_are_refused() -> None:
    mem = bytearray(ring_size(4))
    with pytest.raises(ValueError):
        Ring(memoryview(mem))  # no magic
    mem, r = _ring(4)
    with pytest.raises(ValueError):
        r.read_args(4)
    mem[64:68] = (1000).to_bytes(4, "little")  # garbage head position
    assert r.sqes_queued() == 0  # clamped, no out-of-range access
    with pytest.raises(ValueError):
        Ring(memoryview(bytearray(100)))
    with pytest.raises(ValueError):
        Ring.init(memoryview(bytearray(ring_size(1))), 0, True, 0, 0)


def test_agent_socket_path_is_stable_and_does_not_stat_the_mount(tmp_path: object) -> None:
    p = str(tmp_path)
    assert (
        agent_socket_path(p)
        == agent_socket_path(p + "/")
        == agent_socket_path(os.path.join(p, "."))
    )
    assert agent_socket_path(p) != agent_socket_path(p + "x")
    # a mount point that does not exist yet (computed before mounting) still works
    assert agent_socket_path(os.path.join(p, "not-mounted-yet")).endswith(".sock")
