"""CRAQ write path: head serialisation, forwarding, commit on the way back.

Every target on a chain runs the same steps for an update
(docs/architecture.md#data-flow-of-a-write, steps 4-7):
check the chain version and the target's role, take the chunk lock, verify the
payload checksum, stage the new version in the chunk engine (copy-on-write:
readers keep the committed copy), forward it to the successor and wait, compare
the successor's resulting chunk checksum with ours, then commit locally. So the
commit wave travels tail → head and a client is acknowledged only after the head
committed, i.e. after every replica on the write path has the new version.

The head assigns ``update_ver = commit_ver + 1``; successors take the head's
number (``≤ commit_ver`` → already applied, answered from the chunk's meta;
``> commit_ver + 1`` → MISSING_UPDATE). A SYNCING successor receives full-chunk
replacements (docs/chain-states.md#resync). A staged update the head could
not finish (successor down past the retry deadline) stays pending and is *re-driven* as a full-chunk
replace before the chunk's next update, so versions never fork.

Forwarding retries with backoff (100 ms → 1 s) while re-reading routing: after
mgmtd moves a dead successor to the end of the chain, the next attempt goes to
the new successor, or commits locally if there is none (step 7 of the write
data flow in docs/architecture.md).

Exactly-once: :class:`UpdateChannels` caches, per (client, chain, channel), the
last seqnum and its result, so a retried request is answered without touching
the disk (docs/architecture.md#retries-and-exactly-once-updates). It lives in
memory, like 3FS's.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fs3.config import StorageSection
from fs3.errors import Code, FsError, invalid
from fs3.limits import MAX_CHUNK_SIZE
from fs3.proto import storage_pb2, storage_pb2_grpc, transport_pb2
from fs3.routing import SERVING, SYNCING
from fs3.rpc.channel import ChannelPool, call
from fs3.storage import metrics as M
from fs3.storage.chunk_engine import ChunkKey, ChunkMeta, PendingUpdate, crc32c
from fs3.storage.target import L_OFFLINE, StorageTarget, TargetMap
from fs3.transport.base import ClientTransport, frame_ref, frame_slice, ref_kind, ref_length
from fs3.transport.shm import regions_lost

log = logging.getLogger("fs3.storage.craq")

# Failures of preparing (syncing) a staged update that say nothing about the disk,
# so they must not take the target offline: NO_SPACE (the metadata row did not
# fit), CHUNK_BUSY (``chunk_meta.superseded``: a newer stage of the same chunk
# replaced this one, e.g. the retry of an update whose first attempt was
# cancelled while its stage still ran in the I/O pool).
NOT_DISK_ERRORS = frozenset({Code.NO_SPACE, Code.CHUNK_BUSY})

T = TypeVar("T")

WRITE = storage_pb2.UPDATE_WRITE
TRUNCATE = storage_pb2.UPDATE_TRUNCATE
EXTEND = storage_pb2.UPDATE_EXTEND
REMOVE = storage_pb2.UPDATE_REMOVE
_TYPES = {WRITE: "write", TRUNCATE: "truncate", EXTEND: "extend", REMOVE: "remove"}


class PayloadIO(Protocol):
    """The server half of the bulk transport (``fs3.transport`` provides the real one)."""

    async def fetch(self, ref: transport_pb2.DataRef) -> bytes | bytearray | memoryview:
        """The payload's bytes, which the sender can no longer change (a private copy
        of a one-sided payload): they are checksummed once, then staged and forwarded."""
        ...

    async def deliver_bytes(
        self, ref: transport_pb2.DataRef, data: bytes | bytearray | memoryview
    ) -> object: ...


class InlinePayloadIO:
    """Payloads inside the RPC only (the ``grpc`` transport)."""

    async def fetch(self, ref: transport_pb2.DataRef) -> bytes | bytearray | memoryview:
        kind = ref.WhichOneof("kind") or "inline"
        if kind != "inline":
            raise FsError(
                Code.TRANSPORT, f"{kind} transport not available on this node", retryable=False
            )
        return ref.inline

    async def deliver_bytes(
        self, ref: transport_pb2.DataRef, data: bytes | bytearray | memoryview
    ) -> object:
        raise FsError(
            Code.TRANSPORT, "only inline reads are available on this node", retryable=False
        )


def is_inline(ref: transport_pb2.DataRef) -> bool:
    return (ref.WhichOneof("kind") or "inline") == "inline"


class Peers:
    """StorageService stubs of other storage nodes, one channel per address."""

    def __init__(self) -> None:
        self._pool = ChannelPool()
        self._stubs: dict[str, storage_pb2_grpc.StorageServiceStub] = {}

    def stub(self, address: str) -> storage_pb2_grpc.StorageServiceStub:
        s = self._stubs.get(address)
        if s is None:
            s = storage_pb2_grpc.StorageServiceStub(self._pool.get(address))
            self._stubs[address] = s
        return s

    @property
    def carries_payload(self) -> bool:
        """True if Update calls can carry the chunk bytes as a frame payload (native RPC)."""
        return self._pool.carries_payload

    async def close(self) -> None:
        self._stubs.clear()
        await self._pool.close()


@dataclass
class _ChannelEntry:
    seqnum: int
    result: storage_pb2.IOResult | None
    running: asyncio.Future[storage_pb2.IOResult] | None


class UpdateChannels:
    """Exactly-once filter for client updates (3FS ReliableUpdate), bounded LRU."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._entries: OrderedDict[tuple[str, int, int], _ChannelEntry] = OrderedDict()
        self._capacity = capacity
        self.hits = 0

    async def run(
        self,
        tag: storage_pb2.UpdateTag,
        chain_id: int,
        fn: Callable[[], Awaitable[storage_pb2.IOResult]],
    ) -> storage_pb2.IOResult:
        if not tag.client_id or not tag.channel_id:
            return await fn()
        key = (tag.client_id, chain_id, tag.channel_id)
        while True:
            e = self._entries.get(key)
            if e is not None and tag.seqnum < e.seqnum:
                raise FsError(
                    Code.STALE_UPDATE,
                    f"update seq {tag.seqnum} on channel {tag.channel_id} is older than {e.seqnum}",
                    retryable=False,
                )
            if e is not None and tag.seqnum == e.seqnum:
                if e.result is not None:
                    self.hits += 1
                    out = storage_pb2.IOResult()
                    out.CopyFrom(e.result)
                    return out
                if e.running is not None:
                    try:
                        await asyncio.shield(e.running)
                    except Exception:
                        pass
                    continue  # finished (cached) or failed (re-run below)
            break
        fut: asyncio.Future[storage_pb2.IOResult] = asyncio.get_running_loop().create_future()
        entry = _ChannelEntry(tag.seqnum, None, fut)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        try:
            res = await fn()
        except BaseException as exc:
            entry.running = None
            if not fut.done():
                fut.set_exception(
                    exc if isinstance(exc, Exception) else FsError(Code.CANCELLED, "cancelled")
                )
                fut.exception()  # mark retrieved
            raise
        entry.result, entry.running = res, None
        if not fut.done():
            fut.set_result(res)
        return res


