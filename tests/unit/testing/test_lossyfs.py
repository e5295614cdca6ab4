"""The lossy file system (fs3.testing.lossyfs) against the POSIX/ext4 durability rules, through a real mount.

Each test does something on the mount, cuts the power (``crash()``) and looks at
what survived: synced data and entries of synced directories survive byte for
byte; anything else rolls back or vanishes.
"""

from __future__ import annotations

import mmap
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fs3.testing.lossyfs import PAGE, LossyMount, lossy_dir, skip_reason

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
    pytest.mark.timeout(60),
]


@pytest.fixture
def m() -> Iterator[LossyMount]:
    with lossy_dir() as mount:
        yield mount


def mp(m: LossyMount, *parts: str) -> str:
    return os.path.join(m.mountpoint, *parts)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str, data: bytes, *, sync: bool = False, flags: int = 0) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | flags, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_unsynced_create_vanishes_synced_create_survives(m: LossyMount) -> None:
    write_file(mp(m, "kept"), b"k" * 100, sync=True)
    fsync_dir(mp(m))
    write_file(
        mp(m, "data-synced-entry-not"), b"x", sync=True
    )  # the file fsync'd, its directory not
    write_file(mp(m, "nothing-synced"), b"y")
    m.crash()
    assert sorted(os.listdir(mp(m))) == ["kept"]
    assert read(mp(m, "kept")) == b"k" * 100


def test_synced_entry_without_synced_data_is_empty(m: LossyMount) -> None:
    write_file(mp(m, "f"), b"never fsync'd")
    fsync_dir(mp(m))
    m.crash()
    assert read(mp(m, "f")) == b""


def test_unsynced_overwrite_and_append_roll_back(m: LossyMount) -> None:
    base = os.urandom(3 * PAGE + 17)
    write_file(mp(m, "f"), base, sync=True)
    fsync_dir(mp(m))
    with open(mp(m, "f"), "r+b") as f:
        f.seek(PAGE + 5)
        f.write(b"\xff" * 2 * PAGE)  # overwrite in the middle
        f.seek(0, os.SEEK_END)
        f.write(b"tail" * 1000)  # and append
    assert read(mp(m, "f")) != base
    m.crash()
    assert read(mp(m, "f")) == base


def test_fsync_makes_data_durable_then_later_writes_roll_back_to_it(m: LossyMount) -> None:
    write_file(mp(m, "f"), b"a" * 5000, sync=True)
    fsync_dir(mp(m))
    with open(mp(m, "f"), "r+b") as f:
        f.write(b"b" * 100)
        f.flush()
        os.fdatasync(f.fileno())
        f.write(b"c" * 9000)
    m.crash()
    assert read(mp(m, "f")) == b"b" * 100 + b"a" * 4900


def test_truncate_rolls_back(m: LossyMount) -> None:
    data = os.urandom(10000)
    write_file(mp(m, "f"), data, sync=True)
    fsync_dir(mp(m))
    os.truncate(mp(m, "f"), 10)
    with open(mp(m, "f"), "ab") as f:
        f.write(b"z" * 20000)
    m.crash()
    assert read(mp(m, "f")) == data


def test_o_sync_and_o_direct_writes_are_durable(m: LossyMount) -> None:
    write_file(mp(m, "s"), b"", sync=True)
    write_file(mp(m, "d"), b"", sync=True)
    fsync_dir(mp(m))
    write_file(mp(m, "s"), b"sync" * 100, flags=os.O_SYNC)
    buf = mmap.mmap(-1, 2 * PAGE)  # O_DIRECT wants an aligned buffer
    buf.write(b"D" * 2 * PAGE)
    fd = os.open(mp(m, "d"), os.O_WRONLY | os.O_DIRECT)
    try:
        assert os.pwritev(fd, [buf], 0) == 2 * PAGE
    finally:
        os.close(fd)
    # a buffered write after the O_SYNC one is not durable; the O_SYNC bytes are
    with open(mp(m, "s"), "ab") as f:
        f.write(b"lost")
    m.crash()
    assert read(mp(m, "s")) == b"sync" * 100
    assert read(mp(m, "d")) == b"D" * 2 * PAGE


def test_o_direct_write_into_dirty_file_keeps_only_its_range(m: LossyMount) -> None:
    write_file(mp(m, "f"), b"0" * 4 * PAGE, sync=True)
    fsync_dir(mp(m))
    with open(mp(m, "f"), "r+b") as f:
        f.write(b"1" * 4 * PAGE)  # unsynced, whole file
    buf = mmap.mmap(-1, PAGE)
    buf.write(b"2" * PAGE)
    fd = os.open(mp(m, "f"), os.O_WRONLY | os.O_DIRECT)
    try:
        os.pwritev(fd, [buf], 2 * PAGE)
    finally:
        os.close(fd)
    m.crash()
    assert read(mp(m, "f")) == b"0" * 2 * PAGE + b"2" * PAGE + b"0" * PAGE


