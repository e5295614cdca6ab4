"""MetaService servicer: a thin adapter from gRPC to :class:`MetaOperator`.

Each handler runs the (blocking) operator method on a worker thread so the
event loop keeps serving (point reads over a local KV run inline, see
:class:`MetaServicer`); errors are mapped to statuses by
``fs3.rpc.server.guard_servicer``, so nothing here catches exceptions. The
context is typed ``Any``: servicers never touch grpc directly.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

from prometheus_client import REGISTRY, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from fs3.errors import FsError
from fs3.kv import Database
from fs3.kv.memory import MemoryDatabase
from fs3.kv.sqlite import SqliteDatabase
from fs3.meta.operator import MetaOperator, WouldWait
from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc

# fs3_meta_request_seconds buckets (upper bounds, ending with +Inf): prometheus_client's defaults
BUCKETS: tuple[float, ...] = tuple(Histogram.DEFAULT_BUCKETS)


class _MethodStats:
    """Counts of one operator method: outcomes and a latency histogram (per bucket, not cumulative)."""

    __slots__ = ("ok", "outcomes", "buckets", "sum")

    def __init__(self) -> None:
        self.ok = 0
        self.outcomes: dict[str, int] = {}  # every outcome but "ok"
        self.buckets = [0] * len(BUCKETS)
        self.sum = 0.0


class RequestStats:
    """One servicer's ``fs3_meta_requests_total`` and ``fs3_meta_request_seconds``.

    Why not prometheus_client's Counter and Histogram: their children take a
    lock per increment (an observation: two) and walk the buckets in Python,
    about 3 µs per request, a tenth of a whole point read. A servicer's
    handlers all run on its event loop's thread, so plain ints suffice there;
    the collector (:class:`_StatsCollector`, registered once) adds up every
    servicer's at scrape time.
    """

    def __init__(self) -> None:
        self.methods: dict[str, _MethodStats] = {}
        _register(self)

    def _method(self, name: str) -> _MethodStats:
        m = self.methods.get(name)
        if m is None:
            m = self.methods[name] = _MethodStats()
        return m

    def ok(self, name: str, seconds: float) -> None:
        m = self.methods.get(name) or self._method(name)
        m.ok += 1
        m.buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
        m.sum += seconds

    def observe(self, name: str, outcome: str, seconds: float) -> None:
        if outcome == "ok":
            self.ok(name, seconds)
            return
        m = self._method(name)
        m.outcomes[outcome] = m.outcomes.get(outcome, 0) + 1
        m.buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
        m.sum += seconds


def _merge(into: dict[str, _MethodStats], methods: dict[str, _MethodStats]) -> None:
    for name, m in list(methods.items()):
        acc = into.get(name)
        if acc is None:
            acc = into[name] = _MethodStats()
        acc.ok += m.ok
        for outcome, n in list(m.outcomes.items()):
            acc.outcomes[outcome] = acc.outcomes.get(outcome, 0) + n
        acc.buckets = [a + b for a, b in zip(acc.buckets, m.buckets, strict=True)]
        acc.sum += m.sum


class _StatsCollector(Collector):
    """Exports the sum of every :class:`RequestStats` of the process (a process may
    serve several; a servicer that is gone leaves its counts: counters never go back)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: weakref.WeakSet[RequestStats] = weakref.WeakSet()
        self.retired: dict[str, _MethodStats] = {}

    def add(self, stats: RequestStats) -> None:
        with self.lock:
            self.live.add(stats)
        weakref.finalize(stats, self._retire, stats.methods)

    def _retire(self, methods: dict[str, _MethodStats]) -> None:
        with self.lock:
            _merge(self.retired, methods)

    def collect(self) -> Iterator[Metric]:
        total: dict[str, _MethodStats] = {}
        with self.lock:
            _merge(total, self.retired)
            for stats in list(self.live):
                _merge(total, stats.methods)
        req = CounterMetricFamily(
            "fs3_meta_requests",
            "meta requests by operator method and outcome",
            labels=["method", "outcome"],
        )
        lat = HistogramMetricFamily(
            "fs3_meta_request_seconds", "meta request latency by operator method", labels=["method"]
        )
        for name, m in sorted(total.items()):
            outcomes = dict(m.outcomes)
            if m.ok:
                outcomes["ok"] = m.ok
            for outcome, n in sorted(outcomes.items()):
                req.add_metric([name, outcome], n)
            cumulative, acc = [], 0
            for bound, n in zip(BUCKETS, m.buckets, strict=True):
                acc += n
                cumulative.append((floatToGoString(bound), acc))
            lat.add_metric([name], cumulative, m.sum)
        yield req
        yield lat


