"""``fs3.ckpt``: save and load training checkpoints (see fs3/ckpt/layout.py for the on-storage layout).

::

    import fs3.ckpt as ckpt
    h = ckpt.save(model.state_dict(), "/mnt/fs3/run1", step=step)   # returns once snapshotted
    ...                                                             # training continues
    h.wait()                                                        # durable (rank 0: committed)
    state = ckpt.load("/mnt/fs3/run1")                               # the newest valid checkpoint

How a save works. The caller's thread only *snapshots*: one copy per tensor
into one host buffer laid out exactly like the data file (pinned for CUDA,
else memory of the process's huge-page arena, every page faulted in when it
is made; reused, with its per-tensor destination views, from save to save
while the tensors keep their shapes; made ahead of the first save by
:meth:`Checkpointer.prepare`), plus a copy of the few non-tensor values that
are not immutable scalars. Host tensors are copied with ``memcpy`` on
several threads with the GIL released. A background writer thread then
pickles those values, computes the pieces to store (all tensors, or for a
delta only the blocks that differ from the reference snapshot), CRC32Cs
them, writes the rank's data file with many I/Os in flight, fsyncs it,
publishes the rank's index atomically and — on rank 0, once every rank's
index is there — the manifest and then the success marker. ``handle.wait()`` raises what went wrong; a
failure nobody waited for is raised by the next ``save``.

How a load works. A full checkpoint of one rank is one read of its data file
into one buffer (on an fs3 mount a USRBIO Iov the agent reads into
directly, several rings with many I/Os in flight; the Iov comes from the
process's pool for the mount, reused once an earlier load's tensors are
gone; elsewhere memory of the process's arena); each tensor's CRC32C is
checked on another thread as soon as its bytes have arrived, and the tensors
are views of that buffer. ``into=`` tensors, deltas and re-sharded loads
read each piece into its destination (staged where it is not registered).

Modes. ``sharded``: each rank saves its own state dict; a restore needs the
same world size. ``consolidated``: tensors wrapped in :class:`Shard` are rows
of one global tensor (each rank writes its rows), plain tensors are
replicated (rank 0 writes them); a restore may use any world size: each rank
gets its even share of the rows (``numpy.array_split`` order).

Policies. :class:`Full` stores everything. :class:`Differential` stores the
blocks that changed since the last full checkpoint (restore = baseline + one
delta); :class:`Incremental` the blocks that changed since the previous
checkpoint (restore = baseline + every delta since). Both start a new full
baseline every ``baseline_every`` saves and whenever tensor shapes change or
the process restarted (the reference snapshot lives in memory). Change
detection compares bytes exactly against the reference. Optional: ``compress``
(zlib, lossless) and ``quantize="int8"`` (deltas of float tensors; error
bound in :mod:`fs3.ckpt.codec`).
"""

from __future__ import annotations

import base64
import builtins
import collections
import copy
import ctypes
import io
import json
import os
import pickle
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from fs3.ckpt import buffers, codec, layout
from fs3.ckpt.datafile import (
    ALIGN,
    CorruptCheckpoint,
    IndexEntry,
    crc32c,
    read_verified,
    write_items,
)
from fs3.ckpt.store import Segment, Store, host_arena, open_store, populate_range

# --------------------------------------------------------------------------- policies


@dataclass(frozen=True)
class Full:
    """Every checkpoint stores every tensor."""

    compress: bool = False


@dataclass(frozen=True)
class Differential:
    """Changed blocks against the last full baseline; a new baseline every ``baseline_every`` saves."""

    baseline_every: int = 10
    block_bytes: int = 1 << 20
    compress: bool = False
    quantize: str | None = None  # "int8": quantised deltas of float tensors


@dataclass(frozen=True)
class Incremental:
    """Changed blocks against the previous checkpoint; a new baseline every ``baseline_every`` saves."""

    baseline_every: int = 10
    block_bytes: int = 1 << 20
    compress: bool = False
    quantize: str | None = None


Policy = Full | Differential | Incremental


def _check_policy(p: Policy) -> None:
    if isinstance(p, (Differential, Incremental)):
        if p.baseline_every < 1:
            raise ValueError(f"baseline_every must be >= 1, got {p.baseline_every}")
        if p.block_bytes < 4096 or p.block_bytes % 4096:
            raise ValueError(
                f"block_bytes must be a positive multiple of 4096, got {p.block_bytes}"
            )
        if p.quantize not in (None, "int8"):
            raise ValueError(f"quantize must be None or 'int8', got {p.quantize!r}")
    elif not isinstance(p, Full):
        raise TypeError(f"policy must be Full, Differential or Incremental, got {p!r}")


@dataclass
class Shard:
    """Rows ``[offset, offset + len(tensor))`` (dim 0) of a global tensor of ``global_shape``.

    In ``consolidated`` mode each rank passes its rows; the checkpoint holds the
    whole tensor and can be restored at any world size.
    """

    tensor: Any
    global_shape: tuple[int, ...]
    offset: int


# --------------------------------------------------------------------------- state dict structure


class _Ref:
    """Stands for a tensor in the pickled skeleton of a state dict."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_Ref, (self.name,))


_SAFE_BUILTINS = {
    "dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes",
    "bytearray", "bool", "slice", "range",
}  # fmt: skip


class _SafeUnpickler(pickle.Unpickler):
    """Only plain containers and scalars: loading a checkpoint never runs arbitrary code."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return getattr(builtins, name)
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == __name__ and name == "_Ref":
            return _Ref
        raise pickle.UnpicklingError(
            f"checkpoint state holds a {module}.{name} object; load(..., trusted=True) to allow it"
        )


_ATOMS = (int, float, complex, str, bytes, bool, type(None), range)


