"""USRBIO end to end without FUSE: the real agent (on trio and on asyncio) with a
local-file backend, driven through the public API from this process.

The "mount point" is a temporary directory; files are opened there and their
inode numbers are what the agent hands to the backend, exactly as a FUSE mount
hands fs3 inode numbers.
"""

from __future__ import annotations

import errno
import glob
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from anyio.from_thread import start_blocking_portal

from fs3.errors import Code, FsError
from fs3.transport.region import ShmRegion, buffer_address
from fs3.usrbio import (
    Ior,
    Iov,
    agent_socket_path,
    dereg_fd,
    prep_io,
    reg_fd,
    submit_ios,
    wait_for_ios,
)
from fs3.usrbio.agent import STREAM_MIN_READ, UsrbioAgent


class LocalFileBackend:
    """Backend doing pread/pwrite on files of a directory, addressed by inode."""

    def __init__(self, root: str, delay_s: float = 0.0) -> None:
        self.root = root
        self.delay_s = delay_s
        self.attached: list[ShmRegion] = []
        self.detached: list[str] = []
        self.views_in_region = 0
        self.refuse: set[int] = set()

    def _fd(self, inode: int, flags: int) -> int:
        for entry in os.scandir(self.root):
            if entry.inode() == inode:
                return os.open(entry.path, flags)
        raise FsError(Code.POSIX, f"inode {inode} not found", errno=errno.ENOENT)

    def _check_zero_copy(self, view: memoryview) -> None:
        addr, n = buffer_address(view)
        if any(r.contains(addr, n) for r in self.attached if not r.closed):
            self.views_in_region += 1

    async def authorize(self, inode: int, *, uid: int, gid: int, pid: int, write: bool) -> None:
        if inode in self.refuse:
            raise FsError(Code.POSIX, "no", errno=errno.EACCES)

    async def attach_region(self, region: ShmRegion) -> None:
        self.attached.append(region)

    async def detach_region(self, region: ShmRegion) -> None:
        self.detached.append(region.id)

    async def read(self, inode: int, file_offset: int, dest: memoryview) -> int:
        self._check_zero_copy(dest)
        if self.delay_s:
            await anyio.sleep(self.delay_s)
        fd = self._fd(inode, os.O_RDONLY)
        try:
            return os.preadv(fd, [dest], file_offset)
        finally:
            os.close(fd)

    async def write(self, inode: int, file_offset: int, src: memoryview) -> int:
        self._check_zero_copy(src)
        if self.delay_s:
            await anyio.sleep(self.delay_s)
        fd = self._fd(inode, os.O_WRONLY)
        try:
            return os.pwrite(fd, src, file_offset)
        finally:
            os.close(fd)


class BatchedBackend(LocalFileBackend):
    """The same backend with ``read_batch`` (as the FUSE mount's): a ring batch's reads in one call."""

    def __init__(self, root: str, delay_s: float = 0.0) -> None:
        super().__init__(root, delay_s)
        self.batches: list[int] = []

    async def read_batch(self, ios: list[tuple[int, int, memoryview]]) -> list[int | BaseException]:
        self.batches.append(len(ios))
        out: list[int | BaseException] = []
        for inode, off, dest in ios:
            try:
                out.append(await self.read(inode, off, dest))
            except Exception as e:  # noqa: BLE001 - per-io outcome, as the protocol says
                out.append(e)
        return out


class StreamingBackend(BatchedBackend):
    """``read_batch(ios, on_done)`` (as the FUSE mount's): reads reported as they finish.

    Reads at ``hold_offset`` wait until ``release`` is set (from the test's thread),
    so a test can see the other reads of the batch complete first.
    """

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.hold_offset = -1
        self.release = False

    async def read_batch(
        self,
        ios: list[tuple[int, int, memoryview]],
        on_done: Callable[[list[tuple[int, int | BaseException]]], None] | None = None,
    ) -> list[int | BaseException]:
        self.batches.append(len(ios))
        out: list[int | BaseException] = [0] * len(ios)

        async def one(k: int, inode: int, off: int, dest: memoryview) -> None:
            while off == self.hold_offset and not self.release:  # noqa: ASYNC110 - set by another thread
                await anyio.sleep(0.01)
            try:
                out[k] = await self.read(inode, off, dest)
            except Exception as e:  # noqa: BLE001 - per-io outcome, as the protocol says
                out[k] = e
            if on_done is not None:
                on_done([(k, out[k])])

        async with anyio.create_task_group() as tg:
            for k, (inode, off, dest) in enumerate(ios):
                tg.start_soon(one, k, inode, off, dest)
        return out