_COLLECTOR: _StatsCollector | None = None
_COLLECTOR_LOCK = threading.Lock()


def _register(stats: RequestStats) -> None:
    global _COLLECTOR
    with _COLLECTOR_LOCK:
        if _COLLECTOR is None:
            _COLLECTOR = _StatsCollector()
            REGISTRY.register(_COLLECTOR)
        collector = _COLLECTOR
    collector.add(stats)


def _outcome(e: FsError) -> str:
    return e.code.name.lower() if e.code.name != "POSIX" else f"errno_{e.errno}"


#: A mutation runs on the event loop only if the last one (on the loop or a thread)
#: ended at least this long before it arrived. One sequential client sends its
#: next mutation a FUSE round trip or more later (the reply, the kernel, the
#: application, the kernel's lookup of the next name: over a millisecond here);
#: when several clients' mutations queue behind one that blocked the loop, the
#: next is read within microseconds of its end and goes to a thread, where it
#: can share a group commit with the others.
LONE_GAP_S = 0.0003


def local_reads(db: Database) -> bool:
    """True if the engine answers reads from this host without network I/O.

    SQLite (WAL: readers never wait for writers) and the in-memory engine do;
    FoundationDB reads go over the network and must stay off the event loop.
    """
    return isinstance(db, SqliteDatabase | MemoryDatabase)