def _frozen(x: Any) -> Any:
    """A copy of a non-tensor value that later changes by the caller cannot reach.

    Immutable scalars are shared; anything else is deep-copied (rare in state
    dicts: containers are rebuilt by :func:`_flatten` anyway).
    """
    if type(x) in _ATOMS:
        return x
    try:
        return copy.deepcopy(x)
    except Exception as e:
        raise TypeError(f"state dict holds an object that cannot be copied: {e}") from e


def _flatten(obj: Any, *, freeze: bool = False) -> tuple[Any, list[tuple[str, Any]]]:
    """(skeleton with tensors replaced by _Ref, [(name, tensor or Shard)]).

    ``freeze``: the skeleton's leaves are :func:`_frozen` copies (a save pickles
    the skeleton later, on its writer thread).
    """
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()

    def walk(x: Any, path: tuple[str, ...]) -> Any:
        if isinstance(x, Shard) or buffers.is_tensor(x):
            name = "/".join(path) or "tensor"
            base, k = name, 1
            while name in seen:
                name, k = f"{base}#{k}", k + 1
            seen.add(name)
            out.append((name, x))
            return _Ref(name)
        if isinstance(x, dict):
            d = {k: walk(v, (*path, str(k))) for k, v in x.items()}
            return collections.OrderedDict(d) if isinstance(x, collections.OrderedDict) else d
        if isinstance(x, (list, tuple)):
            items = [walk(v, (*path, str(i))) for i, v in enumerate(x)]
            return items if isinstance(x, list) else tuple(items)
        return _frozen(x) if freeze else x

    return walk(obj, ()), out


def _unflatten(skel: Any, tensors: dict[str, Any]) -> Any:
    """The skeleton with each _Ref replaced by its tensor.

    A plain recursive function, not a recursive closure: a closure refers to
    itself through its cell, and that cycle would keep ``tensors`` (a load's
    memory, which its store's pool takes back once the last tensor is gone)
    alive until the next garbage-collector pass.
    """
    if isinstance(skel, _Ref):
        return tensors[skel.name]
    if isinstance(skel, dict):
        d = {k: _unflatten(v, tensors) for k, v in skel.items()}
        return collections.OrderedDict(d) if isinstance(skel, collections.OrderedDict) else d
    if isinstance(skel, list):
        return [_unflatten(v, tensors) for v in skel]
    if isinstance(skel, tuple):
        return tuple(_unflatten(v, tensors) for v in skel)
    return skel


# --------------------------------------------------------------------------- snapshot


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class _Tensor:
    name: str
    dtype: str
    fw: str
    shape: tuple[int, ...]  # global shape
    local_shape: tuple[int, ...]
    toff: int  # byte offset of this rank's data in the global tensor
    sharded: bool
    nbytes: int
    off: int = 0  # offset in the snapshot buffer (== offset in a full data file)


def _describe(items: list[tuple[str, Any]], mode: str, rank: int) -> list[_Tensor]:
    out = []
    for name, x in items:
        if isinstance(x, Shard):
            if mode != "consolidated":
                raise ValueError(f"{name!r}: Shard values need mode='consolidated'")
            t = x.tensor
            gshape = tuple(int(s) for s in x.global_shape)
            lshape = tuple(int(s) for s in t.shape)
            if len(gshape) != len(lshape) or gshape[1:] != lshape[1:] or len(gshape) == 0:
                raise ValueError(f"{name!r}: shard shape {lshape} does not fit global {gshape}")
            if not 0 <= x.offset <= gshape[0] - lshape[0]:
                raise ValueError(f"{name!r}: rows {x.offset}+{lshape[0]} outside {gshape[0]}")
            row = buffers.element_size(buffers.dtype_name(t)) * int(
                np.prod(gshape[1:], dtype=np.int64)
            )
            out.append(
                _Tensor(name, buffers.dtype_name(t), buffers.framework(t), gshape, lshape,
                        x.offset * row, True, buffers.nbytes(t))
            )  # fmt: skip
        else:
            if mode == "consolidated" and rank != 0:
                continue  # replicated: rank 0 stores it
            shape = tuple(int(s) for s in x.shape)
            out.append(
                _Tensor(name, buffers.dtype_name(x), buffers.framework(x), shape, shape, 0,
                        False, buffers.nbytes(x))
            )  # fmt: skip
    off = 0
    for t in out:
        t.off = off
        off = _align(off + t.nbytes)
    return out


_COPY_MIN = 8 << 20  # below this many bytes a snapshot copies on the caller's thread alone


def _copy_threads() -> int:
    """Threads a snapshot copies with: torch's intra-op thread count (what ``copy_`` uses), <= 8."""
    torch = buffers.torch
    n = torch.get_num_threads() if torch is not None else (os.cpu_count() or 1)
    return max(1, min(8, n))


def _host_address(x: Any) -> int | None:
    """The address of ``x``'s bytes if it is contiguous host memory a plain memcpy may read, else None."""
    if isinstance(x, np.ndarray):
        return int(x.ctypes.data) if x.flags["C_CONTIGUOUS"] else None
    try:
        t = x.detach()
        if (
            t.device.type != "cpu"
            or t.layout != buffers.torch.strided
            or not t.is_contiguous()
            or t.is_conj()  # lazy conjugate/negative views: copy_ resolves them, memcpy would not
            or t.is_neg()
        ):
            return None
        return int(t.data_ptr())
    except (RuntimeError, TypeError, AttributeError):
        return None  # a tensor subclass without plain storage: copy_ knows how to read it