class AgentEnv:
    def __init__(self, mount: str, backend: LocalFileBackend, agent: UsrbioAgent) -> None:
        self.mount = mount
        self.backend = backend
        self.agent = agent


def _my_shm_files() -> set[str]:
    return set(glob.glob(f"/dev/shm/fs3-io[rv]-{os.getpid()}-*"))


@pytest.fixture(params=["trio", "asyncio", "trio-batched", "asyncio-streamed"])
def env(request: pytest.FixtureRequest) -> Iterator[AgentEnv]:
    before = _my_shm_files()
    runtime, _, batched = str(request.param).partition("-")
    with tempfile.TemporaryDirectory(prefix="fs3-usrbio-") as mount:
        backend = (
            StreamingBackend(mount)
            if batched == "streamed"
            else BatchedBackend(mount)
            if batched
            else LocalFileBackend(mount)
        )
        agent = UsrbioAgent(backend)
        sock = agent_socket_path(mount)
        with start_blocking_portal(runtime) as portal:
            fut, _ = portal.start_task(agent.serve, sock)
            try:
                yield AgentEnv(mount, backend, agent)
            finally:
                fut.cancel()
        assert not os.path.exists(sock)
    assert _my_shm_files() - before == set(), "Iov/Ior shared memory left behind"


def _until(cond: Callable[[], bool], limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def _open(env: AgentEnv, name: str, size: int, flags: int = os.O_RDWR) -> int:
    path = os.path.join(env.mount, name)
    with open(path, "wb") as f:
        f.truncate(size)
    fd = os.open(path, flags)
    reg_fd(fd)
    return fd


def _close(fd: int) -> None:
    dereg_fd(fd)
    os.close(fd)


def _run_all(ior: Ior, ios: list[tuple[Iov, int, int, int, int]]) -> dict[int, int]:
    """Push all ``(iov, off_in_iov, fd, file_off, length)`` through the ring, reaping when full."""
    results: dict[int, int] = {}
    i = 0
    while i < len(ios) or ior.in_flight:
        while i < len(ios):
            iov, off, fd, foff, n = ios[i]
            try:
                prep_io(ior, iov, off, fd, foff, n, userdata=i)
            except FsError as e:
                assert e.code == Code.RING_FULL and e.errno == errno.EAGAIN
                break
            i += 1
        submit_ios(ior)
        for c in wait_for_ios(ior, max_results=64, min_results=1, timeout=10):
            assert c.userdata not in results
            results[c.userdata] = c.result
    return results


# --------------------------------------------------------------------------- round trips


@pytest.mark.timeout(60)
@pytest.mark.parametrize("io_depth,timeout", [(0, None), (4, 0.02), (-3, None)])
def test_round_trip_many_ios_mixed_sizes(
    env: AgentEnv, io_depth: int, timeout: float | None
) -> None:
    rng = random.Random(42 + io_depth)
    file_size = 4 << 20
    fd = _open(env, "data.bin", file_size)
    # non-overlapping pieces of mixed sizes covering the file in a random order
    pieces: list[tuple[int, int]] = []
    off = 0
    while off < file_size:
        n = min(rng.choice([1, 7, 512, 4096, 65536, 200_000, 1 << 20]), file_size - off)
        pieces.append((off, n))
        off += n
    rng.shuffle(pieces)
    expected = rng.randbytes(file_size)
    with (
        Iov(env.mount, 2 * file_size) as iov,
        Ior(env.mount, 32, for_read=False, io_depth=io_depth, timeout=timeout) as wr,
    ):
        iov.buf[:file_size] = expected
        res = _run_all(wr, [(iov, o, fd, o, n) for o, n in pieces])
        assert [res[i] for i in range(len(pieces))] == [n for _, n in pieces]
        assert os.pread(fd, file_size, 0) == expected
        with Ior(env.mount, 16, for_read=True, io_depth=io_depth, timeout=timeout) as rd:
            res = _run_all(rd, [(iov, file_size + o, fd, o, n) for o, n in pieces])
            assert [res[i] for i in range(len(pieces))] == [n for _, n in pieces]
        assert bytes(iov.buf[file_size:]) == expected
    assert env.backend.views_in_region > 0  # the backend got views into the Iov itself
    if isinstance(env.backend, BatchedBackend):  # reads arrived in batches, not one by one
        assert sum(env.backend.batches) == len(pieces)
        assert max(env.backend.batches) > 1
    _until(lambda: env.agent.iov_count == 0 and env.agent.ring_count == 0)
    assert len(env.backend.detached) == 1
    _close(fd)


@pytest.mark.timeout(30)
def test_read_past_eof_is_short(env: AgentEnv) -> None:
    fd = _open(env, "short.bin", 0)
    os.pwrite(fd, b"abc", 0)
    with Iov(env.mount, 4096) as iov, Ior(env.mount, 4, for_read=True) as rd:
        prep_io(rd, iov, 0, fd, 0, 100, "x")
        prep_io(rd, iov, 100, fd, 1000, 100, "y")
        prep_io(rd, iov, 200, fd, 0, 0, "empty")
        submit_ios(rd)
        got = {c.userdata: c.result for c in wait_for_ios(rd, 10, 3, timeout=10)}
        assert got == {"x": 3, "y": 0, "empty": 0}
        assert bytes(iov.buf[:3]) == b"abc"
    _close(fd)


@pytest.mark.timeout(30)
def test_each_read_of_a_batch_completes_when_it_is_done() -> None:
    """A batch's large reads complete while a slow one is still out (no lockstep rings);
    small reads complete with their batch (fewer wake-ups where CPU per I/O is the limit)."""
    bs = STREAM_MIN_READ
    with tempfile.TemporaryDirectory(prefix="fs3-usrbio-") as mount:
        backend = StreamingBackend(mount)
        agent = UsrbioAgent(backend)
        env = AgentEnv(mount, backend, agent)
        with start_blocking_portal("asyncio") as portal:
            fut, _ = portal.start_task(agent.serve, agent_socket_path(mount))
            try:
                fd = _open(env, "held.bin", 0)
                data = random.Random(5).randbytes(3 * bs)
                os.pwrite(fd, data, 0)
                with Iov(mount, 3 * bs) as iov, Ior(mount, 4, for_read=True) as rd:
                    for n, hold in ((bs, bs), (4096, 4096)):
                        backend.hold_offset, backend.release = hold, False
                        for k in range(3):
                            prep_io(rd, iov, k * n, fd, k * n, n, k)
                        submit_ios(rd)
                        first: dict[int, int] = {}
                        deadline = time.monotonic() + (10 if n == bs else 1.5)
                        while len(first) < 2 and time.monotonic() < deadline:
                            for c in wait_for_ios(rd, 3, 1, timeout=0.5):
                                first[c.userdata] = c.result
                        if n == bs:
                            assert first == {0: n, 2: n}  # the held read is still out
                        else:
                            assert first == {}  # 4 KiB reads: the batch completes together
                        assert backend.batches[-1] == 3  # ...and it was one batch
                        backend.release = True
                        rest = wait_for_ios(rd, 3, 3 - len(first), timeout=10)
                        got = first | {c.userdata: c.result for c in rest}
                        assert got == {0: n, 1: n, 2: n}
                        assert bytes(iov.buf[: 3 * n]) == data[: 3 * n]
                _close(fd)
            finally:
                fut.cancel()


@pytest.mark.timeout(10)
def test_iov_buf_is_a_plain_writable_buffer() -> None:
    """What numpy.frombuffer needs: a writable, C-contiguous, byte-format buffer."""
    with tempfile.TemporaryDirectory() as mount:
        agent = UsrbioAgent(LocalFileBackend(mount))
        with start_blocking_portal("asyncio") as portal:
            fut, _ = portal.start_task(agent.serve, agent_socket_path(mount))
            try:
                with Iov(mount, 8192) as iov:
                    b = iov.buf
                    assert (
                        not b.readonly and b.c_contiguous and b.format == "B" and b.nbytes == 8192
                    )
                    b.cast("Q")[1] = 2**64 - 1  # typed views work too
                    assert bytes(b[8:16]) == b"\xff" * 8
                    del b
            finally:
                fut.cancel()


# --------------------------------------------------------------------------- refusals


@pytest.mark.timeout(30)
def test_bad_fds_ranges_and_full_ring(env: AgentEnv) -> None:
    fd = _open(env, "f.bin", 8192)
    ro = os.open(os.path.join(env.mount, "f.bin"), os.O_RDONLY)
    reg_fd(ro)
    other = tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="fs3-test-other-")  # another device
    reg_fd(other.fileno())
    with Iov(env.mount, 8192) as iov, Ior(env.mount, 2, for_read=False) as wr:
        with pytest.raises(FsError) as ei:
            prep_io(wr, iov, 0, 9999, 0, 10)
        assert ei.value.code == Code.BAD_FD and ei.value.errno == errno.EBADF
        with pytest.raises(FsError) as ei:
            prep_io(wr, iov, 0, other.fileno(), 0, 10)
        assert ei.value.code == Code.BAD_FD
        with pytest.raises(FsError) as ei:
            prep_io(wr, iov, 0, ro, 0, 10)  # read-only fd on a write ring
        assert ei.value.code == Code.BAD_FD
        for off, n in ((8190, 3), (-1, 1), (0, 8193)):
            with pytest.raises(FsError) as ei:
                prep_io(wr, iov, off, fd, 0, n)
            assert ei.value.code == Code.INVALID_ARGUMENT and ei.value.errno == errno.EINVAL
        with pytest.raises(FsError) as ei:
            prep_io(wr, iov, 0, fd, -5, 1)
        assert ei.value.code == Code.INVALID_ARGUMENT
        prep_io(wr, iov, 0, fd, 0, 10, 1)
        prep_io(wr, iov, 10, fd, 10, 10, 2)
        with pytest.raises(FsError) as ei:
            prep_io(wr, iov, 20, fd, 20, 10, 3)
        assert ei.value.code == Code.RING_FULL and ei.value.errno == errno.EAGAIN
        assert wr.in_flight == 2
        submit_ios(wr)
        done = wait_for_ios(wr, 10, 2, timeout=10)
        assert sorted(c.userdata for c in done) == [1, 2] and all(c.result == 10 for c in done)
        prep_io(wr, iov, 20, fd, 20, 10, 3)  # space again
        submit_ios(wr)
        assert [c.result for c in wait_for_ios(wr, 10, 1, timeout=10)] == [10]
        # nothing in flight: returns at once instead of waiting for min_results
        assert wait_for_ios(wr, 10, 5, timeout=10) == []
    with pytest.raises(FsError) as ei:
        dereg_fd(12345)
    assert ei.value.code == Code.BAD_FD
    with pytest.raises(FsError) as ei:
        reg_fd(123456)
    assert ei.value.code == Code.BAD_FD
    dereg_fd(ro)
    os.close(ro)
    dereg_fd(other.fileno())
    other.close()
    _close(fd)