class MetaServicer(meta_pb2_grpc.MetaServiceServicer):
    """Forwards every RPC to the operator.

    Mutations (they fsync at commit) and range reads run on worker threads.
    Point reads (lookup, getattr, access, ...) run on the event loop when the
    KV's reads are local, with one attempt: a retryable failure falls back to
    the retrying path on a thread. On a loaded 2-core host a thread hand-off
    costs more than the read itself, and the kernel asks for these all the time.

    A lone mutation runs on the event loop too (:meth:`MetaOperator.write_once`):
    when no other is in flight on a thread and the last one ended
    :data:`LONE_GAP_S` or more before, there is nobody to share a group commit
    with, so the thread would only wait for the same fsync, at the price of two
    thread hand-offs. The loop then waits for that one commit (durable as
    ever); anything that would make it wait longer (another commit in progress,
    one newer than its snapshot, an inode-number reservation) sends the
    mutation to a thread instead, as does a retryable failure.

    Args:
        op: the operator.
        inline_reads: None: decide by the KV engine (:func:`local_reads`).
    """

    def __init__(self, op: MetaOperator, *, inline_reads: bool | None = None) -> None:
        self.op = op
        self.inline_reads = local_reads(op.db) if inline_reads is None else inline_reads
        self._inline = MetaOperator.INLINE_READS if self.inline_reads else frozenset()
        self._writes = MetaOperator.INLINE_WRITES
        self.inline_writes = self.inline_reads
        self._writes_off_loop = 0  # mutations on worker threads now (under _count_lock)
        self._count_lock = threading.Lock()
        self._write_ended = 0.0  # perf_counter() when the last mutation ended
        self.writes_inline = 0  # mutations committed on the loop (metrics, tests)
        self.stats = RequestStats()

    async def _run(self, fn: Callable[[Any], Any], request: Any) -> Any:
        name = fn.__name__
        t0 = perf_counter()
        if name in self._inline:
            try:
                resp = self.op.read_once(name, request)
            except FsError as e:
                if not e.retryable:
                    self.stats.observe(name, _outcome(e), perf_counter() - t0)
                    raise
            except Exception:
                self.stats.observe(name, "internal", perf_counter() - t0)
                raise
            else:
                self.stats.ok(name, perf_counter() - t0)
                return resp
        if name not in self._writes:
            return await self._off_loop(fn, request, name, t0)
        if (
            self.inline_writes
            and not self._writes_off_loop
            and t0 - self._write_ended >= LONE_GAP_S
        ):
            try:
                resp = self.op.write_once(name, request)
            except WouldWait:
                pass
            except FsError as e:
                if not e.retryable:
                    self._write_ended = perf_counter()
                    self.stats.observe(name, _outcome(e), self._write_ended - t0)
                    raise
            except Exception:
                self._write_ended = perf_counter()
                self.stats.observe(name, "internal", self._write_ended - t0)
                raise
            else:
                self.writes_inline += 1
                self._write_ended = perf_counter()
                self.stats.ok(name, self._write_ended - t0)
                return resp
        with self._count_lock:
            self._writes_off_loop += 1

        @functools.wraps(fn)
        def on_thread(req: Any) -> Any:
            # counted until the thread is done, not until the awaiting task is:
            # a cancelled call (its deadline passed) leaves its thread running,
            # and a mutation inlined meanwhile would wait for that one's locks
            try:
                return fn(req)
            finally:
                with self._count_lock:
                    self._writes_off_loop -= 1
                    self._write_ended = perf_counter()

        return await self._off_loop(on_thread, request, name, t0)

    async def _off_loop(self, fn: Callable[[Any], Any], request: Any, name: str, t0: float) -> Any:
        outcome = "ok"
        try:
            return await asyncio.to_thread(fn, request)
        except FsError as e:
            outcome = _outcome(e)
            raise
        except Exception:
            outcome = "internal"
            raise
        finally:
            self.stats.observe(name, outcome, perf_counter() - t0)

    async def StatFs(
        self, request: meta_pb2.StatFsRequest, context: Any
    ) -> meta_pb2.StatFsResponse:
        return await self._run(self.op.statfs, request)  # type: ignore[no-any-return]

    async def Lookup(self, request: meta_pb2.LookupRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.lookup, request)  # type: ignore[no-any-return]

    async def LookupPath(
        self, request: meta_pb2.LookupPathRequest, context: Any
    ) -> meta_pb2.LookupPathResponse:
        return await self._run(self.op.lookup_path, request)  # type: ignore[no-any-return]

    async def GetAttr(
        self, request: meta_pb2.GetAttrRequest, context: Any
    ) -> meta_pb2.AttrResponse:
        return await self._run(self.op.getattr, request)  # type: ignore[no-any-return]

    async def SetAttr(
        self, request: meta_pb2.SetAttrRequest, context: Any
    ) -> meta_pb2.SetAttrResponse:
        return await self._run(self.op.setattr, request)  # type: ignore[no-any-return]

    async def Create(self, request: meta_pb2.CreateRequest, context: Any) -> meta_pb2.OpenResponse:
        return await self._run(self.op.create, request)  # type: ignore[no-any-return]

    async def Open(self, request: meta_pb2.OpenRequest, context: Any) -> meta_pb2.OpenResponse:
        return await self._run(self.op.open, request)  # type: ignore[no-any-return]

    async def Close(self, request: meta_pb2.CloseRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.close, request)  # type: ignore[no-any-return]

    async def CloseSessions(
        self, request: meta_pb2.CloseSessionsRequest, context: Any
    ) -> meta_pb2.CloseSessionsResponse:
        return await self._run(self.op.close_sessions, request)  # type: ignore[no-any-return]

    async def Sync(self, request: meta_pb2.SyncRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.sync, request)  # type: ignore[no-any-return]

    async def Mknod(self, request: meta_pb2.MknodRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.mknod, request)  # type: ignore[no-any-return]

    async def Mkdir(self, request: meta_pb2.MkdirRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.mkdir, request)  # type: ignore[no-any-return]

    async def Symlink(
        self, request: meta_pb2.SymlinkRequest, context: Any
    ) -> meta_pb2.AttrResponse:
        return await self._run(self.op.symlink, request)  # type: ignore[no-any-return]

    async def ReadLink(
        self, request: meta_pb2.ReadLinkRequest, context: Any
    ) -> meta_pb2.ReadLinkResponse:
        return await self._run(self.op.readlink, request)  # type: ignore[no-any-return]

    async def Link(self, request: meta_pb2.LinkRequest, context: Any) -> meta_pb2.AttrResponse:
        return await self._run(self.op.link, request)  # type: ignore[no-any-return]

    async def Unlink(
        self, request: meta_pb2.RemoveRequest, context: Any
    ) -> meta_pb2.RemoveResponse:
        return await self._run(self.op.unlink, request)  # type: ignore[no-any-return]

    async def Rmdir(self, request: meta_pb2.RemoveRequest, context: Any) -> meta_pb2.RemoveResponse:
        return await self._run(self.op.rmdir, request)  # type: ignore[no-any-return]

    async def Rename(
        self, request: meta_pb2.RenameRequest, context: Any
    ) -> meta_pb2.RenameResponse:
        return await self._run(self.op.rename, request)  # type: ignore[no-any-return]

    async def ReadDir(
        self, request: meta_pb2.ReadDirRequest, context: Any
    ) -> meta_pb2.ReadDirResponse:
        return await self._run(self.op.readdir, request)  # type: ignore[no-any-return]

    async def GetXattr(
        self, request: meta_pb2.GetXattrRequest, context: Any
    ) -> meta_pb2.GetXattrResponse:
        return await self._run(self.op.getxattr, request)  # type: ignore[no-any-return]

    async def SetXattr(self, request: meta_pb2.SetXattrRequest, context: Any) -> common_pb2.Empty:
        return await self._run(self.op.setxattr, request)  # type: ignore[no-any-return]

    async def ListXattr(
        self, request: meta_pb2.ListXattrRequest, context: Any
    ) -> meta_pb2.ListXattrResponse:
        return await self._run(self.op.listxattr, request)  # type: ignore[no-any-return]

    async def RemoveXattr(
        self, request: meta_pb2.RemoveXattrRequest, context: Any
    ) -> common_pb2.Empty:
        return await self._run(self.op.removexattr, request)  # type: ignore[no-any-return]

    async def Access(self, request: meta_pb2.AccessRequest, context: Any) -> common_pb2.Empty:
        return await self._run(self.op.access, request)  # type: ignore[no-any-return]

    async def SetLayout(
        self, request: meta_pb2.SetLayoutRequest, context: Any
    ) -> meta_pb2.AttrResponse:
        return await self._run(self.op.setlayout, request)  # type: ignore[no-any-return]

    async def PruneSessions(
        self, request: meta_pb2.PruneSessionsRequest, context: Any
    ) -> meta_pb2.PruneSessionsResponse:
        return await self._run(self.op.prune_sessions, request)  # type: ignore[no-any-return]

    async def ListGc(
        self, request: meta_pb2.ListGcRequest, context: Any
    ) -> meta_pb2.ListGcResponse:
        return await self._run(self.op.list_gc, request)  # type: ignore[no-any-return]

    async def AckGc(self, request: meta_pb2.AckGcRequest, context: Any) -> common_pb2.Empty:
        return await self._run(self.op.ack_gc, request)  # type: ignore[no-any-return]

    async def GetCapability(
        self, request: meta_pb2.GetCapabilityRequest, context: Any
    ) -> meta_pb2.GetCapabilityResponse:
        return await self._run(self.op.get_capability, request)  # type: ignore[no-any-return]
