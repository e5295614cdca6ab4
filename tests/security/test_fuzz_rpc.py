"""Hostile messages to every RPC of every service, and to the native frame parser.

For every method of MgmtdService, MetaService, StorageService and
TransportService, hypothesis draws requests from the method's protobuf
descriptor (:mod:`tests.security.fuzz`: extremes, 1 MiB strings, nested
messages) plus bytes that are no protobuf at all, and sends them to the real
server (gRPC; the native parser is attacked with raw frames below). After each
method: every server is alive, its RSS grew by less than :data:`RSS_SLACK_KIB`
over the whole run, a victim file reads back unchanged, and a normal client
still writes and reads.

Service-to-service and admin RPCs of mgmtd (node registration, heartbeats,
chain tables, target states, error reports) get only unparseable bytes here:
well-formed calls to them change the cluster by design and are what
per-connection authentication and admin credentials refuse.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings

from fs3.proto import meta_pb2, mgmtd_pb2, storage_pb2, transport_pb2
from fs3.rpc.channel import sync_channel
from fs3.rpc.native import wire
from fs3.rpc.native.methods import method_id
from fs3.testing.cluster import ProcessCluster
from tests.security.conftest import all_alive, rss_kib, server_pids
from tests.security.fuzz import malformed, message_of

pytestmark = [pytest.mark.security, pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = int(os.environ.get("FS3_SECURITY_EXAMPLES", "20"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same requests in every run (CI is deterministic)
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
RSS_SLACK_KIB = 200 << 10  # growth allowed per server over the whole tier

ROLE_OF_SERVICE = {
    "MgmtdService": ("mgmtd", mgmtd_pb2),
    "MetaService": ("meta", meta_pb2),
    "StorageService": ("storage", storage_pb2),
    "TransportService": ("storage", transport_pb2),
}
MALFORMED_ONLY = {
    "/fs3.v1.MgmtdService/RegisterNode",
    "/fs3.v1.MgmtdService/Heartbeat",
    "/fs3.v1.MgmtdService/CreateChainTable",
    "/fs3.v1.MgmtdService/SetTargetState",
    "/fs3.v1.MgmtdService/ReportTargetError",
}


def _methods() -> list[tuple[str, str, Any]]:
    out = []
    for svc, (role, mod) in ROLE_OF_SERVICE.items():
        for m in mod.DESCRIPTOR.services_by_name[svc].methods:
            out.append((role, f"/fs3.v1.{svc}/{m.name}", m))
    return out


METHODS = _methods()
OUTCOMES: dict[str, dict[str, int]] = {}  # path -> grpc status name -> count (for the report)


@pytest.fixture(scope="module")
def addresses(secure_cluster: ProcessCluster) -> dict[str, str]:
    s = secure_cluster.status()
    out: dict[str, str] = {}
    for p in s["processes"]:
        if p["role"] in ("mgmtd", "meta", "storage"):  # servers (not the mount daemon)
            out.setdefault(p["role"], p["address"])
    return out


@pytest.fixture(scope="module")
def channels(addresses: dict[str, str]) -> Iterator[dict[str, grpc.Channel]]:
    chans = {role: sync_channel(a) for role, a in addresses.items()}
    yield chans
    for c in chans.values():
        c.close()


@pytest.fixture(scope="module")
def baseline(secure_cluster: ProcessCluster, client: Any) -> dict[str, Any]:
    """RSS of every server before the attacks, and a victim file to watch."""
    path = f"/fz-victim-{uuid.uuid4().hex}"
    data = os.urandom(3 << 19)
    with client.open(path, "wb") as f:
        f.write(data)
    return {
        "rss": {n: rss_kib(pid) for n, pid in server_pids(secure_cluster).items()},
        "path": path,
        "crc": zlib.crc32(data),
    }


def check_after(c: ProcessCluster, client: Any, base: dict[str, Any], what: str) -> None:
    all_alive(c)
    for n, pid in server_pids(c).items():
        grew = rss_kib(pid) - base["rss"][n]
        assert grew < RSS_SLACK_KIB, f"{n} grew by {grew} KiB after {what}"
    with client.open(base["path"], "rb") as f:
        assert zlib.crc32(f.read()) == base["crc"], f"victim changed after {what}"
    probe = f"/fz-ok-{uuid.uuid4().hex}"
    with client.open(probe, "wb") as f:
        f.write(b"still fine")
    with client.open(probe, "rb") as f:
        assert f.read() == b"still fine"
    client.unlink(probe)


def invoke(ch: grpc.Channel, path: str, m: Any, body: bytes) -> str:
    """Send one request (serialized ``body``) and return the outcome's status name."""
    try:
        if not m.client_streaming and not m.server_streaming:
            ch.unary_unary(path)(body, timeout=5)
        elif not m.client_streaming:
            it = ch.unary_stream(path)(body, timeout=2)
            try:
                next(it)
            finally:
                it.cancel()
        else:
            it = ch.stream_stream(path)(iter([body, body]), timeout=2)
            try:
                for _ in it:
                    pass
            finally:
                it.cancel()
        return "OK"
    except grpc.RpcError as e:
        code = e.code()
        return code.name if code is not None else "UNKNOWN"
    except StopIteration:
        return "OK"


