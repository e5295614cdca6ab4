"""On-storage layout of a checkpoint directory, validity, retention and garbage collection.

::

    ROOT/step-000000000100/
        rank-00000.data          every tensor (or changed piece) of rank 0, end to end
        rank-00000.index.json    where each piece is (IndexEntry) + tensor dtypes/shapes + non-tensor state
        ...                      one pair per rank
        manifest.json            rank 0, once every rank's index exists: ranks, CRCs of their indexes, bases
        COMMITTED                the success marker: the manifest's CRC32C

Order of durability (each step fsync'd before the next starts): data files,
index files (atomic rename), manifest (atomic rename), marker (atomic
rename). A checkpoint is *valid* when its marker matches its manifest, every
index listed there is present with the recorded CRC, every data file has the
recorded size, and every checkpoint it is a delta of is valid. A crash at any
point therefore leaves no marker (the checkpoint is ignored and later
collected) or a complete checkpoint. Deleting removes the marker first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fs3.ckpt.datafile import CorruptCheckpoint, crc32c
from fs3.ckpt.store import Store

FORMAT = 1
MARKER = "COMMITTED"
MANIFEST = "manifest.json"
_STEP_RE = re.compile(r"^step-(\d{12})$")


def step_dir(step: int) -> str:
    if step < 0 or step >= 10**12:
        raise ValueError(f"step must be 0..10**12-1, got {step}")
    return f"step-{step:012d}"


def data_name(rank: int) -> str:
    return f"rank-{rank:05d}.data"


def index_name(rank: int) -> str:
    return f"rank-{rank:05d}.index.json"


def steps(store: Store) -> list[int]:
    """Every checkpoint directory's step, oldest first (valid or not)."""
    out = []
    for n in store.listdir(""):
        m = _STEP_RE.match(n)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


