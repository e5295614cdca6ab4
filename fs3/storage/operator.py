"""Storage operations behind the RPCs (the servicer in service.py only forwards here).

Reads (docs/architecture.md#data-flow-of-a-read): any target that is locally
UPTODATE serves the *last committed* version of a chunk — staged updates live apart (COW), so a
reader never sees a half-applied write and never has to ask the tail. Every read
verifies the per-block CRC32Cs covering the requested range (see
``chunk_engine``); a mismatch is reported to mgmtd (``ReportTargetError``),
answered with CHECKSUM_MISMATCH so the client reads another replica, and the
chunk is repaired in the background from another serving replica of the chain.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

from fs3.errors import Code, FsError, invalid
from fs3.limits import (
    MAX_CHUNK_OPS,
    MAX_CHUNK_SIZE,
    MAX_READ_BATCH_BYTES,
    MAX_READ_IOS,
    MAX_REMOVE_PER_CALL,
)
from fs3.logs import event
from fs3.proto import common_pb2, storage_pb2
from fs3.routing import SERVING, SYNCING
from fs3.rpc.channel import call
from fs3.security.capability import READ, WRITE, CapabilityVerifier
from fs3.storage import metrics as M
from fs3.storage.chunk_engine import ChunkKey, ChunkMeta, crc32c
from fs3.storage.craq import EXTEND, REMOVE, TRUNCATE, Replicator, io_result, is_inline
from fs3.storage.crc_combine import combined_crc
from fs3.storage.target import L_ONLINE, StorageTarget, TargetMap
from fs3.transport.base import ref_kind

log = logging.getLogger("fs3.storage.operator")

# Requests (batches) of one ReadStream served or answered-but-not-yet-sent at once;
# the stream stops reading further requests until the client has taken an answer
# (flow control back to a client that stops reading, instead of a growing queue).
READ_STREAM_MAX_INFLIGHT = 64
# Bytes of one ReadStream's requests being read or waiting to be sent, together.
READ_STREAM_MAX_BYTES = 4 * MAX_READ_BATCH_BYTES
INLINE_READ_MAX = (
    64 << 10
)  # reads up to this size try the page cache on the event loop (RWF_NOWAIT)
# Small reads of one request that need the disk go to the I/O pool this many per job:
# one thread hop per group instead of per read, several groups of a batch in flight at
# once (large reads go one per job: _read_groups).
READ_GROUP = 4
# After this many page-cache misses in a row only one small read in _COLD_PROBE tries
# the page cache on the loop (see StorageOperator._try_cache).
_COLD_STREAK = 8
_COLD_PROBE = 8
_ALL = 0xFFFFFFFF


class ByteBudget:
    """Bytes that may be in use at once; :meth:`acquire` waits (first come, first
    served) until enough are free; :meth:`release` is synchronous, so ``finally``
    blocks and generators can give bytes back.

    A request larger than the whole budget takes all of it (it runs alone),
    so a big request is slowed, never refused or deadlocked.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, n: int) -> int:
        n = max(0, min(n, self.total))
        if not self._waiters and self.free >= n:
            self.free -= n
            return n
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted as we were cancelled: give it back
            else:
                self._waiters.remove((n, fut))
                self._wake()
            raise
        return n

    def release(self, n: int) -> None:
        self.free += n
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.free:
            n, fut = self._waiters.popleft()
            if not fut.done():
                self.free -= n
                fut.set_result(None)


def read_bytes_asked(req: storage_pb2.BatchReadRequest) -> int:
    """What a read request may make the server hold; refuses one over the limits first."""
    if len(req.ios) > MAX_READ_IOS:
        raise invalid(f"batch of {len(req.ios)} reads exceeds {MAX_READ_IOS}")
    total = 0
    for io in req.ios:
        if io.length > MAX_CHUNK_SIZE:
            raise invalid(
                f"read of {io.length} bytes exceeds the chunk size limit {MAX_CHUNK_SIZE}"
            )
        total += io.length
    if total > MAX_READ_BATCH_BYTES:
        raise invalid(f"batch asks for {total} bytes, more than {MAX_READ_BATCH_BYTES}")
    return total


def check_op_count(ops: Any, what: str) -> None:
    if len(ops) > MAX_CHUNK_OPS:
        raise invalid(f"{what} of {len(ops)} ops exceeds {MAX_CHUNK_OPS}")


