"""The verifying workload and its checker, against a local directory (no cluster).

The fault tests are only as good as this oracle, so each class of corruption it
must catch is produced here on purpose and must be reported.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fs3.testing.workload import (
    HEADER_SIZE,
    Model,
    NamespaceStorm,
    PosixOps,
    Workload,
    WorkloadConfig,
    decode_block,
    make_block,
)

BS = 4096


def test_block_roundtrip_and_classes() -> None:
    a = make_block(7, 3 * BS, 11, BS)
    assert len(a) == BS and decode_block(a, 7, 3 * BS, BS).kind == "valid"
    assert decode_block(a, 7, 3 * BS, BS).seq == 11
    assert make_block(7, 3 * BS, 11, BS) == a  # deterministic
    assert make_block(7, 3 * BS, 12, BS) != a
    assert decode_block(bytes(BS), 7, 0, BS).kind == "zero"
    assert decode_block(b"", 7, 0, BS).kind == "zero"
    assert decode_block(os.urandom(BS), 7, 0, BS).kind == "garbage"
    assert decode_block(a, 8, 3 * BS, BS).kind == "misplaced"
    assert decode_block(a, 7, 0, BS).kind == "misplaced"
    b = make_block(7, 3 * BS, 12, BS)
    torn = a[: BS // 2] + b[BS // 2 :]  # header of write 11, second half of write 12
    d = decode_block(torn, 7, 3 * BS, BS)
    assert d.kind == "torn" and d.seq == 11
    assert decode_block(a[:1000], 7, 3 * BS, BS).kind == "torn"
    flipped = bytearray(a)
    flipped[HEADER_SIZE + 5] ^= 0x40
    assert decode_block(bytes(flipped), 7, 3 * BS, BS).kind == "torn"
    hdr = bytearray(a)
    hdr[12] ^= 1  # offset field: header check fails
    assert decode_block(bytes(hdr), 7, 3 * BS, BS).kind == "garbage"
    zero_head = bytes(HEADER_SIZE) + a[HEADER_SIZE:]
    assert decode_block(zero_head, 7, 3 * BS, BS).kind == "torn"


def _model_with(tmp: Path) -> tuple[Model, PosixOps]:
    m = Model(BS)
    m.add_file(1, "/f1", "w0")
    return m, PosixOps(str(tmp))


def _write(ops: PosixOps, m: Model, block: int, ack: bool = True) -> int:
    seq = m.intend(1, block)
    ops.write("/f1", block * BS, make_block(1, block * BS, seq, BS))
    if ack:
        m.ack(1, block, seq)
    return seq


def test_check_read_rules(tmp_path: Path) -> None:
    m, ops = _model_with(tmp_path)
    s1 = _write(ops, m, 0)
    s2 = _write(ops, m, 0)
    old = make_block(1, 0, s1, BS)
    m.check_read("r", 1, 0, ops.read("/f1", 0, BS), floor_seq=s2, allow_short=False)
    assert not m.violations
    m.check_read("r", 1, 0, old, floor_seq=s2, allow_short=False)
    assert [v.kind for v in m.violations] == ["stale"]
    m.check_read(
        "r", 1, 0, old, floor_seq=s1, allow_short=False
    )  # read began before s2 was acked: fine
    assert len(m.violations) == 1
    m.check_read("w0", 1, 0, old, floor_seq=s2, allow_short=False, exact_seq=s2)
    assert m.violations[-1].kind == "ryw"
    m.check_read("r", 1, 0, make_block(1, 0, 999, BS), floor_seq=-1, allow_short=False)
    assert m.violations[-1].kind == "never-written"
    n = len(m.violations)
    m.check_read("r", 1, 1, b"", floor_seq=-1, allow_short=False)  # nothing acknowledged there yet
    assert len(m.violations) == n
    m.check_read(
        "r", 1, 0, b"", floor_seq=s2, allow_short=True
    )  # POSIX reader, length not visible yet
    assert len(m.violations) == n
    m.check_read("r", 1, 0, b"", floor_seq=s2, allow_short=False)
    assert m.violations[-1].kind == "lost"
    # an unacknowledged (attempted) newer write may be seen
    s3 = m.intend(1, 0)
    m.check_read("r", 1, 0, make_block(1, 0, s3, BS), floor_seq=s2, allow_short=False)
    assert len(m.violations) == n + 1


def test_a_read_racing_a_write_in_one_page_cache_is_counted_not_a_violation(
    tmp_path: Path,
) -> None:
    """A POSIX reader and writer of one mount share the kernel's page cache: a read
    racing a write of the same block copies some bytes before it and some after (Linux
    makes them no more atomic than on a local disk). Mixed from two writes neither
    older than the floor, that is counted; a mix with an older write, any other torn
    block, and any mix seen by a reader with a cache of its own stay violations."""
    m, ops = _model_with(tmp_path)
    s1 = _write(ops, m, 0)
    s2 = _write(ops, m, 0, ack=False)  # in flight
    a, b = make_block(1, 0, s1, BS), make_block(1, 0, s2, BS)
    mixed = a[:1000] + b[1000:3001] + a[3001:]
    m.check_read("r", 1, 0, mixed, floor_seq=s1, allow_short=True, same_page_cache=True)
    assert not m.violations
    assert m.counts["reads_racing_a_write_in_the_page_cache"] == 1
    m.check_read("r", 1, 0, mixed, floor_seq=s1, allow_short=True)  # another client's reader
    assert [v.kind for v in m.violations] == ["torn"]
    s3 = _write(ops, m, 0)  # acknowledged: s1 is older than the floor now
    m.check_read("r", 1, 0, mixed, floor_seq=s3, allow_short=True, same_page_cache=True)
    assert [v.kind for v in m.violations] == ["torn", "torn"]
    noise = a[:1000] + os.urandom(BS - 1000)
    m.check_read("r", 1, 0, noise, floor_seq=s1, allow_short=True, same_page_cache=True)
    assert [v.kind for v in m.violations] == ["torn"] * 3


@pytest.mark.timeout(30)
def test_workload_clean_on_a_local_directory(tmp_path: Path) -> None:
    # Writers only: a local ext4/tmpfs file gives no atomicity between a concurrent
    # pread and pwrite of the same page (a reader can see a half-copied block), so
    # concurrent readers would report "torn" blocks the local disk is allowed to
    # produce. The read checks are covered deterministically by the tests above;
    # here the whole acknowledged history must verify afterwards.
    a, b = PosixOps(str(tmp_path), "a"), PosixOps(str(tmp_path), "b")
    wl = Workload([a, b], [], config=WorkloadConfig(block_size=BS, max_blocks=8), seed=3).start()
    assert wl.wait_acked(60, 20)
    assert wl.stop(10) == []
    s = wl.model.summary()
    assert s["acked_writes"] >= 60, s
    assert wl.model.violations == [], [str(v) for v in wl.model.violations]
    assert wl.model.verify_all(PosixOps(str(tmp_path), "final")) == []


@pytest.mark.timeout(30)
def test_final_check_catches_lost_stale_torn_and_missing(tmp_path: Path) -> None:
    ops = PosixOps(str(tmp_path), "a")
    wl = Workload(
        [ops], [], config=WorkloadConfig(block_size=BS, max_blocks=6, files_per_writer=3), seed=5
    ).start()
    assert wl.wait_acked(40, 20)
    wl.stop(10)
    assert wl.model.verify_all(ops) == []
    files = list(wl.model.files.values())
    # 1: roll one block back to an older acknowledged version (a lost overwrite)
    f0 = files[0]
    blk, st = next((b, s) for b, s in f0.blocks.items() if len(s.acked) >= 2)
    older = st.acked[-2][0]
    ops.write(f0.path, blk * BS, make_block(f0.file_id, blk * BS, older, BS))
    # 2: flip a byte inside another block (silent corruption)
    f1 = files[1]
    p1 = tmp_path / f1.path.lstrip("/")
    raw = bytearray(p1.read_bytes())
    raw[BS + 100] ^= 0xFF
    p1.write_bytes(bytes(raw))
    # 3: truncate the third file (acknowledged blocks lost)
    f2 = files[2]
    os.truncate(tmp_path / f2.path.lstrip("/"), BS)
    kinds = sorted({v.kind for v in wl.model.verify_all(ops)})
    assert kinds == ["lost", "stale", "torn"], [str(v) for v in wl.model.violations]
    where = " ".join(str(v) for v in wl.model.violations)
    assert f0.path in where and f1.path in where and f2.path in where


@pytest.mark.timeout(30)
def test_namespace_storm_and_its_checker(tmp_path: Path) -> None:
    clients = [PosixOps(str(tmp_path), f"c{i}") for i in range(3)]
    storm = NamespaceStorm(clients, seed=2).start()
    deadline = time.monotonic() + 10
    while storm.ops < 300 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert storm.stop(10) == []
    assert storm.ops >= 300 and storm.errors == 0
    final = PosixOps(str(tmp_path), "final")
    assert storm.verify(final) == [], [str(v) for v in storm.violations]
    # now damage the namespace: remove an acknowledged entry, add a stray one, change a content
    d0 = tmp_path / storm.dir(0).lstrip("/")
    victim = sorted(storm.states[0].present)[0]
    (d0 / victim).unlink()
    (d0 / "stray").write_bytes(b"x")
    other = sorted(storm.states[1].present)[0]
    (tmp_path / storm.dir(1).lstrip("/") / other).write_bytes(b"changed")
    bad = storm.verify(final)
    text = "\n".join(str(v) for v in bad)
    assert len(bad) == 3, text
    assert victim in text and "stray" in text and "changed" in text
