"""Two real ``fs3 meta`` processes on one SQLite file, several client processes.

Each client process runs a deterministic random mix of mknods (FIFOs), mkdirs, renames
(within and across shared directories) and unlinks over gRPC, alternating
between the two servers, retrying transient failures with the same request id.
Every client only touches names it owns, so the final namespace is known
exactly: the test compares it with what the servers hold (no entry lost or
duplicated) and runs the invariant checker (fs3.meta.fsck) on the database.

Run as ``python test_meta_cluster.py worker ADDR1,ADDR2 TAG N SEED`` to get one
client process (the test does that).
"""

from __future__ import annotations

import errno
import json
import random
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve()
SHARED_DIRS = ("s0", "s1", "s2")


# ----------------------------------------------------------------------------- worker process


def worker(addresses: list[str], tag: str, n: int, seed: int) -> int:
    from fs3.errors import Code, FsError
    from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc
    from fs3.rpc.channel import call_sync, sync_channel

    stubs = [meta_pb2_grpc.MetaServiceStub(sync_channel(a)) for a in addresses]  # type: ignore[no-untyped-call]
    user = common_pb2.UserInfo(uid=0, gid=0)
    rng = random.Random(seed)
    count = [0]

    def rpc(method: str, req: Any) -> Any:
        deadline = time.monotonic() + 30
        while True:
            stub = stubs[count[0] % len(stubs)]
            count[0] += 1
            try:
                return call_sync(getattr(stub, method), req, timeout=10, what=method)
            except FsError as e:
                if e.code == Code.POSIX or not e.retryable or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)  # same request id: applied once whichever server answers

    dirs = {
        d: rpc("Lookup", meta_pb2.LookupRequest(user=user, parent=1, name=d.encode())).attr.inode
        for d in SHARED_DIRS
    }
    # expected namespace of this worker: dir name -> set of entry names
    have: dict[str, set[str]] = {d: set() for d in SHARED_DIRS}
    serial = 0
    for _ in range(n):
        serial += 1
        p = rng.random()
        rid = uuid.uuid4().hex
        own = [(d, x) for d, names in have.items() for x in names]
        if p < 0.4 or not own:
            d = rng.choice(SHARED_DIRS)
            name = f"{tag}-{serial}"
            if rng.random() < 0.8:
                # a FIFO, not a regular file: these meta servers run without routing, and a
                # regular file needs a chain table to be created (fs3/meta/layout.py)
                rpc(
                    "Mknod",
                    meta_pb2.MknodRequest(
                        user=user,
                        request_id=rid,
                        parent=dirs[d],
                        name=name.encode(),
                        mode=stat.S_IFIFO | 0o644,
                    ),
                )
            else:
                rpc(
                    "Mkdir",
                    meta_pb2.MkdirRequest(
                        user=user, request_id=rid, parent=dirs[d], name=name.encode(), mode=0o755
                    ),
                )
            have[d].add(name)
        elif p < 0.75:
            d, name = rng.choice(own)
            nd = rng.choice(SHARED_DIRS)
            new = f"{tag}-{serial}"
            rpc(
                "Rename",
                meta_pb2.RenameRequest(
                    user=user,
                    request_id=rid,
                    parent=dirs[d],
                    name=name.encode(),
                    new_parent=dirs[nd],
                    new_name=new.encode(),
                ),
            )
            have[d].discard(name)
            have[nd].add(new)
        else:
            d, name = rng.choice(own)
            a = rpc(
                "Lookup", meta_pb2.LookupRequest(user=user, parent=dirs[d], name=name.encode())
            ).attr
            method = "Rmdir" if a.mode & 0o040000 else "Unlink"
            rpc(
                method,
                meta_pb2.RemoveRequest(
                    user=user, request_id=rid, parent=dirs[d], name=name.encode()
                ),
            )
            have[d].discard(name)
    print(json.dumps({d: sorted(v) for d, v in have.items()}), flush=True)
    return 0


# ----------------------------------------------------------------------------- the test


