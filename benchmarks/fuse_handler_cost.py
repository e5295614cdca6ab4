#!/usr/bin/env python
"""CPU time of the FUSE daemon's own handler layer per request (no kernel, no RPC).

    python benchmarks/fuse_handler_cost.py [--calls 20000]

Runs :class:`fs3.fuse.ops.Fs3Operations` handlers in-process against a client
core stand-in that answers at once, and prints the process CPU time
(``time.process_time``: unaffected by other work on the machine) per call:
what the handler layer (caller cache, error guard, attribute conversion) adds
to each request on top of pyfuse3's request cycle and the meta RPC.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyfuse3  # noqa: E402

from fs3 import config  # noqa: E402
from fs3.fuse.ops import Fs3Operations  # noqa: E402
from fs3.proto import meta_pb2  # noqa: E402


@dataclass
class _Ctx:
    uid: int
    gid: int
    pid: int


def _attr(ino: int) -> meta_pb2.Attr:
    a = meta_pb2.Attr(inode=ino, mode=stat.S_IFREG | 0o644, nlink=1, size=10, uid=0, gid=0)
    a.mtime.sec = a.ctime.sec = a.atime.sec = 1_700_000_000
    return a


class _Client:
    """Answers every call at once with fixed attributes (a directory of 1,024 files)."""

    def __init__(self) -> None:
        self.dir_attrs: dict[int, Any] = {}
        self.attr = _attr(5)
        self.page = []
        for i in range(1024):
            e = meta_pb2.DirEntry(name=b"file-%05d" % i, inode=100 + i, type=1)
            e.attr.CopyFrom(_attr(100 + i))
            self.page.append(e)

    async def lookup(self, caller: Any, parent: int, name: bytes) -> meta_pb2.Attr:
        return self.attr

    async def getattr(self, caller: Any, inode: int) -> meta_pb2.Attr:
        d = meta_pb2.Attr()
        d.CopyFrom(self.attr)
        d.mode = stat.S_IFDIR | 0o755
        return d

    async def access(self, caller: Any, inode: int, mode: int) -> None:
        return None

    async def readdir(
        self, caller: Any, inode: int, cursor: bytes, limit: int, *, with_attrs: bool
    ) -> tuple[list[meta_pb2.DirEntry], bool]:
        return (self.page, False) if not cursor else ([], False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    a = p.parse_args(argv)
    ops = Fs3Operations(_Client(), config.FuseSection())  # type: ignore[arg-type]
    ctx = _Ctx(0, 0, os.getpid())
    n = a.calls
    taken = [0]

    def reply(token: Any, name: bytes, attr: Any, off: int) -> bool:
        taken[0] += 1
        return True

    pyfuse3.readdir_reply = reply  # the kernel's buffer: takes everything

    async def run() -> None:
        def t(label: str, per: int, total: float) -> None:
            print(f"{label:34s} {1e6 * total / per:7.2f} us CPU per call")

        c = time.process_time()
        for _ in range(n):
            await ops.lookup(1, b"f1", ctx)  # type: ignore[arg-type]
        t("lookup", n, time.process_time() - c)
        c = time.process_time()
        for _ in range(n):
            await ops.getattr(5, ctx)  # type: ignore[arg-type]
        t("getattr", n, time.process_time() - c)
        attr = _attr(7)
        c = time.process_time()
        for _ in range(n):
            ops._entry(attr)
        t("attributes -> EntryAttributes", n, time.process_time() - c)
        rounds = max(1, n // 1024)
        c = time.process_time()
        for _ in range(rounds):
            fh = await ops.opendir(5, ctx)  # type: ignore[arg-type]
            await ops.readdir(fh, 0, None)  # type: ignore[arg-type]
            await ops.releasedir(fh)
        t("readdir, per entry (1,024 a page)", rounds * 1026, time.process_time() - c)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