class Seen:
    """Small files and data-file sizes already read in one operation (a load reads each once)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.sizes: dict[str, int] = {}


def _cached(cache: dict[str, Any] | None, rel: str, fetch: Callable[[str], Any]) -> Any:
    if cache is None:
        return fetch(rel)
    if rel not in cache:
        cache[rel] = fetch(rel)
    return cache[rel]


def _read(store: Store, rel: str, seen: Seen | None) -> bytes:
    return bytes(_cached(seen.files if seen else None, rel, store.read_bytes))


def _size(store: Store, rel: str, seen: Seen | None) -> int:
    return int(_cached(seen.sizes if seen else None, rel, store.size))


def prefetch(store: Store, step: int, rank: int, seen: Seen, *, also: Any = None) -> Any:
    """Read what validating and loading ``rank``'s part of ``step`` needs, all at once, into ``seen``.

    The manifest, the success marker, the rank's index and its data file's
    size are read concurrently (each is a round trip through the mount or
    the client; one after the other they add up to a visible part of a
    load). A file that cannot be read is left out: the check that follows
    reads it again and reports why. ``also`` (a callable) runs beside them;
    its result is returned.
    """
    try:
        d = step_dir(step)
    except ValueError:  # no such step can exist: nothing to read ahead
        return also() if also is not None else None

    def quiet(fn: Any, *args: Any) -> None:
        try:
            fn(store, *args, seen)
        except OSError:
            pass

    jobs: list[tuple[Any, tuple[Any, ...]]] = [
        (_read, (f"{d}/{MANIFEST}",)),
        (_read, (f"{d}/{MARKER}",)),
        (_read, (f"{d}/{index_name(rank)}",)),
        (_size, (f"{d}/{data_name(rank)}",)),
    ]
    with ThreadPoolExecutor(len(jobs) + 1, thread_name_prefix="fs3-ckpt-meta") as ex:
        futs = [ex.submit(quiet, fn, *args) for fn, args in jobs]
        extra = ex.submit(also) if also is not None else None
        for f in futs:
            f.result()
        return extra.result() if extra is not None else None


def read_json(store: Store, rel: str, seen: Seen | None = None) -> Any:
    return json.loads(_read(store, rel, seen))


def read_manifest(store: Store, step: int, seen: Seen | None = None) -> dict[str, Any]:
    return dict(read_json(store, f"{step_dir(step)}/{MANIFEST}", seen))


def read_index(store: Store, step: int, rank: int, seen: Seen | None = None) -> dict[str, Any]:
    return dict(read_json(store, f"{step_dir(step)}/{index_name(rank)}", seen))


@dataclass
class CkptInfo:
    """What ``fs3 ckpt ls`` shows for one checkpoint directory."""

    step: int
    valid: bool
    reason: str = ""  # why not valid
    kind: str = "?"  # full | diff | incr
    bases: list[int] = field(default_factory=list)
    world_size: int = 0
    mode: str = "?"
    bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _check_own(store: Store, step: int, seen: Seen | None = None) -> CkptInfo:
    """Validity of ``step`` itself (marker, manifest, indexes, data sizes), not of its bases."""
    d = step_dir(step)
    info = CkptInfo(step, False)
    try:
        man_bytes = _read(store, f"{d}/{MANIFEST}", seen)
    except OSError:
        info.reason = "no manifest (incomplete save)"
        return info
    try:
        man = json.loads(man_bytes)
        info.kind, info.bases = man["kind"], list(man["bases"])
        info.world_size, info.mode = int(man["world_size"]), man["mode"]
        info.bytes = sum(int(r["data_bytes"]) for r in man["ranks"])
    except (ValueError, KeyError, TypeError) as e:
        info.reason = f"unreadable manifest: {e}"
        return info
    try:
        marker = json.loads(_read(store, f"{d}/{MARKER}", seen))
    except OSError:
        info.reason = "no success marker (incomplete save)"
        return info
    except ValueError:
        info.reason = "unreadable success marker"
        return info
    if marker.get("manifest_crc32c") != crc32c(man_bytes):
        info.reason = "marker does not match the manifest"
        return info
    for r in man["ranks"]:
        try:
            if crc32c(_read(store, f"{d}/{r['index']}", seen)) != r["index_crc32c"]:
                info.reason = f"{r['index']} does not match the manifest"
                return info
            if _size(store, f"{d}/{r['data']}", seen) != r["data_bytes"]:
                info.reason = f"{r['data']} has the wrong size"
                return info
        except OSError as e:
            info.reason = f"missing file: {e}"
            return info
    info.valid = True
    return info


def list_checkpoints(store: Store) -> list[CkptInfo]:
    """Every checkpoint, oldest first, with validity including its base chain."""
    infos = {s: _check_own(store, s) for s in steps(store)}

    def chain_ok(s: int, seen: frozenset[int]) -> str:
        i = infos.get(s)
        if i is None:
            return f"base step {s} is missing"
        if not i.valid:
            return f"base step {s} is invalid" if seen else i.reason
        for b in i.bases:
            if b in seen or b >= s:
                return f"bad base chain at step {b}"
            why = chain_ok(b, seen | {s})
            if why:
                return why
        return ""

    for s, i in infos.items():
        if i.valid:
            why = chain_ok(s, frozenset())
            if why:
                i.valid, i.reason = False, why
    return list(infos.values())


def check(store: Store, step: int, seen: Seen | None = None) -> CkptInfo:
    """Validity of ``step`` including the checkpoints it is a delta of (reads only that chain).

    ``seen`` collects the small files read (a load then does not read them again).
    """
    info = _check_own(store, step, seen)
    visited = {step}
    todo = list(info.bases) if info.valid else []
    while todo:
        b = todo.pop()
        if b in visited:
            continue
        if b >= step:
            info.valid, info.reason = False, f"bad base chain at step {b}"
            break
        visited.add(b)
        bi = _check_own(store, b, seen)
        if not bi.valid:
            info.valid, info.reason = False, f"base step {b} is invalid"
            break
        todo.extend(bi.bases)
    return info


def latest(store: Store, seen: Seen | None = None, rank: int = 0) -> int | None:
    """The newest valid checkpoint's step (None if there is none); checks newest first.

    ``seen``: what the checks read is kept there (a load then reads nothing
    twice), and each candidate's files for ``rank`` are read concurrently
    (:func:`prefetch`).
    """
    for s in reversed(steps(store)):
        if seen is not None:
            prefetch(store, s, rank, seen)
        if check(store, s, seen).valid:
            return s
    return None


def write_marker(store: Store, step: int, manifest: bytes) -> None:
    store.write_atomic(f"{step_dir(step)}/{MARKER}", dumps({"manifest_crc32c": crc32c(manifest)}))


def remove(store: Store, step: int) -> None:
    """Delete one checkpoint: marker first, so a crash mid-way leaves an invalid one, never a half valid one."""
    d = step_dir(step)
    if store.exists(f"{d}/{MARKER}"):
        store.unlink(f"{d}/{MARKER}")
    store.remove_tree(d)


def needed_by(infos: list[CkptInfo], keep: set[int]) -> set[int]:
    """``keep`` plus every checkpoint their delta chains need."""
    by = {i.step: i for i in infos}
    out: set[int] = set()
    todo = list(keep)
    while todo:
        s = todo.pop()
        if s in out or s not in by:
            continue
        out.add(s)
        todo.extend(by[s].bases)
    return out


def gc(store: Store) -> list[int]:
    """Remove invalid checkpoints older than the newest valid one (newer ones may still be in progress)."""
    infos = list_checkpoints(store)
    valid = [i.step for i in infos if i.valid]
    if not valid:
        return []
    newest = valid[-1]
    gone = [i.step for i in infos if not i.valid and i.step < newest]
    for s in gone:
        remove(store, s)
    return gone


def retain(store: Store, keep_last: int) -> list[int]:
    """Keep the newest ``keep_last`` valid checkpoints and the baselines they need; remove the rest.

    Also collects invalid checkpoints older than the newest valid one. Returns the removed steps.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    infos = list_checkpoints(store)
    valid = [i.step for i in infos if i.valid]
    keep = needed_by(infos, set(valid[-keep_last:]))
    gone = [s for s in valid if s not in keep]
    for s in gone:
        remove(store, s)
    return gone + gc(store)


