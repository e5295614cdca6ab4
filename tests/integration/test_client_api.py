"""The Python file API against a real cluster: parity with the built-ins, transports, truncate.

Parity: every scenario below runs twice, once against a local temporary
directory with Python's own ``open``/``os`` functions and once against fs3 with
the :class:`fs3.client.file_api.Client`; each records a trace of results
(content, positions, sizes, and for failures the exception type and errno) and
the two traces must be identical.
"""

from __future__ import annotations

import asyncio
import errno
import io
import os
import random
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fs3 import config as fs3config
from fs3.errors import FsError
from fs3.testing.cluster import ProcessCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CHUNK = 1 << 20  # the test cluster's chunk size (pinned below: the tests cross chunk boundaries)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProcessCluster]:
    with ProcessCluster(
        storage_nodes=3,
        targets_per_node=1,
        replicas=3,
        meta=2,
        mgmtd=1,
        transport="grpc",
        overrides={
            "storage": {"storage": {"fsync": False}},
            "meta": {"meta": {"default_chunk_size": CHUNK}},
        },
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: ProcessCluster) -> Iterator[Any]:
    c = cluster.connect()
    yield c
    c.close()


# ---------------------------------------------------------------------- adapters


class LocalFS:
    """The reference: Python's built-ins on a local directory."""

    def __init__(self, root: str) -> None:
        self.root = root

    def p(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def open(self, rel: str, mode: str = "r", **kw: Any) -> Any:
        return open(self.p(rel), mode, **kw)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = {
            "exists": os.path.exists,
            "isdir": os.path.isdir,
            "isfile": os.path.isfile,
            "islink": os.path.islink,
        }.get(name) or getattr(os, name)

        def call(rel: str, *a: Any, **kw: Any) -> Any:
            if name in ("rename", "replace", "link"):
                return fn(self.p(rel), self.p(a[0]), *a[1:], **kw)
            if name == "symlink":  # symlink(target, rel): the target text is kept verbatim
                return fn(rel, self.p(a[0]), *a[1:], **kw)
            return fn(self.p(rel), *a, **kw)

        return call


class Fs3FS:
    """The same calls on fs3 (paths below a fresh directory)."""

    def __init__(self, client: Any, root: str) -> None:
        self.c = client
        self.root = root

    def p(self, rel: str) -> str:
        return self.root + "/" + rel

    def open(self, rel: str, mode: str = "r", **kw: Any) -> Any:
        return self.c.open(self.p(rel), mode, **kw)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self.c, name)

        def call(rel: str, *a: Any, **kw: Any) -> Any:
            if name in ("rename", "replace", "link"):
                return fn(self.p(rel), self.p(a[0]), *a[1:], **kw)
            if name == "symlink":
                return fn(rel, self.p(a[0]), *a[1:], **kw)
            return fn(self.p(rel), *a, **kw)

        return call