def io_result(
    meta: ChunkMeta | None, *, written: int | None = None, update_ver: int = 0
) -> storage_pb2.IOResult:
    if meta is None:
        return storage_pb2.IOResult(
            length=written or 0, commit_ver=update_ver, update_ver=update_ver
        )
    return storage_pb2.IOResult(
        length=meta.length if written is None else written,
        commit_ver=meta.commit_ver,
        update_ver=meta.commit_ver,
        checksum=meta.checksum,
        commit_chain_ver=meta.chain_ver,
        chunk_length=meta.length,
    )


class Replicator:
    """Runs updates on this node's targets and forwards them down the chain.

    Args:
        targets: the node's targets and its current routing view.
        cfg: the ``[storage]`` section (forwarding timeouts).
        payload: fetches client payloads (transport server side).
        peers: stubs of other storage nodes.
        executor: thread pool for blocking engine calls.
        refresh_routing: ask the node to fetch routing now (stale version seen).
        forward: client transport for payloads sent to successors (None: inline).
    """

    def __init__(
        self,
        targets: TargetMap,
        cfg: StorageSection,
        payload: PayloadIO,
        peers: Peers,
        executor: ThreadPoolExecutor,
        refresh_routing: Callable[[], None],
        forward: ClientTransport | None = None,
    ) -> None:
        self.targets = targets
        self.cfg = cfg
        self.payload = payload
        self.peers = peers
        self.executor = executor
        self.refresh_routing = refresh_routing
        self.forward = forward
        self.channels = UpdateChannels()
        self.on_local_change: Callable[[], None] = lambda: None  # set by the node: heartbeat now
        # This node's service capability for calls to its peers (Update, resync, repair
        # reads); the node sets it when the cluster has a secret (fs3/security/capability.py).
        self.service_token: Callable[[], bytes] = lambda: b""

    async def run_blocking(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run a blocking engine call in the I/O pool; a disk I/O error takes its target offline."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, lambda: fn(*args, **kw))
        except FsError as e:
            self.note_disk_error(fn, e)
            raise

    def note_disk_error(self, fn: Callable[..., Any], e: FsError) -> None:
        """If ``e`` is a disk I/O error of an engine method, take that engine's target offline."""
        if e.code == Code.INTERNAL and e.errno in (errno.EIO, errno.EROFS):
            eng = getattr(fn, "__self__", None)
            for t in self.targets.targets.values():
                if t.engine is eng and self.targets.disk_error(t, e.message):
                    self.on_local_change()

    # ------------------------------------------------------------------ checks

    def check_version(self, t: StorageTarget, chain_version: int) -> None:
        if chain_version != t.chain_version:
            self.refresh_routing()
            raise FsError(
                Code.CHAIN_VERSION_MISMATCH,
                f"chain {t.chain_id}: request version {chain_version}, target {t.target_id} has {t.chain_version}",
            )

    def check_head(self, t: StorageTarget) -> None:
        if not t.serving or t.public_state != SERVING:
            raise FsError(
                Code.TARGET_NOT_SERVING, f"target {t.target_id} is not serving (chain {t.chain_id})"
            )
        head = self.targets.routing.head(t.chain_id)
        if head != t.target_id:
            raise FsError(
                Code.NOT_HEAD,
                f"target {t.target_id} is not the head of chain {t.chain_id} (head {head})",
            )

    @staticmethod
    def validate(io: storage_pb2.UpdateIO) -> ChunkKey:
        if not io.HasField("chunk"):
            raise invalid("update without a chunk id")
        if io.type not in _TYPES:
            raise invalid(f"unknown update type {io.type}")
        if io.type != REMOVE:
            if not 0 < io.chunk_size <= MAX_CHUNK_SIZE:
                raise invalid(f"chunk size {io.chunk_size} out of range (1..{MAX_CHUNK_SIZE})")
            end = io.offset + io.length if io.type == WRITE else io.length
            if end > io.chunk_size:
                raise invalid(f"range end {end} exceeds chunk size {io.chunk_size}")
        return ChunkKey(io.chunk.inode, io.chunk.index)

    async def fetch_payload(
        self, io: storage_pb2.UpdateIO, frame: memoryview | None = None
    ) -> bytes | bytearray | memoryview:
        """The update's bytes, checked; ``frame`` is the request's bulk payload (native).

        The checksum is verified on the very bytes returned, and only those are
        staged and forwarded: a one-sided (shm) payload comes back as this node's
        private copy (:meth:`PayloadIO.fetch`), never as a view of the sender's
        memory, which the sender may reuse once its attempt timed out.
        """
        if io.type != WRITE:
            return b""
        if ref_kind(io.data) == "frame":
            data: bytes | bytearray | memoryview = frame_slice(io.data, frame)
        else:
            if ref_length(io.data) != io.length:  # before any copy of a bogus length
                raise invalid(f"payload has {ref_length(io.data)} bytes, request says {io.length}")
            data = await self.payload.fetch(io.data)
        if len(data) != io.length:
            raise invalid(f"payload has {len(data)} bytes, request says {io.length}")
        got = crc32c(data)
        if got != io.checksum:
            M.CHECKSUM_ERRORS.labels(str(io.chain_id), "payload").inc()
            raise FsError(
                Code.CHECKSUM_MISMATCH,
                f"payload checksum {got:#010x} != {io.checksum:#010x}",
                retryable=False,
            )
        return data

    # ------------------------------------------------------------------ entry points

    async def client_update(
        self,
        io: storage_pb2.UpdateIO,
        tag: storage_pb2.UpdateTag,
        target_id: int = 0,
        frame: memoryview | None = None,
    ) -> storage_pb2.IOResult:
        """An update from a client: this node must hold the chain's head."""
        key = self.validate(io)
        t = self.targets.resolve(io.chain_id, target_id)
        self.check_version(t, io.chain_version)
        self.check_head(t)
        data = await self.fetch_payload(io, frame)
        op = _TYPES[io.type]
        started = time.perf_counter()
        try:
            res = await self.channels.run(
                tag, io.chain_id, lambda: self._head_update(t, key, io, tag, data)
            )
        except FsError as e:
            M.OPS.labels(str(t.target_id), op, e.code.name).inc()
            raise
        M.OPS.labels(str(t.target_id), op, "ok").inc()
        M.BYTES.labels(str(t.target_id), op).inc(len(data))
        M.LATENCY.labels(op).observe(time.perf_counter() - started)
        return res

    async def _head_update(
        self,
        t: StorageTarget,
        key: ChunkKey,
        io: storage_pb2.UpdateIO,
        tag: storage_pb2.UpdateTag,
        data: bytes | bytearray | memoryview,
    ) -> storage_pb2.IOResult:
        tag_t = (tag.client_id, tag.channel_id, tag.seqnum) if tag.channel_id else None
        eng = t.engine
        async with t.locks.hold(key):
            self.check_version(t, io.chain_version)
            self.check_head(t)
            left = eng.pending(key)
            if left is not None:
                # An update this head staged earlier but could not finish: finish it
                # first (same version, full-chunk replace) so replicas never fork.
                res = await self.forward_and_commit(t, left, None, b"", redrive=True)
                if tag_t is not None and left.tag == tag_t:
                    return res
            meta = eng.get(key)
            if meta is None and io.type in (TRUNCATE, EXTEND) and io.length == 0:
                return storage_pb2.IOResult()
            if meta is None and io.type == WRITE:
                self._check_low_space(t)
            uv = (meta.commit_ver if meta else 0) + 1
            succ = self._overlap_successor(t, io)
            if succ is not None:
                res = await self.overlapped_write(t, succ, key, io, data, uv, meta, tag=tag_t)
            else:
                p = await self.stage(t, key, io, data, uv, t.chain_version)
                p.tag = tag_t
                res = await self.forward_and_commit(t, p, io, data)
            if io.type == WRITE:
                res.length = io.length
            return res

    def _check_low_space(self, t: StorageTarget) -> None:
        sp = t.engine.space()
        if (
            sp.capacity_bytes
            and (1 - sp.free_bytes / sp.capacity_bytes) >= self.cfg.low_space_ratio
        ):
            raise FsError(
                Code.NO_SPACE, f"target {t.target_id} is full: refusing new chunks", retryable=False
            )

    async def successor_update(
        self, req: storage_pb2.UpdateRequest, frame: memoryview | None = None
    ) -> storage_pb2.IOResult:
        """An update forwarded by our predecessor (or a resync transfer)."""
        io = req.io
        key = self.validate(io)
        t = self.targets.resolve(io.chain_id, req.to_target_id)
        self.check_version(t, io.chain_version)
        if t.fenced or t.local_state == L_OFFLINE or t.public_state not in (SERVING, SYNCING):
            raise FsError(
                Code.TARGET_NOT_SERVING, f"target {t.target_id} does not take updates now"
            )
        if t.public_state == SYNCING and not req.is_syncing and io.type != REMOVE:
            raise FsError(
                Code.TARGET_NOT_SERVING, f"target {t.target_id} is syncing: only full-chunk updates"
            )
        data = await self.fetch_payload(io, frame)
        eng = t.engine
        async with t.locks.hold(key):
            self.check_version(t, io.chain_version)
            meta = eng.get(key)
            cv = meta.commit_ver if meta else 0
            full = req.is_syncing or io.full_chunk
            if io.type != REMOVE and not full:
                if io.update_ver <= cv:
                    assert meta is not None
                    return io_result(meta)  # already applied (a retry)
                if io.update_ver > cv + 1:
                    raise FsError(
                        Code.MISSING_UPDATE,
                        f"chunk {key} on target {t.target_id}: update {io.update_ver} after committed {cv}",
                    )
            succ = None if req.is_syncing else self._overlap_successor(t, io)
            if succ is not None:
                return await self.overlapped_write(t, succ, key, io, data, io.update_ver, meta)
            p = await self.stage(
                t, key, io, data, io.update_ver, io.chain_version, replace_all=full
            )
            if req.is_syncing:
                # A syncing receiver installs the predecessor's version as committed.
                new = await self.run_blocking(eng.commit, p, io.chain_version)
                M.BYTES.labels(str(t.target_id), "sync").inc(len(data))
                return io_result(new, update_ver=p.update_ver)
            return await self.forward_and_commit(t, p, io, data, redrive=io.full_chunk)

    # ------------------------------------------------------------------ steps

    def _overlap_successor(self, t: StorageTarget, io: storage_pb2.UpdateIO) -> int | None:
        """The successor a plain write may be forwarded to before it is staged here, or None.

        Only ordinary writes to a serving successor qualify: full-chunk forwarding
        (re-drive, a SYNCING successor) needs the staged content, so it stages first.
        """
        if io.type != WRITE or io.full_chunk or not self.cfg.overlap_forward:
            return None
        routing = self.targets.routing
        try:
            succ = routing.successor(t.chain_id, t.target_id)
            if succ is None or routing.target_state(t.chain_id, succ) != SERVING:
                return None
        except FsError:
            return None
        return succ

    async def overlapped_write(
        self,
        t: StorageTarget,
        succ: int,
        key: ChunkKey,
        io: storage_pb2.UpdateIO,
        data: bytes | bytearray | memoryview,
        update_ver: int,
        meta: ChunkMeta | None,
        *,
        tag: tuple[str, int, int] | None = None,
    ) -> storage_pb2.IOResult:
        """A plain write with a serving successor: forward it *while* staging it here.

        The local stage, data sync and durable metadata row (``prepare``) run in one
        I/O-pool hop concurrently with the successor's whole path, so a replica adds
        only its RPC hop to the write's latency, not its disk work. Nothing is
        published (or acknowledged) before both sides are done and the successor's
        chunk checksum matches ours. Space is checked before anything is sent; if
        staging still fails while the successor may have taken the update, this
        target fails stop (like a failed sync), so the chain never serves a fork.
        Any forwarding error falls back to :meth:`forward_and_commit` (retries,
        full-chunk re-drive, abort on a definite refusal) with the staged update.
        """
        eng = t.engine
        old_len = meta.length if meta is not None else 0
        eng.check_room(io.offset + io.length - old_len)
        cv = t.chain_version
        local = asyncio.ensure_future(
            self._stage_call(
                eng.stage_write,
                key,
                io.offset,
                data,
                update_ver=update_ver,
                chain_ver=cv,
                chunk_size=io.chunk_size,
                checksum=io.checksum,
                sync=False,
                prepare_cv=cv,
            )
        )
        first: storage_pb2.IOResult | FsError
        try:
            try:
                first = await self._send(
                    t,
                    succ,
                    PendingUpdate(key, update_ver, cv, False),
                    io,
                    data,
                    full=False,
                    staged=False,
                )
            except FsError as e:
                first = e
            try:
                p = await asyncio.shield(local)
            except FsError as e:
                refused = isinstance(first, FsError) and not first.retryable
                if not refused and self.targets.disk_error(
                    t, f"staging a forwarded write failed: {e.message}"
                ):
                    self.on_local_change()
                raise
        finally:
            if not local.done():
                await asyncio.wait([local])  # never abandon a running stage of this chunk
        p.tag = tag
        if isinstance(first, FsError):
            return await self.forward_and_commit(t, p, io, data)
        if first.checksum != p.checksum:
            M.CHECKSUM_ERRORS.labels(str(t.target_id), "replica").inc()
            raise FsError(
                Code.CHECKSUM_MISMATCH,
                f"chunk {p.key}: successor {succ} has checksum {first.checksum:#010x}, we have {p.checksum:#010x}",
                retryable=False,
            )
        return await self._commit_local(t, p)

    async def _stage_call(
        self, fn: Callable[..., PendingUpdate], *args: Any, prepare_cv: int | None, **kw: Any
    ) -> PendingUpdate:
        """Run the engine's ``fn`` (a stage method) in the I/O pool, then prepare in the same hop.

        ``prepare_cv``: make the staged update durable (data and row) right away
        with this chain version — the tail, which has nothing to overlap it with.
        """
        eng = getattr(fn, "__self__", None)

        def work() -> PendingUpdate:
            p = fn(*args, **kw)
            if prepare_cv is not None and eng is not None:
                eng.prepare(p, prepare_cv)
            return p

        job = self.executor.submit(work)
        fut = asyncio.wrap_future(job)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            # Never abandon a running stage (the caller holds the chunk lock until it
            # ends): left alone it would set its update pending after a retry and later
            # writes committed, and the chunk's next update would re-drive it, bringing
            # back bytes older than an acknowledged write. One not started yet is dropped.
            if not job.cancel():
                await asyncio.wait([fut])
                err = None if fut.cancelled() else fut.exception()
                if isinstance(err, FsError):
                    self.note_disk_error(fn, err)
            raise
        except FsError as e:
            self.note_disk_error(fn, e)
            raise

    async def stage(
        self,
        t: StorageTarget,
        key: ChunkKey,
        io: storage_pb2.UpdateIO,
        data: bytes | bytearray | memoryview,
        update_ver: int,
        chain_ver: int,
        *,
        replace_all: bool = False,
    ) -> PendingUpdate:
        """Stage the update locally.

        With a successor, making it durable (data sync + metadata row, see
        ``ChunkEngine.prepare``) is left to :meth:`forward_and_commit`, overlapped
        with forwarding; the tail does it right away in the same thread hop, as
        there is nothing to overlap with.
        """
        eng = t.engine
        try:
            defer = self.targets.routing.successor(t.chain_id, t.target_id) is not None
        except FsError:
            defer = False
        prepare_cv = None if defer else t.chain_version
        if io.type == WRITE:
            return await self._stage_call(
                eng.stage_write,
                key,
                io.offset,
                data,
                update_ver=update_ver,
                chain_ver=chain_ver,
                chunk_size=io.chunk_size,
                replace_all=replace_all,
                checksum=io.checksum,
                sync=not defer,
                prepare_cv=prepare_cv,
            )
        if io.type in (TRUNCATE, EXTEND):
            return await self._stage_call(
                eng.stage_truncate,
                key,
                io.length,
                update_ver=update_ver,
                chain_ver=chain_ver,
                chunk_size=io.chunk_size,
                only_extend=io.type == EXTEND,
                prepare_cv=prepare_cv,
            )
        return await self._stage_call(
            eng.stage_remove,
            key,
            update_ver=update_ver,
            chain_ver=chain_ver,
            prepare_cv=prepare_cv,
        )

    async def forward_and_commit(
        self,
        t: StorageTarget,
        p: PendingUpdate,
        io: storage_pb2.UpdateIO | None,
        data: bytes | bytearray | memoryview,
        *,
        redrive: bool = False,
    ) -> storage_pb2.IOResult:
        """Forward ``p`` to the successor (retrying across chain changes), then commit it.

        If the staged update is not durable yet, it is *prepared* (``fdatasync`` of
        the data, then its metadata row written and fsync'd, unpublished) in the
        I/O pool *while* the update travels down the chain, so the replicas'
        syncs overlap instead of adding up and the commit on the way back is a
        memory-only publish. The local commit (and so the ack) still waits for
        it: nothing is acknowledged before every replica on the path has the
        version durable. A failed sync takes this target out of service
        (fail-stop): a successor may already have committed the version, and a
        chain without us stays consistent.
        """
        sync: asyncio.Future[None] | None = None
        if not t.engine.is_published_cheaply(p, t.chain_version):
            sync = asyncio.ensure_future(self.run_blocking(t.engine.prepare, p, t.chain_version))
        try:
            return await self._forward_and_commit(t, p, io, data, redrive=redrive, sync=sync)
        finally:
            if sync is not None:
                if not sync.done():
                    await asyncio.wait([sync])  # never abandon a running sync on this file
                if not sync.cancelled():
                    sync.exception()  # retrieved (reported by _wait_sync where it matters)

    async def _wait_sync(
        self, t: StorageTarget, sync: asyncio.Future[None] | None, *, quiet: bool = False
    ) -> None:
        if sync is None:
            return
        try:
            await asyncio.shield(sync)
        except FsError as e:
            # NO_SPACE (metadata row) leaves the update pending (re-driven later), as a
            # failed commit does; CHUNK_BUSY: see NOT_DISK_ERRORS; anything else means
            # the disk state is unknown.
            if e.code not in NOT_DISK_ERRORS and self.targets.disk_error(
                t, f"sync of staged data failed: {e.message}"
            ):
                self.on_local_change()
            if not quiet:
                raise

    async def _forward_and_commit(
        self,
        t: StorageTarget,
        p: PendingUpdate,
        io: storage_pb2.UpdateIO | None,
        data: bytes | bytearray | memoryview,
        *,
        redrive: bool,
        sync: asyncio.Future[None] | None,
    ) -> storage_pb2.IOResult:
        deadline = time.monotonic() + self.cfg.forward_retry_s
        delay = 0.1
        while True:
            routing = self.targets.routing
            if t.public_state not in (SERVING, SYNCING) or t.fenced:
                raise FsError(
                    Code.TARGET_NOT_SERVING,
                    f"target {t.target_id} left the write path of chain {t.chain_id}",
                )
            try:
                succ = routing.successor(t.chain_id, t.target_id)
            except FsError as e:
                raise FsError(Code.TARGET_NOT_SERVING, e.message) from None
            if succ is None:
                break
            try:
                res = await self._send(t, succ, p, io, data, full=redrive or io is None)
            except FsError as e:
                if e.code == Code.MISSING_UPDATE and not redrive:
                    redrive = True  # the successor missed an update: send the whole chunk instead
                    continue
                if not e.retryable and e.code != Code.CHECKSUM_MISMATCH:
                    # A definite refusal (e.g. NO_SPACE, bad input) downstream: no replica
                    # committed this version, so drop ours; the client sees the error.
                    await self._wait_sync(t, sync, quiet=True)
                    await self.run_blocking(t.engine.abort, p.key)
                    raise
                if not e.retryable or time.monotonic() + delay > deadline:
                    raise  # may have been committed downstream: stays pending, re-driven later
                M.FORWARD_RETRIES.labels(str(t.target_id)).inc()
                log.info(
                    "forward chunk %s of chain %d to target %d failed (%s); retrying",
                    p.key,
                    t.chain_id,
                    succ,
                    e,
                )
                self.refresh_routing()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if not p.remove and res.checksum != p.checksum:
                M.CHECKSUM_ERRORS.labels(str(t.target_id), "replica").inc()
                raise FsError(
                    Code.CHECKSUM_MISMATCH,
                    f"chunk {p.key}: successor {succ} has checksum {res.checksum:#010x}, we have {p.checksum:#010x}",
                    retryable=False,
                )
            break
        await self._wait_sync(t, sync)
        return await self._commit_local(t, p)

    async def _commit_local(self, t: StorageTarget, p: PendingUpdate) -> storage_pb2.IOResult:
        """Commit ``p`` here (its successors have it); memory-only if it was prepared."""
        cv = t.chain_version
        if t.engine.is_published_cheaply(p, cv):
            # Memory only: no thread hop; the superseded file is deleted off the path.
            meta, old = t.engine.publish_prepared(p, cv)
            if old:
                try:
                    asyncio.get_running_loop().run_in_executor(
                        self.executor, t.engine.drop_files, old
                    )
                except RuntimeError:  # the pool is shutting down: delete them here
                    t.engine.drop_files(old)
        else:
            meta = await self.run_blocking(t.engine.commit, p, cv)
        return io_result(meta, update_ver=p.update_ver)

    async def _send(
        self,
        t: StorageTarget,
        succ: int,
        p: PendingUpdate,
        io: storage_pb2.UpdateIO | None,
        data: bytes | bytearray | memoryview,
        *,
        full: bool,
        staged: bool = True,
    ) -> storage_pb2.IOResult:
        """Send ``p`` to ``succ``; ``staged=False``: ``p`` is not staged here yet (overlapped)."""
        routing = self.targets.routing
        node = routing.node_of_target(succ)
        syncing = routing.target_state(t.chain_id, succ) == SYNCING
        if not staged and (syncing or full or io is None or p.remove):
            # Full-chunk forwarding needs the staged content: let the caller retry staged.
            raise FsError(
                Code.TARGET_NOT_SERVING, f"target {succ} needs a full chunk", retryable=True
            )
        fio = storage_pb2.UpdateIO(
            chain_id=t.chain_id,
            chain_version=t.chain_version,
            update_ver=p.update_ver,
        )
        fio.chunk.inode, fio.chunk.index = p.key.inode, p.key.index
        payload: bytes | bytearray | memoryview | None = None
        if p.remove:
            fio.type = REMOVE
        elif syncing or full or io is None:
            content = await self.run_blocking(t.engine.read_pending_full, p.key)
            fio.type = WRITE
            fio.offset, fio.length = 0, len(content)
            fio.chunk_size = max(io.chunk_size if io is not None else 0, len(content), 1)
            fio.checksum = crc32c(content)
            fio.full_chunk = True
            payload = content
        else:
            fio.type, fio.offset, fio.length, fio.chunk_size = (
                io.type,
                io.offset,
                io.length,
                io.chunk_size,
            )
            fio.checksum = io.checksum
            if io.type == WRITE:
                payload = data
        return await self.send_update(
            node.address,
            node.data_address,
            fio,
            payload,
            is_syncing=syncing,
            from_target=t.target_id,
            to_target=succ,
        )

    async def send_update(
        self,
        address: str,
        data_address: str,
        fio: storage_pb2.UpdateIO,
        payload: bytes | bytearray | memoryview | None,
        *,
        is_syncing: bool,
        from_target: int,
        to_target: int,
    ) -> storage_pb2.IOResult:
        """One ``Update`` RPC to a successor, the payload through the forwarding transport.

        A successor the forwarding transport reaches through shared memory (shm;
        auto: a same-host successor) gets the payload staged there
        (:meth:`ClientTransport.forward_ref`). Otherwise, over the native RPC, the
        payload is the frame's bulk payload: sent from ``payload`` as is, received
        by the successor into a buffer of its own.
        """
        sent: Awaitable[None] | None = None
        bulk: memoryview | None = None
        if payload is not None:
            staged = None
            if self.forward is not None:
                staged = await self.forward.forward_ref(address, data_address, memoryview(payload))
            if staged is not None:  # through shared memory (a same-host successor)
                fio.data.CopyFrom(staged[0])
                sent = staged[1]
            elif self.peers.carries_payload:
                bulk = memoryview(payload)
                fio.data.CopyFrom(frame_ref(len(bulk)))
            elif self.forward is not None:
                ref, sent = await self.forward.write_ref(address, data_address, memoryview(payload))
                fio.data.CopyFrom(ref)
            else:
                fio.data.inline = bytes(payload)
        req = storage_pb2.UpdateRequest(
            io=fio,
            is_syncing=is_syncing,
            from_target_id=from_target,
            to_target_id=to_target,
            capability=self.service_token(),
        )
        try:
            resp = await call(
                self.peers.stub(address).Update,
                req,
                timeout=self.cfg.forward_timeout_s,
                what=f"Update@target{to_target}",
                payload=bulk,
            )
        except FsError as e:
            if self.forward is None:
                raise
            raise regions_lost(self.forward, address, e) from None
        if sent is not None:
            await sent
        return resp.result
