"""PyTorch Distributed Checkpoint (``torch.distributed.checkpoint``) on fs3's checkpoint data path.

::

    import torch.distributed.checkpoint as dcp
    from fs3.ckpt.dcp import Fs3StorageWriter, Fs3StorageReader

    dcp.save(state, storage_writer=Fs3StorageWriter("/mnt/fs3/run1/step-100"))
    dcp.load(state, storage_reader=Fs3StorageReader("/mnt/fs3/run1/step-100"))
    # no mount: an fs3 path through the client API
    w = Fs3StorageWriter("fs3:///run1/step-100", cluster_file="/etc/fs3/cluster")

Where the bytes go. Each rank writes everything DCP hands it (tensor shards,
pickled non-tensor objects) into one aggregated data file per ``max_file_bytes``
(default 1 GiB) with
:func:`fs3.ckpt.datafile.write_items`: raw tensor bytes laid end to end, a
CRC32C per item, many I/Os in flight (USRBIO when the directory is on an fs3
mount, ``pwrite`` on other local directories, the fs3 client API for
``fs3://`` paths), fsync'd before ``write_data`` returns. Tensors are stored
raw (not ``torch.save``'d per item), so a load reads a stored piece straight
into the destination tensor when it is a whole, contiguous CPU tensor, and
checks the CRC of everything it reads (:class:`fs3.ckpt.datafile.CorruptCheckpoint`).

The success marker is DCP's own ``.metadata`` (where each item is: file,
offset, length, CRC, dtype, shape), written by the coordinator in ``finish``
with :meth:`fs3.ckpt.store.Store.write_atomic` only after every rank's
``write_data`` returned, i.e. after every data file is durable. Data file
names carry the save's id, so saving again to the same directory never
touches files the current ``.metadata`` points at: a save killed at any point
leaves the previous checkpoint loadable (or, with no previous one, no
``.metadata`` at all, which a load reports as ``FileNotFoundError``). After
the new ``.metadata`` is in place the coordinator removes data files no
longer referenced (older saves, saves that died).

Resharding: the stored pieces are DCP chunks described in ``.metadata``, so
``dcp.load`` with another world size (or another sharding of DTensors) works
as with DCP's own ``FileSystemReader``; a destination covering only part of a
stored piece reads the whole piece (to check its CRC) and copies the part.

Non-collective saves (``use_collectives=False``) write ``__<rank>.metadata``
per rank, as DCP's ``FileSystemWriter`` does; no rank then knows which data
files the others still need, so nothing is garbage-collected.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import pickle
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from fs3.ckpt.datafile import IndexEntry, read_items, write_items
from fs3.ckpt.store import INFLIGHT, ClientStore, Store, open_store

METADATA = ".metadata"
DATA_SUFFIX = ".data"
READ_BATCH_BYTES = 256 << 20  # scratch memory a load may hold for partial pieces at once
FILE_BYTES = 1 << 30  # a rank's items go into data files of about this size

__all__ = ["Fs3StorageWriter", "Fs3StorageReader", "Fs3StorageInfo"]


@dataclass(frozen=True)
class Fs3StorageInfo:
    """Where one DCP item is stored (``Metadata.storage_data`` values; pickled in ``.metadata``)."""

    file: str
    offset: int
    length: int
    crc32c: int
    dtype: str  # "uint8" for pickled (BYTE_IO) items
    shape: tuple[int, ...]

    def entry(self, name: str) -> IndexEntry:
        return IndexEntry(
            name, self.dtype, list(self.shape), self.offset, self.length, self.crc32c, self.file
        )


@dataclass(frozen=True)
class _RankFile:
    """``SavePlan.storage_data``: the name prefix of the data files a rank writes."""

    file: str


def _groups(items: Sequence[WriteItem], max_bytes: int) -> list[list[WriteItem]]:
    """Plan order, cut into data files of about ``max_bytes`` (a larger item gets its own)."""
    out: list[list[WriteItem]] = []
    size = 0
    for wi in items:
        n = 0
        if wi.type != WriteItemType.BYTE_IO and wi.tensor_data is not None:
            n = math.prod(wi.tensor_data.size) * _element_size(wi.tensor_data.properties.dtype)
        if not out or (size and size + n > max_bytes):
            out.append([])
            size = 0
        out[-1].append(wi)
        size += n
    return out


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _metadata_name(rank: int | None) -> str:
    return METADATA if rank is None else f"__{rank}{METADATA}"


class _Fs3Storage:
    """Resolves a checkpoint id to a :class:`~fs3.ckpt.store.Store` (shared by writer and reader).

    ``creates``: the writer makes the directory; a load creates nothing.

    ``path``: a local directory (USRBIO automatically on an fs3 mount) or
    ``fs3:///dir`` (client API: ``client=``, else a connection from
    ``cluster_file=`` / ``$FS3_CLUSTER_FILE``, closed by :meth:`close`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        client: Any = None,
        cluster_file: str | None = None,
        usrbio: bool | None = None,
        inflight: int = INFLIGHT,
    ) -> None:
        self.path = os.fspath(path)
        self._client = client
        self._own_client: Any = None
        self._cluster_file = cluster_file
        self._usrbio = usrbio
        self.inflight = inflight
        self._store: Store | None = None

    creates = False

    def _set_path(self, checkpoint_id: str | os.PathLike[str] | None) -> None:
        if checkpoint_id is not None and os.fspath(checkpoint_id) != self.path:
            self._close_store()
            self.path = os.fspath(checkpoint_id)

    def _on_fs3(self) -> bool:
        """True: an fs3 path through the client API; False: a local directory."""
        return self.path.startswith("fs3://") or self._client is not None

    def _fs3_client(self) -> Any:
        if self._client is not None:
            return self._client
        if self._own_client is None:
            import fs3

            self._own_client = fs3.connect(self._cluster_file)
        return self._own_client

    @property
    def store(self) -> Store:
        """The checkpoint directory's store; a reader's must exist (FileNotFoundError)."""
        if self._store is None:
            c = self.creates
            if self._on_fs3():
                self._store = ClientStore(self._fs3_client(), _fs3_path(self.path), create=c)
            else:
                self._store = open_store(self.path, usrbio=self._usrbio, create=c)
        return self._store

    def _close_store(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def close(self) -> None:
        """Release the store (thread pools, USRBIO buffers) and an owned connection."""
        self._close_store()
        if self._own_client is not None:
            self._own_client.close()
            self._own_client = None

    @property
    def checkpoint_id(self) -> str:
        return self.path


def _fs3_path(path: str) -> str:
    if path.startswith("fs3://"):
        path = path[len("fs3://") :]
    return "/" + path.lstrip("/")


def _validate(checkpoint_id: str | os.PathLike[str]) -> bool:
    s = os.fspath(checkpoint_id)
    if s.startswith("fs3://"):
        return True
    if "://" in s:
        return False
    return any(os.path.isdir(p) and os.access(p, os.W_OK) for p in _parents(s))


def _parents(path: str) -> list[str]:
    out, p = [], os.path.abspath(path)
    while True:
        out.append(p)
        up = os.path.dirname(p)
        if up == p:
            return out
        p = up


def _remove(store: Store, rel: str) -> None:
    if isinstance(store, ClientStore):
        store.client.unlink(f"{store.root.rstrip('/')}/{rel}")
    else:
        os.unlink(os.path.join(store.root, rel))


class Fs3StorageWriter(_Fs3Storage, StorageWriter, BlockingAsyncStager):
    """A DCP ``StorageWriter`` writing through :mod:`fs3.ckpt`'s data files (see the module doc).

    Args:
        path: checkpoint directory (local, possibly on an fs3 mount) or ``fs3:///dir``.
        client: a connected :class:`fs3.client.file_api.Client` (``fs3://`` paths; any path
            is then taken as an fs3 path).
        cluster_file: for ``fs3://`` paths without ``client``.
        usrbio: force (True) or refuse (False) USRBIO for a local path; None: when on a mount.
        overwrite: False raises if the directory already holds a committed checkpoint.
        inflight: I/Os in flight per data file.
        max_file_bytes: a rank writes several data files of about this size when it has more
            (its tensors are resolved, i.e. copied to the host if on a device, a file at a time).
        cache_staged_state_dict: for ``dcp.async_save`` (see ``BlockingAsyncStager``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        client: Any = None,
        cluster_file: str | None = None,
        usrbio: bool | None = None,
        overwrite: bool = True,
        inflight: int = INFLIGHT,
        max_file_bytes: int = FILE_BYTES,
        cache_staged_state_dict: bool = False,
    ) -> None:
        _Fs3Storage.__init__(
            self,
            path,
            client=client,
            cluster_file=cluster_file,
            usrbio=usrbio,
            inflight=inflight,
        )
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        self.overwrite = overwrite
        self.max_file_bytes = max_file_bytes
        self.save_id = uuid.uuid4().hex
        self.rank: int | None = None
        self.is_coordinator = False
        self.use_collectives = True

    creates = True

    def _phase(self, name: str) -> None:
        """A named point of a save (fault tests kill the process at each)."""

    # -- StorageWriter
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._set_path(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        store = self.store
        name = _metadata_name(None if self.use_collectives else (self.rank or 0))
        if not self.overwrite and store.exists(name):
            raise FileExistsError(
                f"{self.checkpoint_id} already holds a checkpoint ({name}) and overwrite=False"
            )
        if not self.use_collectives:  # no global plan: each rank names its own file
            plan = dataclasses.replace(
                plan, storage_data=_RankFile(self._file_name(self.save_id, self.rank or 0))
            )
        return plan

    @staticmethod
    def _file_name(save_id: str, rank: int) -> str:
        return f"{save_id}-rank-{rank:05d}"  # + "-<k>.data" per data file

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # The coordinator's save_id names every rank's file: one id per checkpoint.
        return [
            p
            if isinstance(p.storage_data, _RankFile)
            else dataclasses.replace(p, storage_data=_RankFile(self._file_name(self.save_id, i)))
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        rank_file: _RankFile = plan.storage_data
        results: list[WriteResult] = []
        self._phase("data")
        for k, group in enumerate(_groups(plan.items, self.max_file_bytes)):
            name = f"{rank_file.file}-{k:04d}{DATA_SUFFIX}"
            items: list[tuple[str, Any]] = []
            for wi in group:  # resolved a file at a time: at most one file's tensors on the host
                data = planner.resolve_data(wi)
                if wi.type == WriteItemType.BYTE_IO:
                    assert isinstance(data, io.BytesIO)
                    items.append((wi.index.fqn, data.getbuffer()))
                else:
                    assert isinstance(data, torch.Tensor)
                    # Only the viewed elements are stored, on the host, contiguous.
                    t = data.detach().cpu().contiguous()
                    items.append((_item_name(wi.index), t))
            entries = write_items(self.store, name, items, inflight=self.inflight)
            del items
            results += [
                WriteResult(
                    index=wi.index,
                    size_in_bytes=e.length,
                    storage_data=Fs3StorageInfo(
                        name, e.offset, e.length, e.crc32c, e.dtype, tuple(e.shape)
                    ),
                )
                for wi, e in zip(group, entries, strict=True)
            ]
        self._phase("data-durable")
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        storage: dict[MetadataIndex, Fs3StorageInfo] = {}
        for rank_results in results:
            for r in rank_results:
                storage[r.index] = r.storage_data
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        name = _metadata_name(None if self.use_collectives else (self.rank or 0))
        self._phase("metadata")
        self.store.write_atomic(name, pickle.dumps(metadata))  # the success marker
        self._phase("committed")
        if self.use_collectives:
            self._collect_garbage({s.file for s in storage.values()})

    def _collect_garbage(self, live: set[str]) -> None:
        """Remove data files of older or failed saves (the new ``.metadata`` is durable)."""
        store = self.store
        for n in store.listdir(""):
            stale_data = n.endswith(DATA_SUFFIX) and n not in live
            stale_tmp = n.startswith(f"{METADATA}.tmp-")  # write_atomic of a killed save
            if stale_data or stale_tmp:
                try:
                    _remove(store, n)
                except FileNotFoundError:
                    pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _validate(checkpoint_id)


def _item_name(index: MetadataIndex) -> str:
    if index.offset is None:
        return index.fqn
    return f"{index.fqn}@{','.join(str(o) for o in index.offset)}"


class Fs3StorageReader(_Fs3Storage, StorageReader):
    """A DCP ``StorageReader`` for checkpoints written by :class:`Fs3StorageWriter`.

    Args: as the writer's (``path``, ``client``, ``cluster_file``, ``usrbio``,
    ``inflight``), plus ``verify`` (check CRC32Cs; default True).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        client: Any = None,
        cluster_file: str | None = None,
        usrbio: bool | None = None,
        inflight: int = INFLIGHT,
        verify: bool = True,
    ) -> None:
        super().__init__(
            path, client=client, cluster_file=cluster_file, usrbio=usrbio, inflight=inflight
        )
        self.verify = verify
        self.storage_data: dict[MetadataIndex, Fs3StorageInfo] = {}
        self.load_id = uuid.uuid4().hex

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._set_path(checkpoint_id)
        self.storage_data = {}
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        name = _metadata_name(kwargs.get("rank"))
        try:
            store = self.store
        except FileNotFoundError:
            raise FileNotFoundError(f"no checkpoint directory {self.checkpoint_id}") from None
        if not store.exists(name):
            raise FileNotFoundError(f"no committed DCP checkpoint at {self.checkpoint_id} ({name})")
        md = pickle.loads(store.read_bytes(name))
        if not isinstance(md, Metadata):
            raise ValueError(f"{self.checkpoint_id}/{name} is not DCP metadata")
        meta = getattr(md, "storage_meta", None) or StorageMeta()
        meta.load_id = self.load_id
        md.storage_meta = meta
        return md

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if metadata.storage_data is None:
            raise ValueError(f"{self.checkpoint_id}: metadata has no storage data")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        # One stored item may feed several requests (destinations overlapping it).
        by_item: dict[MetadataIndex, list[ReadItem]] = defaultdict(list)
        for req in plan.items:
            by_item[req.storage_index].append(req)
        per_file: dict[str, list[MetadataIndex]] = defaultdict(list)
        for idx in by_item:
            per_file[self.storage_data[idx].file].append(idx)
        for file, idxs in per_file.items():
            idxs.sort(key=lambda i: self.storage_data[i].offset)
            batch: list[MetadataIndex] = []
            scratch = 0
            for idx in idxs:
                batch.append(idx)
                scratch += self.storage_data[idx].length
                if scratch >= READ_BATCH_BYTES:
                    self._read_batch(file, batch, by_item, planner)
                    batch, scratch = [], 0
            if batch:
                self._read_batch(file, batch, by_item, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read_batch(
        self,
        file: str,
        idxs: Sequence[MetadataIndex],
        by_item: dict[MetadataIndex, list[ReadItem]],
        planner: LoadPlanner,
    ) -> None:
        """Read the stored items ``idxs`` of ``file`` (all I/Os in flight) and hand them to DCP."""
        entries: list[IndexEntry] = []
        outs: list[Any] = []
        finish: list[tuple[list[ReadItem], Any, Any]] = []
        for idx in idxs:
            info = self.storage_data[idx]
            reqs = by_item[idx]
            direct = None
            if reqs[0].type == LoadItemType.BYTE_IO:
                out: Any = bytearray(info.length)
            else:
                if len(reqs) == 1 and _whole(reqs[0], info):
                    target = planner.resolve_tensor(reqs[0]).detach()
                    if _fits(target, info):
                        direct = target  # read straight into the destination
                out = direct if direct is not None else _empty(info)
            if info.length:  # an empty item has nothing to read (and no writable view)
                entries.append(info.entry(_item_name(idx)))
                outs.append(out)
            finish.append((reqs, out, direct))
        read_items(self.store, file, entries, outs, inflight=self.inflight, verify=self.verify)
        for reqs, out, direct in finish:
            for req in reqs:
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(out))
                    continue
                if direct is not None:
                    planner.commit_tensor(req, direct)
                    continue
                src = out
                for dim, (start, n) in enumerate(
                    zip(req.storage_offsets, req.lengths, strict=True)
                ):
                    src = src.narrow(dim, start, n)
                target = planner.resolve_tensor(req).detach()
                if target.size() != src.size():
                    raise ValueError(
                        f"{req.storage_index}: stored piece gives {tuple(src.size())}, "
                        f"destination is {tuple(target.size())}"
                    )
                target.copy_(src)
                planner.commit_tensor(req, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _validate(checkpoint_id)


def _whole(req: ReadItem, info: Fs3StorageInfo) -> bool:
    return all(o == 0 for o in req.storage_offsets) and tuple(req.lengths) == info.shape


def _fits(t: torch.Tensor, info: Fs3StorageInfo) -> bool:
    return (
        t.device.type == "cpu"
        and t.is_contiguous()
        and str(t.dtype).removeprefix("torch.") == info.dtype
        and tuple(t.shape) == info.shape
        and t.numel() * t.element_size() == info.length
    )


def _empty(info: Fs3StorageInfo) -> torch.Tensor:
    dtype = getattr(torch, info.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown stored dtype {info.dtype!r}")
    return torch.empty(info.shape, dtype=dtype)