@pytest.mark.parametrize(("role", "path", "m"), METHODS, ids=[p for _, p, _ in METHODS])
def test_every_method_survives_hostile_requests(
    role: str,
    path: str,
    m: Any,
    channels: dict[str, grpc.Channel],
    secure_cluster: ProcessCluster,
    client: Any,
    baseline: dict[str, Any],
) -> None:
    ch = channels[role]
    seen = OUTCOMES.setdefault(path, {})

    def record(outcome: str) -> None:
        seen[outcome] = seen.get(outcome, 0) + 1
        assert outcome != "UNAVAILABLE" or secure_cluster.alive(f"{role}-1"), f"{role} died"

    @FUZZ
    @given(malformed)
    def bad_bytes(body: bytes) -> None:
        record(invoke(ch, path, m, body))

    bad_bytes()
    if path not in MALFORMED_ONLY:

        @FUZZ
        @given(message_of(m.input_type))
        def structured(req: Any) -> None:
            record(invoke(ch, path, m, req.SerializeToString()))

        structured()
    check_after(secure_cluster, client, baseline, path)


# ------------------------------------------------------------------ oversized, by hand


def test_oversized_batch_read_refused_without_allocating(
    channels: dict[str, grpc.Channel],
    secure_cluster: ProcessCluster,
    client: Any,
    baseline: dict[str, Any],
) -> None:
    m = storage_pb2.DESCRIPTOR.services_by_name["StorageService"].methods_by_name["BatchRead"]
    for n, length in ((1025, 1), (1024, 64 << 20), (1, 0xFFFFFFFF)):
        req = storage_pb2.BatchReadRequest(
            ios=[storage_pb2.ReadIO(chain_id=1, length=length) for _ in range(n)]
        )
        assert (
            invoke(
                channels["storage"], "/fs3.v1.StorageService/BatchRead", m, req.SerializeToString()
            )
            == "INVALID_ARGUMENT"
        )
    check_after(secure_cluster, client, baseline, "oversized BatchRead")


def test_lookup_path_with_100k_names_refused(
    channels: dict[str, grpc.Channel],
    secure_cluster: ProcessCluster,
    client: Any,
    baseline: dict[str, Any],
) -> None:
    m = meta_pb2.DESCRIPTOR.services_by_name["MetaService"].methods_by_name["LookupPath"]
    req = meta_pb2.LookupPathRequest(parent=1, names=[b"n" * 255] * 100_000)
    req.user.uid = 1000
    out = invoke(channels["meta"], "/fs3.v1.MetaService/LookupPath", m, req.SerializeToString())
    assert out in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "UNKNOWN", "OUT_OF_RANGE"), out
    check_after(secure_cluster, client, baseline, "LookupPath of 100k names")


def test_read_stream_client_that_never_reads_is_throttled(
    channels: dict[str, grpc.Channel],
    secure_cluster: ProcessCluster,
    client: Any,
    baseline: dict[str, Any],
) -> None:
    """Requests keep coming, answers are never read: the server stops taking requests
    (backpressure reaches the sender) instead of queueing answers without bound."""
    pulled = 0
    stop = threading.Event()
    io = storage_pb2.ReadIO(chain_id=1, length=64 << 10)
    io.dest.inline = b""

    def requests() -> Iterator[storage_pb2.BatchReadRequest]:
        nonlocal pulled
        rid = 0
        while not stop.is_set() and pulled < 200_000:
            rid += 1
            pulled += 1
            yield storage_pb2.BatchReadRequest(ios=[io] * 16, request_id=rid)

    call = channels["storage"].stream_stream(
        "/fs3.v1.StorageService/ReadStream",
        request_serializer=lambda r: r.SerializeToString(),
    )(requests(), timeout=60)
    try:
        # wait until the sender is held back: the count stops moving for a second
        last, still_since = -1, time.monotonic()
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            now = pulled
            if now != last:
                last, still_since = now, time.monotonic()
            elif time.monotonic() - still_since > 1.0:
                break
            time.sleep(0.05)
        assert pulled < 200_000, "the server kept taking requests whose answers nobody read"
        OUTCOMES["ReadStream, answers never read: requests the server took"] = {"count": pulled}
        check_after(secure_cluster, client, baseline, f"ReadStream never read ({pulled} sent)")
    finally:
        stop.set()
        call.cancel()