def test_unlink_without_dir_fsync_comes_back(m: LossyMount) -> None:
    write_file(mp(m, "f"), b"precious", sync=True)
    fsync_dir(mp(m))
    os.unlink(mp(m, "f"))
    assert not os.path.exists(mp(m, "f"))
    m.crash()
    assert read(mp(m, "f")) == b"precious"


def test_unlink_with_dir_fsync_is_gone(m: LossyMount) -> None:
    write_file(mp(m, "f"), b"gone", sync=True)
    fsync_dir(mp(m))
    os.unlink(mp(m, "f"))
    fsync_dir(mp(m))
    m.crash()
    assert os.listdir(mp(m)) == []


def test_rename_over_existing(m: LossyMount) -> None:
    """The classic atomic replace: only write+fsync+rename+fsync(dir) is durable."""
    write_file(mp(m, "conf"), b"old", sync=True)
    fsync_dir(mp(m))
    write_file(mp(m, "conf.tmp"), b"new", sync=True)
    os.replace(mp(m, "conf.tmp"), mp(m, "conf"))
    assert read(mp(m, "conf")) == b"new"
    m.crash()  # the directory was not fsync'd after the rename: the old file is back
    assert sorted(os.listdir(mp(m))) == ["conf"]
    assert read(mp(m, "conf")) == b"old"
    write_file(mp(m, "conf.tmp"), b"new", sync=True)
    os.replace(mp(m, "conf.tmp"), mp(m, "conf"))
    fsync_dir(mp(m))
    m.crash()
    assert sorted(os.listdir(mp(m))) == ["conf"]
    assert read(mp(m, "conf")) == b"new"


def test_rename_without_fsync_of_data_gives_an_empty_file(m: LossyMount) -> None:
    """write_text + os.replace + fsync(dir) but no fsync of the file: the new name, no bytes."""
    write_file(mp(m, "conf"), b"old", sync=True)
    fsync_dir(mp(m))
    write_file(mp(m, "conf.tmp"), b"new")
    os.replace(mp(m, "conf.tmp"), mp(m, "conf"))
    fsync_dir(mp(m))
    m.crash()
    assert read(mp(m, "conf")) == b""


def test_rename_between_directories_needs_both_synced(m: LossyMount) -> None:
    os.mkdir(mp(m, "a"))
    os.mkdir(mp(m, "b"))
    write_file(mp(m, "a", "f"), b"moving", sync=True)
    fsync_dir(mp(m, "a"))
    fsync_dir(mp(m))
    os.rename(mp(m, "a", "f"), mp(m, "b", "f"))
    fsync_dir(
        mp(m, "b")
    )  # only the destination: under the strict rules the source name survives too
    m.crash()
    assert read(mp(m, "a", "f")) == b"moving"
    assert read(mp(m, "b", "f")) == b"moving"
    assert os.stat(mp(m, "a", "f")).st_ino == os.stat(mp(m, "b", "f")).st_ino


def test_hard_links(m: LossyMount) -> None:
    write_file(mp(m, "f"), b"linked", sync=True)
    fsync_dir(mp(m))
    os.link(mp(m, "f"), mp(m, "g"))
    assert os.stat(mp(m, "f")).st_ino == os.stat(mp(m, "g")).st_ino
    fsync_dir(mp(m))
    os.unlink(mp(m, "f"))  # unsynced
    with open(mp(m, "g"), "ab") as f:
        f.write(b" more")  # unsynced, through the other name
    m.crash()
    assert read(mp(m, "f")) == b"linked"
    assert read(mp(m, "g")) == b"linked"
    assert os.stat(mp(m, "f")).st_nlink == 2


def test_mkdir_and_nested_entries_need_every_level_synced(m: LossyMount) -> None:
    os.makedirs(mp(m, "x", "y"))
    write_file(mp(m, "x", "y", "f"), b"deep", sync=True)
    fsync_dir(mp(m, "x", "y"))
    fsync_dir(mp(m, "x"))
    m.crash()  # the root was never fsync'd: x never reached the disk
    assert os.listdir(mp(m)) == []
    os.makedirs(mp(m, "x", "y"))
    write_file(mp(m, "x", "y", "f"), b"deep", sync=True)
    for d in (mp(m, "x", "y"), mp(m, "x"), mp(m)):
        fsync_dir(d)
    os.symlink("y/f", mp(m, "x", "link"))  # unsynced
    m.crash()
    assert read(mp(m, "x", "y", "f")) == b"deep"
    assert sorted(os.listdir(mp(m, "x"))) == ["y"]


def test_rmdir_without_parent_fsync_comes_back_with_its_files(m: LossyMount) -> None:
    os.mkdir(mp(m, "d"))
    write_file(mp(m, "d", "f"), b"inside", sync=True)
    fsync_dir(mp(m, "d"))
    fsync_dir(mp(m))
    os.unlink(mp(m, "d", "f"))
    fsync_dir(mp(m, "d"))
    os.rmdir(mp(m, "d"))
    m.crash()
    assert os.listdir(mp(m, "d")) == []  # the rmdir was lost, the synced unlink was not