class _Snapshot:
    """The reusable host buffer of one state-dict layout, with a destination per tensor.

    The buffer is laid out exactly like a full data file (``_Tensor.off``).
    The per-tensor destinations (tensors/arrays over the buffer) are built
    once, so a snapshot is nothing but one copy per tensor: pinned memory when
    CUDA is present (device-to-host copies run asynchronously into it), else
    the store's bulk memory (:meth:`~fs3.ckpt.store.Store.alloc`: on an fs3
    mount a registered USRBIO Iov of the process's load pool, which the
    writer sends from with no staging copy; elsewhere the process's
    :class:`~fs3.ckpt.store.HostArena`, in huge pages), every page faulted in
    here, reused from an earlier snapshot or load when one was given back,
    and given back when the snapshot is dropped.
    """

    def __init__(
        self,
        tensors: list[_Tensor],
        total: int,
        *,
        populate: bool = True,
        store: Store | None = None,
    ) -> None:
        torch = buffers.torch
        self.cuda = torch is not None and torch.cuda.is_available()
        # False: the first take faults the pages in, each copy thread its own range
        self.faulted = populate or self.cuda or not total
        if self.cuda:
            t = torch.empty(max(total, 1), dtype=torch.uint8, pin_memory=True)
            self.mem = memoryview(cast(Any, t.numpy())).cast("B")[:total]
        elif total:
            # the store's bulk memory: on an fs3 mount a registered Iov, which the
            # writer sends from in place and which a later load can reuse
            self.mem = (
                store.alloc(total, populate=populate)
                if store is not None
                else host_arena().take(total, populate=populate)
            )
        else:
            self.mem = memoryview(b"")
        self.base = int(np.frombuffer(self.mem, dtype=np.uint8).ctypes.data) if total else 0
        self.tensors = tensors
        self.dsts: list[Any] = [self._dst(t) for t in tensors]

    def _dst(self, t: _Tensor) -> Any:
        if not t.nbytes:
            return None
        mv = self.mem[t.off : t.off + t.nbytes]
        if t.fw == "torch":
            torch = buffers.torch
            return (
                torch.frombuffer(mv, dtype=torch.uint8)
                .view(getattr(torch, t.dtype))
                .view(t.local_shape)
            )
        return np.frombuffer(mv, dtype=np.dtype(t.dtype)).reshape(t.local_shape)

    def take(
        self, srcs: list[Any], pool: ThreadPoolExecutor | None = None, workers: int = 0
    ) -> None:
        """Copy every source tensor into its place (the caller's stall: nothing else happens here).

        Contiguous host tensors are copied with ``memcpy`` (glibc streams large
        copies past the cache, measured 1.4x ``Tensor.copy_`` here) split into
        equal byte ranges over the caller and ``workers`` threads of ``pool``, GIL released;
        the rest (device, strided or lazily conjugated tensors) with
        ``copy_``, which converts them.
        """
        plain: list[tuple[int, int, int]] = []  # (dst address, src address, bytes)
        other: list[tuple[Any, Any]] = []
        for t, dst, x in zip(self.tensors, self.dsts, srcs, strict=True):
            if dst is None:
                continue
            if isinstance(x, Shard):
                x = x.tensor
            addr = _host_address(x)
            if addr is None:
                other.append((dst, x))
            else:
                plain.append((self.base + t.off, addr, t.nbytes))
        total = sum(n for _, _, n in plain)
        nthreads = 1 if pool is None or total < _COPY_MIN else workers + 1
        parts = split_copies(plain, nthreads)
        fault = not self.faulted
        futs = [pool.submit(_memmoves, part, fault) for part in parts[1:] if part] if pool else []
        try:
            _memmoves(parts[0], fault)
        finally:
            for f in futs:
                f.result()
        self.faulted = True
        for dst, x in other:
            if isinstance(x, np.ndarray):
                np.copyto(dst, x)
            else:
                dst.copy_(x.detach(), non_blocking=self.cuda)
        if self.cuda and other:
            buffers.torch.cuda.synchronize()


def _layout_of(tensors: list[_Tensor]) -> tuple[Any, ...]:
    """What a snapshot buffer and its views depend on: same key, same buffer."""
    return tuple((t.name, t.dtype, t.fw, t.shape, t.local_shape, t.toff) for t in tensors)


def _chain_done(src: Future[Any], dst: Future[None]) -> None:
    exc = src.exception()
    if exc is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(None)