@functools.cache
def _read_metrics(target_id: int) -> tuple[Any, Any, Any]:
    """A target's read counters and the read latency histogram (a ``labels()``
    lookup per read costs more than the read of a cached 4 KiB block)."""
    tid = str(target_id)
    return M.OPS.labels(tid, "read", "ok"), M.BYTES.labels(tid, "read"), M.LATENCY.labels("read")


@dataclasses.dataclass(slots=True)
class _Blocked:
    """A read of a batch that needs the I/O pool (or was served from the page cache).

    ``view``: the shared-memory destination the bytes go straight into (None: the
    engine returns bytes).
    """

    index: int
    io: storage_pb2.ReadIO
    t: StorageTarget
    key: ChunkKey
    view: memoryview | None


def _read_sync(b: _Blocked, *, nowait: bool = False) -> Any:
    """The engine read of ``b``: (meta, byte count) into ``b.view``, else (meta, bytes).

    An engine or range that cannot read into the view (``read_into`` gives None)
    reads bytes instead, and the view is dropped (the bytes are then delivered).
    """
    io = b.io
    if b.view is not None:
        got = b.t.engine.read_into(b.key, io.offset, io.length, b.view, nowait=nowait)
        if got is not None:
            return got
        _release(b.view)
        b.view = None
    return b.t.engine.read(b.key, io.offset, io.length, nowait=nowait)


def _read_group(group: list[_Blocked]) -> list[Any]:
    """Run in the I/O pool: every read of ``group``; its result or its own exception."""
    out: list[Any] = []
    for b in group:
        try:
            out.append(_read_sync(b))
        except Exception as e:  # that read's alone: the others of the group go on
            out.append(e)
    return out


def _read_groups(blocked: list[_Blocked]) -> list[list[_Blocked]]:
    """The I/O pool jobs of a request's disk reads: small ones :data:`READ_GROUP` per
    job, each large one (over :data:`INLINE_READ_MAX`) alone.

    Why apart: grouping pays where the thread hop costs more than the read (4 KiB);
    a large read costs the disk far more than the hop, and reads of one job run one
    after another, so grouping them would cut the disk's queue depth (sequential
    USRBIO and checkpoint loads send a few MiB-sized reads per request).
    """
    small = [b for b in blocked if b.io.length <= INLINE_READ_MAX]
    groups = [small[k : k + READ_GROUP] for k in range(0, len(small), READ_GROUP)]
    if len(small) < len(blocked):
        groups.extend([b] for b in blocked if b.io.length > INLINE_READ_MAX)
    return groups