def test_the_mount_keeps_serving_after_several_cuts(m: LossyMount) -> None:
    for i in range(3):
        write_file(mp(m, f"f{i}"), b"%d" % i, sync=True)
        fsync_dir(mp(m))
        write_file(mp(m, f"lost{i}"), b"?")
        m.crash()
        assert sorted(os.listdir(mp(m))) == [f"f{j}" for j in range(i + 1)]
    assert [read(mp(m, f"f{i}")) for i in range(3)] == [b"0", b"1", b"2"]


def test_torn_write_keeps_a_page_aligned_prefix(m: LossyMount) -> None:
    write_file(mp(m, "f"), b"", sync=True)
    fsync_dir(mp(m))
    data = os.urandom(4 * PAGE)
    write_file(mp(m, "f"), data)
    rep = m.crash(tear=7)
    assert rep["torn"] is not None
    got = read(mp(m, "f"))
    assert 0 < len(got) < len(data) and len(got) % PAGE == 0
    assert got == data[: len(got)]


def test_crash_from_another_process_and_by_signal(m: LossyMount) -> None:
    write_file(mp(m, "a"), b"a")
    subprocess.run(
        [sys.executable, "-m", "fs3.testing.lossyfs", "crash", m.control],
        check=True,
        capture_output=True,
        timeout=30,
    )
    assert os.listdir(mp(m)) == []
    write_file(mp(m, "b"), b"b")
    assert m.proc is not None
    os.kill(m.proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while os.path.exists(mp(m, "b")):
        assert time.monotonic() < deadline, "SIGUSR1 did not cut the power"
        time.sleep(0.05)


def _sqlite_rows(path: str) -> list[int]:
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return [r[0] for r in db.execute("SELECT v FROM t ORDER BY v")]
    finally:
        db.close()


def test_sqlite_wal_commits_survive_and_uncommitted_vanish(m: LossyMount) -> None:
    """SQLite in WAL mode (the -shm is mmap'ed) on the mount: committed = durable."""
    os.mkdir(mp(m, "kv"))
    fsync_dir(mp(m))
    path = mp(m, "kv", "kv.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t(v INTEGER)")
    for i in range(50):
        db.execute("INSERT INTO t VALUES (?)", (i,))
    db.execute("BEGIN")
    db.execute("INSERT INTO t VALUES (999)")  # never committed
    # a second connection (another reader of the -shm) sees the committed rows
    other = sqlite3.connect(path)
    assert other.execute("SELECT count(*) FROM t").fetchone() == (50,)
    other.close()
    fsync_dir(mp(m, "kv"))  # the database file's first appearance (SQLite syncs the WAL's itself)
    m.crash()
    db.close()
    assert _sqlite_rows(path) == list(range(50))


def test_sqlite_wal_first_sync_fsyncs_its_directory_but_not_the_parent(m: LossyMount) -> None:
    """SQLite fsyncs the directory when the WAL first appears (which makes the database
    file's name durable too), but a directory created for the database is the caller's."""
    os.mkdir(mp(m, "kv"))
    path = mp(m, "kv", "kv.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t(v INTEGER)")
    db.execute("INSERT INTO t VALUES (1)")
    fsync_dir(mp(m))  # now kv/ is durable too
    m.crash()
    db.close()
    assert _sqlite_rows(path) == [1]
    os.mkdir(mp(m, "kv2"))
    db = sqlite3.connect(mp(m, "kv2", "kv.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t(v INTEGER)")
    m.crash()
    db.close()
    assert sorted(os.listdir(mp(m))) == ["kv"]


def test_backing_directory_holds_exactly_what_survived(tmp_path: Path) -> None:
    with LossyMount(tmp_path / "b", tmp_path / "m") as mnt:
        write_file(mp(mnt, "f"), b"1", sync=True)
        fsync_dir(mp(mnt))
        write_file(mp(mnt, "g"), b"2")
        mnt.crash()
    assert sorted(os.listdir(tmp_path / "b")) == ["f"]


def test_create_with_o_trunc_over_an_existing_file_rolls_back(tmp_path: Path) -> None:
    """The model without FUSE: the kernel may send CREATE for a name that exists by then."""
    from fs3.testing.lossyfs import ROOT_ID, LossyFs

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "f").write_bytes(b"durable")
    fs = LossyFs(tmp_path / "b", tmp_path / "state")
    h, _n = fs.create(ROOT_ID, "f", 0o644, os.O_WRONLY | os.O_TRUNC)
    assert (tmp_path / "b" / "f").read_bytes() == b""
    fs.write(h.fh, 0, b"new")
    fs.crash()
    assert (tmp_path / "b" / "f").read_bytes() == b"durable"
