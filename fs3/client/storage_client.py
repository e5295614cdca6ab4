"""Storage client: chunk I/O against CRAQ chains (docs/architecture.md: data flows).

* A user I/O is split per chunk (:func:`fs3.client.layout.split`); pieces run
  in parallel with at most ``io_depth`` in flight per client operation.
* Writes go to the chain **head** (first SERVING target) with the chain version
  the client believes in and a CRC32C of the payload. The head acknowledges only
  after the tail committed, so a returned write is durable on every replica.
  Each write/truncate/remove piece gets an update channel and sequence number
  (3FS ``UpdateChannelAllocator``) that it keeps across retries, so a retry of
  an update whose answer was lost is applied once by the storage targets.
* Reads go to the least-loaded SERVING replica (fewest of this client's reads
  in flight, random among equals: load spreads over every replica's disk); a
  replica that fails or returns bytes whose CRC32C does not match is skipped
  and another one is tried. A missing chunk (``CHUNK_NOT_FOUND``) or a chunk
  shorter than the requested range is a hole: zeros, up to the file length the
  caller passes.
* Refusals with ``CHAIN_VERSION_MISMATCH`` (and other routing errors) make the
  client refresh routing from mgmtd before retrying; transient errors are
  retried with backoff until ``retry_deadline_s``.
* Reads to one node are batched (:class:`ReadBatcher`) and travel on one
  long-lived bidirectional ``ReadStream`` per node (:class:`NodeReadStream`),
  answers matched by request id; the unary ``BatchRead`` is the fallback for
  servers without the stream. A broken stream fails its pending reads with a
  retryable error and is reopened on the next read.
* Payloads move through the configured :class:`~fs3.transport.base.ClientTransport`
  (inline gRPC bytes or shared memory), except that over the native RPC
  transport every I/O the transport does not move one-sided
  (:meth:`~fs3.transport.base.ClientTransport.one_sided`) sends them as the frame's bulk payload
  (``frame`` DataRefs): a write's bytes go out from the caller's buffer, a
  batch's read bytes are received straight into each read's destination
  (scattered by the answer's per-io lengths), on the ReadStream as on the
  unary ``BatchRead``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import crc32c

from fs3.client.layout import ChunkPiece, chain_of, chunks_from, split
from fs3.client.retry import Deadline, RetryPolicy, retrying
from fs3.errors import Code, FsError
from fs3.proto import mgmtd_pb2, storage_pb2, storage_pb2_grpc
from fs3.routing import Routing
from fs3.rpc.channel import BidiStream, ChannelPool, call
from fs3.security.capability import CapabilitySource
from fs3.transport.base import (
    DONE,
    ClientTransport,
    DataRef,
    ReadCompletion,
    _noop_complete,
    batch_read_scatter,
    frame_ref,
    is_inline,
    scatter_views,
)
from fs3.transport.shm import regions_lost

log = logging.getLogger("fs3.client.storage")

# ios per BatchRead RPC: the storage server accepts up to 1024 (fs3.limits.MAX_READ_IOS);
# 256 keeps one response small and lets several batches to one node run at once.
MAX_BATCH_READ_IOS = 256

# Errors after which routing may have moved on: refresh before the retry.
_ROUTING_ERRORS = frozenset(
    {
        Code.CHAIN_VERSION_MISMATCH,
        Code.UNKNOWN_CHAIN,
        Code.UNKNOWN_TARGET,
        Code.NOT_HEAD,
        Code.TARGET_NOT_SERVING,
        Code.UNAVAILABLE,
        Code.TIMEOUT,
        Code.TRANSPORT,
    }
)
# A capability storage refused: fetch a fresh one (fs3/security/capability.py).
_CAP_ERRORS = frozenset({Code.CAPABILITY_EXPIRED, Code.PERMISSION_DENIED})
# Per-replica read failures worth trying on another replica.
_TRY_OTHER_REPLICA = frozenset(
    {
        Code.CHECKSUM_MISMATCH,
        Code.UNAVAILABLE,
        Code.TIMEOUT,
        Code.TRANSPORT,
        Code.TARGET_NOT_SERVING,
        Code.CHAIN_VERSION_MISMATCH,
        Code.NOT_COMMITTED,
        Code.INTERNAL,
    }
)

MAX_CHANNELS = 65535

_T = TypeVar("_T")

# bytes asked for per batch: an answer's bulk payload stays far below the native
# transport's payload limit ([rpc] max_payload_bytes, 64 MiB by default) and the
# server's per-request limit (fs3.limits.MAX_READ_BATCH_BYTES); a larger piece goes alone
MAX_BATCH_READ_BYTES = 16 << 20

# a read of read_many: (inode, chains, chunk size, file offset, destination, file length)
ReadRequest = tuple[int, Sequence[int], int, int, "memoryview | bytearray", int]

# read_many's progress callback: (index in the batch, byte count or that read's exception), ...
ReadsDone = Callable[[list[tuple[int, "int | BaseException"]]], None]

# a queued read: (io, timeout, its future, its destination when io.dest is a frame ref)
_Queued = tuple[
    storage_pb2.ReadIO, float, "asyncio.Future[storage_pb2.ReadResult]", memoryview | None
]


class ChannelAllocator:
    """Update channels for exactly-once chunk updates.

    See docs/architecture.md#retries-and-exactly-once-updates.

    A channel is held by one in-flight update; its sequence number is taken
    from a client-wide counter so a (channel, seqnum) pair is never reused.
    """

    def __init__(self, max_channels: int = MAX_CHANNELS) -> None:
        self._free = list(range(max_channels, 0, -1))
        self._seq = itertools.count(1)
        self._cond = asyncio.Condition()

    async def acquire(self) -> tuple[int, int]:
        async with self._cond:
            while not self._free:
                await self._cond.wait()
            ch = self._free.pop()
        return ch, next(self._seq)

    async def release(self, channel: int) -> None:
        async with self._cond:
            self._free.append(channel)
            self._cond.notify()


class ReadBatcher:
    """Coalesces the reads sent to one storage node in the same event-loop turn into one batch.

    (The batch goes out as one message on the node's ReadStream, or one unary
    BatchRead as a fallback: ``send`` decides.)

    Why: every chunk read used to be its own ``BatchRead`` RPC with one io, and
    a grpc.aio unary call costs about as much CPU on each side as serving a
    small page-cache read, so with many reads in flight (a USRBIO ring with 64
    I/Os, parallel FUSE readers, read-ahead windows) the RPCs were the cost.
    The storage server already serves up to ``max_ios`` ios per request
    concurrently; this collects every read submitted before the loop runs
    again and sends them together. A lone read is sent on the next loop
    iteration, so it waits microseconds, not a timer.

    Each caller gets its own :class:`~fs3.proto.storage_pb2.ReadResult` (per-io
    errors stay per io); a failure of the RPC itself fails every read of that
    batch with its own copy of the error, and each caller retries as before.
    """

    def __init__(
        self,
        send: Callable[
            [list[storage_pb2.ReadIO], float, list[memoryview | None]],
            Awaitable[storage_pb2.BatchReadResponse],
        ],
        max_ios: int = MAX_BATCH_READ_IOS,
        max_bytes: int = MAX_BATCH_READ_BYTES,
    ) -> None:
        self._send = send
        self._max = max(1, max_ios)
        self._max_bytes = max_bytes
        self._queue: list[_Queued] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = {"rpcs": 0, "ios": 0}

    def submit(
        self, io: storage_pb2.ReadIO, timeout_s: float, dest: memoryview | None = None
    ) -> asyncio.Future[storage_pb2.ReadResult]:
        """Queue one read; ``dest`` receives its bytes when ``io.dest`` is a frame ref."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[storage_pb2.ReadResult] = loop.create_future()
        self._queue.append((io, timeout_s, fut, dest))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        queue, self._queue = self._queue, []
        live = [
            item for item in queue if not item[2].done()
        ]  # callers cancelled meanwhile need nothing
        batch: list[_Queued] = []
        nbytes = 0
        for item in live:
            n = item[0].length
            if batch and (len(batch) >= self._max or nbytes + n > self._max_bytes):
                self._start(batch)
                batch, nbytes = [], 0
            batch.append(item)
            nbytes += n
        if batch:
            self._start(batch)

    def _start(self, batch: list[_Queued]) -> None:
        t = asyncio.ensure_future(self._send_batch(batch))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _send_batch(self, items: list[_Queued]) -> None:
        self.stats["rpcs"] += 1
        self.stats["ios"] += len(items)
        try:
            resp = await self._send(
                [it[0] for it in items], max(it[1] for it in items), [it[3] for it in items]
            )
            if len(resp.results) != len(items):
                raise FsError(
                    Code.INTERNAL,
                    f"BatchRead returned {len(resp.results)} results for {len(items)} ios",
                )
        except FsError as e:
            for it in items:
                if not it[2].done():
                    it[2].set_exception(
                        FsError(e.code, e.message, errno=e.errno, retryable=e.retryable)
                    )
            return
        except (
            BaseException
        ) as e:  # cancelled (client closing) or a bug: never leave a caller hanging
            for it in items:
                if not it[2].done():
                    it[2].set_exception(
                        FsError(Code.UNAVAILABLE, f"BatchRead aborted: {e!r}", retryable=True)
                    )
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        for it, r in zip(items, resp.results, strict=True):
            if not it[2].done():
                it[2].set_result(r)


