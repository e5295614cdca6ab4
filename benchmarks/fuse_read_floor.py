#!/usr/bin/env python3
"""The read floor of a pyfuse3 daemon here: a file system whose read handler does nothing.

Why: fs3's FUSE read cost only means something against what pyfuse3 and the
kernel cost by themselves on this machine. This mounts a read-only file system
with one file ``f`` of ``--size`` bytes (zeros, answered from one buffer, no
copy) in pyfuse3's asyncio mode on uvloop, with the worker limits fs3's daemon
uses, sets the mount's ``read_ahead_kb`` and ``max_background`` as fs3 does,
and runs the suite's two fio reads on it with the daemon's CPU per read/GiB:

* 4 KiB random reads, 4 jobs, O_DIRECT, ``--seconds``;
* a sequential read in 1 MiB blocks, page cache dropped first, for each
  ``--readahead`` value.

Usage (root): python benchmarks/fuse_read_floor.py [--rounds 2] [--readahead 128,1024,16384]
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZE = 256 << 20
ZERO = bytes(1 << 20)


def serve(mountpoint: str) -> None:
    import pyfuse3
    import pyfuse3.asyncio
    import uvloop

    pyfuse3.asyncio.enable()

    class ReadFloor(pyfuse3.Operations):  # type: ignore[misc]
        def _attr(self, ino: int, mode: int, size: int = 0) -> Any:
            a = pyfuse3.EntryAttributes()
            a.st_ino, a.st_mode, a.st_nlink, a.st_size = ino, mode, 1, size
            a.st_blksize, a.st_blocks = 4096, size // 512
            a.attr_timeout = a.entry_timeout = 1
            return a

        async def getattr(self, ino: int, ctx: Any = None) -> Any:
            if ino == pyfuse3.ROOT_INODE:
                return self._attr(ino, stat.S_IFDIR | 0o755)
            return self._attr(ino, stat.S_IFREG | 0o444, SIZE)

        async def lookup(self, parent: int, name: bytes, ctx: Any = None) -> Any:
            if name != b"f":
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attr(5, stat.S_IFREG | 0o444, SIZE)

        async def open(self, ino: int, flags: int, ctx: Any) -> Any:
            return pyfuse3.FileInfo(fh=ino)

        async def read(self, fh: int, off: int, size: int) -> Any:
            return memoryview(ZERO)[: max(0, min(size, SIZE - off))]

    pyfuse3.init(ReadFloor(), mountpoint, {"fsname=readfloor", "default_permissions"})

    async def main() -> None:
        try:
            await pyfuse3.main(min_tasks=4, max_tasks=256)
        finally:
            pyfuse3.close(unmount=True)

    uvloop.run(main())


def cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fio(d: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [
            "fio",
            "--name=floor",
            f"--directory={d}",
            "--filename=f",
            "--ioengine=psync",
            "--output-format=json",
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    return json.loads(out[out.index("{") :])["jobs"][0]["read"]  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--readahead", default="128,1024,16384")
    a = ap.parse_args()
    mnt = tempfile.mkdtemp(prefix="fs3-read-floor-")
    p = subprocess.Popen([sys.executable, __file__, "--serve", mnt])
    try:
        for _ in range(100):
            if os.path.exists(os.path.join(mnt, "f")):
                break
            time.sleep(0.1)
        dev = os.stat(mnt).st_dev
        bdi = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        Path(f"/sys/fs/fuse/connections/{dev}/max_background").write_text("64")
        for r in range(a.rounds):
            c0 = cpu(p.pid)
            j = fio(
                mnt,
                "--rw=randread",
                "--bs=4k",
                f"--size={SIZE}",
                "--numjobs=4",
                "--time_based",
                f"--runtime={a.seconds:g}",
                "--group_reporting",
                "--direct=1",
            )
            used = cpu(p.pid) - c0
            print(
                f"round {r + 1}: 4 KiB random read {j['iops']:.0f} IOPS, daemon "
                f"{used / j['total_ios'] * 1e6:.0f} us CPU per read; load {os.getloadavg()[0]:.1f}"
            )
            for ra in a.readahead.split(","):
                bdi.write_text(ra)
                subprocess.run(["sync"], check=False)
                Path("/proc/sys/vm/drop_caches").write_text("3\n")
                c0 = cpu(p.pid)
                j = fio(mnt, "--rw=read", "--bs=1M", f"--size={SIZE}")
                used = cpu(p.pid) - c0
                print(
                    f"round {r + 1}: read_ahead_kb {ra}: seq read {j['bw_bytes'] / 2**20:.0f} MiB/s, "
                    f"daemon {used / (j['io_bytes'] / 2**30):.2f} CPU s/GiB"
                )
    finally:
        subprocess.run(["fusermount3", "-u", mnt], check=False)
        p.wait(timeout=30)
        os.rmdir(mnt)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        raise SystemExit(main())