class Trace:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def __call__(self, label: str, fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        try:
            r = fn(*a, **kw)
        except OSError as e:
            self.items.append((label, "OSError", type(e).__name__, e.errno))
            return None
        except (ValueError, io.UnsupportedOperation, TypeError) as e:
            self.items.append((label, type(e).__name__))
            return None
        self.items.append((label, _norm(r)))
        return r

    def add(self, label: str, value: Any) -> None:
        self.items.append((label, _norm(value)))


def _norm(r: Any) -> Any:
    if isinstance(r, os.stat_result):
        return (
            "stat",
            stat.S_IFMT(r.st_mode),
            stat.S_IMODE(r.st_mode),
            r.st_size if not stat.S_ISDIR(r.st_mode) else "-",
            r.st_nlink,
        )
    if isinstance(r, list):
        return sorted(_norm(x) for x in r)
    if isinstance(r, bytearray):
        return bytes(r)
    if hasattr(r, "read") or hasattr(r, "write"):
        return "<file>"
    return r


# ---------------------------------------------------------------------- scenarios


def sc_binary_rw(fs: Any, t: Trace) -> None:
    with fs.open("f", "wb") as f:
        t("write", f.write, b"0123456789")
        t("tell", f.tell)
        t("seek", f.seek, 2)
        t("write2", f.write, b"ab")
        t("tell2", f.tell)
        t("seek_end", f.seek, 0, os.SEEK_END)
        t("seek_neg", f.seek, -1)
        t("read_on_wb", f.read)
    t("stat", fs.stat, "f")
    with fs.open("f", "rb") as f:
        t("read3", f.read, 3)
        t("tell", f.tell)
        buf = bytearray(4)
        t("readinto", f.readinto, buf)
        t.add("buf", buf)
        t("read_rest", f.read)
        t("read_eof", f.read, 10)
        t("seek_past", f.seek, 100)
        t("read_past", f.read, 5)
        t("seek_cur", f.seek, -95, os.SEEK_CUR)
        t("read_after", f.read, 2)
        t("write_on_rb", f.write, b"x")
        t("truncate_on_rb", f.truncate, 1)
        t("mode", lambda: f.mode)
    t("read_closed", f.read)
    with fs.open("f", "rb", buffering=0) as f:
        t("raw_read", f.read, 4)
        t("raw_readall", f.readall)


def sc_text(fs: Any, t: Trace) -> None:
    with fs.open("t.txt", "w", encoding="utf-8") as f:
        t("w", f.write, "héllo\nwörld\n\nlast line no newline")
        t("mode", lambda: f.mode)
    with fs.open("t.txt", encoding="utf-8") as f:
        t("readline", f.readline)
        t("lines", lambda: list(f))
    with fs.open("t.txt", "rb") as f:
        t("bytes", f.read)
    with fs.open("t.txt", encoding="utf-8") as f:
        t("readlines", f.readlines)
    with fs.open("t.txt", "a", encoding="utf-8") as f:
        t("append", f.write, "\nappended")
    with fs.open("t.txt", "r+", encoding="utf-8") as f:
        t("read_all", f.read)
        t("write_end", f.write, "!")
    t("final", lambda: fs.open("t.txt", "rb").read())


def sc_modes(fs: Any, t: Trace) -> None:
    t("r_missing", fs.open, "m", "rb")
    t("rplus_missing", fs.open, "m", "r+b")
    with fs.open("m", "xb") as f:
        t("x_write", f.write, b"abc")
    t("x_exists", fs.open, "m", "xb")
    with fs.open("m", "ab") as f:
        t("a_tell0", f.tell)
        f.seek(0)
        t("a_write", f.write, b"def")
        t("a_tell", f.tell)
    with fs.open("m", "a+b") as f:
        f.seek(0)
        t("aplus_read", f.read)
        t("aplus_write", f.write, b"g")
        f.seek(0)
        t("aplus_read2", f.read)
    with fs.open("m", "r+b") as f:
        t("rplus_write", f.write, b"XY")
        t("rplus_read", f.read)
    with fs.open("m", "wb") as f:
        t("w_truncated_tell", f.tell)
    t("w_size", lambda: fs.stat("m").st_size)
    with fs.open("m", "w+b") as f:
        f.write(b"hello")
        f.seek(1)
        t("wplus_read", f.read, 3)
        t("wplus_mode", lambda: f.mode)
    t("bad_mode", fs.open, "m", "rw")
    t("text_binary", fs.open, "m", "rbt")


def sc_truncate_and_holes(fs: Any, t: Trace) -> None:
    with fs.open("h", "wb") as f:
        f.write(b"A" * 100)
        f.seek(CHUNK + 10)  # leave a hole across the first chunk boundary
        f.write(b"B" * 10)
        t("size", f.seek, 0, os.SEEK_END)
    with fs.open("h", "rb") as f:
        data = f.read()
        t.add("len", len(data))
        t.add("head", data[:100])
        t.add("hole_zero", data[100 : CHUNK + 10] == bytes(CHUNK - 90))
        t.add("tail", data[CHUNK + 10 :])
    with fs.open("h", "r+b") as f:
        f.seek(50)
        t("trunc", f.truncate, 60)
        t("tell_after_trunc", f.tell)
        t("trunc_default", f.truncate)
        t("trunc_extend", f.truncate, 2 * CHUNK + 5)
        f.seek(0)
        d = f.read()
        t.add("extended_len", len(d))
        t.add("extended_head", d[:50])
        t.add("extended_zero", d[50:] == bytes(len(d) - 50))
    t("os_truncate", fs.truncate, "h", 3)
    t("after_os_truncate", lambda: fs.open("h", "rb").read())
    t("os_truncate_neg", fs.truncate, "h", -1)
    t("truncate_missing", fs.truncate, "nope", 0)
    t("truncate_dir", fs.truncate, "", 0)


def sc_errors(fs: Any, t: Trace) -> None:
    fs.mkdir("d")
    with fs.open("d/file", "wb") as f:
        f.write(b"x")
    t("open_dir", fs.open, "d", "rb")
    t("open_dir_w", fs.open, "d", "wb")
    t("under_file", fs.open, "d/file/x", "rb")
    t("create_under_file", fs.open, "d/file/x", "wb")
    t("create_missing_dir", fs.open, "nodir/x", "wb")
    t("listdir_file", fs.listdir, "d/file")
    t("listdir_missing", fs.listdir, "nodir")
    t("mkdir_exists", fs.mkdir, "d")
    t("mkdir_missing_parent", fs.mkdir, "x/y")
    t("rmdir_nonempty", fs.rmdir, "d")
    t("rmdir_file", fs.rmdir, "d/file")
    t("unlink_dir", fs.unlink, "d")
    t("unlink_missing", fs.unlink, "d/none")
    t("stat_missing", fs.stat, "d/none")
    t("stat_trailing_slash_file", fs.stat, "d/file/")
    t("makedirs", fs.makedirs, "a/b/c")
    t("makedirs_exists", fs.makedirs, "a/b/c")
    t("makedirs_exist_ok", fs.makedirs, "a/b/c", exist_ok=True)
    t("makedirs_over_file", fs.makedirs, "d/file/q", exist_ok=True)
    t("exists", fs.exists, "a/b")
    t("isdir", fs.isdir, "a/b")
    t("isfile", fs.isfile, "d/file")
    t("listdir", fs.listdir, "d")
    t("dotdot", fs.stat, "a/b/../b/c")
    t("unlink", fs.unlink, "d/file")
    t("rmdir", fs.rmdir, "d")
    t("exists_after", fs.exists, "d")


def sc_rename(fs: Any, t: Trace) -> None:
    for n in ("f1", "f2"):
        with fs.open(n, "wb") as f:
            f.write(n.encode())
    fs.makedirs("da/sub")
    fs.mkdir("db")
    fs.mkdir("dc")
    with fs.open("dc/x", "wb"):
        pass
    t("file_over_file", fs.rename, "f1", "f2")
    t("content", lambda: fs.open("f2", "rb").read())
    t("src_gone", fs.exists, "f1")
    t("missing_src", fs.rename, "f1", "f3")
    t("file_over_dir", fs.rename, "f2", "db")
    t("dir_over_file", fs.rename, "db", "f2")
    t("dir_over_nonempty", fs.rename, "db", "dc")
    t("dir_into_self", fs.rename, "da", "da/sub/inner")
    t("dir_over_empty_dir", fs.rename, "db", "da/sub")
    t("listdir_da", fs.listdir, "da")
    t("replace", fs.replace, "f2", "dc/x")
    t("listdir_dc", fs.listdir, "dc")
    t("move_dir", fs.rename, "dc", "da/dc")
    t("listdir_moved", fs.listdir, "da/dc")
    t("nlink_da", lambda: fs.stat("da").st_nlink)


def sc_links(fs: Any, t: Trace) -> None:
    fs.mkdir("dir")
    with fs.open("dir/target", "wb") as f:
        f.write(b"target data")
    t("symlink", fs.symlink, "dir/target", "ln")
    t("symlink_dir", fs.symlink, "dir", "lndir")
    t("symlink_dangling", fs.symlink, "nowhere", "dangle")
    t("symlink_loop", fs.symlink, "loop", "loop")
    t("symlink_exists", fs.symlink, "x", "ln")
    t("readlink", fs.readlink, "ln")
    t("readlink_file", fs.readlink, "dir/target")
    t("stat_ln", fs.stat, "ln")
    t("lstat_ln", lambda: stat.S_ISLNK(fs.lstat("ln").st_mode))
    t("lstat_size", lambda: fs.lstat("ln").st_size)
    t("read_via_ln", lambda: fs.open("ln", "rb").read())
    t("through_dir_link", lambda: fs.open("lndir/target", "rb").read())
    t("stat_dangling", fs.stat, "dangle")
    t("exists_dangling", fs.exists, "dangle")
    t("stat_loop", fs.stat, "loop")
    t("open_loop", fs.open, "loop", "rb")
    t("islink", fs.islink, "ln")
    with fs.open("dangle", "wb") as f:  # creates the dangling link's target
        f.write(b"created via link")
    t("created_target", lambda: fs.open("nowhere", "rb").read())
    t("hardlink", fs.link, "dir/target", "hard")
    t("nlink2", lambda: fs.stat("hard").st_nlink)
    t("unlink_orig", fs.unlink, "dir/target")
    t("nlink1", lambda: fs.stat("hard").st_nlink)
    t("hard_content", lambda: fs.open("hard", "rb").read())
    t("ln_now_dangling", fs.stat, "ln")
    t("link_dir", fs.link, "dir", "dirhard")
    t("link_exists", fs.link, "hard", "nowhere")


def sc_attrs(fs: Any, t: Trace) -> None:
    with fs.open("a", "wb") as f:
        f.write(b"attrs")
    t("chmod", fs.chmod, "a", 0o640)
    t("mode", lambda: stat.S_IMODE(fs.stat("a").st_mode))
    t("chmod_suid", fs.chmod, "a", 0o4755)
    t("mode2", lambda: stat.S_IMODE(fs.stat("a").st_mode))
    t("utime_ns", fs.utime, "a", ns=(1_000_000_123, 2_000_000_456))
    t("times", lambda: (fs.stat("a").st_atime_ns, fs.stat("a").st_mtime_ns))
    t("utime_s", fs.utime, "a", (10.5, 20.25))
    t("times_s", lambda: (fs.stat("a").st_atime, fs.stat("a").st_mtime))
    t("chown_same", fs.chown, "a", os.getuid(), os.getgid())
    t("chmod_missing", fs.chmod, "zz", 0o600)
    t("setxattr", fs.setxattr, "a", "user.k", b"v1")
    t("getxattr", fs.getxattr, "a", "user.k")
    t("listxattr", fs.listxattr, "a")
    t("setxattr_create_exists", fs.setxattr, "a", "user.k", b"v2", os.XATTR_CREATE)
    t("setxattr_replace_missing", fs.setxattr, "a", "user.nope", b"v", os.XATTR_REPLACE)
    t("setxattr_replace", fs.setxattr, "a", "user.k", b"v3", os.XATTR_REPLACE)
    t("getxattr2", fs.getxattr, "a", "user.k")
    t("getxattr_missing", fs.getxattr, "a", "user.missing")
    t("removexattr", fs.removexattr, "a", "user.k")
    t("removexattr_missing", fs.removexattr, "a", "user.k")
    t("listxattr_empty", fs.listxattr, "a")


def sc_mtime(fs: Any, t: Trace) -> None:
    with fs.open("mt", "wb") as f:
        f.write(b"0123456789")
    t("utime_old", fs.utime, "mt", ns=(1_000_000_000, 1_000_000_000))
    with fs.open("mt", "r+b") as f:
        f.write(b"abc")  # an overwrite: the length does not change
    t("overwrite_moves_mtime", lambda: fs.stat("mt").st_mtime_ns > 1_000_000_000)
    t("size", lambda: fs.stat("mt").st_size)
    with fs.open("mt", "r+b") as f:
        f.write(b"xyz")
        f.flush()
        t("utime_explicit", fs.utime, "mt", ns=(5_000_000_000, 7_000_000_000))
    t("explicit_mtime_kept", lambda: fs.stat("mt").st_mtime_ns)
    t("content", lambda: fs.open("mt", "rb").read())


def sc_unlink_while_open(fs: Any, t: Trace) -> None:
    f = fs.open("u", "w+b")
    f.write(b"still here")
    f.flush()
    t("unlink", fs.unlink, "u")
    t("exists", fs.exists, "u")
    f.seek(0)
    t("read_after_unlink", f.read)
    t("write_after_unlink", f.write, b"!")
    f.seek(0)
    t("read2", f.read)
    f.close()


def sc_random_io(fs: Any, t: Trace) -> None:
    """Model check: a seeded random sequence of seeks, writes, reads and truncates."""
    rng = random.Random(1234)
    span = 3 * CHUNK
    with fs.open("r", "w+b") as f:
        for i in range(60):
            op = rng.random()
            if op < 0.45:
                off = rng.randrange(span)
                n = rng.choice([1, 7, 4096, 65536, CHUNK - 3, CHUNK + 17])
                f.seek(off)
                t(f"w{i}", f.write, rng.randbytes(n))
            elif op < 0.85:
                off = rng.randrange(span + 100)
                n = rng.choice([1, 100, 4096, CHUNK, 2 * CHUNK])
                f.seek(off)
                d = f.read(n)
                t.add(f"r{i}", (len(d), hash(d)))
            elif op < 0.95:
                t(f"t{i}", f.truncate, rng.randrange(span))
            else:
                t(f"flush{i}", f.flush)
            t.add(f"pos{i}", f.tell())
        f.seek(0)
        d = f.read()
        t.add("final", (len(d), hash(d)))


SCENARIOS = [
    sc_binary_rw,
    sc_text,
    sc_modes,
    sc_truncate_and_holes,
    sc_errors,
    sc_rename,
    sc_links,
    sc_attrs,
    sc_mtime,
    sc_unlink_while_open,
    sc_random_io,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_parity_with_builtins(
    scenario: Callable[[Any, Trace], None], client: Any, tmp_path: Any
) -> None:
    local_root = tmp_path / "root"
    local_root.mkdir()
    want = Trace()
    scenario(LocalFS(str(local_root)), want)
    root = f"/parity-{scenario.__name__}-{uuid.uuid4().hex[:6]}"
    client.mkdir(root)
    got = Trace()
    scenario(Fs3FS(client, root), got)
    for i, (a, b) in enumerate(zip(want.items, got.items, strict=False)):
        assert a == b, f"step {i}: builtins gave {a!r}, fs3 gave {b!r}"
    assert len(want.items) == len(got.items)


# ---------------------------------------------------------------------- transports and sizes


@pytest.mark.parametrize("kind", ["grpc", "tcp", "shm"])
def test_transport_round_trip(cluster: ProcessCluster, kind: str) -> None:
    rng = random.Random(7)
    c = cluster.connect(transport=kind)
    try:
        assert c.core.transport.kind == kind
        path = f"/io-{kind}"
        data = rng.randbytes(3 * CHUNK + 12345)
        with c.open(path, "wb") as f:
            f.write(data[:100])
            f.write(data[100:])  # spans four chunks (three chains)
        with c.open(path, "rb") as f:
            assert f.read() == data
        with c.open(path, "rb", buffering=0) as f:
            for _ in range(50):
                off = rng.randrange(len(data))
                n = rng.choice([1, 4096, 70000, CHUNK + 5])
                f.seek(off)
                assert f.read(n) == data[off : off + n]
        assert c.stat(path).st_size == len(data)
    finally:
        c.close()


def test_length_visible_to_other_clients(cluster: ProcessCluster, client: Any) -> None:
    """Length reaches meta on flush/fsync/close; another client then sees it."""
    other = cluster.connect()
    try:
        f = client.open("/len", "wb")
        f.write(b"a" * 5000)
        assert (
            client.stat("/len").st_size == 0
        )  # still in the file object's buffer (as with builtins)
        f.flush()
        assert client.stat("/len").st_size == 5000  # own writes count at once
        f.fsync()
        assert other.stat("/len").st_size == 5000
        with other.open("/len", "rb") as g:
            assert g.read() == b"a" * 5000
            f.write(b"b" * 5000)
            f.fsync()
            assert g.read() == b"b" * 5000  # a reader sees growth after the fsync
        f.close()
        assert other.stat("/len").st_size == 10000
    finally:
        other.close()


def test_statvfs_and_scandir(client: Any) -> None:
    client.makedirs("/sd/sub", exist_ok=True)
    with client.open("/sd/file", "wb") as f:
        f.write(b"12345")
    client.symlink("file", "/sd/link")
    entries = {e.name: e for e in client.scandir("/sd")}
    assert sorted(entries) == ["file", "link", "sub"]
    assert entries["sub"].is_dir() and not entries["sub"].is_file()
    assert entries["file"].is_file() and entries["file"].stat().st_size == 5
    assert entries["link"].is_symlink() and entries["link"].is_file()
    assert not entries["link"].is_file(follow_symlinks=False)
    assert entries["file"].path == "/sd/file"
    v = client.statvfs("/")
    assert v.f_namemax == 255 and v.f_bsize > 0 and v.f_blocks >= v.f_bfree
    walked = list(client.walk("/sd"))
    assert walked[0][0] == "/sd" and sorted(walked[0][1]) == ["sub"]


def test_readahead_and_write_behind_stay_coherent(client: Any) -> None:
    """Sequential reads prefetch chunks; writes through another handle invalidate them."""
    rng = random.Random(3)
    size = 6 * CHUNK
    a = bytearray(rng.randbytes(size))
    with client.open("/ra", "wb") as w:
        for off in range(0, size, CHUNK):
            w.write(a[off : off + CHUNK])  # write-behind: several chunks in flight
    r = client.open("/ra", "rb")
    w = client.open("/ra", "r+b")
    try:
        got = bytearray()
        got += r.read(65536)
        got += r.read(65536)
        assert r.raw.handle.ra, "a sequential reader should have read-ahead windows"
        while len(got) < CHUNK:
            got += r.read(65536)
        b = rng.randbytes(CHUNK)
        w.seek(CHUNK + CHUNK // 2)
        w.write(b)
        w.flush()  # the write is done (and visible to this client) after flush
        a[CHUNK + CHUNK // 2 : 2 * CHUNK + CHUNK // 2] = b
        got += r.read()
        assert len(got) == size
        assert got == a, "a read after a completed write returned stale read-ahead data"
    finally:
        r.close()
        w.close()


def test_eof_length_from_storage(cluster: ProcessCluster) -> None:
    """A reader may learn an unreported writer's length from storage (QueryLastChunk)."""
    cfg = fs3config.load(fs3config.ClientConfig, None, env={})
    cfg.client.eof_length_from_storage = True
    slow = fs3config.load(fs3config.ClientConfig, None, env={})
    slow.client.length_report_interval_s = 600.0  # the writer reports only at close
    writer = cluster.connect(config=slow)
    plain = cluster.connect()
    eager = cluster.connect(config=cfg)
    try:
        with writer.open("/grow", "wb") as f:
            f.write(b"x" * 10)
        w = writer.open("/grow", "r+b")
        w.seek(0, os.SEEK_END)
        w.write(b"y" * (CHUNK + 100))  # into a second chunk (another chain)
        w.flush()  # on storage now, length not yet reported to meta
        with plain.open("/grow", "rb") as g:
            assert g.read() == b"x" * 10  # meta's length
        with eager.open("/grow", "rb") as g:
            assert g.read() == b"x" * 10 + b"y" * (CHUNK + 100)
        w.close()
        with plain.open("/grow", "rb") as g:
            assert len(g.read()) == 10 + CHUNK + 100  # reported at close
    finally:
        writer.close()
        plain.close()
        eager.close()


async def _chunks_on_every_target(core: Any, ino: int) -> int:
    """How many chunks of ``ino`` exist, summed over every target (replicas count)."""
    from fs3.proto import storage_pb2
    from fs3.rpc.channel import call

    n = 0
    routing = core.routing
    for t in routing.targets():
        node = routing.node(t.node_id)
        r = await call(
            core.storage._stub(node.address).ListChunks,
            storage_pb2.ListChunksRequest(target_id=t.target_id, inode=ino),
            timeout=10,
        )
        n += len(r.metas)
    return n


def test_gc_worker_removes_chunks_of_unlinked_files(client: Any) -> None:
    """The GC worker (fs3/client/gc.py) drains meta's queue and deletes chunks on every replica."""
    from fs3.client.gc import GcWorker

    core = client.core

    async def chunks_of(ino: int) -> int:
        return await _chunks_on_every_target(core, ino)

    with client.open("/gc-victim", "wb") as f:
        f.write(random.Random(5).randbytes(2 * CHUNK + 5))
    ino = client.stat("/gc-victim").st_ino
    assert client.bridge.run(chunks_of(ino)) == 3 * 3  # 3 chunks x 3 replicas
    client.unlink("/gc-victim")

    worker = GcWorker(
        list_gc=lambda r: core.meta.call("ListGc", r),
        ack_gc=lambda r: core.meta.call("AckGc", r),
        storage=core.storage,
    )

    async def drain() -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            await worker.run_once()
            left = await chunks_of(ino)
            if left == 0:
                return 0
            await asyncio.sleep(0.1)
        return await chunks_of(ino)

    assert client.bridge.run(drain()) == 0


def test_meta_servers_delete_chunks_of_unlinked_files_on_their_own(client: Any) -> None:
    """No worker in the test: the meta servers' background GC removes every replica's chunks."""
    core = client.core

    async def chunks_of(ino: int) -> int:
        return await _chunks_on_every_target(core, ino)

    with client.open("/gc-auto", "wb") as f:
        f.write(random.Random(6).randbytes(CHUNK + 1))
    ino = client.stat("/gc-auto").st_ino
    assert client.bridge.run(chunks_of(ino)) == 2 * 3
    client.unlink("/gc-auto")

    async def wait_gone() -> int:
        deadline = time.monotonic() + 60
        left = await chunks_of(ino)
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            left = await chunks_of(ino)
        return left

    assert client.bridge.run(wait_gone()) == 0


def test_unclosed_file_is_flushed_at_exit(cluster: ProcessCluster, client: Any) -> None:
    """A program that exits without closing its file still gets its data and length recorded."""
    import subprocess
    import sys

    code = (
        "import fs3\n"
        f"c = fs3.connect({cluster.cluster_file!r})\n"
        "f = c.open('/at-exit', 'w')\n"
        "f.write('buffered text, never closed')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with client.open("/at-exit") as f:
        assert f.read() == "buffered text, never closed"


def test_inode_api_from_trio(client: Any) -> None:
    """A trio program's path: AsyncClient inode operations awaited from trio through the bridge."""
    import trio

    from fs3.client.core import ROOT_INODE, Caller

    core, br = client.core, client.bridge
    caller = Caller.current()

    async def main() -> None:
        d = await br.trio_run(core.mkdir(caller, ROOT_INODE, b"trio-dir", 0o755))
        h, attr = await br.trio_run(
            core.create(caller, d.inode, b"f", 0o644, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        )
        assert attr.size == 0 and h.writable and h.readable
        payload = random.Random(11).randbytes(CHUNK + 999)

        async def put(i: int) -> None:  # parallel writes of disjoint ranges
            lo = i * (len(payload) // 8)
            hi = len(payload) if i == 7 else (i + 1) * (len(payload) // 8)
            await br.trio_run(core.write(h, lo, payload[lo:hi]))

        async with trio.open_nursery() as n:
            for i in range(8):
                n.start_soon(put, i)
        assert (await br.trio_run(core.getattr(caller, h.inode))).size == len(payload)
        assert await br.trio_run(core.read(h, 0, len(payload) + 10)) == payload
        await br.trio_run(core.fsync(h))
        await br.trio_run(core.release(h))
        entries, more = await br.trio_run(core.readdir(caller, d.inode, b"", 0, with_attrs=True))
        assert [(e.name, e.attr.size) for e in entries] == [(b"f", len(payload))] and not more
        with pytest.raises(FsError) as ei:
            await br.trio_run(core.lookup(caller, d.inode, b"missing"))
        assert ei.value.errno == errno.ENOENT
        await br.trio_run(core.setattr(caller, h.inode, size=10))
        h2 = await br.trio_run(core.open(caller, h.inode, os.O_RDONLY))
        assert await br.trio_run(core.read(h2, 0, 100)) == payload[:10]
        await br.trio_run(core.release(h2))

    trio.run(main)


def test_identity_is_checked_by_meta(cluster: ProcessCluster, client: Any) -> None:
    """connect(uid=, gid=) is the identity meta checks; errors map to PermissionError."""
    client.makedirs("/perm/closed", exist_ok=True)
    client.chmod("/perm/closed", 0o755)
    client.mkdir("/perm/open")
    client.chmod("/perm/open", 0o777)
    nobody = cluster.connect(uid=65534, gid=65534)
    try:
        with pytest.raises(PermissionError):
            nobody.open("/perm/closed/f", "wb")
        with pytest.raises(PermissionError):
            nobody.mkdir("/perm/closed/d")
        with nobody.open("/perm/open/f", "wb") as f:
            f.write(b"mine")
        st = client.stat("/perm/open/f")
        assert (st.st_uid, st.st_gid) == (65534, 65534)
        client.chmod("/perm/open/f", 0o600)
        client.chown("/perm/open/f", 0, 0)
        with pytest.raises(PermissionError):
            nobody.open("/perm/open/f", "rb")
        assert not nobody.access("/perm/open/f", os.R_OK)
        assert client.access("/perm/open/f", os.R_OK)
    finally:
        nobody.close()


def test_fallocate_through_the_python_api(cluster: ProcessCluster, client: Any) -> None:
    """Allocate, punch and zero through Client.fallocate: every replica ends up the same."""
    from fs3.client.core import FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE
    from fs3.testing.invariants import check_replicas

    data = bytearray(random.Random(11).randbytes(3 * CHUNK + 77))
    with client.open("/falloc", "wb") as f:
        f.write(data)
    ino = client.stat("/falloc").st_ino
    assert client.bridge.run(_chunks_on_every_target(client.core, ino)) == 4 * 3
    with client.open("/falloc", "r+b") as f:
        # Punch chunk 1 whole plus 10 bytes on either side.
        client.fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, CHUNK - 10, CHUNK + 20)
        data[CHUNK - 10 : 2 * CHUNK + 10] = bytes(CHUNK + 20)
        assert client.bridge.run(_chunks_on_every_target(client.core, ino)) == 3 * 3
        client.fallocate(f, FALLOC_FL_ZERO_RANGE, 3 * CHUNK, 200)  # grows by 123 zeros
        data[3 * CHUNK :] = bytes(200)
        client.posix_fallocate(f, 0, 5 * CHUNK)  # grows; allocates chunk 4 on storage
        data += bytes(5 * CHUNK - len(data))
        with pytest.raises(OSError) as e:
            client.fallocate(f, FALLOC_FL_PUNCH_HOLE, 0, 1)  # without KEEP_SIZE
        assert e.value.errno == errno.EOPNOTSUPP
        with pytest.raises(OSError) as e:
            client.fallocate(f, 0x08, 0, CHUNK)  # FALLOC_FL_COLLAPSE_RANGE
        assert e.value.errno == errno.EOPNOTSUPP
    assert client.stat("/falloc").st_size == 5 * CHUNK
    with client.open("/falloc", "rb") as f:
        assert f.read() == bytes(data)
    with client.open("/falloc", "rb") as f, pytest.raises(OSError) as e:
        client.fallocate(f, 0, 0, 10)
    assert e.value.errno == errno.EBADF
    assert check_replicas(cluster) == []


def test_write_by_non_root_clears_setid_bits_on_any_path(
    cluster: ProcessCluster, client: Any
) -> None:
    """The Python API's writes (no kernel in the path) drop S_ISUID/S_ISGID like Linux writes do."""
    client.makedirs("/setid", exist_ok=True)
    client.chmod("/setid", 0o777)
    with client.open("/setid/prog", "wb") as f:
        f.write(b"#!/bin/sh\n")
    client.chmod("/setid/prog", 0o6777)
    nobody = cluster.connect(uid=65534, gid=65534)
    try:
        with nobody.open("/setid/prog", "r+b") as f:
            f.seek(2)
            f.write(b"X")  # an overwrite: the length does not change
        assert stat.S_IMODE(client.stat("/setid/prog").st_mode) == 0o777
        client.chmod("/setid/prog", 0o6777)
        with nobody.open("/setid/prog", "rb") as f:
            assert f.read(2) == b"#!"  # reading changes nothing
        assert stat.S_IMODE(client.stat("/setid/prog").st_mode) == 0o6777
    finally:
        nobody.close()
    with client.open("/setid/prog", "ab") as f:
        f.write(b"echo\n")  # root keeps them (CAP_FSETID)
    assert stat.S_IMODE(client.stat("/setid/prog").st_mode) == 0o6777


def test_closing_a_handle_that_wrote_nothing_costs_no_round_trip(client: Any) -> None:
    """Create + close of an unwritten file: one Create RPC; the session ends with the next
    Create (or a batched CloseSessions); a handle that wrote still closes with its own Close."""
    from fs3.client.core import ROOT

    core = client.core
    calls: list[str] = []
    ended: list[tuple[int, str]] = []  # sessions sent to be ended, by any request
    real_call = core.meta.call

    real_now = core.meta.call_now

    def seen(method: str, req: Any) -> None:
        calls.append(method)
        refs = getattr(req, "close_sessions", None) or getattr(req, "sessions", None) or []
        ended.extend((r.inode, r.session_id) for r in refs)

    async def spy(method: str, req: Any, **kw: Any) -> Any:
        seen(method, req)
        return await real_call(method, req, **kw)

    def spy_now(method: str, req: Any, pool: Any) -> Any:  # the calling thread's calls
        seen(method, req)
        return real_now(method, req, pool)

    core.meta.call = spy
    core.meta.call_now = spy_now
    try:
        client.bridge.run(core.flush_closes())
        with client.open("/quiet-1", "xb"):
            pass
        # no lookup before it, no Close after it (the session ends later)
        assert calls in (["Create"], ["Create", "CloseSessions"])
        for i in range(2, 6):
            client.open(f"/quiet-{i}", "wb").close()
        client.bridge.run(core.flush_closes())
        assert "Close" not in calls and calls.count("Create") == 5
        assert len(set(ended)) == 5  # every session was ended once it was flushed
        ino = client.stat("/quiet-1").st_ino
        client.unlink("/quiet-1")  # no session left: removed at once, not kept as an orphan
        with pytest.raises(FsError) as ei:
            client.bridge.run(core.getattr(ROOT, ino))
        assert ei.value.errno == errno.ENOENT
        calls.clear()
        with client.open("/loud", "wb") as f:
            f.write(b"data")
        assert calls[-1] == "Close"  # the length goes with the session close
        assert client.stat("/loud").st_size == 4
    finally:
        core.meta.call = real_call
        core.meta.call_now = real_now
        client.bridge.run(core.flush_closes())
        for name in [f"/quiet-{i}" for i in range(2, 6)] + ["/loud"]:
            if client.lexists(name):
                client.unlink(name)


def test_directories_on_a_path_are_reused_but_own_changes_show_at_once(client: Any) -> None:
    """Path resolution remembers directories per caller (dir_cache_s); rmdir/rename/chmod
    by this client drop them, and another caller still asks meta itself."""
    from fs3.client.core import Caller

    core = client.core
    calls: list[str] = []
    real_call = core.meta.call

    real_now = core.meta.call_now

    async def spy(method: str, req: Any, **kw: Any) -> Any:
        calls.append(method)
        return await real_call(method, req, **kw)

    def spy_now(method: str, req: Any, pool: Any) -> Any:  # the calling thread's calls
        calls.append(method)
        return real_now(method, req, pool)

    client.makedirs("/dc/sub", exist_ok=True)
    client.chmod("/dc", 0o700)  # only root may search it
    core.meta.call = spy
    core.meta.call_now = spy_now
    try:
        client.open("/dc/sub/a", "wb").close()
        calls.clear()
        client.open("/dc/sub/b", "wb").close()
        assert calls[0] == "Create"  # /dc and /dc/sub were not looked up again
        assert client.stat("/dc/sub/a").st_size == 0
        # another caller resolves on its own: no search permission in /dc for uid 1234
        with pytest.raises(FsError) as ei:
            client.bridge.run(core.resolve(Caller(1234, 1234), "/dc/sub/a"))
        assert ei.value.errno == errno.EACCES
        client.rename("/dc/sub", "/dc/moved")
        with pytest.raises(FileNotFoundError):
            client.open("/dc/sub/c", "wb")
        assert sorted(client.listdir("/dc/moved")) == ["a", "b"]
    finally:
        core.meta.call = real_call
        core.meta.call_now = real_now
        client.bridge.run(core.flush_closes())
    for n in ("a", "b"):
        client.unlink(f"/dc/moved/{n}")
    client.rmdir("/dc/moved")
    with pytest.raises(FileNotFoundError):
        client.open("/dc/moved/x", "wb")
    client.rmdir("/dc")


# ---------------------------------------------------------------------- the calling thread's meta calls


def _outcome(fn: Callable[[], Any]) -> Any:
    """What a call gives: a comparable summary of its result, or its exception and errno."""
    try:
        r = fn()
    except (OSError, ValueError) as e:
        return (type(e).__name__, getattr(e, "errno", None))
    if isinstance(r, os.stat_result):
        return tuple(r)[:7] + (r.st_mtime_ns,)  # mode, ino, dev, nlink, uid, gid, size, mtime
    return r


def test_calling_thread_meta_path_matches_the_loop_path(cluster: ProcessCluster) -> None:
    """stat/lstat/open/create made from the calling thread ([client] sync_meta, the
    default) give what the same calls through the client's loop give (sync_meta off),
    for every kind of path; and they really take the calling thread's path."""
    cfg = fs3config.load(fs3config.ClientConfig, None)
    cfg.client.sync_meta = False
    on, off = cluster.connect(), cluster.connect(config=cfg)
    assert on.sync_meta and not off.sync_meta
    now_calls: list[str] = []
    real_now = on.core.meta.call_now

    def spy_now(method: str, req: Any, pool: Any) -> Any:
        now_calls.append(method)
        return real_now(method, req, pool)

    on.core.meta.call_now = spy_now
    d = f"/sync-{uuid.uuid4().hex[:8]}"
    try:
        off.makedirs(f"{d}/sub/deep")
        with off.open(f"{d}/sub/f", "wb") as f:
            f.write(b"12345")
        off.symlink(f"{d}/sub/f", f"{d}/link")
        off.symlink("nowhere", f"{d}/dangling")
        paths = [
            f"{d}/sub/f",
            f"{d}/sub",
            f"{d}/sub/deep",
            f"{d}/link",
            f"{d}/dangling",
            f"{d}/missing",
            f"{d}/sub/f/x",  # a file used as a directory
            f"{d}/sub/",
            f"{d}/sub/f/",
            f"{d}/sub/.",
            f"{d}/sub/..",
            f"{d}/link/x",
            "/",
            f"{d}/" + "n" * 300,
        ]
        for _ in range(2):  # cold directory cache, then warm
            for p in paths:
                for follow in (True, False):
                    a = _outcome(lambda p=p, follow=follow: on.stat(p, follow_symlinks=follow))
                    b = _outcome(lambda p=p, follow=follow: off.stat(p, follow_symlinks=follow))
                    assert a == b, (p, follow)
        assert now_calls.count("Lookup") >= 4

        # open/create in every mode, on twin trees: one through each path
        def twin(c: Any, root: str) -> None:
            c.makedirs(f"{root}/sub")
            with c.open(f"{root}/sub/f", "wb") as f:
                f.write(b"12345")
            c.symlink(f"{root}/sub/f", f"{root}/link")
            c.symlink("nowhere", f"{root}/dangling")

        def shape(r: Any) -> Any:  # what must agree between the twins (not inode, times)
            if isinstance(r, tuple) and len(r) == 8:
                return (r[0], r[3], r[4], r[5], r[6])  # mode, nlink, uid, gid, size
            return r

        twin(off, f"{d}/on")
        twin(off, f"{d}/off")
        rels = ["sub/new", "sub/f", "link", "dangling", "no/x", "sub", "sub/new/", "sub/."]
        for mode in ("xb", "wb", "ab", "rb", "r+b", "w", "x"):
            for rel in rels:
                got = []
                for c, root in ((on, f"{d}/on"), (off, f"{d}/off")):
                    opened = _outcome(
                        lambda c=c, p=f"{root}/{rel}", mode=mode: c.open(p, mode).close()
                    )
                    got.append((opened, shape(_outcome(lambda p=f"{root}/{rel}": off.stat(p)))))
                assert got[0] == got[1], (mode, rel)
        assert "Create" in now_calls and "Open" in now_calls
        # a file written and closed through the sync open is read whole by the other client
        with on.open(f"{d}/sub/w", "wb") as f:
            f.write(b"hello")
        assert off.stat(f"{d}/sub/w").st_size == 5
        with off.open(f"{d}/sub/w", "rb") as f:
            assert f.read() == b"hello"
        # own unreported writes show in the size a sync stat gives
        f = on.open(f"{d}/sub/grow", "wb", buffering=0)
        f.write(b"x" * 1000)
        assert on.stat(f"{d}/sub/grow").st_size == 1000
        f.close()
        assert off.stat(f"{d}/sub/grow").st_size == 1000
    finally:
        on.core.meta.call_now = real_now
        on.close()
        off.close()


def test_calling_thread_meta_path_from_many_threads(client: Any) -> None:
    """Several threads stat, create and close at once: each gets its own answers, every
    session is ended, and the loop path sees the same files."""
    import threading

    d = f"/mt-{uuid.uuid4().hex[:8]}"
    client.makedirs(f"{d}/a")
    assert client.sync_meta
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def worker(k: int) -> None:
        try:
            barrier.wait(30)
            for i in range(25):
                p = f"{d}/a/t{k}-{i}"
                with client.open(p, "xb") as f:
                    if i % 5 == 0:
                        f.write(bytes([k]) * (i + 1))
                st = client.stat(p)
                assert st.st_size == (i + 1 if i % 5 == 0 else 0), (p, st)
                with pytest.raises(FileExistsError):
                    client.open(p, "xb")
                with pytest.raises(FileNotFoundError):
                    client.stat(f"{d}/a/none-{k}-{i}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert not errors, errors[:3]
    client.bridge.run(client.core.flush_closes())
    assert sorted(client.listdir(f"{d}/a")) == sorted(
        f"t{k}-{i}" for k in range(6) for i in range(25)
    )
    assert not client.core._quiet_closes and not client.core.open_handles()
    for name in client.listdir(f"{d}/a"):
        client.unlink(f"{d}/a/{name}")  # no session left: removed at once
    client.rmdir(f"{d}/a")
    client.rmdir(d)