class NodeReadStream:
    """The client end of one ``ReadStream`` to one storage node.

    Why: a unary ``BatchRead`` costs ~1 ms of gRPC CPU on each side, a message
    on an open bidi stream ~0.3 ms. The caller writes its request itself (gRPC
    allows one write at a time: requests arriving during a write are queued and
    sent by that writer), one reader task matches answers to callers by
    ``request_id`` (the server answers in completion order). Each request has
    its own timeout (TIMEOUT, retryable; the server is told to drop the work).
    When the stream breaks (node gone or restarted, channel closed) every
    pending request fails with a retryable UNAVAILABLE error, so the read
    retry/replica logic applies, and the stream is marked dead: the owner opens
    a new one for the next request. ``NOT_IMPLEMENTED`` (a server without
    ReadStream) is remembered in :attr:`unsupported`.
    """

    def __init__(
        self,
        open_call: Callable[[], BidiStream],
        address: str,
        client_id: str,
        on_dead: Callable[[NodeReadStream], None] | None = None,
    ) -> None:
        self.address = address
        self.client_id = client_id
        self.dead = False
        self.unsupported = False
        self._on_dead = on_dead
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[storage_pb2.BatchReadResponse]] = {}
        self._outbox: collections.deque[storage_pb2.BatchReadRequest] = collections.deque()
        self._writing = False
        self._drainer: asyncio.Task[None] | None = None
        self._stream = open_call()
        # frame-destined reads: rid -> (ios, their buffers, laid flag); the answers'
        # payloads are received straight into those buffers (native transport only)
        self._layouts: dict[
            int, tuple[list[storage_pb2.ReadIO], list[memoryview | None], list[bool]]
        ] = {}
        self.carries_payload = self._stream.set_payload_layout(self._layout)
        self._reader = asyncio.create_task(self._read_loop(), name=f"fs3-read-stream-{address}")

    def _layout(self, body: bytes | memoryview, length: int) -> list[memoryview] | None:
        resp = storage_pb2.BatchReadResponse.FromString(bytes(body))  # parsed once per answer
        entry = self._layouts.get(resp.request_id)
        if entry is None:  # given up on (timeout): the bytes are dropped
            return None
        ios, dests, laid = entry
        return scatter_views(ios, dests, resp, length, laid)

    async def _send(self, req: storage_pb2.BatchReadRequest) -> None:
        """Write ``req`` now, or queue it behind the write in progress (which sends it)."""
        self._outbox.append(req)
        if self._writing:
            return
        self._writing = True
        try:
            while self._outbox and not self.dead:
                await self._stream.write(self._outbox.popleft())
        except FsError as e:
            self._die(
                FsError(
                    Code.UNAVAILABLE,
                    f"read stream to {self.address} broke: {e.message}",
                    retryable=True,
                )
            )
            raise self._closed_error() from None
        finally:
            self._writing = False
            if self._outbox and not self.dead:  # the writer was cancelled: hand over
                self._drain_soon()

    def _drain_soon(self) -> None:
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        if self._outbox and not self._writing and not self.dead:
            with contextlib.suppress(FsError):
                await self._send(self._outbox.popleft())

    def _closed_error(self) -> FsError:
        return FsError(Code.UNAVAILABLE, f"read stream to {self.address} is closed", retryable=True)

    async def _read_loop(self) -> None:
        err: FsError | None = None
        try:
            async for resp in self._stream.responses():
                fut = self._pending.pop(resp.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(resp)
            err = FsError(Code.UNAVAILABLE, f"read stream to {self.address} ended", retryable=True)
        except FsError as e:
            if e.code == Code.NOT_IMPLEMENTED:
                self.unsupported = True
            err = FsError(
                Code.UNAVAILABLE,
                f"read stream to {self.address} broke: {e.message}",
                retryable=True,
            )
        except asyncio.CancelledError:
            err = FsError(Code.UNAVAILABLE, f"read stream to {self.address} closed", retryable=True)
        except Exception as e:  # pragma: no cover - a bug: still fail callers cleanly
            log.exception("read stream to %s failed", self.address)
            err = FsError(
                Code.UNAVAILABLE, f"read stream to {self.address} failed: {e!r}", retryable=True
            )
        finally:
            self._die(err or self._closed_error())

    def _die(self, err: FsError) -> None:
        if not self.dead:
            self.dead = True
            if self._on_dead is not None:
                self._on_dead(self)
        self._outbox.clear()
        self._stream.cancel()
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(
                    FsError(err.code, err.message, errno=err.errno, retryable=err.retryable)
                )

    async def request(
        self,
        ios: list[storage_pb2.ReadIO],
        timeout_s: float,
        dests: list[memoryview | None] | None = None,
    ) -> storage_pb2.BatchReadResponse:
        """Send one batch and wait for its answer (at most ``timeout_s``).

        ``dests``: the buffers of ios with frame destinations (needs :attr:`carries_payload`).
        """
        if self.dead:
            raise self._closed_error()
        rid = next(self._ids)
        fut: asyncio.Future[storage_pb2.BatchReadResponse] = (
            asyncio.get_running_loop().create_future()
        )
        self._pending[rid] = fut
        laid = [False]
        if dests is not None:
            self._layouts[rid] = (ios, dests, laid)
        try:
            async with asyncio.timeout(timeout_s):
                await self._send(
                    storage_pb2.BatchReadRequest(ios=ios, client_id=self.client_id, request_id=rid)
                )
                resp = await fut
            if dests is not None and not laid[0] and _frame_bytes(ios, dests, resp):
                raise FsError(
                    Code.TRANSPORT,
                    f"storage.ReadStream@{self.address}: the answer's payload did not match "
                    "its read lengths",
                    retryable=True,
                )
            return resp
        except TimeoutError:
            if not self.dead:  # let the server drop the work, as a unary deadline would
                self._outbox.append(storage_pb2.BatchReadRequest(request_id=rid, cancel=True))
                if not self._writing:
                    self._drain_soon()
            raise FsError(
                Code.TIMEOUT,
                f"storage.ReadStream@{self.address}: no answer in {timeout_s:.3g}s",
                retryable=True,
            ) from None
        finally:
            self._pending.pop(rid, None)
            self._layouts.pop(rid, None)
            if fut.done() and not fut.cancelled():
                fut.exception()  # consumed here or raised above: no "never retrieved" noise

    async def close(self) -> None:
        """Cancel the stream (the server cancels its work); fail pending requests."""
        self._die(
            FsError(Code.UNAVAILABLE, f"read stream to {self.address} closed", retryable=True)
        )
        self._reader.cancel()
        tasks = [self._reader] + ([self._drainer] if self._drainer is not None else [])
        await asyncio.gather(*tasks, return_exceptions=True)


class StorageClient:
    """Chunk reads/writes/truncates/removals for files with a given layout.

    Args:
        routing: returns the current :class:`Routing`.
        refresh_routing: ``await refresh_routing()`` fetches routing from mgmtd.
        pool: channel pool of the client's loop.
        transport: the bulk transport.
        client_id: this client's id (update tags, shm registrations).
        policy: retry deadlines.
        io_depth: chunk requests in flight per operation.
        use_read_streams: send reads on a long-lived ``ReadStream`` per node (default)
            instead of one unary ``BatchRead`` per batch.
    """

    def __init__(
        self,
        routing: Callable[[], Routing],
        refresh_routing: Callable[[], Awaitable[Any]],
        pool: ChannelPool,
        transport: ClientTransport,
        client_id: str,
        policy: RetryPolicy,
        *,
        io_depth: int = 16,
        verify_read_checksums: bool = True,
        rng: random.Random | None = None,
        use_read_streams: bool = True,
    ) -> None:
        self._routing = routing
        self._refresh = refresh_routing
        self._pool = pool
        self.transport = transport
        self.client_id = client_id
        self._policy = policy
        self.io_depth = io_depth
        self.verify_read_checksums = verify_read_checksums
        self._rng = rng or random.Random()
        self._channels = ChannelAllocator()
        self._request_ids = itertools.count(1)
        self._stubs: dict[str, storage_pb2_grpc.StorageServiceStub] = {}
        self._batchers: dict[str, ReadBatcher] = {}
        # Reads travel on one ReadStream per node (NodeReadStream); BatchRead is the
        # fallback for servers without it (and for use_read_streams=False).
        self.use_read_streams = use_read_streams
        # reads in flight from this client per target (the least-loaded replica serves a read)
        self._target_load: dict[int, int] = {}
        self._streams: dict[str, NodeReadStream] = {}
        self._no_stream: set[str] = set()
        # Where chunk capabilities come from (fs3/security/capability.py): the client's
        # grants from meta, or a service's own token; None: send none (no cluster secret).
        self.caps: CapabilitySource | None = None
        self.stats = {
            "read_streams_opened": 0,
            "read_retries": 0,
            "write_retries": 0,
            "checksum_errors": 0,
            "routing_refreshes": 0,
        }

    # ------------------------------------------------------------------ helpers

    def _stub(self, address: str) -> storage_pb2_grpc.StorageServiceStub:
        s = self._stubs.get(address)
        if s is None:
            s = storage_pb2_grpc.StorageServiceStub(self._pool.get(address))  # type: ignore[no-untyped-call]
            self._stubs[address] = s
        return s

    def stub(self, address: str) -> storage_pb2_grpc.StorageServiceStub:
        """The StorageService stub of the node at ``address`` (tools, tests: raw calls)."""
        return self._stub(address)

    def _batcher(self, address: str) -> ReadBatcher:
        """The read batcher of one storage node (reads to it in one loop turn share an RPC)."""
        b = self._batchers.get(address)
        if b is None:

            async def send(
                ios: list[storage_pb2.ReadIO],
                timeout_s: float,
                dests: list[memoryview | None],
            ) -> storage_pb2.BatchReadResponse:
                frames = any(d is not None for d in dests)
                if self.use_read_streams and address not in self._no_stream:
                    stream = self._read_stream(address)
                    if not frames or stream.carries_payload:
                        try:
                            return await stream.request(ios, timeout_s, dests if frames else None)
                        finally:
                            if stream.unsupported:  # an old server: unary from now on
                                self._no_stream.add(address)
                if frames:
                    # frame destinations: the bytes come as the answer's payload
                    req = storage_pb2.BatchReadRequest(ios=ios, client_id=self.client_id)
                    laid = [False]
                    resp, n = await call(
                        self._stub(address).BatchRead,
                        req,
                        timeout=timeout_s,
                        what=f"storage.BatchRead@{address}",
                        into=batch_read_scatter(ios, dests, laid),
                    )
                    if n and not laid[0]:
                        raise FsError(
                            Code.TRANSPORT,
                            f"storage.BatchRead@{address}: payload of {n} bytes does not match "
                            "the answer's read lengths",
                            retryable=True,
                        )
                    return resp  # type: ignore[no-any-return]
                req = storage_pb2.BatchReadRequest(ios=ios, client_id=self.client_id)
                return await call(
                    self._stub(address).BatchRead,
                    req,
                    timeout=timeout_s,
                    what=f"storage.BatchRead@{address}",
                )

            b = self._batchers[address] = ReadBatcher(send)
        return b

    def _read_stream(self, address: str) -> NodeReadStream:
        """The live read stream to ``address``, opened on first use or after a break."""
        st = self._streams.get(address)
        if st is None or st.dead:
            stub = self._stub(address)
            st = NodeReadStream(
                lambda: BidiStream(stub.ReadStream, what=f"storage.ReadStream@{address}"),
                address,
                self.client_id,
                on_dead=self._stream_died,
            )
            self._streams[address] = st
            self.stats["read_streams_opened"] += 1
        return st

    def _stream_died(self, st: NodeReadStream) -> None:
        if self._streams.get(st.address) is st:
            del self._streams[st.address]

    async def close(self) -> None:
        """Close the read streams (call before closing the channel pool)."""
        streams, self._streams = list(self._streams.values()), {}
        await asyncio.gather(*(s.close() for s in streams), return_exceptions=True)
        if self._batchers:
            tasks = [t for b in self._batchers.values() for t in b._tasks]
            await asyncio.gather(*tasks, return_exceptions=True)

    def read_batch_stats(self) -> dict[str, int]:
        """RPCs and ios sent by the read batchers (ios / rpcs = reads per RPC)."""
        out = {"rpcs": 0, "ios": 0}
        for b in self._batchers.values():
            out["rpcs"] += b.stats["rpcs"]
            out["ios"] += b.stats["ios"]
        return out

    async def _on_error(self, err: FsError, _attempt: int) -> None:
        if err.code in _ROUTING_ERRORS:
            self.stats["routing_refreshes"] += 1
            try:
                await self._refresh()
            except FsError as e:
                log.debug("routing refresh failed: %s", e)

    async def _retry(self, attempt: Callable[[int], Awaitable[_T]], what: str) -> _T:
        """``attempt`` under the retry policy, refreshing routing after routing errors.

        The first attempt runs bare: the retry loop (its deadline, a wrapper per
        attempt) is set up only once that failed, so the common I/O that succeeds
        at once (every 4 KiB read of a batch) pays nothing for it.
        """
        run = _routing_lag_retried(attempt)
        try:
            return await attempt(1)
        except FsError as e:
            if not e.retryable and e.code not in _STALE_ROUTING:
                raise
            await self._on_error(e, 1)
        return await retrying(
            lambda n: run(n + 1), self._policy, what=what, on_error=self._on_error
        )

    def _timeout(self, deadline: Deadline) -> float:
        return max(0.05, min(self._policy.rpc_timeout_s, deadline.remaining()))

    async def _bounded(self, coros: Sequence[Awaitable[Any]]) -> list[Any]:
        """Run awaitables with at most ``io_depth`` in flight; first error wins."""
        if len(coros) == 1:
            return [await coros[0]]
        sem = asyncio.Semaphore(self.io_depth)

        async def one(c: Awaitable[Any]) -> Any:
            async with sem:
                return await c

        tasks = [asyncio.ensure_future(one(c)) for c in coros]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _cap(self, inode: int, write: bool) -> bytes:
        """The capability for I/O on ``inode`` (empty when there is no source)."""
        return b"" if self.caps is None else await self.caps.token(inode, write)

    def _cap_refused(self, inode: int, token: bytes, e: FsError, attempt: int) -> FsError:
        """``e`` as the attempt should raise it: a refused capability is dropped and the
        retry fetches a fresh one (an expired grant always; a denied one once, since
        meta answers a real lack of permission with EACCES on the fetch)."""
        if self.caps is None or e.code not in _CAP_ERRORS:
            return e
        self.caps.invalidate(inode, token)
        if e.code == Code.CAPABILITY_EXPIRED or attempt == 1:
            return FsError(e.code, e.message, errno=e.errno, retryable=True)
        return e

    def _head(self, routing: Routing, chain_id: int) -> tuple[int, Any, int]:
        """(head target id, its node, chain version) or a retryable error."""
        with _stale_routing_is_retryable():
            chain = routing.chain(chain_id)
            head = routing.head(chain_id)
            if head is None:
                raise FsError(
                    Code.TARGET_NOT_SERVING,
                    f"chain {chain_id} has no serving target",
                    retryable=True,
                )
            return head, routing.node_of_target(head), int(chain.version)

    def _tag(self, channel: int, seq: int) -> storage_pb2.UpdateTag:
        return storage_pb2.UpdateTag(
            client_id=self.client_id,
            request_id=next(self._request_ids),
            channel_id=channel,
            seqnum=seq,
        )

    # ------------------------------------------------------------------ write

    async def write(
        self,
        inode: int,
        chains: Sequence[int],
        chunk_size: int,
        offset: int,
        data: memoryview | bytes | bytearray,
    ) -> int:
        """Write ``data`` at file ``offset``; returns once every piece is committed."""
        mv = memoryview(data).cast("B")
        pieces = split(offset, len(mv), chunk_size, chains)
        await self._bounded(
            [
                self._write_piece(inode, chunk_size, p, mv[p.buf_offset : p.buf_offset + p.length])
                for p in pieces
            ]
        )
        return len(mv)

    async def _write_piece(
        self, inode: int, chunk_size: int, p: ChunkPiece, data: memoryview
    ) -> storage_pb2.IOResult:
        checksum = crc32c.crc32c(data)
        channel, seq = await self._channels.acquire()
        tag = self._tag(channel, seq)
        deadline = Deadline(self._policy.deadline_s)
        try:

            async def attempt(n: int) -> storage_pb2.WriteResponse:
                if n > 1:
                    self.stats["write_retries"] += 1
                head, node, version = self._head(self._routing(), p.chain_id)
                token = await self._cap(inode, True)
                bulk: memoryview | None = None
                if self._pool.carries_payload and not self.transport.one_sided(node.address, data):
                    bulk, ref, sent = data, frame_ref(len(data)), DONE
                else:
                    ref, sent = await self.transport.write_ref(
                        node.address, node.data_address, data
                    )
                req = storage_pb2.WriteRequest(
                    io=storage_pb2.UpdateIO(
                        chain_id=p.chain_id,
                        chain_version=version,
                        chunk=storage_pb2.ChunkId(inode=inode, index=p.index),
                        type=storage_pb2.UPDATE_WRITE,
                        offset=p.offset,
                        length=p.length,
                        chunk_size=chunk_size,
                        checksum=checksum,
                        data=ref,
                    ),
                    tag=tag,
                    retry_count=n - 1,
                    target_id=head,
                    capability=token,
                )
                try:
                    resp = await call(
                        self._stub(node.address).Write,
                        req,
                        timeout=self._timeout(deadline),
                        what=f"storage.Write@{node.address}",
                        payload=bulk,
                    )
                except FsError as e:
                    e = regions_lost(self.transport, node.address, e)
                    raise self._cap_refused(inode, token, e, n) from None
                finally:
                    await _settle(sent)
                res = resp.result
                # A retry answered from the exactly-once cache may report the chunk's
                # length instead of the bytes written; either proves the piece landed.
                if (
                    res.length != p.length
                    and max(res.length, res.chunk_length) < p.offset + p.length
                ):
                    raise FsError(
                        Code.INTERNAL,
                        f"head wrote {res.length} of {p.length} bytes (chunk length {res.chunk_length})",
                    )
                return resp

            resp = await self._retry(attempt, f"write chunk {inode}:{p.index}")
            return resp.result
        finally:
            await self._channels.release(channel)

    async def write_chunk(
        self,
        inode: int,
        chain_id: int,
        index: int,
        chunk_size: int,
        offset: int,
        data: memoryview | bytes | bytearray,
    ) -> storage_pb2.IOResult:
        """Chunk-level write (tools, tests): ``data`` at ``offset`` of chunk ``index``.

        The same path as :meth:`write`; returns the head's result (commit
        version, chunk length and checksum after the write).
        """
        mv = memoryview(data).cast("B")
        p = ChunkPiece(
            index, chain_id, offset, len(mv), buf_offset=0, file_offset=0
        )  # no file here
        return await self._write_piece(inode, chunk_size, p, mv)

    # ------------------------------------------------------------------ read

    async def read(
        self,
        inode: int,
        chains: Sequence[int],
        chunk_size: int,
        offset: int,
        dest: memoryview | bytearray,
        file_length: int,
    ) -> int:
        """Read into ``dest`` from file ``offset``; bytes up to ``file_length``.

        Returns the number of bytes produced (``min(len(dest), file_length -
        offset)``, 0 at or past EOF). Holes inside the file read as zeros.
        """
        mv = memoryview(dest).cast("B")
        n = max(0, min(len(mv), file_length - offset))
        if n == 0:
            return 0
        index = offset // chunk_size
        if (offset + n - 1) // chunk_size == index:  # one chunk: every FUSE read but a few
            p = ChunkPiece(
                index, chain_of(chains, index), offset - index * chunk_size, n, 0, offset
            )
            view = mv if n == len(mv) else mv[:n]
            failed = await self._read_first(inode, p, view)
            if failed >= 0:  # the full path: replica failover, retries, routing refreshes
                await self._read_piece(inode, p, view, avoid=failed)
            return n
        pieces = split(offset, n, chunk_size, chains)
        await self._bounded(
            [self._read_piece(inode, p, mv[p.buf_offset : p.buf_offset + p.length]) for p in pieces]
        )
        return n

    async def _read_first(self, inode: int, p: ChunkPiece, dest: memoryview) -> int:
        """The first try of a one-chunk read, with none of the retry machinery's setup.

        Returns -1 once ``dest`` holds the bytes; otherwise the target that failed
        (0: none was asked), for :meth:`_read_piece` to start the read over without
        it. Why: a FUSE 4 KiB read is one of these, and the deadline, the attempt
        closures, the routing-error wrapper and the piece list of the general path
        cost more Python than the try itself (the same first try as :meth:`read_many`'s).
        """
        try:
            version, target, node = self._first_replica(self._routing(), p.chain_id)
        except FsError:
            return 0  # stale routing or nobody serving: the full path refreshes and waits
        load = self._target_load
        load[target] = load.get(target, 0) + 1
        token = b""
        try:
            token = await self._cap(inode, False)
            timeout_s = min(self._policy.rpc_timeout_s, self._policy.deadline_s)
            direct = self.transport.read_ref_ready(node.address, dest)
            if direct is not None:  # a staging slot or Iov the node maps: no coroutine chain
                fut = self._queue_read(inode, p, node, target, version, timeout_s, token, direct)
                self._read_done(inode, p, dest, target, await fut, direct, True)
            else:
                fut, ref, complete = await self._submit_read(
                    inode, p, dest, node, target, version, timeout_s, token
                )
                await self._read_result(inode, p, dest, target, await fut, ref, complete, True)
        except FsError as e:
            if e.code in _CAP_ERRORS and self.caps is not None:
                self.caps.invalidate(inode, token)
            self.stats["read_retries"] += 1  # the full path's first attempt is this one's retry
            if e.code in _TRY_OTHER_REPLICA:
                return target
            return 0
        finally:
            self._unload(target)
        return -1

    async def _read_piece(
        self,
        inode: int,
        p: ChunkPiece,
        dest: memoryview,
        *,
        target_id: int = 0,
        holes: bool = True,
        avoid: int = 0,
    ) -> storage_pb2.ReadResult:
        """Read one chunk piece into ``dest``, retrying on another replica when one fails.

        The replica is the least-loaded serving one (fewest of this client's
        reads in flight to it, ties broken at random), so a sequential reader
        with read-ahead keeps every replica's disk busy instead of queueing on
        one. ``target_id`` pins the replica (chunk-level callers comparing
        replicas); then a replica-level failure is raised, not retried
        elsewhere. With ``holes`` a missing chunk or short chunk reads as zeros
        (file semantics); without, ``CHUNK_NOT_FOUND`` is raised and the result
        says how many bytes the chunk had. ``avoid``: a replica that already failed this
        piece (:meth:`_read_first`), tried last.
        """
        deadline = Deadline(self._policy.deadline_s)
        bad: set[int] = {avoid} if avoid else set()  # replicas that failed this piece

        async def attempt(n: int) -> storage_pb2.ReadResult:
            if n > 1:
                self.stats["read_retries"] += 1
            routing = self._routing()
            with _stale_routing_is_retryable():
                chain = routing.chain(p.chain_id)
                if target_id:
                    target = target_id
                else:
                    serving = routing.serving_targets(p.chain_id)
                    if not serving:
                        raise FsError(
                            Code.TARGET_NOT_SERVING,
                            f"chain {p.chain_id} has no serving target",
                            retryable=True,
                        )
                    candidates = [t for t in serving if t not in bad] or serving
                    if len(candidates) == len(serving) and bad:
                        bad.clear()  # every replica failed once: start over
                    target = self._least_loaded(candidates)
                node = routing.node_of_target(target)
            token = await self._cap(inode, False)
            load = self._target_load
            load[target] = load.get(target, 0) + 1
            try:
                return await self._read_once(
                    inode, p, dest, node, target, int(chain.version), deadline, holes, token
                )
            except FsError as e:
                if e.code in _CAP_ERRORS:
                    raise self._cap_refused(inode, token, e, n) from None
                if target_id:
                    if e.code == Code.CHECKSUM_MISMATCH:  # the pinned replica is bad: say so
                        raise FsError(e.code, e.message, errno=e.errno) from e
                    raise
                if e.code in _TRY_OTHER_REPLICA:
                    bad.add(target)
                    if e.code == Code.CHECKSUM_MISMATCH or e.code == Code.INTERNAL:
                        # Another replica may be fine: retry at once (still bounded by the deadline).
                        raise FsError(e.code, e.message, errno=e.errno, retryable=True) from e
                raise
            finally:
                self._unload(target)

        return await self._retry(attempt, f"read chunk {inode}:{p.index}")

    def _first_replica(
        self, routing: Routing, chain_id: int
    ) -> tuple[int, int, mgmtd_pb2.NodeInfo]:
        """Chain version, target and node of a read's first try (the least-loaded serving replica).

        :meth:`_read_first`'s (``read_many`` takes the same steps with per-batch lookups); a missing chain, target or node
        (stale routing) or a chain with nobody serving raises a retryable FsError.
        """
        with _stale_routing_is_retryable():
            version, serving = self._serving(routing, chain_id)
            target = self._least_loaded(serving)
            return version, target, routing.node_of_target(target)

    @staticmethod
    def _serving(routing: Routing, chain_id: int) -> tuple[int, Sequence[int]]:
        """(chain version, its serving targets); FsError if the chain is unknown or none serves."""
        version = int(routing.chain(chain_id).version)
        serving = routing.serving_targets(chain_id)
        if not serving:
            raise FsError(Code.TARGET_NOT_SERVING, "no serving target", retryable=True)
        return version, serving

    def _least_loaded(self, candidates: Sequence[int]) -> int:
        """The candidate with the fewest reads in flight from this client (random among equals)."""
        if len(candidates) == 1:
            return candidates[0]
        get = self._target_load.get
        best: list[int] = []
        low = -1
        for t in candidates:  # one pass, no generator: this runs for every read
            n = get(t, 0)
            if n < low or low < 0:
                low, best = n, [t]
            elif n == low:
                best.append(t)
        return best[0] if len(best) == 1 else best[int(self._rng.random() * len(best))]

    async def read_chunk(
        self,
        inode: int,
        chain_id: int,
        index: int,
        offset: int,
        dest: memoryview | bytearray,
        *,
        target_id: int = 0,
    ) -> storage_pb2.ReadResult:
        """Chunk-level read: committed bytes of chunk ``index`` from ``offset`` into ``dest``.

        For tools and tests that address chunks, not files: the same batching,
        transport and retries as :meth:`read`, but a missing chunk raises
        ``CHUNK_NOT_FOUND`` and a short chunk is not zero-filled (the result's
        ``length`` says how many bytes came). ``target_id`` pins the replica.
        """
        mv = memoryview(dest).cast("B")
        p = ChunkPiece(
            index, chain_id, offset, len(mv), buf_offset=0, file_offset=0
        )  # no file here
        return await self._read_piece(inode, p, mv, target_id=target_id, holes=False)

    async def _read_once(
        self,
        inode: int,
        p: ChunkPiece,
        dest: memoryview,
        node: Any,
        target: int,
        version: int,
        deadline: Deadline,
        holes: bool = True,
        token: bytes = b"",
    ) -> storage_pb2.ReadResult:
        fut, ref, complete = await self._submit_read(
            inode, p, dest, node, target, version, self._timeout(deadline), token
        )
        return await self._read_result(inode, p, dest, target, await fut, ref, complete, holes)

    async def _submit_read(
        self,
        inode: int,
        p: ChunkPiece,
        dest: memoryview,
        node: Any,
        target: int,
        version: int,
        timeout_s: float,
        token: bytes = b"",
    ) -> tuple[asyncio.Future[storage_pb2.ReadResult], DataRef | None, ReadCompletion]:
        """Queue one chunk read on its node's batcher; (its answer, its ref or None for a frame, completion).

        The bytes travel one-sided (shm: the server writes dest itself) when the
        transport can for this node and buffer, else as the frame's payload
        received straight into dest (native RPC), else inline (gRPC).
        """
        complete: ReadCompletion = _noop_complete
        # the steady state of a USRBIO ring: its Iov already mapped by the node, no setup
        ready = self.transport.read_ref_ready(node.address, dest)
        frame = False
        if ready is not None:
            ref = ready
        else:
            frame = self._pool.carries_payload and not self.transport.one_sided(node.address, dest)
            if frame:
                ref = frame_ref(len(dest))
            else:
                ref, complete = await self.transport.read_ref(node.address, node.data_address, dest)
        fut = self._queue_read(
            inode, p, node, target, version, timeout_s, token, ref, dest if frame else None
        )
        return fut, None if frame else ref, complete

    def _queue_read(
        self,
        inode: int,
        p: ChunkPiece,
        node: Any,
        target: int,
        version: int,
        timeout_s: float,
        token: bytes,
        ref: DataRef,
        frame_dest: memoryview | None = None,
    ) -> asyncio.Future[storage_pb2.ReadResult]:
        """Queue one chunk read whose destination ``ref`` is settled on its node's batcher.

        ``frame_dest``: the buffer a frame-destined read's bytes are received into.
        """
        io = storage_pb2.ReadIO(
            chain_id=p.chain_id,
            chain_version=version,
            chunk=storage_pb2.ChunkId(inode=inode, index=p.index),
            offset=p.offset,
            length=p.length,
            dest=ref,
            target_id=target,
            capability=token,
        )
        # One BatchRead per node per loop turn carries every read issued meanwhile (see ReadBatcher).
        return self._batcher(node.address).submit(io, timeout_s, frame_dest)

    async def _read_result(
        self,
        inode: int,
        p: ChunkPiece,
        dest: memoryview,
        target: int,
        r: storage_pb2.ReadResult,
        ref: DataRef | None,
        complete: ReadCompletion,
        holes: bool,
    ) -> storage_pb2.ReadResult:
        """Check one answer and finish its bytes in ``dest`` (holes as zeros with ``holes``)."""
        if complete is not _noop_complete and not r.error.code and ref is not None:
            if not is_inline(ref) and int(r.length) <= len(dest):
                await complete(int(r.length))  # staged: copy into dest before the check
        return self._read_done(inode, p, dest, target, r, ref, holes)

    def _read_done(
        self,
        inode: int,
        p: ChunkPiece,
        dest: memoryview,
        target: int,
        r: storage_pb2.ReadResult,
        ref: DataRef | None,
        holes: bool,
    ) -> storage_pb2.ReadResult:
        """:meth:`_read_result` once the bytes are in ``dest`` (or inline in ``r``): no await,
        so a batch of one-sided reads is finished without a coroutine per read."""
        err = r.error
        if err.code:
            if err.code == Code.CHUNK_NOT_FOUND and holes:
                dest[:] = bytes(len(dest))  # a hole
                return r
            raise FsError(err.code, err.message, errno=err.errno or None, retryable=err.retryable)
        got = r.length
        if got > len(dest):
            raise FsError(
                Code.INTERNAL, f"replica returned {got} bytes for a {len(dest)}-byte read"
            )
        if ref is not None and is_inline(ref):
            if len(r.data) != got:
                raise FsError(
                    Code.TRANSPORT,
                    f"inline payload of {len(r.data)} bytes, header says {got}",
                    retryable=True,
                )
            dest[:got] = r.data
        if (
            self.verify_read_checksums
            and got
            and crc32c.crc32c(dest if got == len(dest) else dest[:got]) != r.checksum
        ):
            self.stats["checksum_errors"] += 1
            raise FsError(
                Code.CHECKSUM_MISMATCH,
                f"chunk {inode}:{p.index} from target {target}: checksum mismatch",
                retryable=True,
            )
        if got < len(dest) and holes:
            dest[got:] = bytes(len(dest) - got)  # short chunk: the rest is a hole
        return r

    async def read_many(
        self, reads: Sequence[ReadRequest], on_done: ReadsDone | None = None
    ) -> list[int | BaseException]:
        """Several file reads at once (a USRBIO ring batch); one result per read:
        the byte count (as :meth:`read`) or that read's own exception.

        Why: with 64 reads of 4 KiB in flight the per-read Python work is the
        cost. A read inside one chunk is queued straight on its node's batcher
        (no task, no retry-loop setup per read); a read that spans chunks, or
        whose first try fails, takes the full :meth:`read` path (replica
        failover, retries) on its own.

        ``on_done([(i, result), ...])`` is called as reads finish, once per group
        that finished together (one node's answer), before the whole batch is
        done: a USRBIO ring completes each I/O as soon as its bytes are there
        instead of waiting for the slowest read of the batch (which kept a ring
        in lockstep: 64 I/Os out, wait for all, 64 more).
        """
        out: list[int | BaseException] = [0] * len(reads)
        # finished reads, by index: a queued read's answer (its future) or a full-path read
        ready: collections.deque[tuple[int, asyncio.Future[Any]]] = collections.deque()
        wake = asyncio.Event()
        queued: dict[
            int, tuple[ChunkPiece, memoryview, int, Any, ReadCompletion, asyncio.Future[Any]]
        ] = {}
        slow: dict[int, asyncio.Future[int]] = {}
        routing = self._routing()
        load = self._target_load
        timeout_s = min(self._policy.rpc_timeout_s, self._policy.deadline_s)
        serving: dict[int, tuple[int, Sequence[int]]] = {}
        nodes: dict[int, mgmtd_pb2.NodeInfo] = {}
        tokens: dict[int, bytes] = {}

        def arrived(i: int, fut: asyncio.Future[Any]) -> None:
            ready.append((i, fut))
            wake.set()

        def full_path(i: int) -> None:
            inode, chains, chunk_size, offset, dest, file_length = reads[i]
            t = asyncio.ensure_future(
                self.read(inode, chains, chunk_size, offset, dest, file_length)
            )
            slow[i] = t
            t.add_done_callback(functools.partial(arrived, i))

        finished: list[tuple[int, int | BaseException]] = []
        for i, (inode, chains, chunk_size, offset, dest, file_length) in enumerate(reads):
            mv = memoryview(dest).cast("B")
            n = max(0, min(len(mv), file_length - offset))
            if n == 0:
                finished.append((i, 0))
                continue
            index = offset // chunk_size
            if (offset + n - 1) // chunk_size != index:
                full_path(i)
                continue
            chain_id = chain_of(chains, index)
            p = ChunkPiece(index, chain_id, offset - index * chunk_size, n, 0, offset)
            view = mv if n == len(mv) else mv[:n]
            try:
                # once per chain, node and inode in a batch: the routing snapshot and the
                # capability do not change within it; the replica is picked per read
                chain = serving.get(chain_id)
                if chain is None:
                    chain = serving[chain_id] = self._serving(routing, chain_id)
                version, candidates = chain
                target = self._least_loaded(candidates)
                node = nodes.get(target)
                if node is None:
                    node = nodes[target] = routing.node_of_target(target)
                token = tokens.get(inode)
                if token is None:
                    token = tokens[inode] = await self._cap(inode, False)
                # the steady state of a USRBIO ring (its Iov mapped by the node): no await
                direct = self.transport.read_ref_ready(node.address, view)
                complete: ReadCompletion = _noop_complete
                if direct is not None:
                    fut = self._queue_read(
                        inode, p, node, target, version, timeout_s, token, direct
                    )
                    ref: DataRef | None = direct
                else:
                    fut, ref, complete = await self._submit_read(
                        inode, p, view, node, target, version, timeout_s, token
                    )
            except FsError:
                full_path(i)
                continue
            load[target] = load.get(target, 0) + 1
            queued[i] = (p, view, target, ref, complete, fut)
            fut.add_done_callback(functools.partial(arrived, i))
        if finished and on_done is not None:
            on_done(finished)
        try:
            while queued or slow:
                if not ready:
                    await wake.wait()
                    wake.clear()
                finished = []
                while ready:
                    i, got = ready.popleft()
                    if i in slow:
                        del slow[i]
                        r: int | BaseException = (
                            FsError(Code.CANCELLED, "read cancelled")
                            if got.cancelled()
                            else (got.exception() or got.result())
                        )
                        out[i] = r
                        finished.append((i, r))
                        continue
                    p, view, target, ref, complete, _ = queued.pop(i)
                    self._unload(target)
                    try:
                        if got.cancelled():
                            raise FsError(Code.CANCELLED, "read cancelled", retryable=True)
                        if complete is _noop_complete:
                            self._read_done(reads[i][0], p, view, target, got.result(), ref, True)
                        else:
                            await self._read_result(
                                reads[i][0], p, view, target, got.result(), ref, complete, True
                            )
                    except FsError:  # the full path: another replica, retries, or this error
                        full_path(i)
                        continue
                    out[i] = p.length
                    finished.append((i, p.length))
                if finished and on_done is not None:
                    on_done(finished)
        finally:
            if queued or slow:  # cancelled: nothing of this batch may outlive it
                for _p, _view, target, _ref, _complete, pending in queued.values():
                    self._unload(target)
                    pending.cancel()
                queued.clear()
                for t in slow.values():
                    t.cancel()
                await asyncio.gather(*slow.values(), return_exceptions=True)
        return out

    def _unload(self, target: int) -> None:
        """One read to ``target`` finished (see :meth:`_least_loaded`)."""
        left = self._target_load[target] - 1
        if left:
            self._target_load[target] = left
        else:
            del self._target_load[target]

    # ------------------------------------------------------------------ truncate / remove

    async def truncate(
        self, inode: int, chains: Sequence[int], chunk_size: int, new_size: int
    ) -> None:
        """Drop file data past ``new_size`` on every replica.

        Chunks wholly past the new end are removed; the chunk containing the new
        end is cut to it. A later extension therefore reads zeros, never stale bytes.
        """
        first = chunks_from(new_size, chunk_size)
        await self.remove_chunks(inode, chains, first)
        if new_size % chunk_size:
            idx = new_size // chunk_size
            await self.truncate_chunk(
                inode, chain_of(chains, idx), idx, new_size % chunk_size, chunk_size
            )

    async def remove_chunks(
        self, inode: int, chains: Sequence[int], begin: int = 0, end: int = 0
    ) -> int:
        """Remove chunks with ``begin <= index < end`` (end 0: no limit) on every chain of the stripe."""
        counts = await self._bounded(
            [self._remove_on_chain(inode, c, begin, end) for c in dict.fromkeys(chains)]
        )
        return sum(counts)

    async def zero_range(
        self, inode: int, chains: Sequence[int], chunk_size: int, start: int, end: int
    ) -> None:
        """Make file bytes [start, end) read as zeros on every replica (punch hole, zero range).

        Chunks wholly inside the range are removed (their space is freed; a
        missing chunk reads as zeros); the partial chunks at either edge get a
        write of zeros over their part, through the chain like any write, so
        every replica holds the same bytes. Callers keep ``end`` within the
        file's length: a zero write never makes a chunk longer than the file.
        """
        if end <= start:
            return
        first_whole = -(-start // chunk_size)
        end_whole = end // chunk_size
        pieces: list[tuple[int, int]] = []
        if first_whole >= end_whole:
            pieces.append((start, end))
        else:
            await self.remove_chunks(inode, chains, first_whole, end_whole)
            if start < first_whole * chunk_size:
                pieces.append((start, first_whole * chunk_size))
            if end_whole * chunk_size < end:
                pieces.append((end_whole * chunk_size, end))
        for a, b in pieces:
            await self.write(inode, chains, chunk_size, a, bytes(b - a))

    async def allocate(
        self, inode: int, chains: Sequence[int], chunk_size: int, start: int, end: int
    ) -> None:
        """Zero-extend every chunk under [start, end) to cover it (fallocate's allocation).

        Replicated EXTEND updates: they never shrink a chunk nor touch its bytes.
        """
        first = start // chunk_size
        last = (end - 1) // chunk_size
        await self._bounded(
            [
                self.truncate_chunk(
                    inode,
                    chain_of(chains, idx),
                    idx,
                    min(chunk_size, end - idx * chunk_size),
                    chunk_size,
                    only_extend=True,
                )
                for idx in range(first, last + 1)
            ]
        )

    async def truncate_chunk(
        self,
        inode: int,
        chain_id: int,
        index: int,
        length: int,
        chunk_size: int,
        *,
        only_extend: bool = False,
    ) -> None:
        """Chunk-level truncate (``only_extend``: zero-extend, never shrink) on every replica."""
        await self._update_at_head(
            inode,
            chain_id,
            "TruncateChunks",
            storage_pb2.TruncateChunksRequest,
            storage_pb2.TruncateChunkOp,
            f"truncate chunk {inode}:{index}",
            chunk=storage_pb2.ChunkId(inode=inode, index=index),
            length=length,
            chunk_size=chunk_size,
            only_extend=only_extend,
        )

    async def _remove_on_chain(self, inode: int, chain_id: int, begin: int, end: int = 0) -> int:
        total = 0
        while True:
            removed, more = await self._remove_once(inode, chain_id, begin, end)
            total += removed
            if not more:
                return total

    async def _remove_once(
        self, inode: int, chain_id: int, begin: int, end: int = 0
    ) -> tuple[int, bool]:
        r = await self._update_at_head(
            inode,
            chain_id,
            "RemoveChunks",
            storage_pb2.RemoveChunksRequest,
            storage_pb2.RemoveChunksOp,
            f"remove chunks {inode} on chain {chain_id}",
            range=storage_pb2.ChunkRange(inode=inode, begin=begin, end=end),
        )
        return int(r.removed), bool(r.more)

    async def _update_at_head(
        self,
        inode: int,
        chain_id: int,
        method: str,
        request_type: type[Any],
        op_type: type[Any],
        what: str,
        **fields: Any,
    ) -> Any:
        """Send a one-op chunk update (``method`` of the storage service) to the chain's
        head under the retry policy and return the op's result; a missing chunk is
        not an error. The op is ``op_type(**fields)`` plus the chain, its version, the
        update tag (the same for every attempt) and the capability (looked up again
        for each attempt, as routing is)."""
        channel, seq = await self._channels.acquire()
        tag = self._tag(channel, seq)
        deadline = Deadline(self._policy.deadline_s)
        try:

            async def attempt(n: int) -> Any:
                _head, node, version = self._head(self._routing(), chain_id)
                token = await self._cap(inode, True)
                op = op_type(
                    chain_id=chain_id, chain_version=version, tag=tag, capability=token, **fields
                )
                resp = await call(
                    getattr(self._stub(node.address), method),
                    request_type(ops=[op]),
                    timeout=self._timeout(deadline),
                    what=f"storage.{method}@{node.address}",
                )
                r = resp.results[0]
                if r.error.code and r.error.code != Code.CHUNK_NOT_FOUND:
                    raise self._cap_refused(inode, token, _item_error(r.error), n)
                return r

            return await self._retry(attempt, what)
        finally:
            await self._channels.release(channel)

    # ------------------------------------------------------------------ length

    async def query_last_chunk(self, inode: int, chain_id: int) -> storage_pb2.QueryLastChunkResult:
        """The last chunk of ``inode`` on one chain, as the chain's tail sees it (committed data)."""
        deadline = Deadline(self._policy.deadline_s)

        async def attempt(n: int) -> storage_pb2.QueryLastChunkResult:
            token = await self._cap(inode, False)
            routing = self._routing()
            with _stale_routing_is_retryable():
                chain = routing.chain(chain_id)
                serving = routing.serving_targets(chain_id)
                if not serving:
                    raise FsError(
                        Code.TARGET_NOT_SERVING,
                        f"chain {chain_id} has no serving target",
                        retryable=True,
                    )
                node = routing.node_of_target(serving[-1])  # the tail holds only committed data
            req = storage_pb2.QueryLastChunkRequest(
                ops=[
                    storage_pb2.QueryLastChunkOp(
                        chain_id=chain_id,
                        chain_version=int(chain.version),
                        range=storage_pb2.ChunkRange(inode=inode, begin=0, end=0),
                        capability=token,
                    )
                ]
            )
            resp = await call(
                self._stub(node.address).QueryLastChunk,
                req,
                timeout=self._timeout(deadline),
                what=f"storage.QueryLastChunk@{node.address}",
            )
            r = resp.results[0]
            if r.error.code and r.error.code != Code.CHUNK_NOT_FOUND:
                raise self._cap_refused(inode, token, _item_error(r.error), n)
            return r

        return await self._retry(attempt, f"query length {inode} on chain {chain_id}")

    async def query_length(self, inode: int, chains: Sequence[int], chunk_size: int) -> int:
        """File length as storage sees it: max over chains of last chunk end.

        See docs/architecture.md#file-length.
        """

        async def one(chain_id: int) -> int:
            r = await self.query_last_chunk(inode, chain_id)
            if not r.found:
                return 0
            return int(r.last_index) * chunk_size + int(r.last_length)

        lengths = await self._bounded([one(c) for c in dict.fromkeys(chains)])
        return max(lengths, default=0)

    async def list_chunks(self, target_id: int) -> list[storage_pb2.ChunkMeta]:
        """Every chunk's metadata on one target (tools and tests comparing replicas)."""
        node = self._routing().node_of_target(target_id)
        resp = await call(
            self._stub(node.address).ListChunks,
            storage_pb2.ListChunksRequest(target_id=target_id),
            timeout=self._policy.rpc_timeout_s,
            what=f"storage.ListChunks@{node.address}",
        )
        return list(resp.metas)


def _item_error(e: Any) -> FsError:
    """The FsError of a per-item ``ErrorDetail`` in a batch answer."""
    return FsError(e.code, e.message, errno=e.errno or None, retryable=e.retryable)


def _frame_bytes(
    ios: Sequence[storage_pb2.ReadIO],
    dests: Sequence[memoryview | None],
    resp: storage_pb2.BatchReadResponse,
) -> int:
    """Bytes an answer says it sent as payload for the frame-destined reads."""
    return sum(
        r.length
        for d, r in zip(dests, resp.results, strict=False)
        if d is not None and not r.error.code
    )


_STALE_ROUTING = frozenset({Code.UNKNOWN_CHAIN, Code.UNKNOWN_TARGET, Code.UNKNOWN_NODE})


@contextlib.contextmanager
def _stale_routing_is_retryable() -> Iterator[None]:
    """A chain/target/node missing from *our* routing means it is stale: refresh and retry."""
    try:
        yield
    except FsError as e:
        if e.code in _STALE_ROUTING and not e.retryable:
            raise FsError(e.code, e.message, retryable=True) from None
        raise


def _routing_lag_retried(
    attempt: Callable[[int], Awaitable[_T]],
) -> Callable[[int], Awaitable[_T]]:
    """``attempt`` with UNKNOWN_CHAIN/TARGET/NODE made retryable, ours or the server's.

    A storage node refuses a chain it does not know yet when its routing lags
    the client's (a chain table just created, a target just moved); like a
    chain version mismatch that clears once routing settles, so it is retried
    (after a refresh, :data:`_ROUTING_ERRORS`) until the deadline.
    """

    async def run(n: int) -> _T:
        with _stale_routing_is_retryable():
            return await attempt(n)

    return run


async def _settle(sent: Awaitable[None]) -> None:
    """Wait for the transport's send side; its failure only matters if the RPC succeeded."""
    try:
        await sent
    except FsError:
        raise
    except asyncio.CancelledError:
        raise
    except Exception as e:  # pragma: no cover - defensive
        raise FsError(Code.TRANSPORT, f"payload send failed: {e}", retryable=True) from e