def split_copies(
    plan: Sequence[tuple[int, int, int]], nthreads: int
) -> list[list[tuple[int, int, int]]]:
    """Split ``(dst, src, n)`` copies into parts of equal bytes, one per thread.

    Why equal bytes, not equal tensors: a state dict mixes 4 KiB and 32 MiB
    tensors, and a thread given the big ones would finish last alone.
    """
    share = max(1, -(-sum(n for _, _, n in plan) // max(1, nthreads)))
    parts: list[list[tuple[int, int, int]]] = [[]]
    room = share
    for d, src, n in plan:
        while n:
            k = min(n, room)
            parts[-1].append((d, src, k))
            d, src, n, room = d + k, src + k, n - k, room - k
            if not room:
                parts.append([])
                room = share
    return parts


def _memmoves(part: list[tuple[int, int, int]], fault: bool = False) -> None:
    """Copy each ``(dst, src, n)``; ``fault``: first fault in the destination range in one call.

    A fresh buffer's pages are mapped (and zeroed by the kernel) by every copy
    thread for its own range at once, rather than by one thread before the
    copy or a trap per page during it.
    """
    if fault and part:
        populate_range(part[0][0], part[-1][0] + part[-1][2] - part[0][0])
    for d, s, n in part:
        ctypes.memmove(d, s, n)


# --------------------------------------------------------------------------- handle


class SaveHandle:
    """A save in progress: ``wait()`` blocks until it is durable (on rank 0: committed)."""

    def __init__(self, step: int, kind: str, stall_s: float, fut: Future[dict[str, Any]]):
        self.step = step
        self.kind = kind  # full | diff | incr
        self.stall_s = stall_s  # time the caller was blocked (snapshot)
        self._fut = fut
        self._reported = False

    def done(self) -> bool:
        return self._fut.done()

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the background write; raises its error. Returns stats (bytes written, seconds)."""
        try:
            return self._fut.result(timeout)
        finally:
            if self._fut.done():
                self._reported = True

    @property
    def stats(self) -> dict[str, Any]:
        return self._fut.result(0) if self._fut.done() and not self._fut.exception() else {}


# --------------------------------------------------------------------------- checkpointer


class Checkpointer:
    """Saves and loads the checkpoints of one rank under ``path``.

    Keeps the reusable snapshot buffer, the delta reference and the
    background writer thread, so create one per rank and training run (the
    module-level :func:`save` does that for you).
    """

    def __init__(
        self,
        path: str | Store,
        *,
        client: Any = None,
        rank: int = 0,
        world_size: int = 1,
        mode: str = "sharded",
        policy: Policy | None = None,
        keep_last: int | None = None,
        usrbio: bool | None = None,
        barrier_timeout_s: float = 600.0,
    ) -> None:
        if mode not in ("sharded", "consolidated"):
            raise ValueError(f"mode must be 'sharded' or 'consolidated', got {mode!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.policy: Policy = policy or Full()
        _check_policy(self.policy)
        self.store = open_store(path, client=client, usrbio=usrbio)
        self.rank, self.world_size, self.mode = rank, world_size, mode
        self.keep_last = keep_last
        self.barrier_timeout_s = barrier_timeout_s
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._queue: list[tuple[Future[dict[str, Any]], Any]] = []
        self._cv = threading.Condition(self._lock)
        self._closed = False
        self._last: SaveHandle | None = None
        self._layout_key: tuple[Any, ...] | None = None
        self._snap: _Snapshot | None = None
        self._ref: _Snapshot | None = None  # reference snapshot for deltas (same layout)
        self._ref_step: int | None = None
        self._since_full = 0
        # a snapshot buffer being made ahead of the first save (prepare): (layout key, future)
        self._prepared: tuple[tuple[Any, ...], Future[_Snapshot]] | None = None
        self._copy_workers = _copy_threads() - 1
        self._copiers: ThreadPoolExecutor | None = None
        # a hook for crash tests: called with (phase, step) before each durable step
        self._phase_hook: Any = None

    # ------------------------------------------------------------------ save

    def save(
        self, state_dict: Any, *, step: int | None = None, asynchronous: bool = True
    ) -> SaveHandle:
        """Snapshot ``state_dict`` and write it as checkpoint ``step`` (see the module docstring)."""
        if self._closed:
            raise ValueError("checkpointer is closed")
        t0 = time.perf_counter()
        prev = self._last
        if prev is not None:
            exc = None
            try:
                prev._fut.result()  # the snapshot buffer is reused: the previous write must end
            except BaseException as e:  # noqa: BLE001 - re-raised below if nobody saw it
                exc = e
            if exc is not None and not prev._reported:
                prev._reported = True
                raise RuntimeError(f"previous checkpoint (step {prev.step}) failed: {exc}") from exc
        if step is None:
            if self.world_size > 1:
                raise ValueError("step is required when world_size > 1 (ranks must agree)")
            have = layout.steps(self.store)
            step = (have[-1] + 1) if have else 0
        layout.step_dir(step)  # validates the range
        skel, items = _flatten(state_dict, freeze=True)
        tensors = _describe(items, self.mode, self.rank)
        key = _layout_of(tensors)
        total = (tensors[-1].off + tensors[-1].nbytes) if tensors else 0
        if key != self._layout_key or self._snap is None:
            self._snap = None  # drop the old layout's buffer before mapping the new one
            prep, self._prepared = self._prepared, None
            if prep is not None and prep[0] == key:
                self._snap = prep[1].result()  # made by prepare(): waits only for what is left
            else:
                # faulted in by take
                self._snap = _Snapshot(tensors, total, populate=False, store=self.store)
            self._ref, self._ref_step, self._layout_key = None, None, key
        pol = self.policy
        kind, base = "full", None
        if isinstance(pol, (Differential, Incremental)) and self._ref is not None:
            if self._since_full + 1 < pol.baseline_every:
                kind = "diff" if isinstance(pol, Differential) else "incr"
                base = self._ref_step
        byname = dict(items)
        if self._copiers is None and self._copy_workers:
            self._copiers = ThreadPoolExecutor(
                self._copy_workers, thread_name_prefix="fs3-ckpt-copy"
            )
        self._snap.take([byname[t.name] for t in tensors], self._copiers, self._copy_workers)
        stall = time.perf_counter() - t0
        # everything else (pickling the non-tensor skeleton, CRCs, I/O) is the writer's
        job = dict(step=step, kind=kind, base=base, tensors=tensors, total=total, skel=skel)
        fut: Future[dict[str, Any]] = Future()
        h = SaveHandle(step, kind, stall, fut)
        self._last = h
        if asynchronous:
            with self._cv:
                self._queue.append((fut, job))
                self._cv.notify()
                if self._writer is None:
                    self._writer = threading.Thread(
                        target=self._writer_loop, name=f"fs3-ckpt-writer-{self.rank}", daemon=True
                    )
                    self._writer.start()
        else:
            self._run_job(fut, job)
            h.wait()
        return h

    def prepare(self, state_dict: Any) -> Future[None]:
        """Make the snapshot buffer for ``state_dict``'s layout now, on a background thread.

        The first save of a layout otherwise maps and faults in a buffer as
        large as the state dict inside the caller's stall (fresh memory cost
        this VM 0.2-5 s per GiB, up to several times the copy itself:
        benchmarks/results). Call this once the model is built (training
        steps run meanwhile); a save of the same layout then only copies, and
        waits for the rest of the preparation if it is still running. The
        returned future is done when the buffer is ready (its error, if any,
        is raised there and by that save). Nothing is prepared if the layout's
        buffer already exists.
        """
        if self._closed:
            raise ValueError("checkpointer is closed")
        _, items = _flatten(state_dict)
        tensors = _describe(items, self.mode, self.rank)
        key = _layout_of(tensors)
        total = (tensors[-1].off + tensors[-1].nbytes) if tensors else 0
        done: Future[None] = Future()
        if (key == self._layout_key and self._snap is not None) or (
            self._prepared is not None and self._prepared[0] == key
        ):
            prep = self._prepared
            if prep is not None and prep[0] == key:
                prep[1].add_done_callback(lambda f: _chain_done(f, done))
            else:
                done.set_result(None)
            return done
        made: Future[_Snapshot] = Future()

        def run() -> None:
            try:
                made.set_result(_Snapshot(tensors, total, store=self.store))
            except BaseException as e:  # noqa: BLE001 - raised by the save that wants it
                made.set_exception(e)

        made.add_done_callback(lambda f: _chain_done(f, done))
        self._prepared = (key, made)
        threading.Thread(target=run, name=f"fs3-ckpt-prepare-{self.rank}", daemon=True).start()
        return done

    def _writer_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                fut, job = self._queue.pop(0)
            self._run_job(fut, job)

    def _run_job(self, fut: Future[dict[str, Any]], job: dict[str, Any]) -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            stats = self._write(job)
        except BaseException as e:
            fut.set_exception(e)
        else:
            fut.set_result(stats)

    def _phase(self, name: str, step: int) -> None:
        if self._phase_hook is not None:
            self._phase_hook(name, step)

    def _write(self, job: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        step, kind, base = job["step"], job["kind"], job["base"]
        tensors: list[_Tensor] = job["tensors"]
        snapshot = self._snap
        assert snapshot is not None
        snap = snapshot.mem
        pol = self.policy
        d = layout.step_dir(step)
        self.store.makedirs(d)
        data_rel = f"{d}/{layout.data_name(self.rank)}"
        compress = getattr(pol, "compress", False)
        self._phase("data", step)
        if kind == "full" and not compress:
            entries = [
                IndexEntry(t.name, t.dtype, list(t.shape), t.off, t.nbytes,
                           crc32c(snap[t.off : t.off + t.nbytes]), file=layout.data_name(self.rank),
                           toff=t.toff)
                for t in tensors
            ]  # fmt: skip
            size = job["total"]
            segs = [Segment(0, snap[:size])] if size else []
            self.store.write_segments(data_rel, segs, size=size)
        else:
            items, metas = self._pieces(tensors, kind, compress)
            entries = write_items(self.store, data_rel, items, meta=metas)
            for e in entries:
                e.file = layout.data_name(self.rank)
            size = (entries[-1].offset + entries[-1].length) if entries else 0
        self._phase("index", step)
        try:
            objects = pickle.dumps(job["skel"], protocol=4)
        except Exception as exc:
            raise TypeError(f"state dict holds an object that cannot be pickled: {exc}") from exc
        index = {
            "format": layout.FORMAT, "step": step, "rank": self.rank, "world_size": self.world_size,
            "mode": self.mode, "kind": kind, "base": base, "data": layout.data_name(self.rank),
            "data_bytes": size,
            "tensors": {t.name: {"dtype": t.dtype, "shape": list(t.shape), "fw": t.fw,
                                 "sharded": t.sharded} for t in tensors},
            "pieces": [e.to_json() for e in entries],
            "objects": base64.b64encode(objects).decode(),
        }  # fmt: skip
        self.store.write_atomic(f"{d}/{layout.index_name(self.rank)}", layout.dumps(index))
        if self.rank == 0:
            self._commit(step)
        # the reference for the next delta: only once this step is durable (and committed)
        if isinstance(pol, (Differential, Incremental)):
            if kind == "full":
                self._ref, self._snap = snapshot, self._ref
                self._ref_step, self._since_full = step, 0
            else:
                self._since_full += 1
                if isinstance(pol, Incremental):
                    self._ref, self._snap = snapshot, self._ref
                    self._ref_step = step
            if self._snap is None:
                # the next snapshot's buffer, populated here rather than in the caller's stall
                self._snap = _Snapshot(tensors, job["total"], store=self.store)
        return {"step": step, "kind": kind, "bytes": size, "seconds": time.perf_counter() - t0}

    def _pieces(
        self, tensors: list[_Tensor], kind: str, compress: bool
    ) -> tuple[list[tuple[str, Any]], list[dict[str, Any]]]:
        """The stored pieces of a delta (changed blocks) or compressed full checkpoint."""
        assert self._snap is not None
        snap, pol = self._snap.mem, self.policy
        ref = self._ref.mem if self._ref is not None else None
        block = getattr(pol, "block_bytes", 1 << 20)
        quant = getattr(pol, "quantize", None) == "int8"
        items: list[tuple[str, Any]] = []
        metas: list[dict[str, Any]] = []
        for t in tensors:
            cur = snap[t.off : t.off + t.nbytes]
            if kind == "full":
                runs = [(0, t.nbytes)] if t.nbytes else []
            else:
                assert ref is not None
                runs = _changed_runs(cur, ref[t.off : t.off + t.nbytes], block)
            for a, b in runs:
                piece = cur[a:b]
                meta: dict[str, Any] = {
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "toff": t.toff + a,
                }
                data: Any = piece
                if kind != "full" and quant and codec.q8_supported(t.dtype):
                    assert ref is not None
                    enc = codec.q8_encode(piece, ref[t.off + a : t.off + b], t.dtype)
                    if enc is not None:
                        data, decoded = enc
                        meta.update(enc="q8", rawlen=b - a)
                        # the reference must be what a restore will produce
                        np.frombuffer(piece, dtype=np.uint8)[:] = decoded.view(np.uint8)
                if compress and meta.get("enc", "raw") == "raw":
                    z = codec.zlib_encode(piece)
                    if z is not None:
                        data = z
                        meta.update(enc="zlib", rawlen=b - a)
                items.append((t.name, data))
                metas.append(meta)
        return items, metas

    def _commit(self, step: int) -> None:
        """Rank 0: wait for every rank's index, then write the manifest and the success marker."""
        d = layout.step_dir(step)
        deadline = time.monotonic() + self.barrier_timeout_s
        delay = 0.005
        ranks = []
        for r in range(self.world_size):
            rel = f"{d}/{layout.index_name(r)}"
            while not self.store.exists(rel):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"rank {r} did not publish {rel} within {self.barrier_timeout_s}s"
                    )
                time.sleep(delay)  # other ranks are separate processes: poll their durable index
                delay = min(delay * 2, 0.2)
            raw = self.store.read_bytes(rel)
            idx = json.loads(raw)
            if idx["world_size"] != self.world_size or idx["mode"] != self.mode:
                raise CorruptCheckpoint(
                    22,
                    f"rank {r} saved step {step} with world size {idx['world_size']} mode {idx['mode']}",
                )
            ranks.append({
                "rank": r, "index": layout.index_name(r), "index_crc32c": crc32c(raw),
                "data": idx["data"], "data_bytes": idx["data_bytes"], "kind": idx["kind"],
                "base": idx["base"],
            })  # fmt: skip
        kinds = {r["kind"] for r in ranks}
        manifest = layout.dumps({
            "format": layout.FORMAT, "step": step, "world_size": self.world_size, "mode": self.mode,
            "kind": "full" if kinds == {"full"} else sorted(kinds - {"full"})[0],
            "bases": sorted({r["base"] for r in ranks if r["base"] is not None}),
            "ranks": ranks, "created": time.time(),
        })  # fmt: skip
        self._phase("manifest", step)
        self.store.write_atomic(f"{d}/{layout.MANIFEST}", manifest)
        self._phase("marker", step)
        layout.write_marker(self.store, step, manifest)
        self._phase("committed", step)
        if self.keep_last is not None:
            layout.retain(self.store, self.keep_last)

    # ------------------------------------------------------------------ load

    def latest(self) -> int | None:
        return layout.latest(self.store)

    def load(
        self,
        step: int | None = None,
        *,
        into: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        trusted: bool = False,
    ) -> Any:
        """Restore checkpoint ``step`` (default: the newest valid) — see :func:`load`."""
        return _load(self.store, step, into=into, rank=self.rank if rank is None else rank,
                     world_size=self.world_size if world_size is None else world_size,
                     trusted=trusted)  # fmt: skip

    def wait(self) -> None:
        """Wait for the last save (raises its error)."""
        if self._last is not None:
            self._last.wait()

    def close(self) -> None:
        """Finish queued saves, stop the writer and release buffers."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        prep, self._prepared = self._prepared, None
        if prep is not None:
            prep[1].exception()  # its thread ends; the buffer goes back to the arena unused
        if self._copiers is not None:
            self._copiers.shutdown(wait=True)
            self._copiers = None
        self._snap = self._ref = None  # the buffers go back to the process's arena
        self.store.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _changed_runs(cur: memoryview, ref: memoryview, block: int) -> list[tuple[int, int]]:
    """Byte ranges (merged runs of ``block``-sized blocks) where ``cur`` differs from ``ref``."""
    n = len(cur)
    if n == 0:
        return []
    a = np.frombuffer(cur, dtype=np.uint8)
    b = np.frombuffer(ref, dtype=np.uint8)
    full = n // block
    changed: list[bool] = []
    if full:
        w = 8 if block % 8 == 0 else 1
        ax = a[: full * block].view(np.uint64 if w == 8 else np.uint8).reshape(full, block // w)
        bx = b[: full * block].view(np.uint64 if w == 8 else np.uint8).reshape(full, block // w)
        changed = list(np.any(ax != bx, axis=1))
    if n % block:
        changed.append(bool(np.any(a[full * block :] != b[full * block :])))
    runs: list[tuple[int, int]] = []
    for i, c in enumerate(changed):
        if not c:
            continue
        s, e = i * block, min(n, (i + 1) * block)
        if runs and runs[-1][1] == s:
            runs[-1] = (runs[-1][0], e)
        else:
            runs.append((s, e))
    return runs


# --------------------------------------------------------------------------- load


def _rows_of(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """``numpy.array_split``'s share of ``n`` rows for ``rank``."""
    q, r = divmod(n, world_size)
    start = rank * q + min(rank, r)
    return start, start + q + (1 if rank < r else 0)


