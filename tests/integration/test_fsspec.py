"""fs3:// through fsspec against a real local cluster: files, listings, namespace ops, pandas."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest

from fs3.client.fsspec_fs import Fs3File, Fs3FileSystem
from fs3.testing.cluster import ProcessCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProcessCluster]:
    with ProcessCluster(
        storage_nodes=1,
        targets_per_node=1,
        replicas=1,
        meta=1,
        mgmtd=1,
        overrides={"storage": {"storage": {"fsync": False}}},
    ) as c:
        yield c
        Fs3FileSystem.close_clients()  # before the cluster goes away


@pytest.fixture(scope="module")
def so(cluster: ProcessCluster) -> dict[str, Any]:
    """storage_options naming the test cluster."""
    return {"cluster_file": cluster.cluster_file}


@pytest.fixture
def fs(so: dict[str, Any]) -> Fs3FileSystem:
    f = fsspec.filesystem("fs3", **so)
    assert isinstance(f, Fs3FileSystem)
    return f


@pytest.fixture
def root(fs: Fs3FileSystem) -> Iterator[str]:
    d = f"/t-{uuid.uuid4().hex[:8]}"
    fs.mkdir(d)
    yield d
    fs.rm(d, recursive=True)


def test_fsspec_open_text_and_url_forms(so: dict[str, Any], root: str) -> None:
    with fsspec.open(f"fs3://{root}/a.txt", "w", encoding="utf-8", **so) as f:
        f.write("héllo\nwörld\n")
    with fsspec.open(f"fs3://{root.lstrip('/')}/a.txt", "r", encoding="utf-8", **so) as f:
        assert f.read() == "héllo\nwörld\n"
    with fsspec.open(f"fs3://{root}/a.txt", "rb", **so) as f:
        assert isinstance(f, Fs3File)
        assert f.read() == "héllo\nwörld\n".encode()
    fs = fsspec.filesystem("fs3", **so)
    assert fs.cat(f"fs3://{root}/a.txt") == "héllo\nwörld\n".encode()


def test_large_file_blocks_seek_and_ranges(fs: Fs3FileSystem, root: str) -> None:
    rng = random.Random(7)
    data = rng.randbytes(5 * (1 << 20) + 12345)  # several blocks and chunks, odd tail
    p = f"{root}/big.bin"
    with fs.open(p, "wb", block_size=1 << 20) as f:
        for i in range(0, len(data), 300_000):  # writes that straddle block boundaries
            f.write(data[i : i + 300_000])
        assert f.tell() == len(data)
    assert fs.size(p) == len(data)
    with fs.open(p, "rb", block_size=1 << 20) as f:
        assert f.size == len(data)
        for _ in range(20):
            a = rng.randrange(len(data))
            n = rng.randrange(1, 3 << 20)
            f.seek(a)
            assert f.read(n) == data[a : a + n]
            assert f.tell() == min(a + n, len(data))
        f.seek(-10, os.SEEK_END)
        assert f.read() == data[-10:]
        assert f.read(5) == b""
    assert fs.cat_file(p) == data
    assert fs.cat_file(p, start=100, end=200) == data[100:200]
    assert fs.cat_file(p, start=-1000) == data[-1000:]
    assert fs.cat_file(p, start=10, end=-10) == data[10:-10]
    assert fs.cat_file(p, start=len(data) + 5) == b""


def test_append_exclusive_and_open_errors(fs: Fs3FileSystem, root: str) -> None:
    p = f"{root}/f"
    fs.pipe_file(p, b"abc")
    with fs.open(p, "ab") as f:
        assert f.tell() == 3
        f.write(b"def")
    assert fs.cat_file(p) == b"abcdef"
    with pytest.raises(FileExistsError):
        fs.open(p, "xb")
    with fs.open(f"{root}/new", "xb") as f:
        f.write(b"x")
    assert fs.cat_file(f"{root}/new") == b"x"
    with pytest.raises(FileExistsError):
        fs.pipe_file(p, b"zz", mode="create")
    assert fs.cat_file(p) == b"abcdef"  # unchanged
    with pytest.raises(FileNotFoundError):
        fs.open(f"{root}/missing", "rb")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{root}/missing")
    with pytest.raises(FileNotFoundError):
        fs.open(f"{root}/nodir/f", "wb")  # parent missing
    with pytest.raises(IsADirectoryError):
        fs.open(root, "rb")
    with pytest.raises(NotImplementedError):
        fs.open(p, "r+b")


def test_ls_info_and_walk(fs: Fs3FileSystem, root: str) -> None:
    fs.makedirs(f"{root}/d/sub")
    fs.pipe({f"{root}/d/x": b"12345", f"{root}/d/sub/y": b"", f"{root}/z": b"zz"})
    assert fs.ls(root, detail=False) == [f"{root}/d", f"{root}/z"]
    infos = {i["name"]: i for i in fs.ls(f"{root}/d")}
    assert set(infos) == {f"{root}/d/sub", f"{root}/d/x"}
    assert infos[f"{root}/d/x"]["type"] == "file"
    assert infos[f"{root}/d/x"]["size"] == 5
    assert infos[f"{root}/d/sub"]["type"] == "directory"
    i = fs.info(f"{root}/z")
    assert (i["name"], i["type"], i["size"], i["islink"]) == (f"{root}/z", "file", 2, False)
    assert i["mtime"] > 0 and i["ino"] > 0
    assert fs.ls(f"fs3://{root}/z", detail=False) == [f"{root}/z"]  # ls of a file
    assert fs.info("fs3:///")["type"] == "directory"
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{root}/nope")
    with pytest.raises(FileNotFoundError):
        fs.info(f"{root}/nope")
    assert fs.exists(f"{root}/d/x") and not fs.exists(f"{root}/nope")
    assert fs.isdir(f"{root}/d") and fs.isfile(f"{root}/z")
    assert sorted(fs.find(root)) == [f"{root}/d/sub/y", f"{root}/d/x", f"{root}/z"]
    assert sorted(fs.glob(f"{root}/d/*")) == [f"{root}/d/sub", f"{root}/d/x"]
    assert fs.du(root) == 7
    walked = {d: (sorted(ds), sorted(fs_)) for d, ds, fs_ in fs.walk(root)}
    assert walked[root] == (["d"], ["z"])
    assert walked[f"{root}/d"] == (["sub"], ["x"])
    assert fs.modified(f"{root}/z").timestamp() == pytest.approx(i["mtime"])


def test_symlink_info(fs: Fs3FileSystem, root: str) -> None:
    fs.pipe_file(f"{root}/target", b"tt")
    fs.client.symlink("target", f"{root}/link")
    fs.client.symlink("gone", f"{root}/dangling")
    i = fs.info(f"{root}/link")
    assert (i["type"], i["size"], i["islink"], i["destination"]) == ("file", 2, True, "target")
    assert fs.cat_file(f"{root}/link") == b"tt"
    d = fs.info(f"{root}/dangling")
    assert d["islink"] and d["type"] == "other"
    names = {x["name"]: x for x in fs.ls(root)}
    assert names[f"{root}/link"]["islink"]
    fs.rm(f"{root}/link")  # removes the link, not its target
    assert fs.exists(f"{root}/target") and not fs.client.lexists(f"{root}/link")


def test_mkdir_rm_and_errors(fs: Fs3FileSystem, root: str) -> None:
    fs.mkdir(f"{root}/a/b/c")  # create_parents
    assert fs.isdir(f"{root}/a/b/c")
    with pytest.raises(FileExistsError):
        fs.mkdir(f"{root}/a/b/c")
    with pytest.raises(FileNotFoundError):
        fs.mkdir(f"{root}/x/y", create_parents=False)
    fs.makedirs(f"{root}/a/b/c", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{root}/a/b/c")
    fs.pipe_file(f"{root}/a/b/f", b"1")
    with pytest.raises(OSError) as e:
        fs.rm(f"{root}/a")  # not empty, not recursive
    assert e.value.errno == 39  # ENOTEMPTY
    with pytest.raises(IsADirectoryError):
        fs.rm_file(f"{root}/a")
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{root}/nope")
    fs.rm(f"{root}/a/b/c")  # an empty directory goes without recursive
    fs.rm(f"{root}/a", recursive=True)
    assert not fs.exists(f"{root}/a")
    fs.pipe({f"{root}/g1.log": b"", f"{root}/g2.log": b"", f"{root}/keep": b""})
    fs.rm(f"{root}/*.log")
    assert fs.ls(root, detail=False) == [f"{root}/keep"]
    fs.touch(f"{root}/keep2")
    assert fs.cat_file(f"{root}/keep2") == b""
    fs.pipe_file(f"{root}/keep2", b"data")
    fs.touch(f"{root}/keep2", truncate=False)
    assert fs.cat_file(f"{root}/keep2") == b"data"
    fs.touch(f"{root}/keep2")
    assert fs.cat_file(f"{root}/keep2") == b""


def test_mv_and_copy(fs: Fs3FileSystem, root: str) -> None:
    auto = fsspec.filesystem("fs3", client=fs.client, auto_mkdir=True)
    auto.pipe({f"{root}/src/a": b"A" * 100, f"{root}/src/sub/b": b"B"})  # parents made
    ino = fs.info(f"{root}/src/a")["ino"]
    fs.mv(f"{root}/src/a", f"{root}/a2")
    assert fs.info(f"{root}/a2")["ino"] == ino  # a rename, not a copy
    assert not fs.exists(f"{root}/src/a")
    fs.mkdir(f"{root}/into")
    fs.mv(f"{root}/a2", f"{root}/into")  # into an existing directory
    assert fs.cat_file(f"{root}/into/a2") == b"A" * 100
    fs.mv(f"{root}/src", f"{root}/moved")  # a whole directory
    assert fs.cat_file(f"{root}/moved/sub/b") == b"B"
    with pytest.raises(FileNotFoundError):
        fs.mv(f"{root}/nope", f"{root}/x")
    data = random.Random(3).randbytes(9 << 20)  # more than one copy buffer
    fs.pipe_file(f"{root}/moved/big", data)
    fs.cp_file(f"{root}/moved/big", f"{root}/big2")
    assert fs.cat_file(f"{root}/big2") == data
    fs.copy(f"{root}/moved", f"{root}/copy", recursive=True)
    assert sorted(fs.find(f"{root}/copy")) == [
        f"{root}/copy/big",
        f"{root}/copy/sub/b",
    ]
    assert fs.cat_file(f"{root}/copy/sub/b") == b"B"


def test_transaction_commit_and_discard(fs: Fs3FileSystem, root: str) -> None:
    with fs.transaction:
        with fs.open(f"{root}/t1", "wb") as f:
            f.write(b"committed")
        assert not fs.exists(f"{root}/t1")  # invisible until the transaction ends
    assert fs.cat_file(f"{root}/t1") == b"committed"

    class Boom(Exception):
        pass

    with pytest.raises(Boom), fs.transaction:
        with fs.open(f"{root}/t2", "wb") as f:
            f.write(b"never")
        raise Boom
    assert not fs.exists(f"{root}/t2")
    assert fs.ls(root, detail=False) == [f"{root}/t1"]  # no temporary files left
    with fs.transaction:
        with pytest.raises(FileExistsError):
            fs.open(f"{root}/t1", "xb")  # exclusive creation holds in a transaction too


def test_put_get_local(fs: Fs3FileSystem, root: str, tmp_path: Any) -> None:
    src = tmp_path / "local.bin"
    data = os.urandom(3 << 20)
    src.write_bytes(data)
    fs.put(str(src), f"{root}/up.bin")
    assert fs.cat_file(f"{root}/up.bin") == data
    fs.get(f"{root}/up.bin", str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == data


def test_one_connection_per_process(so: dict[str, Any]) -> None:
    found: list[Any] = []
    alive = threading.Barrier(3, timeout=30)  # all alive at once: no reused thread ids

    def work() -> None:
        found.append(fsspec.filesystem("fs3", **so))
        alive.wait()

    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    found.append(fsspec.filesystem("fs3", **so))
    assert len({id(f) for f in found}) == 4  # fsspec caches an instance per thread ...
    assert len({id(f.client) for f in found}) == 1  # ... all on one connection


def test_cluster_from_env(cluster: ProcessCluster, monkeypatch: Any, root: str) -> None:
    monkeypatch.setenv("FS3_CLUSTER_FILE", cluster.cluster_file)
    fs = fsspec.filesystem("fs3")
    fs.pipe_file(f"{root}/env", b"e")
    assert fs.cat_file(f"fs3://{root}/env") == b"e"


def test_pandas_round_trip(so: dict[str, Any], fs: Fs3FileSystem, root: str) -> None:
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"step": range(1000), "loss": [1.0 / (i + 1) for i in range(1000)]})
    df.to_csv(f"fs3://{root}/m.csv", index=False, storage_options=so)
    back = pd.read_csv(f"fs3://{root}/m.csv", storage_options=so)
    pd.testing.assert_frame_equal(back, df)
    df.to_csv(f"fs3://{root}/m.csv.gz", index=False, storage_options=so)  # compression inferred
    assert fs.cat_file(f"{root}/m.csv.gz")[:2] == b"\x1f\x8b"
    pd.testing.assert_frame_equal(pd.read_csv(f"fs3://{root}/m.csv.gz", storage_options=so), df)
    df.to_json(f"fs3://{root}/m.jsonl", orient="records", lines=True, storage_options=so)
    back = pd.read_json(f"fs3://{root}/m.jsonl", lines=True, storage_options=so)
    pd.testing.assert_frame_equal(back, df)


def test_fresh_interpreter_finds_fs3_by_entry_point(cluster: ProcessCluster, root: str) -> None:
    """A program that never imports fs3 reads and writes fs3:// (no mount, no storage options:
    fsspec takes the cluster file from FSSPEC_FS3_CLUSTER_FILE)."""
    code = (
        "import fsspec, sys\n"
        "with fsspec.open('fs3://' + sys.argv[1] + '/child.txt', 'w') as f:\n"
        "    f.write('from a child')\n"
        "print(fsspec.open('fs3://' + sys.argv[1] + '/child.txt', 'r').open().read())\n"
    )
    env = dict(os.environ, FSSPEC_FS3_CLUSTER_FILE=cluster.cluster_file)
    env.pop("FS3_CLUSTER_FILE", None)
    r = subprocess.run(
        [sys.executable, "-c", code, root], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "from a child"


def test_torch_dcp_fsspec_writer_on_fs3(so: dict[str, Any], fs: Fs3FileSystem, root: str) -> None:
    """PyTorch's own fsspec-based DCP storage works on fs3:// unchanged."""
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    want = {"w": torch.randn(50, 7, generator=torch.Generator().manual_seed(1)), "step": 3}
    url = f"fs3://{root}/dcp"
    dcp.save(want, storage_writer=FsspecWriter(url, **so), no_dist=True)
    assert fs.exists(f"{root}/dcp/.metadata")
    got = {"w": torch.zeros(50, 7), "step": 0}
    dcp.load(got, storage_reader=FsspecReader(url, **so), no_dist=True)
    assert torch.equal(got["w"], want["w"]) and got["step"] == 3
