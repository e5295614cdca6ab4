"""Invariant checks and the scenario harness of the fault tests.

Checks (each returns a list of problems; empty = holds):

* :func:`check_replicas` — every chain's serving replicas hold the same chunks,
  byte for byte (read from each target's ``meta.db`` and chunk files, CRC32C
  re-computed), with no update left pending (``ListChunks``);
* :func:`check_meta` — the namespace invariants of :mod:`fs3.meta.fsck`;
* the workload's own checks (:class:`fs3.testing.workload.Model`): nothing
  acknowledged lost, nothing never-written/stale/torn read.

:class:`Scenario` / :func:`fault_cluster` wrap a :class:`~fs3.testing.cluster.ProcessCluster`
with short failure-detection timings, the verifying workload over the Python
API *and* the FUSE mount, narration (``say``), bounded waits that measure how
long the service took to resume, and a teardown that undoes exactly what the
scenario set up (namespaces, small file systems, clients, processes) and keeps
the logs when the scenario failed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fs3.testing.cluster import ProcessCluster
from fs3.testing.faults import (
    NetnsLink,
    SmallFs,
    create_cluster_with_netns,
    list_chunk_files,
    read_chunk_bytes,
    storage_target_dirs,
)
from fs3.testing.workload import ApiOps, FileOps, PosixOps, Workload, WorkloadConfig

# Short timings so failures are detected in ~2-3 s and a leader lease lasts 3 s
# (the fault tier must finish in minutes on 2 cores).
FAULT_OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
    "mgmtd": {
        "mgmtd": {
            "lease_length_s": 3.0,
            "lease_renew_interval_s": 0.5,
            "lease_safety_margin_s": 1.0,
            "heartbeat_interval_s": 0.5,
            "heartbeat_timeout_s": 2.5,
            "check_interval_s": 0.2,
        }
    },
    "meta": {
        # 1 MiB chunks (not the 4 MiB default): the scenarios' small files cross chunk
        # boundaries and so chains, which is what they exercise.
        "meta": {
            "routing_refresh_s": 0.5,
            "heartbeat_interval_s": 0.5,
            "default_chunk_size": 1 << 20,
        },
        "client": {"routing_refresh_s": 0.5, "retry_deadline_s": 30.0, "rpc_timeout_s": 3.0},
    },
    "storage": {
        "storage": {
            "heartbeat_interval_s": 0.5,
            "routing_refresh_s": 0.5,
            "forward_timeout_s": 2.0,
        },
        "client": {"routing_refresh_s": 0.5, "rpc_timeout_s": 3.0},
    },
    "fuse": {"client": {"routing_refresh_s": 0.5, "retry_deadline_s": 30.0, "rpc_timeout_s": 3.0}},
}


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = (
            _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
    return out


# --------------------------------------------------------------------------- checks


def check_replicas(pc: ProcessCluster, *, status: dict[str, Any] | None = None) -> list[str]:
    """Every chain: all replicas byte-identical, every chunk file matching its CRC32C, nothing pending.

    Only meaningful when no writes are in flight and every target is serving.
    """

    s = status or pc.status()
    dirs = storage_target_dirs(pc)
    problems: list[str] = []
    pending = _pending_chunks(pc, s)
    for t, keys in pending.items():
        if keys:
            problems.append(
                f"target {t}: {len(keys)} chunks still have a pending (uncommitted) update: "
                f"{sorted(keys)[:5]}"
            )
    for chain in s["chains"]:
        problems += compare_chain(chain["id"], {tid: dirs[tid] for tid in chain["targets"]})
    return problems


def compare_chain(chain_id: int, target_dirs: dict[int, Path]) -> list[str]:
    """Compare the committed chunks of one chain's targets (first target is the reference).

    Checks per chunk: present on every target, same commit version, length and
    CRC32C, the same bytes, and the bytes match the recorded CRC32C (catches a
    corrupt replica that was never repaired).
    """
    from fs3.storage.chunk_engine import crc32c

    problems: list[str] = []
    per_target: dict[int, dict[tuple[int, int], tuple[int, int, int, bytes]]] = {}
    for tid, d in target_dirs.items():
        chunks: dict[tuple[int, int], tuple[int, int, int, bytes]] = {}
        for cf in list_chunk_files(d, tid):
            try:
                data = read_chunk_bytes(cf)
            except FileNotFoundError:
                # a live target replaced this version (copy-on-write) between listing and
                # reading: report it so a polling caller looks again
                problems.append(f"target {tid} chunk {cf.inode}:{cf.index}: replaced while read")
                continue
            if len(data) != cf.length or crc32c(data) != cf.checksum:
                problems.append(
                    f"target {tid} chunk {cf.inode}:{cf.index}: file content does not match its "
                    f"checksum (len {len(data)}/{cf.length}) — corrupt and not repaired"
                )
            chunks[(cf.inode, cf.index)] = (cf.commit_ver, cf.length, cf.checksum, data)
        per_target[tid] = chunks
    tids = list(target_dirs)
    ref_t = tids[0]
    ref = per_target[ref_t]
    for tid in tids[1:]:
        other = per_target[tid]
        if set(other) != set(ref):
            only_a = sorted(set(ref) - set(other))[:5]
            only_b = sorted(set(other) - set(ref))[:5]
            problems.append(
                f"chain {chain_id}: targets {ref_t} and {tid} hold different chunks "
                f"(only on {ref_t}: {only_a}; only on {tid}: {only_b})"
            )
        for key in sorted(set(ref) & set(other)):
            a, b = ref[key], other[key]
            if a[:3] != b[:3] or a[3] != b[3]:
                problems.append(
                    f"chain {chain_id} chunk {key[0]}:{key[1]}: target {ref_t} has "
                    f"(ver {a[0]}, len {a[1]}, crc {a[2]:#x}), target {tid} has "
                    f"(ver {b[0]}, len {b[1]}, crc {b[2]:#x})"
                    + ("; the bytes differ" if a[3] != b[3] else "")
                )
    return problems


def _pending_chunks(pc: ProcessCluster, s: dict[str, Any]) -> dict[int, set[tuple[int, int]]]:
    """target id -> chunks with an uncommitted update, asked over ``ListChunks`` (in-memory state)."""
    from fs3.errors import FsError
    from fs3.proto import storage_pb2, storage_pb2_grpc
    from fs3.rpc.channel import call_sync, sync_channel

    addr = {p["name"]: p["address"] for p in s["processes"] if p["role"] == "storage"}
    out: dict[int, set[tuple[int, int]]] = {}
    for t in s["targets"]:
        a = addr.get(t["node"])
        if not a:
            continue
        ch = sync_channel(a)
        try:
            r = call_sync(
                storage_pb2_grpc.StorageServiceStub(ch).ListChunks,
                storage_pb2.ListChunksRequest(target_id=t["id"]),
                timeout=10,
            )
            out[t["id"]] = {(m.chunk.inode, m.chunk.index) for m in r.metas if m.uncommitted}
        except FsError:
            out[t["id"]] = set()
        finally:
            ch.close()
    return out


def check_meta(pc: ProcessCluster) -> list[str]:
    """Namespace invariants (fs3.meta.fsck) over the cluster's KV."""
    from fs3.meta.fsck import check_kv

    return list(check_kv(f"sqlite://{pc.dir / 'kv' / 'kv.db'}").problems)