def _chain(
    store: Store, step: int, rank: int, seen: layout.Seen | None = None
) -> list[dict[str, Any]]:
    """Index files of ``rank`` from the baseline to ``step`` (oldest first)."""
    out = []
    s: int | None = step
    while s is not None:
        idx = layout.read_index(store, s, rank, seen)
        out.append(idx)
        s = idx["base"]
        if s is not None and s >= idx["step"]:
            raise CorruptCheckpoint(22, f"bad base {s} for step {idx['step']}")
    return out[::-1]


def _load(
    store: Store,
    step: int | None,
    *,
    into: Any,
    rank: int,
    world_size: int,
    trusted: bool,
) -> Any:
    seen = layout.Seen()
    if step is None:
        step = layout.latest(store, seen, rank)
        if step is None:
            raise FileNotFoundError(2, f"no valid checkpoint under {store.root}")
    elif step not in layout.prefetch(store, step, rank, seen, also=lambda: layout.steps(store)):
        raise FileNotFoundError(2, f"no checkpoint at step {step} under {store.root}")
    info = layout.check(store, step, seen)
    if not info.valid:
        raise CorruptCheckpoint(5, f"checkpoint step {step} is not valid: {info.reason}")
    man = layout.read_manifest(store, step, seen)
    if man["mode"] == "sharded":
        if man["world_size"] != world_size:
            raise ValueError(
                f"step {step} is a sharded checkpoint of world size {man['world_size']}; "
                f"restoring at world size {world_size} needs mode='consolidated'"
            )
        read_ranks = [rank]
    else:
        read_ranks = [int(r["rank"]) for r in man["ranks"]]
    chains = {r: _chain(store, step, r, seen) for r in read_ranks}
    head = chains[read_ranks[0]][-1]
    raw_objects = base64.b64decode(head["objects"])
    skel = pickle.loads(raw_objects) if trusted else _SafeUnpickler(io.BytesIO(raw_objects)).load()
    meta: dict[str, dict[str, Any]] = {}
    for r in read_ranks:
        meta.update(chains[r][-1]["tensors"])
    if into is None and len(read_ranks) == 1 and len(chains[read_ranks[0]]) == 1:
        fast = _load_whole_file(store, chains[read_ranks[0]][0], meta)
        if fast is not None:
            return _unflatten(skel, fast)
    # destination of each tensor: byte range [lo, hi) of the global tensor
    _, into_items = _flatten(into) if into is not None else (None, [])
    into_by = dict(into_items)
    dests: dict[str, tuple[Any, memoryview, int]] = {}
    for name, m in meta.items():
        shape = tuple(m["shape"])
        esz = buffers.element_size(m["dtype"])
        lo = 0
        if m["sharded"] and man["mode"] == "consolidated" and world_size > 1:
            row = esz * int(np.prod(shape[1:], dtype=np.int64))
            r0, r1 = _rows_of(shape[0], rank, world_size)
            shape, lo = (r1 - r0, *shape[1:]), r0 * row
        obj = into_by.get(name)
        if isinstance(obj, Shard):
            obj = obj.tensor
        if obj is not None:
            if buffers.dtype_name(obj) != m["dtype"] or tuple(obj.shape) != shape:
                raise ValueError(
                    f"into[{name!r}] is {buffers.dtype_name(obj)}{tuple(obj.shape)}, "
                    f"checkpoint has {m['dtype']}{shape}"
                )
            mv = buffers.byte_view(obj)
            if buffers.is_torch(obj) and (obj.device.type != "cpu" or not obj.is_contiguous()):
                raise ValueError(f"into[{name!r}] must be a contiguous CPU tensor")
        else:
            obj = buffers.make_empty(m["dtype"], shape, m["fw"])
            mv = buffers.byte_view(obj)
        dests[name] = (obj, mv, lo)
    for r in read_ranks:
        for idx in chains[r]:
            _apply(store, idx, dests)
    return _unflatten(skel, {n: o for n, (o, _, _) in dests.items()})