@pytest.mark.timeout(30)
def test_per_io_errors_come_back_as_negative_errno(env: AgentEnv) -> None:
    fd = _open(env, "gone.bin", 4096)
    keep = _open(env, "keep.bin", 4096)
    os.unlink(os.path.join(env.mount, "gone.bin"))  # backend cannot find the inode any more
    env.backend.refuse.add(os.fstat(keep).st_ino)
    with Iov(env.mount, 8192) as iov, Ior(env.mount, 8, for_read=True) as rd:
        prep_io(rd, iov, 0, fd, 0, 100, "gone")
        prep_io(rd, iov, 0, keep, 0, 100, "refused")
        submit_ios(rd)
        got = {c.userdata: c.result for c in wait_for_ios(rd, 10, 2, timeout=10)}
        assert got == {"gone": -errno.ENOENT, "refused": -errno.EACCES}
        # a forged ring entry (what a buggy or hostile app could write) is refused by the agent
        from fs3.usrbio.ring import IoArgs

        ring = rd._ring
        ino = os.fstat(fd).st_ino
        forged = [
            IoArgs(iov.id.bytes, 8000, ino, 0, 500, 0),  # runs past the Iov
            IoArgs(b"\0" * 16, 0, ino, 0, 10, 0),  # unknown buffer
        ]
        for i, a in enumerate(forged):
            slot = rd._free.pop()
            rd._userdata[slot] = f"forged{i}"
            ring.write_args(slot, a)
            assert ring.push_sqe(slot, slot)
        ring.push_sqe(40000, 0)  # a slot index that does not exist: must not crash the agent
        submit_ios(rd)
        got = {c.userdata: c.result for c in wait_for_ios(rd, 10, 2, timeout=10)}
        assert got == {"forged0": -errno.EINVAL, "forged1": -errno.EINVAL}
        assert env.agent.iov_count == 1  # the agent is still fine
    _close(fd)
    _close(keep)