def _start_meta(tmp: Path, idx: int, db_path: Path) -> tuple[subprocess.Popen[str], str]:
    cfg = tmp / f"meta{idx}.toml"
    cfg.write_text(
        f'[node]\nid = {100 + idx}\nhost = "127.0.0.1"\nport = 0\n'
        f'[kv]\nurl = "sqlite://{db_path}"\n[log]\nlevel = "WARNING"\nfile = "{tmp}/meta{idx}.log"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "fs3.cli.main", "meta", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the server prints its address (or exits)
    if "listening on" not in line:
        proc.kill()
        _, errout = proc.communicate(timeout=10)
        raise AssertionError(f"meta {idx} did not start: {line!r} {errout[-2000:]}")
    return proc, line.rsplit(" ", 1)[1].strip()


@pytest.fixture
def two_metas(tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    db_path = tmp_path / "kv.db"
    procs: list[subprocess.Popen[str]] = []
    try:
        addrs = []
        for i in (1, 2):
            p, a = _start_meta(tmp_path, i, db_path)
            procs.append(p)
            addrs.append(a)
        yield addrs, db_path
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_two_meta_servers_concurrent_clients(two_metas: tuple[list[str], Path]) -> None:
    from fs3.kv import open_database
    from fs3.meta.fsck import check_namespace
    from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc
    from fs3.rpc.channel import call_sync, sync_channel

    addrs, db_path = two_metas
    user = common_pb2.UserInfo(uid=0, gid=0)
    stub = meta_pb2_grpc.MetaServiceStub(sync_channel(addrs[0]))  # type: ignore[no-untyped-call]
    for d in SHARED_DIRS:
        call_sync(
            stub.Mkdir,
            meta_pb2.MkdirRequest(
                user=user, request_id=uuid.uuid4().hex, parent=1, name=d.encode(), mode=0o755
            ),
        )
    workers = []
    for k in range(4):
        order = addrs if k % 2 == 0 else addrs[::-1]
        workers.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE),
                    "worker",
                    ",".join(order),
                    f"w{k}",
                    "60",
                    str(1000 + k),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    expected: dict[str, set[str]] = {d: set() for d in SHARED_DIRS}
    try:
        for w in workers:
            out, errout = w.communicate(timeout=90)
            assert w.returncode == 0, errout[-3000:]
            for d, theirs in json.loads(out.strip().splitlines()[-1]).items():
                expected[d].update(theirs)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(5)

    # the servers' view, read over gRPC through the *other* server, page by page
    stub2 = meta_pb2_grpc.MetaServiceStub(sync_channel(addrs[1]))  # type: ignore[no-untyped-call]
    for d in SHARED_DIRS:
        ino = call_sync(
            stub2.Lookup, meta_pb2.LookupRequest(user=user, parent=1, name=d.encode())
        ).attr.inode
        names: list[str] = []
        cursor = b""
        while True:
            r = call_sync(
                stub2.ReadDir,
                meta_pb2.ReadDirRequest(user=user, inode=ino, cursor=cursor, limit=16),
            )
            names.extend(e.name.decode() for e in r.entries)
            if not r.more:
                break
            cursor = r.entries[-1].name
        assert len(names) == len(set(names)), f"duplicated entries in {d}"
        assert set(names) == expected[d], (
            f"{d}: lost {expected[d] - set(names)} extra {set(names) - expected[d]}"
        )

    # errors cross the wire as fs3 errors: POSIX errno, INVALID_ARGUMENT, and the server survives
    from fs3.errors import Code, FsError

    with pytest.raises(FsError) as ei:
        call_sync(stub2.Lookup, meta_pb2.LookupRequest(user=user, parent=1, name=b"missing"))
    assert ei.value.code == Code.POSIX and ei.value.errno == errno.ENOENT
    with pytest.raises(FsError) as ei:
        call_sync(stub2.Mkdir, meta_pb2.MkdirRequest(parent=1, name=b"nouser", mode=0o755))
    assert ei.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(FsError) as ei:  # no routing: no chains to place a regular file on
        call_sync(
            stub2.Create,
            meta_pb2.CreateRequest(
                user=user, request_id=uuid.uuid4().hex, parent=1, name=b"f", mode=0o644
            ),
        )
    assert ei.value.code == Code.UNKNOWN_CHAIN_TABLE and not ei.value.retryable
    assert call_sync(stub2.StatFs, meta_pb2.StatFsRequest(user=user)).name_max == 255

    db = open_database(f"sqlite://{db_path}")
    try:
        rep = check_namespace(db)
    finally:
        db.close()
    assert rep.ok, str(rep)
    assert rep.directories >= 4


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "worker":
        sys.exit(worker(sys.argv[2].split(","), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