def _load_whole_file(
    store: Store, idx: dict[str, Any], meta: dict[str, dict[str, Any]]
) -> dict[str, Any] | None:
    """A full checkpoint of one rank read as one sequential transfer into one buffer.

    The tensors are views of that buffer at their file offsets, so the read
    needs no per-tensor I/Os. None if the level is not a plain
    full checkpoint (then the general path runs).
    """
    pieces = [IndexEntry.from_json(j) for j in idx["pieces"]]
    by: dict[str, IndexEntry] = {}
    for e in pieces:
        m = meta.get(e.name)
        if m is None or e.enc != "raw" or e.toff != 0 or e.name in by:
            return None
        want = buffers.element_size(m["dtype"]) * int(np.prod(m["shape"], dtype=np.int64))
        if e.length != want:
            return None
        by[e.name] = e
    if not {n for n, m in meta.items() if _nonempty(m)} <= set(by):
        return None
    size = int(idx["data_bytes"])
    rel = f"{layout.step_dir(idx['step'])}/{idx['data']}"
    # The tensors' final memory: on an fs3 mount a registered USRBIO Iov from the
    # store's pool, so the agent reads straight into it (no staging copy); it goes
    # back to the pool when the last tensor viewing it is gone, and the next load
    # reuses its pages instead of faulting in fresh ones.
    big = store.alloc(size)
    ents = sorted(by.values(), key=lambda e: e.offset)
    read_verified(
        store, rel, [Segment(0, big[:size])] if size else [], ents,
        [big[e.offset : e.offset + e.length] for e in ents],
    )  # fmt: skip
    out = {}
    for name, m in meta.items():
        ent = by.get(name)
        if ent is None or not ent.length:  # an empty tensor has no bytes
            out[name] = buffers.make_empty(m["dtype"], tuple(m["shape"]), m["fw"])
            continue
        view = big[ent.offset : ent.offset + ent.length]
        out[name] = buffers.from_bytes(view, m["dtype"], tuple(m["shape"]), m["fw"])
    return out