@pytest.mark.timeout(10)
def test_no_agent_is_a_clear_error() -> None:
    with tempfile.TemporaryDirectory() as d:
        before = _my_shm_files()
        with pytest.raises(FsError) as ei:
            Iov(d, 4096)
        assert ei.value.code == Code.UNAVAILABLE and ei.value.errno == errno.ENODEV
        with pytest.raises(FsError):
            Ior(d, 4, for_read=True)
        assert _my_shm_files() == before
    with pytest.raises(FsError) as ei:
        Iov("/tmp", 0)
    assert ei.value.code == Code.INVALID_ARGUMENT


# --------------------------------------------------------------------------- crashes

_APP = """
import os, sys, time
from fs3.usrbio import Iov, Ior, reg_fd, prep_io, submit_ios
mount, path = sys.argv[1], sys.argv[2]
iov = Iov(mount, 1 << 20)
ior = Ior(mount, 16, for_read=True)
fd = os.open(path, os.O_RDONLY); reg_fd(fd)
for i in range(16):
    prep_io(ior, iov, i * 4096, fd, 0, 4096, i)
submit_ios(ior)
print(iov.path, flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(30)
def test_crashed_application_is_reclaimed(env: AgentEnv) -> None:
    env.backend.delay_s = 0.2  # I/Os are still in flight when the app dies
    path = os.path.join(env.mount, "x.bin")
    with open(path, "wb") as f:
        f.write(b"y" * 4096)
    p = subprocess.Popen(
        [sys.executable, "-c", _APP, env.mount, path], stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None
        iov_path = p.stdout.readline().strip()
        assert iov_path
        _until(lambda: env.agent.iov_count == 1 and env.agent.ring_count == 1)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        _until(lambda: env.agent.iov_count == 0 and env.agent.ring_count == 0)
        _until(
            lambda: not glob.glob(f"/dev/shm/fs3-io[rv]-{p.pid}-*")
        )  # the agent removed its files
        assert env.agent.stats["ios"] >= 1
    finally:
        _reap(p)


def _reap(p: subprocess.Popen[Any]) -> None:
    """Kill the application process ``p`` if it still runs, reap it, and remove any
    Iov/Ior file of its pid (only a failing test leaves one)."""
    if p.poll() is None:
        p.kill()
    p.wait(10)
    for leftover in glob.glob(f"/dev/shm/fs3-io[rv]-{p.pid}-*"):
        os.unlink(leftover)


_APP_RW = """
import os, sys, time
from fs3.usrbio import Iov, Ior, reg_fd, prep_io, submit_ios, wait_for_ios
mount, path = sys.argv[1], sys.argv[2]
iov = Iov(mount, 1 << 20)
ior = Ior(mount, 4, for_read=True)
fd = os.open(path, os.O_RDONLY); reg_fd(fd)
prep_io(ior, iov, 4096, fd, 0, 4096, 1)
submit_ios(ior)
(c,) = wait_for_ios(ior, max_results=1, min_results=1, timeout=10)
assert c.result == 4096 and bytes(iov.buf[4096:8192]) == b"z" * 4096, c
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(30)
def test_iov_file_gone_once_mapped_so_no_exit_leaks_it() -> None:
    """An Iov's /dev/shm file is unlinked once the agent mapped it: neither the
    agent stopping first nor a kill -9 of the application can leave it behind."""
    with tempfile.TemporaryDirectory(prefix="fs3-usrbio-") as mount:
        path = os.path.join(mount, "x.bin")
        with open(path, "wb") as f:
            f.write(b"z" * 4096)
        agent = UsrbioAgent(LocalFileBackend(mount))
        p: subprocess.Popen[str] | None = None
        try:
            with start_blocking_portal("trio") as portal:
                fut, _ = portal.start_task(agent.serve, agent_socket_path(mount))
                try:
                    p = subprocess.Popen(
                        [sys.executable, "-c", _APP_RW, mount, path],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
                    assert agent.iov_count == 1 and agent.ring_count == 1
                    # registered and used (the read above landed in the Iov), yet no file
                    assert glob.glob(f"/dev/shm/fs3-io[rv]-{p.pid}-*") == []
                finally:
                    fut.cancel()  # the agent goes first; the application is still alive
            p.send_signal(signal.SIGKILL)
            p.wait(10)
            assert glob.glob(f"/dev/shm/fs3-io[rv]-{p.pid}-*") == []
        finally:
            if p is not None:
                _reap(p)


_APP_SELF_KILL = """
import os, signal, sys
from fs3.usrbio import Iov
iov = Iov(sys.argv[1], 64 << 20)
print("ready", flush=True)
sys.stdin.readline()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(30)
def test_killed_child_not_yet_reaped_leaves_no_iov_file(env: AgentEnv) -> None:
    """A rank that kills itself stays a zombie until its parent waits for it (a
    launcher busy waiting for another rank): when the agent sees the connection
    close the pid still exists, so the agent must not be what removes the file."""
    p = subprocess.Popen(
        [sys.executable, "-c", _APP_SELF_KILL, env.mount],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdin is not None and p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        _until(lambda: env.agent.iov_count == 1)
        p.stdin.write("die\n")
        p.stdin.flush()
        _until(lambda: env.agent.iov_count == 0)  # dropped while the child is a zombie
        assert glob.glob(f"/dev/shm/fs3-iov-{p.pid}-*") == []
    finally:
        _reap(p)


_AGENT = """
import sys, anyio, os
from fs3.usrbio.agent import STREAM_MIN_READ, UsrbioAgent
class Slow:
    async def read(self, inode, off, dest):
        await anyio.sleep(30)
        return 0
    async def write(self, inode, off, src):
        await anyio.sleep(30)
        return 0
async def main():
    async with anyio.create_task_group() as tg:
        await tg.start(UsrbioAgent(Slow()).serve, sys.argv[1])
        print("ready", flush=True)
anyio.run(main, backend="trio")
"""


@pytest.mark.timeout(30)
def test_crashed_agent_fails_wait_not_hang() -> None:
    before = _my_shm_files()
    with tempfile.TemporaryDirectory() as mount:
        p = subprocess.Popen(
            [sys.executable, "-c", _AGENT, agent_socket_path(mount)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            path = os.path.join(mount, "f")
            with open(path, "wb") as f:
                f.write(b"z" * 100)
            fd = os.open(path, os.O_RDONLY)
            reg_fd(fd)
            with Iov(mount, 4096) as iov, Ior(mount, 4, for_read=True) as rd:
                prep_io(rd, iov, 0, fd, 0, 100)
                submit_ios(rd)
                assert wait_for_ios(rd, 1, 1, timeout=0.2) == []  # still running
                p.send_signal(signal.SIGKILL)
                t0 = time.monotonic()
                with pytest.raises(FsError) as ei:
                    wait_for_ios(rd, 1, 1)  # no timeout: must still return
                assert ei.value.code == Code.UNAVAILABLE and time.monotonic() - t0 < 5
                with pytest.raises(FsError):
                    submit_ios(rd)
            with pytest.raises(FsError) as ei:
                Iov(mount, 4096)
            assert ei.value.code == Code.UNAVAILABLE
            dereg_fd(fd)
            os.close(fd)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait(10)
            sock = agent_socket_path(mount)
            if os.path.exists(sock):
                os.unlink(sock)  # the killed agent could not remove it
    assert _my_shm_files() == before


# --------------------------------------------------------------------------- with the shm transport


class ShmTransportBackend(LocalFileBackend):
    """Backend moving the bytes the way the fs3 client does: through the shm transport.

    The "storage server" is a real ServerTransport (RegisterRegion over gRPC);
    the storage RPC itself is simulated by serialising the DataRef.
    """

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.refs: list[Any] = []

    async def setup(self) -> None:
        from fs3.proto import transport_pb2_grpc
        from fs3.rpc.server import add_servicer, bind, create_server
        from fs3.transport import ServerTransport, client_transport

        self.st = ServerTransport()
        self.server = create_server()
        add_servicer(
            self.server, transport_pb2_grpc.add_TransportServiceServicer_to_server, self.st.servicer
        )
        self.node = f"127.0.0.1:{bind(self.server, '127.0.0.1', 0)}"
        await self.server.start()
        await self.st.start("127.0.0.1", address=self.node)  # + its region socket
        self.ct = client_transport("shm", "usrbio-agent")

    async def teardown(self) -> None:
        await self.ct.close()
        await self.server.stop(0)
        await self.st.stop()

    async def attach_region(self, region: ShmRegion) -> None:
        await super().attach_region(region)
        await self.ct.register_region(region)

    async def detach_region(self, region: ShmRegion) -> None:
        await super().detach_region(region)
        await self.ct.unregister_region(region)

    @staticmethod
    def _wire(ref: Any) -> Any:
        return type(ref).FromString(ref.SerializeToString())

    async def read(self, inode: int, file_offset: int, dest: memoryview) -> int:
        ref, complete = await self.ct.read_ref(self.node, "", dest)
        self.refs.append(ref)
        fd = self._fd(inode, os.O_RDONLY)
        try:
            n = await self.st.deliver_file(
                self._wire(ref), fd, file_offset, len(dest)
            )  # the storage server
        finally:
            os.close(fd)
        await complete(n)
        return n

    async def write(self, inode: int, file_offset: int, src: memoryview) -> int:
        ref, sent = await self.ct.write_ref(self.node, "", src)
        self.refs.append(ref)
        data = await self.st.fetch(self._wire(ref))  # the storage server
        fd = self._fd(inode, os.O_WRONLY)
        try:
            n = os.pwrite(fd, data, file_offset)
        finally:
            os.close(fd)
            data.release()
        await sent
        return n


@pytest.mark.timeout(30)
def test_usrbio_over_shm_transport_moves_no_bytes_through_the_agent() -> None:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as mount:
        backend = ShmTransportBackend(mount)
        agent = UsrbioAgent(backend)
        with start_blocking_portal("asyncio") as portal:
            portal.call(backend.setup)
            fut, _ = portal.start_task(agent.serve, agent_socket_path(mount))
            try:
                path = os.path.join(mount, "f")
                with open(path, "wb") as f:
                    f.truncate(1 << 20)
                fd = os.open(path, os.O_RDWR)
                reg_fd(fd)
                payload = rng.randbytes(1 << 20)
                with Iov(mount, 2 << 20) as iov:
                    iov.buf[: 1 << 20] = payload
                    with Ior(mount, 16, for_read=False) as wr:
                        res = _run_all(
                            wr, [(iov, i << 16, fd, i << 16, 1 << 16) for i in range(16)]
                        )
                        assert all(v == 1 << 16 for v in res.values())
                    assert os.pread(fd, 1 << 20, 0) == payload
                    with Ior(mount, 16, for_read=True) as rd:
                        res = _run_all(
                            rd,
                            [(iov, (1 << 20) + (i << 16), fd, i << 16, 1 << 16) for i in range(16)],
                        )
                        assert all(v == 1 << 16 for v in res.values())
                    assert bytes(iov.buf[1 << 20 :]) == payload
                    # every transfer named the Iov itself: no staging copy anywhere
                    assert len(backend.refs) == 32
                    assert {r.shm.region for r in backend.refs} == {iov.id.hex}
                    assert backend.st.regions.has(iov.id.hex)
                _until(lambda: not backend.st.regions.has(iov.id.hex))  # unregistered with the Iov
                dereg_fd(fd)
                os.close(fd)
            finally:
                fut.cancel()
                portal.call(backend.teardown)


@pytest.mark.timeout(10)
def test_a_wake_up_is_skipped_only_while_the_last_one_is_unread() -> None:
    import socket

    from fs3.usrbio.agent import _wake_up_pending

    agent_end, app_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with agent_end, app_end:
        assert not _wake_up_pending(agent_end)
        agent_end.send(b"c")
        assert _wake_up_pending(agent_end)  # the application will wake up and reap anyway
        app_end.recv(16)
        assert not _wake_up_pending(agent_end)  # it read it: the next completion must send
