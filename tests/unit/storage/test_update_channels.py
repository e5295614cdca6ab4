"""Exactly-once channels (3FS ReliableUpdate): same (client, channel, seq) runs once."""

from __future__ import annotations

import asyncio

import pytest

from fs3.errors import Code, FsError
from fs3.proto import storage_pb2
from fs3.storage.craq import UpdateChannels

pytestmark = pytest.mark.timeout(10)


def tag(seq: int, channel: int = 3, client: str = "c1") -> storage_pb2.UpdateTag:
    return storage_pb2.UpdateTag(client_id=client, channel_id=channel, seqnum=seq, request_id=seq)


def test_duplicates_and_order() -> None:
    async def main() -> None:
        ch = UpdateChannels()
        runs = 0
        gate = asyncio.Event()

        async def op() -> storage_pb2.IOResult:
            nonlocal runs
            runs += 1
            await gate.wait()
            return storage_pb2.IOResult(commit_ver=runs)

        # two concurrent copies of one request: one run, both get its result
        a = asyncio.create_task(ch.run(tag(5), 1, op))
        b = asyncio.create_task(ch.run(tag(5), 1, op))
        await asyncio.sleep(0.01)
        gate.set()
        ra, rb = await asyncio.gather(a, b)
        assert runs == 1 and ra.commit_ver == rb.commit_ver == 1
        # a later retry: cached, no run
        assert (await ch.run(tag(5), 1, op)).commit_ver == 1 and runs == 1 and ch.hits >= 1
        # an older seq on the channel is refused; a newer one runs
        with pytest.raises(FsError) as ei:
            await ch.run(tag(4), 1, op)
        assert ei.value.code == Code.STALE_UPDATE
        assert (await ch.run(tag(6), 1, op)).commit_ver == 2
        # other channels, chains and clients are independent; channel 0 disables the filter
        assert (await ch.run(tag(5, channel=4), 1, op)).commit_ver == 3
        assert (await ch.run(tag(5), 2, op)).commit_ver == 4
        assert (await ch.run(tag(5, client="c2"), 1, op)).commit_ver == 5
        await ch.run(tag(1, channel=0), 1, op)
        await ch.run(tag(1, channel=0), 1, op)
        assert runs == 7

    asyncio.run(main())


def test_failed_attempt_is_rerun() -> None:
    async def main() -> None:
        ch = UpdateChannels()
        calls = 0

        async def flaky() -> storage_pb2.IOResult:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise FsError(Code.SUCCESSOR_UNAVAILABLE, "down")
            return storage_pb2.IOResult(commit_ver=9)

        with pytest.raises(FsError):
            await ch.run(tag(1), 1, flaky)
        assert (await ch.run(tag(1), 1, flaky)).commit_ver == 9
        assert (await ch.run(tag(1), 1, flaky)).commit_ver == 9 and calls == 2

    asyncio.run(main())
