"""A lossy file system for power-loss tests: a FUSE passthrough that can forget what was not durable.

Why: SIGKILL keeps the kernel's page cache, so a crash test that only kills
processes cannot catch a missing or misplaced ``fsync``. This layer forwards
every operation to a real *backing* directory and keeps, on the side, what a
power cut would leave behind under the POSIX/ext4 durability rules:

* **file data** written since the last ``fsync``/``fdatasync`` of that file is
  not durable (a write through a descriptor opened with ``O_DIRECT``,
  ``O_SYNC`` or ``O_DSYNC`` is durable at once). The layer keeps an undo log:
  before an unsynced write or truncation overwrites bytes that were durable,
  it saves them (bytes past the durable length need no copy: the roll-back
  truncates them);
* **directory entries** (create, mkdir, mknod, symlink, link, rename, unlink,
  rmdir) are not durable until their directory is ``fsync``'d. On the first
  change after a directory fsync the layer snapshots the directory's entries
  (name -> node); a node whose last name is removed while a snapshot still
  names it is kept in a *graveyard* (a hard link, or the moved empty
  directory) so a cut can bring it back.

:meth:`LossyFs.crash` throws all of that away in one step: the backing tree
is rebuilt from the durable directory snapshots, every file is rolled back to
its last synced contents and length, unsynced entries vanish or come back, and
the mount keeps serving what survived. Optionally one unsynced write is *torn*:
a page-aligned prefix of it survives the cut, as a disk may leave it.

Metadata other than names and sizes (mode, owner, times) is treated as durable
at once; extended attributes and ``fallocate`` are not supported (the kernel
then answers ``EOPNOTSUPP``, and glibc's ``posix_fallocate`` writes zeros).

Every handler is synchronous (no ``await`` inside): on the single asyncio loop
each operation, and a crash, is atomic with respect to the others.

Run one mount per process (pyfuse3 serves one mount per process)::

    with LossyMount(backing, mountpoint) as m:  # spawns ``python -m fs3.testing.lossyfs``
        ...                                      # use the mount
        m.crash()                                # or: fs3.testing.lossyfs crash CONTROL_SOCKET
                                                 # or: kill -USR1 <pid of the daemon>

``crash()`` returns only when the roll-back is complete. Callers SIGKILL the
processes using the mount first (a power cut stops them too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAGE = 4096
ROOT_ID = 1
_SYNC_FLAGS = getattr(os, "O_DIRECT", 0) | os.O_SYNC | os.O_DSYNC
_MAX_WRITES_KEPT = 64  # unsynced write ranges remembered per file (candidates for a torn write)


@dataclass
class Node:
    """One file, directory or symlink, identified by its FUSE inode number ``id``."""

    id: int
    kind: str  # "f" | "d" | "l" | "o" (fifo, socket, device: treated like a file without data)
    st_ino: int
    links: set[tuple[int, str]] = field(default_factory=set)  # live (parent id, name)
    grave: bool = False  # backing lives in the graveyard (no live name, a snapshot names it)
    dead: bool = False  # backing is gone
    open_count: int = 0
    # files: None = clean (live bytes are the durable bytes); else the durable length
    durable_size: int | None = None
    undo: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, durable bytes)
    writes: list[tuple[int, int]] = field(default_factory=list)  # unsynced (offset, length)
    # directories: None = clean (live entries are durable); else the durable entries
    durable: dict[str, int] | None = None


@dataclass
class Handle:
    node: int
    fd: int
    sync: bool  # O_DIRECT / O_SYNC / O_DSYNC: each write is durable when it returns
    append: bool
    fh: int = 0


class LossyFs:
    """The durability model and the backing-directory operations (no FUSE in here).

    :class:`LossyOps` maps FUSE requests onto these methods; the unit tests of
    the model may call them directly, the layer's tests go through a real mount.
    """

    def __init__(self, backing: str | os.PathLike[str], state: str | os.PathLike[str]) -> None:
        self.backing = Path(backing).absolute()
        self.state = Path(state).absolute()
        self.grave_dir = self.state / "graveyard"
        self.grave_dir.mkdir(parents=True, exist_ok=True)
        self.crashes = 0
        # never reused, not even across cuts: a dead process's late release or page write-back
        # names a handle of the old tree and must not hit a new file
        self._next_fh = 1
        self._reset()

    def _reset(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.by_ino: dict[int, int] = {}
        self.handles: dict[int, Handle] = {}
        self._next_id = ROOT_ID + 1
        st = os.lstat(self.backing)
        self.nodes[ROOT_ID] = Node(ROOT_ID, "d", st.st_ino)
        self.by_ino[st.st_ino] = ROOT_ID

    # ------------------------------------------------------------------ nodes and paths

    def path(self, nid: int) -> str:
        if nid == ROOT_ID:
            return str(self.backing)
        n = self.node(nid)
        if n.grave:
            return str(self.grave_dir / str(n.id))
        if not n.links:
            raise OSError(errno.ENOENT, "no name left")
        parent, name = min(n.links)
        return os.path.join(self.path(parent), name)

    def node(self, nid: int) -> Node:
        n = self.nodes.get(nid)
        if n is None or n.dead:
            raise OSError(errno.ESTALE if n is None else errno.ENOENT, "unknown or removed inode")
        return n

    @staticmethod
    def _kind(mode: int) -> str:
        if stat.S_ISDIR(mode):
            return "d"
        if stat.S_ISLNK(mode):
            return "l"
        if stat.S_ISREG(mode):
            return "f"
        return "o"

    def _node_for(self, parent: int, name: str, st: os.stat_result) -> Node:
        """The node of backing inode ``st`` seen as ``parent/name`` (created clean if new)."""
        nid = self.by_ino.get(st.st_ino)
        if nid is None:
            nid = self._next_id
            self._next_id += 1
            self.nodes[nid] = Node(nid, self._kind(st.st_mode), st.st_ino)
            self.by_ino[st.st_ino] = nid
        n = self.nodes[nid]
        n.links.add((parent, name))
        return n

    def child(self, parent: int, name: str) -> tuple[Node, os.stat_result]:
        st = os.lstat(os.path.join(self.path(parent), name))
        return self._node_for(parent, name, st), st

    def entries(self, dir_id: int) -> dict[str, int]:
        """The live entries of a directory, name -> node id."""
        p = self.path(dir_id)
        out: dict[str, int] = {}
        for name in os.listdir(p):
            with contextlib.suppress(FileNotFoundError):
                out[name] = self._node_for(dir_id, name, os.lstat(os.path.join(p, name))).id
        return out

    def _forget_backing(self, n: Node) -> None:
        """The backing inode is gone: a new file may reuse its number."""
        n.dead = True
        if self.by_ino.get(n.st_ino) == n.id and n.open_count == 0:
            del self.by_ino[n.st_ino]

    # ------------------------------------------------------------------ durability bookkeeping

    def dir_changing(self, dir_id: int) -> None:
        """Snapshot a directory's durable entries before its first change since its last fsync."""
        d = self.node(dir_id)
        if d.durable is None:
            d.durable = self.entries(dir_id)

    def durably_named(self, nid: int) -> bool:
        return any(nid in d.durable.values() for d in self.nodes.values() if d.durable is not None)

    def file_changing(self, n: Node, size_now: int) -> None:
        if n.durable_size is None:
            n.durable_size = size_now

    def save_range(self, n: Node, fd: int, off: int, end: int) -> None:
        """Keep the durable bytes of ``[off, end)`` before an unsynced change overwrites them."""
        assert n.durable_size is not None
        end = min(end, n.durable_size)
        if off < end:
            n.undo.append((off, os.pread(fd, end - off, off)))

    def make_durable(self, n: Node, off: int, end: int) -> None:
        """An O_DIRECT/O_SYNC write made ``[off, end)`` durable in a file with unsynced changes."""
        if n.durable_size is None:
            return
        kept: list[tuple[int, bytes]] = []
        for o, data in n.undo:
            e = o + len(data)
            if e <= off or o >= end:
                kept.append((o, data))
                continue
            if o < off:
                kept.append((o, data[: off - o]))
            if e > end:
                kept.append((end, data[end - o :]))
        if off > n.durable_size:
            # the gap between the durable end and this write was never synced: zeros on "disk"
            kept.append((n.durable_size, bytes(off - n.durable_size)))
        n.undo = kept
        n.durable_size = max(n.durable_size, end)

    def file_synced(self, n: Node) -> None:
        n.durable_size = None
        n.undo = []
        n.writes = []

    def dir_synced(self, n: Node) -> None:
        old = n.durable
        n.durable = None
        if not old:
            return
        for nid in set(old.values()):
            c = self.nodes.get(nid)
            if c is not None and c.grave and not self.durably_named(nid):
                self._bury(c)

    def _bury(self, c: Node) -> None:
        """Delete a graveyard node no snapshot names any more."""
        p = self.grave_dir / str(c.id)
        if c.kind == "d":
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        c.grave = False
        self._forget_backing(c)

    def _drop_name(self, parent: int, name: str, n: Node, last: bool) -> None:
        """Bookkeeping after ``parent/name`` (node ``n``) was removed (``last``: its last name)."""
        n.links.discard((parent, name))
        if last and not n.grave:
            self._forget_backing(n)

    def _remove_name(self, parent: int, name: str, n: Node, st: os.stat_result) -> None:
        """Remove ``parent/name``; keep the node in the graveyard if a snapshot still names it."""
        path = os.path.join(self.path(parent), name)
        last = n.kind == "d" or st.st_nlink <= 1
        if last and self.durably_named(n.id):
            grave = self.grave_dir / str(n.id)
            if n.kind == "d":
                if os.listdir(path):
                    raise OSError(errno.ENOTEMPTY, "directory not empty")
                os.rename(path, grave)
            else:
                os.link(path, grave, follow_symlinks=False)
                os.unlink(path)
            n.grave = True
            n.links.discard((parent, name))
            return
        if n.kind == "d":
            os.rmdir(path)
        else:
            os.unlink(path)
        self._drop_name(parent, name, n, last)

    # ------------------------------------------------------------------ namespace operations

    def create(self, parent: int, name: str, mode: int, flags: int) -> tuple[Handle, Node]:
        self.dir_changing(parent)
        path = os.path.join(self.path(parent), name)
        existed = os.path.lexists(path)
        fd = os.open(path, self._backing_flags(flags) | os.O_CREAT, mode & 0o7777)
        try:
            n = self._node_for(parent, name, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        if not existed:
            n.durable_size = 0  # a new file: nothing of it is durable yet
            n.undo = []
        h = self._handle(n, fd, flags)
        if existed and flags & os.O_TRUNC:
            self.truncate(n, fd, 0, sync=h.sync)
        return h, n

    def mknod(self, parent: int, name: str, mode: int, rdev: int) -> Node:
        self.dir_changing(parent)
        path = os.path.join(self.path(parent), name)
        os.mknod(path, mode, rdev)
        n = self._node_for(parent, name, os.lstat(path))
        if n.kind == "f":
            n.durable_size = 0
        return n

    def mkdir(self, parent: int, name: str, mode: int) -> Node:
        self.dir_changing(parent)
        path = os.path.join(self.path(parent), name)
        os.mkdir(path, mode & 0o7777)
        n = self._node_for(parent, name, os.lstat(path))
        n.durable = {}  # a new directory: none of its entries are durable yet
        return n

    def symlink(self, parent: int, name: str, target: str) -> Node:
        self.dir_changing(parent)
        path = os.path.join(self.path(parent), name)
        os.symlink(target, path)
        return self._node_for(parent, name, os.lstat(path))

    def link(self, nid: int, parent: int, name: str) -> Node:
        n = self.node(nid)
        self.dir_changing(parent)
        path = os.path.join(self.path(parent), name)
        os.link(self.path(nid), path, follow_symlinks=False)
        n.links.add((parent, name))
        return n

    def unlink(self, parent: int, name: str) -> None:
        n, st = self.child(parent, name)
        if n.kind == "d":
            raise OSError(errno.EISDIR, "is a directory")
        self.dir_changing(parent)
        self._remove_name(parent, name, n, st)

    def rmdir(self, parent: int, name: str) -> None:
        n, _st = self.child(parent, name)
        if n.kind != "d":
            raise OSError(errno.ENOTDIR, "not a directory")
        if os.listdir(self.path(n.id)):
            raise OSError(errno.ENOTEMPTY, "directory not empty")
        self.dir_changing(parent)
        self._remove_name(parent, name, n, _st)

    def rename(self, p_old: int, old: str, p_new: int, new: str, flags: int) -> None:
        noreplace = getattr(os, "RENAME_NOREPLACE", 1)
        if flags & ~noreplace:
            raise OSError(errno.EINVAL, "only RENAME_NOREPLACE is supported")
        src, _ = self.child(p_old, old)
        src_path = os.path.join(self.path(p_old), old)
        dst_path = os.path.join(self.path(p_new), new)
        try:
            tgt: tuple[Node, os.stat_result] | None = self.child(p_new, new)
        except FileNotFoundError:
            tgt = None
        if tgt is not None:
            t, tst = tgt
            if flags & noreplace:
                raise OSError(errno.EEXIST, "target exists")
            if t.id == src.id:
                return  # two names of one inode: POSIX says do nothing
            if src.kind == "d" and t.kind != "d":
                raise OSError(errno.ENOTDIR, "target is not a directory")
            if src.kind != "d" and t.kind == "d":
                raise OSError(errno.EISDIR, "target is a directory")
            if t.kind == "d" and os.listdir(dst_path):
                raise OSError(errno.ENOTEMPTY, "target directory not empty")
        if src.kind == "d":
            a, b = os.path.realpath(src_path), os.path.realpath(dst_path)
            if b.startswith(a + os.sep):
                raise OSError(errno.EINVAL, "cannot move a directory into itself")
        self.dir_changing(p_old)
        self.dir_changing(p_new)
        if tgt is not None:
            t, tst = tgt
            # the replaced node loses a name: keep it if a snapshot still names it
            self._remove_name(p_new, new, t, tst)
        os.rename(src_path, dst_path)
        src.links.discard((p_old, old))
        src.links.add((p_new, new))

    # ------------------------------------------------------------------ file data

    def _backing_flags(self, flags: int) -> int:
        """Open the backing file read-write (the undo log must read what a write replaces)."""
        f = flags & ~(_SYNC_FLAGS | os.O_ACCMODE | os.O_CREAT | os.O_EXCL | os.O_TRUNC)
        return f | os.O_RDWR | (flags & (os.O_CREAT | os.O_EXCL))

    def _handle(self, n: Node, fd: int, flags: int) -> Handle:
        fh = self._next_fh
        self._next_fh += 1
        h = Handle(n.id, fd, bool(flags & _SYNC_FLAGS), bool(flags & os.O_APPEND), fh)
        self.handles[fh] = h
        n.open_count += 1
        return h

    def open(self, nid: int, flags: int) -> Handle:
        n = self.node(nid)
        path = self.path(nid)
        try:
            fd = os.open(path, self._backing_flags(flags))
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EISDIR, errno.ETXTBSY, errno.EROFS):
                raise
            fd = os.open(path, flags & ~(_SYNC_FLAGS | os.O_CREAT | os.O_EXCL | os.O_TRUNC))
        h = self._handle(n, fd, flags)
        if flags & os.O_TRUNC:
            self.truncate(n, fd, 0, sync=h.sync)
        return h

    def fh(self, fh: int) -> Handle:
        h = self.handles.get(fh)
        if h is None:
            raise OSError(errno.EBADF, "unknown file handle")
        return h

    def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(self.fh(fh).fd, size, off)

    def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self.fh(fh)
        n = self.node(h.node)
        size_now = os.fstat(h.fd).st_size
        if h.append:
            off = size_now
        end = off + len(buf)
        if h.sync and n.durable_size is None:
            return os.pwrite(h.fd, buf, off)
        self.file_changing(n, size_now)
        self.save_range(n, h.fd, off, end)
        written = os.pwrite(h.fd, buf, off)
        if h.sync:
            self.make_durable(n, off, off + written)
        else:
            n.writes = (n.writes + [(off, written)])[-_MAX_WRITES_KEPT:]
        return written

    def truncate(self, n: Node, fd: int, length: int, *, sync: bool = False) -> None:
        size_now = os.fstat(fd).st_size
        if not sync or n.durable_size is not None:
            self.file_changing(n, size_now)
            self.save_range(n, fd, length, size_now)
        os.ftruncate(fd, length)
        if sync and n.durable_size is not None:
            n.durable_size = length
            n.undo = [(o, d[: max(0, length - o)]) for o, d in n.undo if o < length]

    def truncate_path(self, nid: int, length: int) -> None:
        n = self.node(nid)
        fd = os.open(self.path(nid), os.O_RDWR)
        try:
            self.truncate(n, fd, length)
        finally:
            os.close(fd)

    def fsync(self, fh: int) -> None:
        h = self.fh(fh)
        self.file_synced(self.node(h.node))

    def release(self, fh: int) -> None:
        h = self.handles.pop(fh, None)
        if h is None:
            return
        os.close(h.fd)
        n = self.nodes.get(h.node)
        if n is not None:
            n.open_count -= 1
            if n.dead and n.open_count == 0 and self.by_ino.get(n.st_ino) == n.id:
                del self.by_ino[n.st_ino]

    # ------------------------------------------------------------------ the power cut

    def crash(self, *, tear: int | None = None) -> dict[str, Any]:
        """Lose everything not durable (see the module docstring); returns what was lost.

        ``tear``: a seed; one unsynced write (if any spans a page boundary) is
        torn: its first page(s), up to a page boundary, survive.
        """
        for h in list(self.handles.values()):
            with contextlib.suppress(OSError):
                os.close(h.fd)
        self.handles.clear()
        report: dict[str, Any] = {"files_rolled_back": 0, "dirs_reverted": 0, "torn": None}
        torn = self._pick_tear(tear) if tear is not None else None
        # 1. file data: undo, newest first, then cut to the durable length
        for n in self.nodes.values():
            if n.kind != "f" or n.durable_size is None or n.dead:
                continue
            try:
                path = self.path(n.id)
            except OSError:
                continue
            fd = os.open(path, os.O_RDWR)
            try:
                for off, data in reversed(n.undo):
                    os.pwrite(fd, data, off)
                os.ftruncate(fd, n.durable_size)
                if torn is not None and torn[0] == n.id:
                    os.pwrite(fd, torn[2], torn[1])
                    report["torn"] = {"path": path, "offset": torn[1], "length": len(torn[2])}
            finally:
                os.close(fd)
            report["files_rolled_back"] += 1
        report["dirs_reverted"] = sum(
            1 for n in self.nodes.values() if n.kind == "d" and n.durable is not None
        )
        # 2. directory entries: build the durable tree beside the old one, then swap
        self.crashes += 1
        staging = self.state / f"rebuild-{self.crashes}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        placed: dict[int, str] = {}
        self._materialize_dir(ROOT_ID, str(staging), placed, set())
        for name in os.listdir(self.backing):
            p = self.backing / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        for name in os.listdir(staging):
            os.rename(staging / name, self.backing / name)
        staging.rmdir()
        shutil.rmtree(self.grave_dir, ignore_errors=True)
        self.grave_dir.mkdir()
        self._reset()
        # numbers stay unique across cuts: the kernel may still hold inodes of the old tree
        self._next_id = max(self._next_id, self._id_floor)
        return report

    @property
    def _id_floor(self) -> int:
        return (self.crashes + 1) << 40

    def _entries_durable(self, dir_id: int) -> dict[str, int]:
        d = self.nodes[dir_id]
        if d.durable is not None:
            return d.durable
        try:
            return self.entries(dir_id)
        except OSError:
            return {}

    def _materialize_dir(
        self, dir_id: int, dst: str, placed: dict[int, str], seen: set[int]
    ) -> None:
        seen.add(dir_id)
        for name, nid in sorted(self._entries_durable(dir_id).items()):
            n = self.nodes.get(nid)
            if n is None or n.dead:
                continue
            target = os.path.join(dst, name)
            if n.kind == "d":
                if nid in seen:
                    continue  # a directory durably named twice: it exists once
                os.mkdir(target)
                with contextlib.suppress(OSError):
                    st = os.stat(self.path(nid))
                    os.chmod(target, stat.S_IMODE(st.st_mode))
                self._materialize_dir(nid, target, placed, seen)
            else:
                src = placed.get(nid)
                if src is None:
                    try:
                        src = self.path(nid)
                    except OSError:
                        continue
                os.link(src, target, follow_symlinks=False)
                placed.setdefault(nid, target)

    def _pick_tear(self, seed: int) -> tuple[int, int, bytes] | None:
        """(node, offset, bytes that survive) of one unsynced write crossing a page boundary."""
        cands: list[tuple[int, int, int]] = []
        for n in self.nodes.values():
            if n.kind == "f" and n.durable_size is not None and not n.dead:
                cands += [
                    (n.id, o, ln) for o, ln in n.writes if (o // PAGE) != ((o + ln - 1) // PAGE)
                ]
        if not cands:
            return None
        rng = random.Random(seed)
        nid, off, ln = rng.choice(sorted(cands))
        bounds = list(range((off // PAGE + 1) * PAGE, off + ln, PAGE))
        cut = rng.choice(bounds)
        fd = os.open(self.path(nid), os.O_RDONLY)
        try:
            data = os.pread(fd, cut - off, off)
        finally:
            os.close(fd)
        return nid, off, data

    def unsynced(self) -> dict[str, Any]:
        """What a cut would lose now (for tests and narration)."""
        files = [n.id for n in self.nodes.values() if n.kind == "f" and n.durable_size is not None]
        dirs = [n.id for n in self.nodes.values() if n.kind == "d" and n.durable is not None]
        return {"files": len(files), "dirs": len(dirs)}


# ====================================================================== FUSE side


def _ops_class() -> type:
    """The pyfuse3 Operations subclass (built lazily: importing this module needs no pyfuse3)."""
    import pyfuse3

    def errs(fn: Any) -> Any:
        import functools

        @functools.wraps(fn)
        async def wrapper(*a: Any, **kw: Any) -> Any:
            try:
                return fn(*a, **kw)
            except pyfuse3.FUSEError:
                raise
            except OSError as e:
                raise pyfuse3.FUSEError(e.errno or errno.EIO) from None

        return wrapper

    class LossyOps(pyfuse3.Operations):  # type: ignore[misc]
        enable_writeback_cache = False

        def __init__(self, fs: LossyFs) -> None:
            super().__init__()
            self.fs = fs
            self.dirs: dict[int, list[tuple[str, int]]] = {}
            self._next_dh = 1

        def _attr(self, n: Node, st: os.stat_result | None = None) -> Any:
            if st is None:
                st = os.lstat(self.fs.path(n.id))
            e = pyfuse3.EntryAttributes()
            for a in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size"):
                setattr(e, a, getattr(st, a))
            e.st_blksize = st.st_blksize
            e.st_blocks = st.st_blocks
            e.st_atime_ns, e.st_mtime_ns, e.st_ctime_ns = (
                st.st_atime_ns,
                st.st_mtime_ns,
                st.st_ctime_ns,
            )
            e.st_ino = n.id
            e.generation = 0
            # no caching: after a cut the kernel must ask again (names and sizes changed under it)
            e.entry_timeout = 0
            e.attr_timeout = 0
            return e

        @errs
        def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
            nm = os.fsdecode(name)
            if nm == ".":
                return self._attr(self.fs.node(parent_inode))
            if nm == "..":
                raise pyfuse3.FUSEError(errno.ENOENT)
            n, st = self.fs.child(parent_inode, nm)
            return self._attr(n, st)

        async def forget(self, inode_list: Any) -> None:
            return None

        @errs
        def getattr(self, inode: int, ctx: Any = None) -> Any:
            return self._attr(self.fs.node(inode))

        @errs
        def setattr(self, inode: int, attr: Any, fields: Any, fh: Any, ctx: Any) -> Any:
            n = self.fs.node(inode)
            path = self.fs.path(inode)
            if fields.update_size:
                if fh is not None and fh in self.fs.handles:
                    h = self.fs.fh(fh)
                    self.fs.truncate(n, h.fd, attr.st_size, sync=h.sync)
                else:
                    self.fs.truncate_path(inode, attr.st_size)
            if fields.update_mode:
                os.chmod(path, stat.S_IMODE(attr.st_mode))
            if fields.update_uid or fields.update_gid:
                os.chown(
                    path,
                    attr.st_uid if fields.update_uid else -1,
                    attr.st_gid if fields.update_gid else -1,
                    follow_symlinks=False,
                )
            if fields.update_atime or fields.update_mtime:
                st = os.lstat(path)
                at = attr.st_atime_ns if fields.update_atime else st.st_atime_ns
                mt = attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns
                os.utime(path, ns=(at, mt), follow_symlinks=False)
            return self._attr(n)

        @errs
        def readlink(self, inode: int, ctx: Any = None) -> bytes:
            return os.fsencode(os.readlink(self.fs.path(inode)))

        @errs
        def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> Any:
            return self._attr(self.fs.mknod(parent_inode, os.fsdecode(name), mode, rdev))

        @errs
        def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> Any:
            return self._attr(self.fs.mkdir(parent_inode, os.fsdecode(name), mode))

        @errs
        def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
            return self._attr(self.fs.symlink(parent_inode, os.fsdecode(name), os.fsdecode(target)))

        @errs
        def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
            return self._attr(self.fs.link(inode, new_parent_inode, os.fsdecode(new_name)))

        @errs
        def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
            self.fs.unlink(parent_inode, os.fsdecode(name))

        @errs
        def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
            self.fs.rmdir(parent_inode, os.fsdecode(name))

        @errs
        def rename(
            self, p_old: int, name_old: bytes, p_new: int, name_new: bytes, flags: int, ctx: Any
        ) -> None:
            self.fs.rename(p_old, os.fsdecode(name_old), p_new, os.fsdecode(name_new), flags)

        @errs
        def open(self, inode: int, flags: int, ctx: Any) -> Any:
            h = self.fs.open(inode, flags)
            return pyfuse3.FileInfo(fh=h.fh, keep_cache=False, direct_io=False)

        @errs
        def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> Any:
            h, n = self.fs.create(parent_inode, os.fsdecode(name), mode, flags)
            fi = pyfuse3.FileInfo(fh=h.fh, keep_cache=False, direct_io=False)
            return fi, self._attr(n)

        @errs
        def read(self, fh: int, off: int, size: int) -> bytes:
            return self.fs.read(fh, off, size)

        @errs
        def write(self, fh: int, off: int, buf: bytes) -> int:
            return self.fs.write(fh, off, buf)

        @errs
        def flush(self, fh: int) -> None:
            return None

        @errs
        def release(self, fh: int) -> None:
            self.fs.release(fh)

        @errs
        def fsync(self, fh: int, datasync: bool) -> None:
            self.fs.fsync(fh)

        @errs
        def opendir(self, inode: int, ctx: Any) -> int:
            dh = self._next_dh
            self._next_dh += 1
            self.dirs[dh] = [(nm, nid) for nm, nid in sorted(self.fs.entries(inode).items())]
            self.dirs[dh].insert(0, ("", inode))  # slot 0: the directory itself (for fsyncdir)
            return dh

        @errs
        def readdir(self, fh: int, start_id: int, token: Any) -> None:
            listing = self.dirs.get(fh)
            if listing is None:
                raise pyfuse3.FUSEError(errno.EBADF)
            for i in range(max(start_id, 1), len(listing)):
                nm, nid = listing[i]
                try:
                    attr = self._attr(self.fs.node(nid))
                except OSError:
                    continue
                if not pyfuse3.readdir_reply(token, os.fsencode(nm), attr, i + 1):
                    break

        @errs
        def releasedir(self, fh: int) -> None:
            self.dirs.pop(fh, None)

        @errs
        def fsyncdir(self, fh: int, datasync: bool) -> None:
            listing = self.dirs.get(fh)
            if listing is None:
                raise pyfuse3.FUSEError(errno.EBADF)
            self.fs.dir_synced(self.fs.node(listing[0][1]))

        @errs
        def statfs(self, ctx: Any) -> Any:
            s = os.statvfs(self.fs.backing)
            out = pyfuse3.StatvfsData()
            for a in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail"):
                setattr(out, a, getattr(s, a))
            for a in ("f_files", "f_ffree", "f_favail", "f_namemax"):
                setattr(out, a, getattr(s, a))
            return out

        async def access(self, inode: int, mode: int, ctx: Any) -> bool:
            return True

    return LossyOps


async def _serve(fs: LossyFs, mountpoint: str, control: str, ready_fd: int | None) -> None:
    import pyfuse3

    ops = _ops_class()(fs)
    opts = set(pyfuse3.default_options)
    opts |= {"fsname=fs3-lossy", "allow_other"}
    pyfuse3.init(ops, mountpoint, opts)
    loop = asyncio.get_running_loop()

    def do_crash(tear: int | None) -> dict[str, Any]:
        t = time.monotonic()
        rep = fs.crash(tear=tear)
        rep["took_s"] = round(time.monotonic() - t, 3)
        print(f"fs3-lossy: power cut #{fs.crashes}: {json.dumps(rep)}", file=sys.stderr, flush=True)
        return rep

    async def on_client(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            line = (await r.readline()).decode().split()
            if line and line[0] == "crash":
                tear = int(line[1]) if len(line) > 1 and line[1] != "-" else None
                reply: dict[str, Any] = {"ok": True, **do_crash(tear)}
            elif line and line[0] == "unsynced":
                reply = {"ok": True, **fs.unsynced()}
            elif line and line[0] == "ping":
                reply = {"ok": True, "crashes": fs.crashes}
            else:
                reply = {"ok": False, "error": f"unknown command {line!r}"}
        except Exception as e:  # the daemon keeps serving; the caller sees the failure
            reply = {"ok": False, "error": repr(e)}
        w.write((json.dumps(reply) + "\n").encode())
        with contextlib.suppress(OSError):
            await w.drain()
            w.close()

    server = await asyncio.start_unix_server(on_client, path=control)
    loop.add_signal_handler(signal.SIGUSR1, lambda: do_crash(None))
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    main = asyncio.ensure_future(pyfuse3.main())
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({main, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        server.close()
        if not main.done():
            pyfuse3.terminate()
            with contextlib.suppress(Exception):
                await main
        waiter.cancel()
        pyfuse3.close(unmount=True)


def serve(backing: str, mountpoint: str, state: str, control: str, ready_fd: int | None) -> int:
    """Run the daemon in this process until SIGTERM or unmount."""
    import pyfuse3.asyncio

    pyfuse3.asyncio.enable()
    fs = LossyFs(backing, state)
    asyncio.run(_serve(fs, mountpoint, control, ready_fd))
    return 0


def send(control: str, command: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """One command to a running daemon's control socket; returns its JSON reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(control)
        s.sendall((command + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    reply: dict[str, Any] = json.loads(buf or b"{}")
    if not reply.get("ok"):
        raise RuntimeError(f"lossy fs at {control}: {command!r} failed: {reply.get('error')}")
    return reply


def skip_reason() -> str | None:
    """Why a lossy mount cannot be made here (tests skip with it), or None."""
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        return "needs /dev/fuse and fusermount3"
    if os.geteuid() != 0:
        return "needs root (allow_other, and the fs3 processes on it run as root)"
    return None


def _is_mounted(path: str) -> bool:
    p = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == p for line in f)


class LossyMount:
    """A lossy file system mounted at ``mountpoint`` over ``backing``, served by a child process.

    ``state``: where the graveyard and the rebuild staging live; it must be on
    the same file system as ``backing`` (default: ``<backing>.lossy``).
    """

    def __init__(
        self,
        backing: str | os.PathLike[str],
        mountpoint: str | os.PathLike[str],
        *,
        state: str | os.PathLike[str] | None = None,
        log: str | os.PathLike[str] | None = None,
    ) -> None:
        self.backing = Path(backing).absolute()
        self.mountpoint = Path(mountpoint).absolute()
        self.state = Path(state) if state else Path(str(self.backing) + ".lossy")
        self.control = str(self.state / "control.sock")
        self.log = Path(log) if log else Path(str(self.backing) + ".lossy.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.cuts = 0

    def mount(self, timeout_s: float = 30.0) -> LossyMount:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.control)
        r, w = os.pipe()
        cmd = [sys.executable, "-m", "fs3.testing.lossyfs", "serve", str(self.backing)]
        cmd += [str(self.mountpoint), "--state", str(self.state), "--control", self.control]
        cmd += ["--ready-fd", str(w)]
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                cmd, stdout=logf, stderr=subprocess.STDOUT, pass_fds=(w,), start_new_session=True
            )
        os.close(w)
        deadline = time.monotonic() + timeout_s
        try:
            with os.fdopen(r, "rb") as rf:
                ready = rf.readline()  # EOF if the daemon died
            if not ready.startswith(b"ready"):
                raise RuntimeError(f"lossy fs daemon did not start:\n{self._log_tail()}")
            while not _is_mounted(str(self.mountpoint)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"lossy fs not mounted in {timeout_s}s:\n{self._log_tail()}")
                time.sleep(0.01)
        except BaseException:
            self.unmount()
            raise
        return self

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return ""

    def crash(self, *, tear: int | None = None) -> dict[str, Any]:
        """Power cut: lose every unsynced write and directory entry; returns what was lost."""
        rep = send(self.control, f"crash {'-' if tear is None else tear}")
        self.cuts += 1
        return rep

    def unsynced(self) -> dict[str, Any]:
        return send(self.control, "unsynced")

    def unmount(self, timeout_s: float = 30.0) -> None:
        """Unmount (lazily if busy) and stop the daemon; idempotent."""
        if self.proc is None:
            return
        if _is_mounted(str(self.mountpoint)):
            r = subprocess.run(
                ["fusermount3", "-u", str(self.mountpoint)], capture_output=True, timeout=30
            )
            if r.returncode != 0:
                subprocess.run(
                    ["fusermount3", "-u", "-z", str(self.mountpoint)],
                    capture_output=True,
                    timeout=30,
                )
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> LossyMount:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.unmount()


@contextlib.contextmanager
def lossy_dir(prefix: str = "fs3-lossy-") -> Iterator[LossyMount]:
    """A fresh lossy mount over a fresh temporary backing directory; removed on exit."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    m = LossyMount(root / "backing", root / "mnt")
    try:
        yield m.mount()
    finally:
        m.unmount()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fs3.testing.lossyfs", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="mount BACKING at MOUNTPOINT and serve until unmounted")
    s.add_argument("backing")
    s.add_argument("mountpoint")
    s.add_argument("--state", required=True)
    s.add_argument("--control", required=True, help="unix socket for crash/unsynced/ping")
    s.add_argument("--ready-fd", type=int, default=None)
    c = sub.add_parser("crash", help="power cut of a running lossy mount (by its control socket)")
    c.add_argument("control")
    c.add_argument("--tear", type=int, default=None, help="seed: tear one unsynced write")
    a = ap.parse_args(argv)
    if a.cmd == "serve":
        return serve(a.backing, a.mountpoint, a.state, a.control, a.ready_fd)
    print(json.dumps(send(a.control, f"crash {'-' if a.tear is None else a.tear}")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