def _range_crc(bs: int, meta: ChunkMeta, offset: int, n: int) -> int | None:
    """The CRC of ``n`` bytes read at ``offset`` without a pass over them, where known:
    the whole chunk's, or (a range on checksum-block boundaries, whose blocks the engine
    has just verified against ``meta.block_crcs``) the blocks' CRCs combined
    (:func:`combined_crc`). None: the caller checksums the bytes."""
    if offset == 0 and n == meta.length:
        return meta.checksum
    end = offset + n
    if n <= 0 or offset % bs or (end % bs and end != meta.length):
        return None  # unaligned: its covering blocks were verified in scratch, not these bytes
    count = -(-n // bs)
    return combined_crc(meta.block_crcs, offset // bs, count, bs, n - (count - 1) * bs)


async def _one(job: Awaitable[list[Any]]) -> list[list[Any]]:
    """``job``'s outcome as the one-group list :func:`asyncio.gather` would give."""
    return [await job]


def _release(view: memoryview) -> None:
    with contextlib.suppress(BufferError):  # a cancelled worker may still hold it; GC frees it
        view.release()


def error_detail(e: FsError) -> common_pb2.ErrorDetail:
    return common_pb2.ErrorDetail(
        code=int(e.code), errno=e.errno, message=e.message, retryable=e.retryable
    )


def chunk_meta_pb(m: ChunkMeta) -> storage_pb2.ChunkMeta:
    out = storage_pb2.ChunkMeta(
        commit_ver=m.commit_ver,
        update_ver=m.update_ver,
        chain_ver=m.chain_ver,
        length=m.length,
        checksum=m.checksum,
        uncommitted=m.uncommitted,
    )
    out.chunk.inode, out.chunk.index = m.key.inode, m.key.index
    return out


class StorageOperator:
    """Everything the storage RPCs do, for one node.

    Args:
        node_id: this node's id (for error reports).
        targets: the node's targets.
        replicator: the CRAQ write path.
        report_error: ``await report_error(target_id, kind, detail)`` tells mgmtd.
        on_local_change: called when a local state changed (heartbeat now).
        read_buffer_bytes: bytes all reads of the node may hold at once.
    """

    def __init__(
        self,
        node_id: int,
        targets: TargetMap,
        replicator: Replicator,
        report_error: Callable[[int, str, str], Awaitable[None]],
        on_local_change: Callable[[], None],
        *,
        read_buffer_bytes: int = 1 << 30,
    ) -> None:
        self.node_id = node_id
        self.targets = targets
        self.rep = replicator
        self.report_error = report_error
        self.on_local_change = on_local_change
        self._repairs: dict[tuple[int, ChunkKey], asyncio.Task[None]] = {}
        # Chunk capabilities (fs3/security/capability.py): None when the cluster has
        # no secret, and then nothing is checked (a cluster without authentication).
        self.caps: CapabilityVerifier | None = None
        # Bytes the node's reads may hold at once (``[storage] read_buffer_bytes``): many
        # concurrent requests, each within the per-request limit, wait instead of piling up.
        self.read_budget = ByteBudget(read_buffer_bytes)
        # page-cache misses in a row of small reads, and the probe count (_try_cache)
        self._miss_streak = 0
        self._probe = 0

    # ------------------------------------------------------------------ capabilities

    def _check(self, token: bytes, inode: int, first: int, last: int, need: int, what: str) -> None:
        """Refuse (PERMISSION_DENIED / CAPABILITY_EXPIRED) unless ``token`` covers the chunks."""
        if self.caps is not None:
            self.caps.check(token, inode, first, last, need, what)

    def _check_service(self, token: bytes, what: str) -> None:
        if self.caps is not None:
            self.caps.check_service(token, what)

    def _check_range(self, token: bytes, rg: storage_pb2.ChunkRange, need: int, what: str) -> None:
        end = rg.end or _ALL
        if end <= rg.begin:
            raise invalid(f"{what}: empty chunk range [{rg.begin}, {end})")
        self._check(token, rg.inode, rg.begin, end - 1, need, what)

    # ------------------------------------------------------------------ writes

    async def write(
        self, req: storage_pb2.WriteRequest, frame: memoryview | None = None
    ) -> storage_pb2.WriteResponse:
        """``frame``: the request's bulk payload (what a ``frame`` DataRef names)."""
        ch = req.io.chunk
        self._check(req.capability, ch.inode, ch.index, ch.index, WRITE, "Write")
        res = await self.rep.client_update(req.io, req.tag, req.target_id, frame)
        return storage_pb2.WriteResponse(result=res)

    async def update(
        self, req: storage_pb2.UpdateRequest, frame: memoryview | None = None
    ) -> storage_pb2.UpdateResponse:
        # Only a chain member forwards updates: a client sending Update straight to a
        # successor would otherwise bypass the head's capability check.
        self._check_service(req.capability, "Update")
        res = await self.rep.successor_update(req, frame)
        return storage_pb2.UpdateResponse(result=res)

    async def truncate_chunks(
        self, req: storage_pb2.TruncateChunksRequest
    ) -> storage_pb2.TruncateChunksResponse:
        check_op_count(req.ops, "TruncateChunks")
        out = storage_pb2.TruncateChunksResponse()
        for op in req.ops:
            io = storage_pb2.UpdateIO(
                chain_id=op.chain_id,
                chain_version=op.chain_version,
                type=EXTEND if op.only_extend else TRUNCATE,
                length=op.length,
                chunk_size=op.chunk_size,
            )
            io.chunk.CopyFrom(op.chunk)
            r = out.results.add()
            try:
                ch = op.chunk
                self._check(op.capability, ch.inode, ch.index, ch.index, WRITE, "TruncateChunks")
                r.result.CopyFrom(await self.rep.client_update(io, op.tag))
            except FsError as e:
                r.error.CopyFrom(error_detail(e))
        return out

    async def remove_chunks(
        self, req: storage_pb2.RemoveChunksRequest
    ) -> storage_pb2.RemoveChunksResponse:
        check_op_count(req.ops, "RemoveChunks")
        out = storage_pb2.RemoveChunksResponse()
        for op in req.ops:
            r = out.results.add()
            try:
                self._check_range(op.capability, op.range, WRITE, "RemoveChunks")
                r.removed, r.more = await self._remove_range(op)
            except FsError as e:
                r.error.CopyFrom(error_detail(e))
        return out

    async def _remove_range(self, op: storage_pb2.RemoveChunksOp) -> tuple[int, bool]:
        t = self.targets.by_chain(op.chain_id)
        self.rep.check_version(t, op.chain_version)
        self.rep.check_head(t)
        rg = op.range
        end = rg.end or _ALL
        limit = min(rg.max_chunks or 32, MAX_REMOVE_PER_CALL)
        metas = t.engine.list(rg.inode, rg.begin, end)
        removed = 0
        for m in metas[:limit]:
            io = storage_pb2.UpdateIO(
                chain_id=op.chain_id, chain_version=op.chain_version, type=REMOVE
            )
            io.chunk.inode, io.chunk.index = m.key.inode, m.key.index
            await self.rep.client_update(io, storage_pb2.UpdateTag())
            removed += 1
        return removed, len(metas) > limit

    # ------------------------------------------------------------------ reads

    async def batch_read(
        self, req: storage_pb2.BatchReadRequest, reply: list[Any] | None = None
    ) -> storage_pb2.BatchReadResponse:
        """Serve every io; ``reply`` (a call that can answer with a bulk payload) gets
        the bytes of the ios with a ``frame`` destination, in io order, each
        ``results[i].length`` long (the client lays the payload out by that)."""
        cost = await self.read_budget.acquire(read_bytes_asked(req))
        try:
            return await self._batch_read(req, reply)
        finally:
            self.read_budget.release(cost)

    async def _batch_read(
        self, req: storage_pb2.BatchReadRequest, reply: list[Any] | None
    ) -> storage_pb2.BatchReadResponse:
        """Every io of one request: page-cache reads inline, the rest in a few thread jobs.

        Why this shape (3FS serves a batch of reads the same way, with one AIO
        submission): a 4 KiB read costs the disk little and Python a lot, so the
        per-io overhead of a task, an executor future and a thread wake-up each
        is what limits IOPS. Each io is started synchronously (checks, then a
        ``RWF_NOWAIT`` read from the page cache); the ios that need the disk go
        to the I/O pool in groups of up to :data:`READ_GROUP` (one hop per group,
        several groups in flight so the disk still sees many reads at once), and
        are finished (checksum, answer) back on the loop.
        """
        started = time.perf_counter()
        ios = req.ios
        slots: list[Any] | None = [None] * len(ios) if reply is not None else None
        results: list[Any] = [None] * len(ios)  # a ReadResult each, once served
        blocked: list[_Blocked] = []
        hits: list[tuple[_Blocked, Any]] = []
        dest_view = getattr(self.rep.payload, "shm_dest_view", None)
        for i, io in enumerate(ios):
            r = self._read_start(io, slots, i, dest_view)
            if isinstance(r, _Blocked):
                blocked.append(r)
            elif isinstance(r, tuple):
                hits.append(r)
            else:
                results[i] = r
        served: list[tuple[StorageTarget, int]] = []
        pool: Awaitable[list[list[Any]]] | None = None
        groups: list[list[_Blocked]] = []
        if blocked:
            groups = _read_groups(blocked)
            if len(groups) == 1 and not hits:  # one job (a lone read): no task around it
                pool = _one(self.rep.run_blocking(_read_group, groups[0]))
            else:  # the disk reads start before the page-cache hits are answered
                pool = asyncio.gather(*(self.rep.run_blocking(_read_group, g) for g in groups))
        try:
            for b, got in hits:
                results[b.index] = await self._read_finish(b, got, slots, served)
            if pool is not None:
                for group, outcomes in zip(groups, await pool, strict=True):
                    for b, got in zip(group, outcomes, strict=True):
                        results[b.index] = await self._read_finish(b, got, slots, served)
        except BaseException:  # cancelled: a worker may still hold a view; GC frees it
            if isinstance(pool, asyncio.Future):
                pool.cancel()
            elif pool is not None:
                pool.close()  # type: ignore[attr-defined]  # a coroutine never awaited
            for b in blocked:
                v = b.view  # read once: a pool thread still running may drop it meanwhile
                if v is not None:
                    _release(v)
            raise
        self._count_reads(served, started)
        if reply is not None and slots is not None:
            reply.extend(d for d in slots if d is not None and len(d))
        return storage_pb2.BatchReadResponse(results=results)

    async def read_stream(
        self,
        requests: AsyncIterable[storage_pb2.BatchReadRequest],
        max_inflight: int = READ_STREAM_MAX_INFLIGHT,
        frames: bool = False,
    ) -> AsyncIterator[tuple[storage_pb2.BatchReadResponse, list[Any]]]:
        """Serve a ReadStream: every request concurrently, answers in completion order.

        Yields (answer, payload buffers): with ``frames`` (the call can carry bulk
        payloads) the bytes of frame-destined ios, as :meth:`batch_read` gives them.

        Why: a unary ``BatchRead`` costs about 1 ms of gRPC CPU per side here; a
        message on an open stream about a third of that. Each request runs through
        :meth:`batch_read` (same per-io semantics) in its own task, at most
        ``max_inflight`` at once; this generator is the stream's only writer and
        tags every response with its request's ``request_id``. A request that fails
        as a whole (too many ios, a bug) is answered with that error in every
        result, so one bad request never ends the stream. A ``cancel`` message
        (the client's timeout for that request passed) cancels that request's task
        and it gets no answer, as a unary deadline would. When the client goes
        away gRPC cancels this generator and the ``finally`` cancels every task.
        """
        # At most max_inflight requests and READ_STREAM_MAX_BYTES asked bytes are
        # being read or sit answered in `out`; both are given back only when the
        # answer was taken by the transport (after the yield), so a client that
        # stops reading stops the stream from reading its requests (bounded memory).
        out: asyncio.Queue[tuple[storage_pb2.BatchReadResponse, list[Any], int] | None] = (
            asyncio.Queue()
        )
        slots = asyncio.Semaphore(max(1, max_inflight))
        budget = ByteBudget(READ_STREAM_MAX_BYTES)
        tasks: dict[int, asyncio.Task[None]] = {}  # request_id -> its task

        def give_back(cost: int) -> None:
            slots.release()
            budget.release(cost)

        async def serve(req: storage_pb2.BatchReadRequest, cost: int) -> None:
            reply: list[Any] = []
            queued = False
            try:
                try:
                    resp = await self.batch_read(req, reply if frames else None)
                except FsError as e:
                    resp = self._failed_batch(req, e)
                    reply.clear()
                except Exception as e:  # a bug must not end the stream: answer INTERNAL
                    log.exception("read stream request %d failed", req.request_id)
                    resp = self._failed_batch(
                        req, FsError(Code.INTERNAL, f"read failed: {type(e).__name__}: {e}")
                    )
                    reply.clear()
                resp.request_id = req.request_id
                out.put_nowait((resp, reply, cost))
                queued = True
            finally:
                if not queued:  # cancelled: nothing waits to be sent
                    give_back(cost)

        async def pump() -> None:
            try:
                async for req in requests:
                    if req.cancel:  # the client gave up on it (its timeout): like a unary deadline
                        victim = tasks.get(req.request_id)
                        if victim is not None:
                            victim.cancel()
                        continue
                    try:
                        asked = read_bytes_asked(req)
                    except FsError:
                        asked = 0  # refused by batch_read without reading anything
                    await slots.acquire()
                    cost = await budget.acquire(asked)
                    rid = req.request_id
                    t = asyncio.create_task(serve(req, cost))
                    tasks[rid] = t
                    t.add_done_callback(functools.partial(_forget, rid))
                # The client half-closed: finish what is in flight, then end the stream.
                while tasks:
                    await asyncio.gather(*list(tasks.values()), return_exceptions=True)
            finally:
                out.put_nowait(None)

        def _forget(rid: int, t: asyncio.Task[None]) -> None:
            if tasks.get(rid) is t:
                del tasks[rid]

        pumper = asyncio.create_task(pump())
        try:
            while True:
                item = await out.get()
                if item is None:
                    break
                resp, reply, cost = item
                try:
                    yield resp, reply
                finally:
                    give_back(cost)
            await pumper  # re-raises a failure to read the request stream
        finally:
            pending = [pumper, *tasks.values()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    @staticmethod
    def _failed_batch(
        req: storage_pb2.BatchReadRequest, e: FsError
    ) -> storage_pb2.BatchReadResponse:
        detail = error_detail(e)
        return storage_pb2.BatchReadResponse(
            results=[storage_pb2.ReadResult(error=detail) for _ in req.ios]
        )

    def _read_start(
        self,
        io: storage_pb2.ReadIO,
        slots: list[Any] | None,
        index: int,
        dest_view: Callable[[Any], memoryview | None] | None,
    ) -> storage_pb2.ReadResult | _Blocked | tuple[_Blocked, Any]:
        """Check one io and serve it from the page cache if it can be, without blocking.

        Returns an error answer, the :class:`_Blocked` read the I/O pool has to do,
        or ``(read, its engine result)`` when the page cache had the bytes. A
        shared-memory destination (``dest_view`` maps it: USRBIO, FUSE staging) gets
        the bytes ``preadv``'d and verified in place: the payload is never copied
        through Python. Whether to try the page cache at all follows the recent hit
        rate (:meth:`_try_cache`): a cold random read would only pay an ``open``, a
        failed ``preadv`` and an exception before going to the pool anyway. Every
        field is read once (each access of a protobuf field makes an object).
        """
        t: StorageTarget | None = None
        view: memoryview | None = None
        chunk = io.chunk
        key = ChunkKey(chunk.inode, chunk.index)
        try:
            if not io.HasField("chunk"):
                raise invalid("read without a chunk id")
            if self.caps is not None:
                self.caps.check(io.capability, key.inode, key.index, key.index, READ, "Read")
            dest = io.dest
            length = io.length
            frame = dest.WhichOneof("kind") == "frame"
            if frame and slots is None:
                raise invalid(
                    "a frame destination needs a unary BatchRead over the native transport"
                )
            if frame and length > dest.frame.length:
                raise invalid(
                    f"read of {length} bytes into a {dest.frame.length}-byte frame destination"
                )
            t = self.targets.resolve(io.chain_id, io.target_id)
            self.rep.check_version(t, io.chain_version)
            if not t.serving:
                raise FsError(Code.TARGET_NOT_SERVING, f"target {t.target_id} is not serving reads")
            if dest_view is not None and length and not frame:
                view = dest_view(dest)
                if view is not None and len(view) < length:
                    view.release()
                    view = None
            b = _Blocked(index, io, t, key, view)
            view = None  # b owns it now: _read_finish releases it
            if length > INLINE_READ_MAX or not self._try_cache():
                return b
            try:
                got: Any = _read_sync(b, nowait=True)
            except BlockingIOError:
                self._miss_streak += 1
                return b
            except FsError as e:
                if b.view is not None:
                    _release(b.view)
                self.rep.note_disk_error(t.engine.read, e)
                raise
            self._miss_streak = 0
            return b, got
        except FsError as e:
            if view is not None:
                _release(view)
            return self._read_failed(t, key, e)

    def _try_cache(self) -> bool:
        """Whether the next small read should try the page cache first.

        After :data:`_COLD_STREAK` misses in a row only one read in
        :data:`_COLD_PROBE` tries (the others go straight to the pool); one hit
        and every read tries again.
        """
        if self._miss_streak < _COLD_STREAK:
            return True
        self._probe += 1
        return self._probe % _COLD_PROBE == 0

    async def _read_finish(
        self,
        b: _Blocked,
        got: Any,
        slots: list[Any] | None,
        served: list[tuple[StorageTarget, int]],
    ) -> storage_pb2.ReadResult:
        """Answer a read the pool did (``got``: its engine result or exception)."""
        if isinstance(got, BaseException):
            if b.view is not None:
                _release(b.view)
            if isinstance(got, FsError):
                self.rep.note_disk_error(b.t.engine.read, got)
                return self._read_failed(b.t, b.key, got)
            raise got
        res = self._read_done(b, got, slots)
        if b.view is None and b.io.dest.WhichOneof("kind") not in (None, "inline", "frame"):
            try:
                await self.rep.payload.deliver_bytes(b.io.dest, got[1])
            except FsError as e:
                return self._read_failed(b.t, b.key, e)
        served.append((b.t, res.length))
        return res

    def _read_done(self, b: _Blocked, got: Any, slots: list[Any] | None) -> storage_pb2.ReadResult:
        """The answer of a read whose bytes are in (``got`` from :func:`_read_sync`).

        Bytes for a frame go to ``slots``, inline bytes into the answer; bytes for
        another destination are delivered by the caller (an await).
        """
        io = b.io
        if b.view is not None:
            try:
                meta, n = got
                checksum = _range_crc(b.t.engine.block_size, meta, io.offset, n)
                if checksum is None:
                    checksum = crc32c(b.view if n == len(b.view) else b.view[:n])
            finally:
                _release(b.view)
        else:
            meta, data = got
            n = len(data)
            checksum = _range_crc(b.t.engine.block_size, meta, io.offset, n)
            if checksum is None:
                checksum = crc32c(data)
        res = storage_pb2.ReadResult(
            length=n,
            commit_ver=meta.commit_ver,
            checksum=checksum,
            chunk_length=meta.length,
            chunk_checksum=meta.checksum,
        )
        if b.view is None:
            if ref_kind(io.dest) == "frame":
                if slots is not None:
                    slots[b.index] = data  # sent as the answer's payload, after the body
            elif is_inline(io.dest):
                res.data = bytes(data)
        return res

    def _read_failed(
        self, t: StorageTarget | None, key: ChunkKey, e: FsError
    ) -> storage_pb2.ReadResult:
        if t is not None and e.code == Code.CHECKSUM_MISMATCH:
            self._on_corruption(t, key, e.message)
        M.OPS.labels(str(t.target_id if t else 0), "read", e.code.name).inc()
        return storage_pb2.ReadResult(error=error_detail(e))

    @staticmethod
    def _count_reads(served: list[tuple[StorageTarget, int]], started: float) -> None:
        """Count a batch's served reads and bytes per target, and its latency once (one
        observation per batch: the reads of a batch are served together)."""
        if not served:
            return
        tally: dict[int, list[int]] = {}
        for t, n in served:
            c = tally.get(t.target_id)
            if c is None:
                tally[t.target_id] = [1, n]
            else:
                c[0] += 1
                c[1] += n
        for tid, (k, n) in tally.items():
            ops, nbytes, latency = _read_metrics(tid)
            ops.inc(k)
            nbytes.inc(n)
        latency.observe(time.perf_counter() - started)

    # ------------------------------------------------------------------ corruption

    def _on_corruption(self, t: StorageTarget, key: ChunkKey, detail: str) -> None:
        t.error_count += 1
        M.CHECKSUM_ERRORS.labels(str(t.target_id), "read").inc()
        event(
            log,
            "checksum mismatch",
            level=logging.WARNING,
            target=t.target_id,
            chunk=str(key),
            detail=detail,
        )
        if (t.target_id, key) in self._repairs:
            return
        task = asyncio.create_task(self._repair(t, key, detail))
        self._repairs[(t.target_id, key)] = task
        task.add_done_callback(lambda _f: self._repairs.pop((t.target_id, key), None))

    async def _repair(self, t: StorageTarget, key: ChunkKey, detail: str) -> None:
        try:
            await self.report_error(t.target_id, "checksum", f"chunk {key}: {detail}")
        except FsError as e:
            log.warning("cannot report checksum error of target %d: %s", t.target_id, e)
        for attempt in range(20):
            try:
                if await self._repair_once(t, key):
                    event(log, "chunk repaired", target=t.target_id, chunk=str(key))
                    return
            except FsError as e:
                log.info("repair of chunk %s on target %d failed: %s", key, t.target_id, e)
            await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
        log.error("giving up repairing chunk %s on target %d", key, t.target_id)

    async def _repair_once(self, t: StorageTarget, key: ChunkKey) -> bool:
        """Fetch the committed chunk from another serving replica and install it."""
        routing = self.targets.routing
        others = [x for x in routing.serving_targets(t.chain_id) if x != t.target_id]
        if not others:
            return False
        for other in others:
            node = routing.node_of_target(other)
            rio = storage_pb2.ReadIO(
                chain_id=t.chain_id,
                chain_version=t.chain_version,
                offset=0,
                length=MAX_CHUNK_SIZE,
                target_id=other,
            )
            rio.chunk.inode, rio.chunk.index = key.inode, key.index
            rio.dest.inline = b""
            rio.capability = self.rep.service_token()
            resp = await call(
                self.rep.peers.stub(node.address).BatchRead,
                storage_pb2.BatchReadRequest(ios=[rio]),
                timeout=self.rep.cfg.forward_timeout_s,
                what=f"BatchRead@target{other}",
            )
            r = resp.results[0]
            if r.error.code:
                continue
            async with t.locks.hold(key):
                cur = t.engine.get(key)
                if cur is None or cur.commit_ver != r.commit_ver:
                    return True  # changed meanwhile: the newer write replaced the bad copy
                if crc32c(r.data) != r.chunk_checksum:
                    continue
                meta = ChunkMeta(key, r.commit_ver, cur.chain_ver, len(r.data), r.chunk_checksum)
                await self.rep.run_blocking(t.engine.install, meta, r.data)
            return True
        return False

    # ------------------------------------------------------------------ queries

    async def query_last_chunk(
        self, req: storage_pb2.QueryLastChunkRequest
    ) -> storage_pb2.QueryLastChunkResponse:
        check_op_count(req.ops, "QueryLastChunk")
        out = storage_pb2.QueryLastChunkResponse()
        for op in req.ops:
            r = out.results.add()
            try:
                self._check_range(op.capability, op.range, READ, "QueryLastChunk")
                t = self.targets.by_chain(op.chain_id)
                self.rep.check_version(t, op.chain_version)
                if not t.serving:
                    raise FsError(Code.TARGET_NOT_SERVING, f"target {t.target_id} is not serving")
                metas = t.engine.list(op.range.inode, op.range.begin, op.range.end or _ALL)
                if metas:
                    last = metas[-1]
                    r.found, r.last_index, r.last_length = True, last.key.index, last.length
                    r.total_length = sum(m.length for m in metas)
                    r.total_chunks = len(metas)
            except FsError as e:
                r.error.CopyFrom(error_detail(e))
        return out

    async def list_chunks(
        self, req: storage_pb2.ListChunksRequest
    ) -> storage_pb2.ListChunksResponse:
        if req.target_id:
            t = self.targets.by_id(req.target_id)
        elif req.chain_id:
            t = self.targets.by_chain(req.chain_id)
        elif len(self.targets.targets) == 1:
            t = next(iter(self.targets.targets.values()))
        else:
            raise invalid("ListChunks needs target_id or chain_id on a node with several targets")
        metas = t.engine.list(req.inode or None)
        return storage_pb2.ListChunksResponse(
            target_id=t.target_id, metas=[chunk_meta_pb(m) for m in metas]
        )

    async def space_info(self, req: storage_pb2.SpaceInfoRequest) -> storage_pb2.SpaceInfoResponse:
        out = storage_pb2.SpaceInfoResponse()
        for t in self.targets.targets.values():
            sp = t.engine.space()
            out.targets.add(
                target_id=t.target_id,
                path=t.path,
                capacity_bytes=sp.capacity_bytes,
                free_bytes=sp.free_bytes,
                used_bytes=sp.used_bytes,
                chunk_count=sp.chunk_count,
                chain_id=t.chain_id,
                local_state=t.local_state,  # type: ignore[arg-type]
            )
        return out

    # ------------------------------------------------------------------ resync receiver

    def _syncing_target(self, chain_id: int, chain_version: int, target_id: int) -> StorageTarget:
        t = self.targets.resolve(chain_id, target_id)
        self.rep.check_version(t, chain_version)
        if t.public_state != SYNCING or t.local_state != L_ONLINE:
            raise FsError(
                Code.TARGET_NOT_SERVING,
                f"target {t.target_id} is not syncing (public {t.public_state}, local {t.local_state})",
            )
        return t

    async def sync_start(self, req: storage_pb2.SyncStartRequest) -> storage_pb2.SyncStartResponse:
        self._check_service(req.capability, "SyncStart")
        t = self._syncing_target(req.chain_id, req.chain_version, req.target_id)
        metas = t.engine.list()
        event(
            log,
            "sync start",
            target=t.target_id,
            chain=t.chain_id,
            chunks=len(metas),
            by=req.from_target_id,
        )
        return storage_pb2.SyncStartResponse(metas=[chunk_meta_pb(m) for m in metas])

    async def sync_done(self, req: storage_pb2.SyncDoneRequest) -> storage_pb2.SyncDoneResponse:
        self._check_service(req.capability, "SyncDone")
        t = self._syncing_target(req.chain_id, req.chain_version, req.target_id)
        if self.targets.sync_done(t):
            self.on_local_change()
        return storage_pb2.SyncDoneResponse()


__all__ = ["StorageOperator", "io_result", "SERVING"]
