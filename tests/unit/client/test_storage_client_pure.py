"""Pure parts of the storage client: update channels, caller identity."""

from __future__ import annotations

import asyncio
import os

import pytest

from fs3.client.core import Caller, layout_of
from fs3.client.storage_client import ChannelAllocator
from fs3.proto import meta_pb2

pytestmark = pytest.mark.timeout(10)


def test_channels_are_exclusive_and_seqnums_unique() -> None:
    async def main() -> None:
        alloc = ChannelAllocator(max_channels=3)
        got = [await alloc.acquire() for _ in range(3)]
        assert sorted(c for c, _ in got) == [1, 2, 3]
        assert len({s for _, s in got}) == 3
        waiter = asyncio.create_task(alloc.acquire())
        await asyncio.sleep(0.01)
        assert not waiter.done()  # all channels busy: a fourth update waits
        await alloc.release(2)
        ch, seq = await asyncio.wait_for(waiter, 1)
        assert ch == 2 and seq > max(s for _, s in got)

    asyncio.run(main())


def test_caller_from_pid_reads_groups() -> None:
    me = Caller.from_pid(os.getuid(), os.getgid(), os.getpid())
    assert set(me.groups) == set(os.getgroups())
    assert Caller.from_pid(5, 6, 0) == Caller(5, 6, (), 0)
    assert Caller.from_pid(5, 6, 999_999_999).groups == ()  # no such process
    p = Caller(1, 2, (3, 4)).to_proto()
    assert (p.uid, p.gid, list(p.groups)) == (1, 2, [3, 4])


def test_layout_of_attr() -> None:
    a = meta_pb2.Attr(
        layout=meta_pb2.Layout(
            chunk_size=1 << 16, stripe=2, table_id=1, table_version=3, chain_ids=[5, 9]
        )
    )
    lay = layout_of(a)
    lay.validate()
    assert (lay.chunk_size, lay.stripe, lay.chain_ids, lay.table_version) == (1 << 16, 2, (5, 9), 3)
    assert lay.chains() == [5, 9]