# ------------------------------------------------------------------ the native frame parser


def native_send(address: str, data: bytes, *, linger: float = 0.0) -> bytes:
    """Connect to a server's port, send ``data``, read what comes back until it closes."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        try:
            s.sendall(data)
        except OSError:
            return b""
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the server already closed it (its right with hostile input)
            return b""
        out = b""
        s.settimeout(2 + linger)
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
        return out


def frame(kind: int, mid: int, body: bytes, *, blen: int | None = None, plen: int = 0) -> bytes:
    return (
        wire.HEADER.pack(
            kind, wire.HAS_MESSAGE, 0, mid, 1, 1000, len(body) if blen is None else blen, plen
        )
        + body
    )


NATIVE_CASES = {
    "not a preface": b"GET / HTTP/1.1\r\n\r\n",
    "preface then garbage": wire.PREFACE + os.urandom(4096),
    "bad frame kind": wire.PREFACE + frame(99, 0, b""),
    "body beyond the limit": wire.PREFACE + frame(wire.CALL, 0, b"", blen=0xFFFFFFFF),
    "payload beyond the limit": wire.PREFACE + frame(wire.CALL, 0, b"", plen=0xFFFFFFFF),
    "256 MiB body announced, 1 MiB sent": wire.PREFACE
    + frame(
        wire.CALL, method_id("/fs3.v1.MetaService/GetAttr"), b"\x00" * (1 << 20), blen=256 << 20
    ),
    "unknown method": wire.PREFACE + frame(wire.CALL, 12345, b""),
    "garbage body to a real method": wire.PREFACE
    + frame(wire.CALL, method_id("/fs3.v1.StorageService/Write"), b"\x0a\xff\xff\xff\xff\x0f"),
    "stream message without a call": wire.PREFACE + frame(wire.MESSAGE, 0, b"x"),
    "10k calls in one burst": wire.PREFACE
    + b"".join(
        struct.pack(
            "<BBHIQIII",
            wire.CALL,
            wire.HAS_MESSAGE,
            0,
            method_id("/fs3.v1.MgmtdService/GetLeader"),
            i,
            1000,
            0,
            0,
        )
        for i in range(1, 10_001)
    ),
}


@pytest.mark.parametrize("case", list(NATIVE_CASES))
def test_native_frames_never_crash_a_server(
    case: str,
    addresses: dict[str, str],
    secure_cluster: ProcessCluster,
    client: Any,
    baseline: dict[str, Any],
) -> None:
    for role in ("mgmtd", "meta", "storage"):
        native_send(addresses[role], NATIVE_CASES[case])
    check_after(secure_cluster, client, baseline, f"native: {case}")


def test_native_random_frames(
    addresses: dict[str, str],
    secure_cluster: ProcessCluster,
    client: Any,
    baseline: dict[str, Any],
) -> None:
    from hypothesis import strategies as st

    mids = [method_id(p) for _, p, _ in METHODS] + [0, 0xFFFFFFFF]
    frames = st.lists(
        st.builds(
            lambda k, f, mid, rid, t, body, extra, plen: (
                wire.HEADER.pack(k, f, 0, mid, rid, t, len(body) + extra, plen) + body
            ),
            st.integers(0, 9),
            st.integers(0, 255),
            st.sampled_from(mids),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**32 - 1),
            st.binary(max_size=256),
            st.sampled_from([0, 0, 1, 1 << 20, 2**32 - 300]),
            st.sampled_from([0, 0, 1, 4096, 64 << 20, 2**32 - 1]),
        ),
        min_size=1,
        max_size=8,
    )

    @FUZZ
    @given(st.sampled_from(["mgmtd", "meta", "storage"]), frames)
    def one(role: str, fs: list[bytes]) -> None:
        native_send(addresses[role], wire.PREFACE + b"".join(fs))

    one()
    check_after(secure_cluster, client, baseline, "random native frames")


def test_zz_outcomes_summary(
    capsys: pytest.CaptureFixture[str], secure_cluster: ProcessCluster, baseline: dict[str, Any]
) -> None:
    """Not a check: prints what every method answered and each server's RSS growth."""
    with capsys.disabled():
        for path, seen in sorted(OUTCOMES.items()):
            print(f"{path}: {dict(sorted(seen.items()))}")
        for n, pid in server_pids(secure_cluster).items():
            print(f"RSS {n}: {baseline['rss'][n]} KiB before, {rss_kib(pid)} KiB after")
