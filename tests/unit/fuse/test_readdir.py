"""fs3.fuse.ops: directory listings stream in bounded daemon memory, and what a listing costs.

The handler runs for real (Fs3Operations.opendir/readdir); only the client
core below it is a stand-in that serves a directory of N names page by page,
generated on demand, and counts the meta calls it receives. pyfuse3's
``readdir_reply`` is replaced by a kernel buffer that takes a fixed number of
entries per call, as the kernel's READDIRPLUS buffer does (~25 entries of a
page), so the listing is resumed by offset exactly as through a mount.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import tracemalloc
from dataclasses import dataclass
from typing import Any

import pyfuse3
import pytest

from fs3 import config as _config
from fs3.fuse import ops as fuse_ops
from fs3.fuse.ops import DIR_OFFSETS_MAX, READDIR_PAGE, DirHandle, Fs3Operations
from fs3.proto import meta_pb2

pytestmark = pytest.mark.timeout(300)

DIR_INO = 77
PARENT_INO = 5


def _name(i: int) -> bytes:
    return b"file-%07d" % i


@dataclass
class _Ctx:
    uid: int
    gid: int
    pid: int


class FakeClient:
    """A directory of ``n`` regular files, served in name order like meta's ReadDir."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls: dict[str, int] = {}
        self.dir_attrs: dict[int, Any] = {}
        self.max_page = 0

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    async def getattr(self, caller: Any, inode: int) -> meta_pb2.Attr:
        self._count("getattr")
        return meta_pb2.Attr(inode=inode, mode=stat.S_IFDIR | 0o755, nlink=2, parent=PARENT_INO)

    async def access(self, caller: Any, inode: int, mode: int) -> None:
        self._count("access")

    async def readdir(
        self, caller: Any, inode: int, cursor: bytes, limit: int, *, with_attrs: bool
    ) -> tuple[list[meta_pb2.DirEntry], bool]:
        self._count("readdir")
        assert inode == DIR_INO and with_attrs
        # the first index whose name sorts after the cursor (names are fixed width)
        start = 0 if not cursor else int(cursor[len(b"file-") :]) + 1
        end = min(self.n, start + limit)
        page = []
        for i in range(start, end):
            e = meta_pb2.DirEntry(name=_name(i), inode=1000 + i, type=1)
            e.attr.CopyFrom(
                meta_pb2.Attr(inode=1000 + i, mode=stat.S_IFREG | 0o644, nlink=1, size=i)
            )
            page.append(e)
        self.max_page = max(self.max_page, len(page))
        return page, end < self.n


class KernelBuffer:
    """Stands in for pyfuse3.readdir_reply: ``per_call`` entries fit in one reply."""

    def __init__(self, per_call: int = 25, keep: bool = True) -> None:
        self.per_call = per_call
        self.keep = keep  # keep the names (else only check them: no memory of the test's own)
        self.taken = 0
        self.names: list[bytes] = []
        self.last_off = 0
        self.inos: dict[bytes, int] = {}
        self.files = 0  # names after "." and "..", checked in order when not kept

    def reply(self, token: Any, name: bytes, attr: pyfuse3.EntryAttributes, off: int) -> bool:
        if self.taken >= self.per_call:
            return False
        self.taken += 1
        self.last_off = off
        if name in (b".", b".."):
            self.names.append(name)
            self.inos[name] = attr.st_ino
        elif self.keep:
            self.names.append(bytes(name))
        else:
            assert name == _name(self.files) and attr.st_ino == 1000 + self.files
            self.files += 1
        return True


def _ops(client: FakeClient) -> Fs3Operations:
    return Fs3Operations(client, _config.FuseSection())  # type: ignore[arg-type]


async def _list(ops: Fs3Operations, fh: int, kb: KernelBuffer, start: int = 0) -> None:
    """Call readdir the way the kernel does until a call returns nothing new."""
    off = start
    while True:
        kb.taken = 0
        await ops.readdir(fh, off, None)  # type: ignore[arg-type]
        if kb.taken == 0:
            return
        off = kb.last_off