def _nonempty(m: dict[str, Any]) -> bool:
    return int(np.prod(m["shape"], dtype=np.int64)) > 0


def _apply(
    store: Store, idx: dict[str, Any], dests: dict[str, tuple[Any, memoryview, int]]
) -> None:
    """Read one index level's pieces into the destinations (direct where a piece fits, else staged)."""
    rel = f"{layout.step_dir(idx['step'])}/{idx['data']}"
    direct: list[tuple[IndexEntry, memoryview]] = []
    staged: list[tuple[IndexEntry, bytearray, memoryview, int, int]] = []
    segs: list[Segment] = []
    for j in idx["pieces"]:
        e = IndexEntry.from_json(j)
        d = dests.get(e.name)
        if d is None:
            continue
        _, mv, lo = d
        hi = lo + len(mv)
        a, b = max(lo, e.toff), min(hi, e.toff + e.covered)
        if a >= b:
            continue
        if e.enc == "raw" and a == e.toff and b == e.toff + e.length:
            view = mv[a - lo : b - lo]
            direct.append((e, view))
            segs.append(Segment(e.offset, view))
        else:
            tmp = bytearray(e.length)
            staged.append((e, tmp, mv, a - lo, b - lo))
            segs.append(Segment(e.offset, memoryview(tmp)))
    read_verified(
        store,
        rel,
        segs,
        [e for e, _ in direct] + [e for e, *_ in staged],
        [v for _, v in direct] + [memoryview(tmp) for _, tmp, *_ in staged],
    )
    for e, tmp, mv, da, db in staged:
        lo = dests[e.name][2]
        pa = lo + da - e.toff  # first byte of the piece (decoded) that the destination wants
        if e.enc == "raw":
            mv[da:db] = memoryview(tmp)[pa : pa + (db - da)]
        elif e.enc == "zlib":
            mv[da:db] = memoryview(codec.zlib_decode(memoryview(tmp), e.rawlen))[
                pa : pa + (db - da)
            ]
        elif e.enc == "q8":
            esz = buffers.element_size(e.dtype)
            out = codec.q8_decode(memoryview(tmp), mv[da:db], e.dtype, pa // esz, e.rawlen // esz)
            mv[da:db] = memoryview(cast(Any, out.view(np.uint8).reshape(-1))).cast("B")
        else:
            raise CorruptCheckpoint(22, f"unknown piece encoding {e.enc!r} in {rel}")


# --------------------------------------------------------------------------- module-level API

_checkpointers: dict[tuple[Any, ...], Checkpointer] = {}
_reg_lock = threading.Lock()


def _key(path: str | Store, client: Any, rank: int) -> tuple[Any, ...]:
    if isinstance(path, Store):
        return (id(path), rank)
    p = path if client is not None else os.path.abspath(path)
    return (p, id(client), rank)


def checkpointer(
    path: str | Store,
    *,
    client: Any = None,
    rank: int = 0,
    world_size: int = 1,
    mode: str = "sharded",
    policy: Policy | None = None,
    keep_last: int | None = None,
    usrbio: bool | None = None,
) -> Checkpointer:
    """The process-wide :class:`Checkpointer` for (path, client, rank), created on first use.

    Settings given later replace earlier ones (a different mode, world size or
    policy starts a new checkpointer; the old one finishes its saves first).
    """
    k = _key(path, client, rank)
    with _reg_lock:
        c = _checkpointers.get(k)
        want = (world_size, mode, policy or Full(), keep_last)
        if c is not None and (c.world_size, c.mode, c.policy, c.keep_last) != want:
            c.close()
            c = None
        if c is None:
            c = Checkpointer(path, client=client, rank=rank, world_size=world_size, mode=mode,
                             policy=policy, keep_last=keep_last, usrbio=usrbio)  # fmt: skip
            _checkpointers[k] = c
        return c


def save(
    state_dict: Any,
    path: str | Store,
    *,
    step: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    mode: str = "sharded",
    asynchronous: bool = True,
    policy: Policy | None = None,
    keep_last: int | None = None,
    client: Any = None,
) -> SaveHandle:
    """Save ``state_dict`` (nested dicts/lists of tensors, arrays and plain values) under ``path``.

    Returns once the tensors are snapshotted; ``handle.wait()`` for durability.
    ``path``: a directory (on an fs3 mount: USRBIO), or an fs3 path with ``client``.
    """
    c = checkpointer(path, client=client, rank=rank, world_size=world_size, mode=mode,
                     policy=policy, keep_last=keep_last)  # fmt: skip
    return c.save(state_dict, step=step, asynchronous=asynchronous)


def load(
    path: str | Store,
    step: int | None = None,
    *,
    into: Any = None,
    rank: int = 0,
    world_size: int = 1,
    client: Any = None,
    trusted: bool = False,
) -> Any:
    """Restore a checkpoint (default: the newest valid one), checking every CRC32C.

    ``into``: a state dict of preallocated tensors/arrays (same structure) to
    read straight into; missing ones are allocated. A consolidated checkpoint
    restores at any ``world_size``: sharded tensors come back as this rank's
    rows. A delta checkpoint is composed from its baseline and deltas.
    ``trusted=True`` allows arbitrary pickled non-tensor objects.
    """
    store = open_store(path, client=client, create=False)
    try:
        return _load(store, step, into=into, rank=rank, world_size=world_size, trusted=trusted)
    finally:
        if store is not path:
            store.close()


def latest(path: str | Store, *, client: Any = None) -> int | None:
    """The step of the newest valid checkpoint under ``path`` (None if none)."""
    store = open_store(path, client=client, create=False)
    try:
        return layout.latest(store)
    finally:
        if store is not path:
            store.close()


def wait_all() -> None:
    """Wait for every checkpointer's last save (e.g. before exiting)."""
    for c in list(_checkpointers.values()):
        c.wait()


def close_all() -> None:
    with _reg_lock:
        cs = list(_checkpointers.values())
        _checkpointers.clear()
    for c in cs:
        c.close()


__all__: Sequence[str] = (
    "Checkpointer", "Differential", "Full", "Incremental", "SaveHandle", "Shard", "checkpointer",
    "close_all", "latest", "load", "save", "wait_all",
)  # fmt: skip