def wait_replicas_identical(pc: ProcessCluster, timeout_s: float) -> list[str]:
    """Poll :func:`check_replicas` (background resync/repair may still be finishing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = pc.status()
        serving = bool(s["chains"]) and all(
            st == "serving" for c in s["chains"] for st in c["states"]
        )
        problems = (
            check_replicas(pc, status=s)
            if serving
            else [
                "not every target is serving: "
                + ", ".join(
                    f"chain {c['id']}: {list(zip(c['targets'], c['states'], strict=True))}"
                    for c in s["chains"]
                )
            ]
        )
        if not problems or time.monotonic() >= deadline:
            return problems
        time.sleep(0.5)


# --------------------------------------------------------------------------- scenario harness


def fast_client_config() -> Any:
    from fs3.config import ClientConfig

    cfg = ClientConfig()
    cfg.client.routing_refresh_s = 0.5
    cfg.client.retry_deadline_s = 30.0
    cfg.client.rpc_timeout_s = 3.0
    return cfg


@dataclass
class Scenario:
    """One fault scenario on one cluster: narration, clients, workload, checks."""

    name: str
    pc: ProcessCluster
    seed: int = 0
    t0: float = field(default_factory=time.monotonic)
    clients: list[Any] = field(default_factory=list)
    workload: Workload | None = None
    links: list[NetnsLink] = field(default_factory=list)
    small_fs: list[SmallFs] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)

    def say(self, msg: str) -> None:
        print(
            f"[{self.name} {time.monotonic() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True
        )

    # -- clients

    def api(self, name: str = "api") -> ApiOps:
        client = self.pc.connect(config=fast_client_config())
        self.clients.append(client)
        return ApiOps(client, name)

    def fuse(self, name: str = "fuse") -> PosixOps:
        if not self.pc.mountpoint:
            raise RuntimeError("this scenario's cluster has no mount")
        return PosixOps(self.pc.mountpoint, name)

    # -- workload

    def start_workload(
        self,
        *,
        api_writers: int = 2,
        fuse_writers: int = 1,
        api_readers: int = 1,
        fuse_readers: int = 1,
        config: WorkloadConfig | None = None,
    ) -> Workload:
        writers: list[FileOps] = [self.api(f"api{i}") for i in range(api_writers)]
        readers: list[FileOps] = [self.api(f"apir{i}") for i in range(api_readers)]
        if self.pc.mountpoint:
            writers += [self.fuse(f"fuse{i}") for i in range(fuse_writers)]
            readers += [self.fuse(f"fuser{i}") for i in range(fuse_readers)]
        self.workload = Workload(
            writers, readers, config=config, seed=self.seed, log=self.say
        ).start()
        self.say(
            f"workload started: {len(writers)} writers, {len(readers)} readers "
            f"({'API + FUSE' if self.pc.mountpoint else 'API only'})"
        )
        return self.workload

    def progress(self, n: int, timeout_s: float, what: str) -> float:
        """Wait until the workload acknowledges ``n`` more writes; returns how long that took."""
        assert self.workload is not None
        t = time.monotonic()
        if not self.workload.wait_acked(n, timeout_s):
            raise AssertionError(
                f"{what}: fewer than {n} writes acknowledged within {timeout_s:.0f}s "
                f"(errors: {self.workload.errors})"
            )
        took = time.monotonic() - t
        self.say(
            f"{what}: {n} more writes acknowledged in {took:.1f}s (total {self.workload.acked()})"
        )
        return took

    def stop_workload(self, timeout_s: float = 60.0) -> dict[str, Any]:
        assert self.workload is not None
        stuck = self.workload.stop(timeout_s)
        summary = self.workload.model.summary()
        self.say(f"workload stopped: {summary}" + (f"; STUCK threads: {stuck}" if stuck else ""))
        return summary

    # -- waiting and measuring

    def wait(self, cond: Callable[..., Any], timeout_s: float, what: str) -> float:
        """Wait for ``cond`` (gets the status dict if it takes an argument); returns seconds taken."""
        t = time.monotonic()
        self.pc.wait_for(cond, timeout_s, what, interval=0.2)
        took = time.monotonic() - t
        self.say(f"{what}: after {took:.1f}s")
        return took

    def wait_target(self, target_id: int, state: str, timeout_s: float) -> float:
        return self.wait(
            lambda s: ProcessCluster.target_states(s).get(target_id) == state,
            timeout_s,
            f"target {target_id} {state}",
        )

    def wait_all_serving(self, timeout_s: float, what: str = "every target serving again") -> float:
        def ok(s: dict[str, Any]) -> bool:
            return bool(s["chains"]) and all(
                st == "serving" for c in s["chains"] for st in c["states"]
            )

        return self.wait(ok, timeout_s, what)

    def measure_resume(self, bound_s: float, what: str = "service resumed") -> float:
        """Time until a fresh write+fsync+read through the Python API succeeds; asserts ``<= bound_s``."""
        t = time.monotonic()
        ops = self.api("probe")
        deadline = t + bound_s
        n = 0
        last: BaseException | None = None
        while True:
            n += 1
            data = os.urandom(4096 + n)
            path = f"/probe-{self.name}-{n}"
            try:
                ops.write(path, 0, data)
                if ops.read(path, 0, len(data)) != data:
                    raise AssertionError(f"{what}: probe file read back different bytes")
                ops.unlink(path)
                break
            except OSError as e:
                last = e
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{what}: not within the {bound_s:.0f}s bound (last error: {last})"
                )
            time.sleep(0.2)
        took = time.monotonic() - t
        self.figures[what] = took
        self.say(f"{what} within {took:.1f}s (bound {bound_s:.0f}s)")
        return took

    # -- final checks

    def final_checks(
        self,
        *,
        replicas: bool = True,
        meta: bool = True,
        workload: bool = True,
        replica_timeout_s: float = 60.0,
    ) -> list[str]:
        """Run every invariant; returns the problems (the test asserts it is empty)."""
        problems: list[str] = []
        if self.workload is not None and workload:
            if not self.workload._stop.is_set():
                self.stop_workload()
            final = self.api("final")
            v = self.workload.model.verify_all(final, "final-api")
            if self.pc.mountpoint:
                v += self.workload.model.verify_all(self.fuse("final-fuse"), "final-fuse")
            problems += [str(x) for x in self.workload.model.violations]
            self.say(
                f"workload invariants: {len(self.workload.model.violations)} violations "
                f"({self.workload.model.summary().get('acked_writes', 0)} acknowledged writes re-read)"
            )
        if replicas:
            t = time.monotonic()
            rp = wait_replicas_identical(self.pc, replica_timeout_s)
            self.say(
                f"replicas byte-identical: {'yes' if not rp else 'NO'} (checked in {time.monotonic() - t:.1f}s)"
            )
            problems += rp
        if meta:
            mp = check_meta(self.pc)
            self.say(f"meta namespace invariants (fsck): {'hold' if not mp else 'BROKEN'}")
            problems += [f"fsck: {p}" for p in mp]
        return problems

    def close(self) -> None:
        if self.workload is not None and not self.workload._stop.is_set():
            self.workload.stop(30)
        for c in self.clients:
            with contextlib.suppress(Exception):
                c.close()
        self.clients.clear()


@contextlib.contextmanager
def fault_cluster(
    name: str,
    *,
    mount: bool = True,
    storage_nodes: int = 3,
    targets_per_node: int = 2,
    replicas: int = 3,
    meta: int = 2,
    mgmtd: int = 2,
    overrides: dict[str, dict[str, dict[str, Any]]] | None = None,
    netns: dict[str, int] | None = None,
    small_targets: dict[int, int] | None = None,
    seed: int = 0,
    dir: Path | None = None,
    mountpoint: str | None = None,
) -> Iterator[Scenario]:
    """A started cluster for one scenario; everything is undone on exit, logs kept on failure.

    ``netns``: process name -> subnet index; that process runs in its own namespace
    from the start (``sc.links``). ``small_targets``: target id -> MiB; that target's
    directory is a tmpfs of that size (``sc.small_fs``). ``dir``: the cluster directory
    (default: a fresh one, removed after a clean run); ``mountpoint``: where to mount
    (default ``<dir>/mnt``).
    """
    pc = ProcessCluster(
        dir,
        storage_nodes=storage_nodes,
        targets_per_node=targets_per_node,
        replicas=replicas,
        meta=meta,
        mgmtd=mgmtd,
        mount=(mountpoint or True) if mount else False,
        overrides=_deep_merge(FAULT_OVERRIDES, overrides or {}),
        start_timeout_s=90.0,
        grace_s=3.0,
    )
    sc = Scenario(name, pc, seed=seed)
    failed = True
    try:
        if netns or small_targets:
            links = {n: NetnsLink(i) for n, i in (netns or {}).items()}
            sc.links = list(links.values())
            create_cluster_with_netns(pc, {})  # lay out configs and data dirs first
            dirs = storage_target_dirs(pc)
            for tid, mb in (small_targets or {}).items():
                fs = SmallFs(dirs[tid], mb)
                sc.small_fs.append(fs)
                fs.mount()
                sc.say(f"target {tid} lives on a {mb} MiB tmpfs at {dirs[tid]}")
            st = pc.launcher.load_state()
            assert st is not None
            for n, link in links.items():
                rec = st.proc(n)
                link.setup(rec.ports)
                rec.command = link.wrap(rec.command)
                sc.say(
                    f"{n} will run in network namespace {link.ns} (veth {link.host_if} {link.host_ip} <-> "
                    f"{link.ns_if} {link.ns_ip}, ports {rec.ports})"
                )
            pc.launcher.save_state(st)
        t = time.monotonic()
        pc.start()
        sc.say(
            f"cluster up in {time.monotonic() - t:.1f}s at {pc.dir}"
            + (f", mounted at {pc.mountpoint}" if mount else "")
        )
        yield sc
        failed = False
    finally:
        try:
            sc.close()
            for link in sc.links:
                link.heal()
            with contextlib.suppress(Exception):
                pc.stop()  # processes first: they hold the small file systems and namespaces
        finally:
            for fs in sc.small_fs:
                fs.unmount()
            for link in sc.links:
                link.cleanup()
            pc.close(failed=failed)
            if failed:
                print(
                    f"[{name}] FAILED: cluster directory and logs kept in {pc.dir}",
                    file=sys.stderr,
                    flush=True,
                )