def test_listing_of_100k_entries_streams_in_bounded_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 100_000
    client = FakeClient(n)
    ops = _ops(client)
    kb = KernelBuffer(keep=False)
    monkeypatch.setattr(fuse_ops.pyfuse3, "readdir_reply", kb.reply)
    ctx = _Ctx(0, 0, os.getpid())

    async def run() -> tuple[int, Any]:
        fh = await ops.opendir(DIR_INO, ctx)  # type: ignore[arg-type]
        tracemalloc.start()
        try:
            await _list(ops, fh, kb)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        return peak, ops.dirs[fh]

    peak, dh = asyncio.run(run())
    assert kb.names == [b".", b".."]
    assert kb.inos[b"."] == DIR_INO and kb.inos[b".."] == PARENT_INO
    assert kb.files == n  # each name once, in order (checked as they came)
    # what the handle holds is bounded, whatever the directory's size
    assert len(dh.names) <= DIR_OFFSETS_MAX and len(dh.ids) <= DIR_OFFSETS_MAX
    assert len(dh.buffer) <= READDIR_PAGE and client.max_page <= READDIR_PAGE
    # the offset maps of DIR_OFFSETS_MAX names and one page of entries with
    # attributes: a few MiB (holding all 100,000 names alone would take ~25 MiB)
    assert peak < 8 << 20, f"peak {peak / (1 << 20):.1f} MiB while listing {n:,} entries"
    # meta calls: one GetAttr (opendir), one ReadDir per page; no Access, no
    # GetAttr of the parent for ".."
    assert client.calls == {"getattr": 1, "readdir": -(-n // READDIR_PAGE)}


def test_offsets_resume_after_the_right_name_and_old_ones_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """seekdir(telldir()) works within the kept window; far older offsets fail with EINVAL."""
    n = DIR_OFFSETS_MAX + 5000
    client = FakeClient(n)
    ops = Fs3Operations(client, _config.FuseSection(attr_timeout_s=3600))  # type: ignore[arg-type]
    kb = KernelBuffer(per_call=1000)
    monkeypatch.setattr(fuse_ops.pyfuse3, "readdir_reply", kb.reply)
    ctx = _Ctx(0, 0, os.getpid())

    async def run() -> None:
        fh = await ops.opendir(DIR_INO, ctx)  # type: ignore[arg-type]
        kb.taken = 0
        await ops.readdir(fh, 0, None)  # type: ignore[arg-type]
        early = kb.last_off  # the offset after the 998th name
        early_name = kb.names[-1]
        # within the window: resumes right after that name
        kb.names.clear()
        kb.taken = 0
        await ops.readdir(fh, early, None)  # type: ignore[arg-type]
        i = int(early_name[len(b"file-") :])
        assert kb.names[0] == _name(i + 1)
        # list everything: the early offset falls out of the window
        kb.names.clear()
        await _list(ops, fh, kb, start=early)
        assert kb.names[-1] == _name(n - 1)
        kb.taken = 0
        with pytest.raises(pyfuse3.FUSEError) as e:
            await ops.readdir(fh, early, None)  # type: ignore[arg-type]
        assert e.value.errno == errno.EINVAL
        # a recent offset still resumes exactly
        dh = ops.dirs[fh]
        recent = dh.ids[_name(n - 10)]
        kb.names.clear()
        kb.taken = 0
        await ops.readdir(fh, recent, None)  # type: ignore[arg-type]
        assert kb.names == [_name(n - 9 + k) for k in range(9)]
        # rewinddir: "." and ".." again from the handle's attributes (no new GetAttr
        # while they are younger than attr_timeout_s)
        kb.names.clear()
        kb.taken = 0
        await ops.readdir(fh, 0, None)  # type: ignore[arg-type]
        assert kb.names[:3] == [b".", b"..", _name(0)]
        assert client.calls["getattr"] == 1
        # ... and fetched again once they are older than that
        dh.attr_at -= 7200
        kb.names.clear()
        kb.taken = 0
        await ops.readdir(fh, 0, None)  # type: ignore[arg-type]
        assert kb.names[:2] == [b".", b".."] and client.calls["getattr"] == 2

    asyncio.run(run())


def test_entry_timeouts_follow_the_mount_options() -> None:
    """Directories get dir_entry_timeout_s, everything else entry_timeout_s."""
    cfg = _config.FuseSection(attr_timeout_s=2.5, entry_timeout_s=3.0, dir_entry_timeout_s=7.0)
    ops = Fs3Operations(FakeClient(0), cfg)  # type: ignore[arg-type]
    d = ops._entry(meta_pb2.Attr(inode=9, mode=stat.S_IFDIR | 0o755, nlink=2))
    f = ops._entry(meta_pb2.Attr(inode=10, mode=stat.S_IFREG | 0o644, nlink=1, size=4097))
    s = ops._entry(meta_pb2.Attr(inode=11, mode=stat.S_IFLNK | 0o777, nlink=1))
    assert (d.entry_timeout, d.attr_timeout) == (7.0, 2.5)
    assert (f.entry_timeout, f.attr_timeout) == (3.0, 2.5)
    assert s.entry_timeout == 3.0
    assert f.st_blocks == 9 and f.st_size == 4097  # blocks cover the size


def test_offsets_forget_the_least_recently_handed_out_name() -> None:
    """A name handed out again is kept over older ones: the kernel resumes from the newest."""
    dh = DirHandle(DIR_INO, None, meta_pb2.Attr())  # type: ignore[arg-type]
    first = [dh.offset_of(_name(i)) for i in range(DIR_OFFSETS_MAX)]
    assert len(set(first)) == DIR_OFFSETS_MAX
    assert dh.offset_of(_name(0)) == first[0]  # listed again (rewinddir): same offset
    dh.offset_of(b"new")  # one name over the limit: the least recent goes, not name 0
    assert dh.names.get(first[0]) == _name(0)
    assert first[1] not in dh.names and _name(1) not in dh.ids
    assert len(dh.names) == len(dh.ids) == DIR_OFFSETS_MAX
    # a name forgotten and listed again gets a new offset (its old one stays refused)
    again = dh.offset_of(_name(1))
    assert again != first[1] and dh.names[again] == _name(1)


def test_two_full_passes_over_a_directory_larger_than_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rewinddir and list again: every name once per pass, every resume found."""
    n = DIR_OFFSETS_MAX + 3000
    client = FakeClient(n)
    ops = _ops(client)
    kb = KernelBuffer(per_call=97, keep=False)
    monkeypatch.setattr(fuse_ops.pyfuse3, "readdir_reply", kb.reply)

    async def run() -> None:
        fh = await ops.opendir(DIR_INO, _Ctx(0, 0, os.getpid()))  # type: ignore[arg-type]
        for _ in range(2):
            kb.files = 0
            kb.names.clear()
            await _list(ops, fh, kb)
            assert kb.files == n and kb.names == [b".", b".."]

    asyncio.run(run())