def verify(store: Store, step: int) -> list[str]:
    """Read every piece of ``step`` and check its CRC32C; returns problems (empty: all good)."""
    from fs3.ckpt.datafile import IndexEntry, read_items

    problems: list[str] = []
    info = next((i for i in list_checkpoints(store) if i.step == step), None)
    if info is None:
        return [f"no checkpoint at step {step}"]
    if not info.valid:
        problems.append(f"step {step} is not valid: {info.reason}")
    try:
        man = read_manifest(store, step)
    except (OSError, ValueError) as e:
        return problems + [f"step {step}: {e}"]
    for r in man["ranks"]:
        try:
            idx = read_index(store, step, int(r["rank"]))
        except (OSError, ValueError) as e:
            problems.append(f"step {step} rank {r['rank']}: {e}")
            continue
        entries = [IndexEntry.from_json(e) for e in idx["pieces"]]
        rel = f"{step_dir(step)}/{idx['data']}"
        # bounded memory: verify in groups of at most 256 MiB
        groups: list[list[IndexEntry]] = [[]]
        size = 0
        for ent in entries:
            if groups[-1] and size + ent.length > 256 << 20:
                groups.append([])
                size = 0
            groups[-1].append(ent)
            size += ent.length
        for group in groups:
            if not group:
                continue
            try:
                read_items(store, rel, group, [bytearray(g.length) for g in group])
            except CorruptCheckpoint as ex:
                problems.append(str(ex))
            except OSError as ex:
                problems.append(f"{rel}: {ex}")
    return problems
