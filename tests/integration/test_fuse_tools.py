"""Real tools on a real fs3 mount: cp -a + diff -r, tar, git, sqlite3, fio --verify; then failover.

The failover test is last in the last FUSE module: it kills and restarts nodes
of the shared cluster.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from fs3.testing.cluster import ProcessCluster

pytest.register_assert_rewrite("fuse_helpers")  # shared helpers + the fuse_cluster plugin
from fuse_helpers import needs_fuse  # noqa: E402 - after register_assert_rewrite

CHUNK = 1 << 20

pytest_plugins = ["fuse_helpers"]  # the shared cluster fixture ``fuse_cluster``
pytestmark = [pytest.mark.integration, pytest.mark.fuse, needs_fuse, pytest.mark.timeout(90)]


def _run(*args: str, cwd: Path | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        list(args), cwd=cwd, capture_output=True, text=True, timeout=60, check=False, **kw
    )  # type: ignore[call-overload]
    assert r.returncode == 0, f"{' '.join(args)} failed ({r.returncode}): {r.stdout}\n{r.stderr}"
    return r  # type: ignore[no-any-return]


def _make_tree(root: Path) -> None:
    rng = random.Random(7)
    (root / "sub" / "deeper").mkdir(parents=True)
    for i in range(8):
        (root / f"f{i}.bin").write_bytes(rng.randbytes(rng.choice([0, 1, 4095, 70000, 1_200_000])))
    (root / "sub" / "text.txt").write_text("hello\n" * 1000)
    (root / "sub" / "deeper" / "x").write_bytes(b"x")
    os.symlink("../f1.bin", root / "sub" / "link")
    os.link(root / "f2.bin", root / "sub" / "hard")
    os.chmod(root / "f3.bin", 0o600)
    os.chmod(root / "sub" / "deeper", 0o700)
    os.utime(root / "f4.bin", ns=(1_600_000_000_123_456_789, 1_600_000_000_987_654_321))


def test_cp_a_and_diff_r(d: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _make_tree(src)
    _run("cp", "-a", str(src), str(d / "copy"))
    _run("diff", "-r", "--no-dereference", str(src), str(d / "copy"))
    for rel in ("f3.bin", "f4.bin", "sub/deeper", "sub/link"):
        a, b = os.lstat(src / rel), os.lstat(d / "copy" / rel)
        assert a.st_mode == b.st_mode, rel
        if not os.path.islink(src / rel):
            assert a.st_mtime_ns == b.st_mtime_ns, rel
    assert os.stat(d / "copy" / "sub" / "hard").st_nlink == 2  # cp -a keeps hard links
    # and back out again
    _run("cp", "-a", str(d / "copy"), str(tmp_path / "back"))
    _run("diff", "-r", "--no-dereference", str(src), str(tmp_path / "back"))


def test_tar_create_and_extract(d: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _make_tree(src)
    _run("tar", "-C", str(tmp_path), "-cf", str(d / "a.tar"), "src")  # archive written to fs3
    (d / "x").mkdir()
    _run("tar", "-C", str(d / "x"), "-xpf", str(d / "a.tar"))  # extracted onto fs3
    _run("diff", "-r", "--no-dereference", str(src), str(d / "x" / "src"))
    _run("tar", "-C", str(d / "x"), "-cf", str(tmp_path / "b.tar"), "src")  # archive read from fs3
    (tmp_path / "y").mkdir()
    _run("tar", "-C", str(tmp_path / "y"), "-xpf", str(tmp_path / "b.tar"))
    _run("diff", "-r", "--no-dereference", str(src), str(tmp_path / "y" / "src"))


def test_git_init_add_commit_fsck(d: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@x",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@x",
        HOME=str(d),
        GIT_CONFIG_NOSYSTEM="1",
    )
    repo = d / "repo"
    _run("git", "init", "-q", "--template=", str(repo), env=env)
    for i in range(4):
        (repo / f"file{i}.txt").write_text(f"content {i}\n" * (i * 100 + 1))
    _run("git", "add", ".", cwd=repo, env=env)
    _run("git", "commit", "-q", "-m", "first", cwd=repo, env=env)
    os.rename(repo / "file1.txt", repo / "renamed.txt")
    _run("git", "add", "-A", cwd=repo, env=env)
    _run("git", "commit", "-q", "-m", "second", cwd=repo, env=env)
    _run("git", "fsck", "--full", "--strict", cwd=repo, env=env)
    log = _run("git", "log", "--oneline", cwd=repo, env=env).stdout.splitlines()
    assert len(log) == 2
    assert _run("git", "status", "--porcelain", cwd=repo, env=env).stdout == ""


def test_sqlite_integrity(d: Path) -> None:
    if shutil.which("sqlite3") is None:
        pytest.skip("sqlite3 not installed")
    db = d / "t.db"
    script = (
        "PRAGMA journal_mode=DELETE;\n"
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\n"
        "BEGIN;\n"
        + "".join(f"INSERT INTO t(v) VALUES ('{'v' * (i % 300)}{i}');\n" for i in range(1500))
        + "COMMIT;\n"
        "CREATE INDEX iv ON t(v);\n"
        "DELETE FROM t WHERE id % 3 = 0;\n"
        "VACUUM;\n"
    )
    _run("sqlite3", str(db), input=script)
    out = _run("sqlite3", str(db), "PRAGMA integrity_check; SELECT count(*) FROM t;").stdout.split()
    assert out == ["ok", "1000"]
    # WAL mode uses shared memory (mmap of the -shm file) on the mount
    _run("sqlite3", str(db), input="PRAGMA journal_mode=WAL; INSERT INTO t(v) VALUES ('wal'); ")
    out = _run("sqlite3", str(db), "PRAGMA integrity_check; SELECT count(*) FROM t;").stdout.split()
    assert out == ["ok", "1001"]


def test_fio_verify(d: Path, tmp_path: Path) -> None:
    if shutil.which("fio") is None:
        pytest.skip("fio not installed")
    # fio saves <job>-<n>-verify.state files in its working directory: a temporary one
    here = set(glob.glob("*-verify.state"))
    r = _run(
        "fio",
        "--name=verify",
        f"--directory={d}",
        "--rw=randwrite",
        "--bs=16k",
        "--size=2m",
        "--ioengine=psync",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--do_verify=1",
        "--numjobs=2",
        "--group_reporting",
        "--randseed=6",
        cwd=tmp_path,
    )
    assert "err= 0" in r.stdout
    r = _run(
        "fio",
        "--name=seqverify",
        f"--directory={d}",
        "--rw=write",
        "--bs=1m",
        "--size=6m",
        "--ioengine=psync",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--do_verify=1",
        "--end_fsync=1",
        cwd=tmp_path,
    )
    assert "err= 0" in r.stdout
    assert set(glob.glob("*-verify.state")) == here  # nothing left where pytest runs


# ---------------------------------------------------------------------------- failover (last: disturbs the cluster)


def test_operations_survive_meta_and_storage_failures(cluster: ProcessCluster, d: Path) -> None:
    """A killed meta or storage node stalls operations on the mount; they complete after failover."""
    data = os.urandom(2 * CHUNK + 5)
    cluster.kill("meta-1")
    try:
        for i in range(3):
            (d / f"m{i}").write_bytes(data)
        assert sorted(os.listdir(d)) == ["m0", "m1", "m2"]
        assert (d / "m1").read_bytes() == data
    finally:
        cluster.restart("meta-1")
    cluster.kill("storage-3")  # every chain has a replica there (3 replicas on 3 nodes)
    fd = os.open(d / "during-storage-failure", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)  # waits for the chain to drop the dead replica, then commits
    finally:
        os.close(fd)
    assert (d / "during-storage-failure").read_bytes() == data
    assert (d / "m2").read_bytes() == data
    cluster.restart("storage-3")
