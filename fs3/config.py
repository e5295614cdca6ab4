"""Configuration: one TOML file per service, defaults for every key.

Each service's config is a dataclass made of *sections* (``[node]``, ``[kv]``,
``[mgmtd]`` ...), each a dataclass whose fields carry their defaults and, in
their names, their units (``heartbeat_interval_s``). :func:`load` reads the TOML
file (stdlib ``tomllib``), applies environment overrides and validates: unknown
sections or keys, wrong types and out-of-range values are refused with a message
naming the file, section and key.

The environment (``os.environ`` unless ``env`` is given): for every section and
key of the service's own config class, ``FS3_<SECTION>_<KEY>`` replaces the
file's value (the environment wins; it is converted to the key's type and a bad
value is refused). Any other ``FS3_*`` name is ignored silently. This module
reads nothing else from the environment; the only other variables fs3 reads are
``FS3_CLUSTER_FILE`` (the cluster file when none is given: ``fs3.connect``,
``fs3 mount``, ``fs3 admin``) and ``XDG_STATE_HOME`` (base of ``fs3 mount``'s
default log directory for non-root users). See docs/configuration.md.

The cluster file (like FoundationDB's ``fdb.cluster``) is one line
``<cluster_id>@host:port,host:port`` listing the mgmtd addresses.
"""

from __future__ import annotations

import dataclasses
import errno as _errno
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fs3.errors import Code, FsError
from fs3.limits import chunk_size_rule, valid_chunk_size


class ConfigError(FsError):
    """A configuration file or override is invalid, or a file it names is unreadable.

    ``errno`` is EINVAL for bad content and the OS's errno (ENOENT, EACCES,
    EISDIR ...) when the file itself cannot be read, so the ``OSError`` a caller
    finally sees is the subclass Python's own ``open`` would raise.
    """

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(Code.INVALID_ARGUMENT, message, errno=errno)


# --------------------------------------------------------------------------- sections


@dataclass
class NodeSection:
    """Identity and listening address of a server process."""

    id: int = 0  # node id, unique per cluster (mgmtd 1..; meta 100..; storage 10001..)
    host: str = "127.0.0.1"  # address to listen on and to advertise
    port: int = 0  # gRPC port; 0 picks a free port (and advertises it)
    data_dir: str = ""  # where the process keeps local state (storage: targets)
    name: str = ""  # human name advertised to mgmtd, e.g. "storage-1" ("" = none)

    def validate(self) -> None:
        _check(0 <= self.port <= 65535, "port must be 0..65535")
        _check(self.id >= 0, "id must be >= 0")


@dataclass
class ClusterSection:
    """How to find the cluster."""

    id: str = "fs3"  # cluster id; requests from another cluster are refused
    cluster_file: str = ""  # path of the cluster file (mgmtd addresses)


@dataclass
class KvSection:
    """The transactional KV store (mgmtd and meta)."""

    url: str = "sqlite:///var/lib/fs3/kv.db"  # memory:// | sqlite:///path | fdb:///cluster-file

    def validate(self) -> None:
        _check("://" in self.url, "url must look like engine://...")


@dataclass
class LogSection:
    level: str = "INFO"  # DEBUG | INFO | WARNING | ERROR
    file: str = ""  # empty: stderr

    def validate(self) -> None:
        _check(
            self.level.upper() in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"},
            "level must be DEBUG, INFO, WARNING, ERROR or CRITICAL",
        )


@dataclass
class MetricsSection:
    port: int = -1  # Prometheus HTTP port; 0 picks a free port, -1 disables

    def validate(self) -> None:
        _check(-1 <= self.port <= 65535, "port must be -1..65535")


@dataclass
class MgmtdSection:
    """Cluster manager timings (3FS defaults; tests use short ones)."""

    lease_length_s: float = 60.0  # how long a lease is valid after renewal
    lease_renew_interval_s: float = 10.0  # how often every mgmtd tries to renew/take it
    lease_safety_margin_s: float = 20.0  # stop acting as leader this long before expiry
    heartbeat_interval_s: float = 10.0  # how often nodes heartbeat (told to nodes)
    heartbeat_timeout_s: float = 60.0  # silent this long -> node offline
    check_interval_s: float = 1.0  # how often the leader checks heartbeats and chains
    new_chain_grace_s: float = 0.0  # freeze a chain's state machine after leader change
    allow_unregistered: bool = True  # first heartbeat registers a node

    def validate(self) -> None:
        _check(self.lease_length_s > 0, "lease_length_s must be > 0")
        _check(
            0 < self.lease_renew_interval_s < self.lease_length_s,
            "lease_renew_interval_s must be > 0 and < lease_length_s",
        )
        _check(
            0 <= self.lease_safety_margin_s < self.lease_length_s - self.lease_renew_interval_s,
            "lease_safety_margin_s must be >= 0 and < lease_length_s - lease_renew_interval_s",
        )
        _check(self.heartbeat_interval_s > 0, "heartbeat_interval_s must be > 0")
        _check(
            self.heartbeat_timeout_s > self.heartbeat_interval_s,
            "heartbeat_timeout_s must exceed heartbeat_interval_s",
        )


@dataclass
class MetaSection:
    """Metadata service behaviour."""

    default_chunk_size: int = 4 << 20  # bytes; power of two (why 4 MiB: docs/configuration.md)
    default_stripe: int = 4  # chains per file
    default_chain_table: int = 1
    inode_batch: int = 1024  # inode ids reserved per allocation
    gc_delay_s: float = 0.0  # delay before removing chunks of deleted files
    statfs_cache_s: float = 5.0
    routing_refresh_s: float = 2.0
    heartbeat_interval_s: float = 10.0  # heartbeats to mgmtd (so clients find meta in routing)
    request_record_ttl_s: float = 1800.0  # keep idempotency records of requests this long

    def validate(self) -> None:
        _check(self.heartbeat_interval_s > 0, "heartbeat_interval_s must be > 0")
        _check(self.request_record_ttl_s > 0, "request_record_ttl_s must be > 0")
        _check(self.gc_delay_s >= 0, "gc_delay_s must be >= 0")
        _check(
            valid_chunk_size(self.default_chunk_size),
            f"default_chunk_size must be {chunk_size_rule()}",
        )
        _check(self.default_stripe >= 1, "default_stripe must be >= 1")
        _check(self.inode_batch >= 1, "inode_batch must be >= 1")


@dataclass
class StorageSection:
    """Storage node: targets and chain replication."""

    targets: list[str] = field(default_factory=list)  # target directories; empty: <data_dir>/t<N>
    target_ids: list[int] = field(default_factory=list)  # ids of those targets (same order)
    fsync: bool = True  # fsync chunk data before acknowledging (never disable in production)
    forward_timeout_s: float = 10.0  # one forwarding attempt to the successor
    forward_retry_s: float = 60.0  # keep retrying forwarding this long
    heartbeat_interval_s: float = 10.0
    routing_refresh_s: float = 2.0
    low_space_ratio: float = 0.98  # refuse new chunks above this used fraction
    reserved_bytes: int = 0  # keep this much free on each target's disk
    io_threads: int = 16  # blocking chunk I/O pool per node (stage, data sync, commit, large reads)
    overlap_forward: bool = True  # forward a plain write down the chain while staging it locally
    direct_write: bool = True  # O_DIRECT for whole page-aligned chunk versions (saves a copy)
    read_buffer_bytes: int = 1 << 30  # bytes all reads of the node may hold at once; more wait

    def validate(self) -> None:
        _check(1 <= self.io_threads <= 256, "io_threads must be in 1..256")
        _check(
            not self.target_ids or not self.targets or len(self.target_ids) == len(self.targets),
            "target_ids must be empty or as long as targets (with no targets: <data_dir>/t<N> per id)",
        )
        _check(0 < self.low_space_ratio <= 1, "low_space_ratio must be in (0, 1]")
        _check(self.read_buffer_bytes >= 64 << 20, "read_buffer_bytes must be >= 64 MiB")


@dataclass
class TransportSection:
    """Bulk data transport (chunk payloads)."""

    kind: str = "auto"  # auto (shm for same-host Iovs, else the frame) | grpc | tcp (alias) | shm
    tcp_port: int = 0  # unused: the tcp data listener folded into the native RPC (old configs load)
    timeout_s: float = 30.0  # unused since that fold (accepted so old configs load)
    region_check_interval_s: float = 1.0  # storage: drop shm regions of dead owner pids this often
    shm_staging_bytes: int = (
        64 << 20
    )  # client: shm staging arena for buffers outside registered regions
    shm_staging_max_bytes: int = 512 << 20  # client: cap on all staging arenas together

    def validate(self) -> None:
        _check(self.kind in {"auto", "grpc", "tcp", "shm"}, "kind must be auto, grpc, tcp or shm")
        _check(self.timeout_s > 0, "timeout_s must be > 0")
        _check(self.region_check_interval_s > 0, "region_check_interval_s must be > 0")
        _check(self.shm_staging_bytes >= 1 << 20, "shm_staging_bytes must be >= 1 MiB")
        _check(
            self.shm_staging_max_bytes >= self.shm_staging_bytes,
            "shm_staging_max_bytes must be >= shm_staging_bytes",
        )


@dataclass
class RpcSection:
    """How this process makes RPCs; every server serves both transports on its port."""

    transport: str = "native"  # native | grpc: what this process's own calls use
    event_loop: str = "uvloop"  # uvloop | asyncio: the process's event loop
    unix_sockets: bool = True  # servers also listen on, and clients prefer, a same-host Unix socket
    socket_dir: str = "/tmp/fs3-rpc"  # Unix sockets' directory (fs3/rpc/native/endpoints.py)
    grpc_port: int = -1  # servers: also gRPC without the relay on this port (0: free; -1: off)
    max_inflight_calls: int = 1024  # per connection; more waits (client) / stops reading (server)
    max_inflight_bytes: int = 128 << 20  # per connection: request bytes being served
    max_message_bytes: int = 256 << 20  # largest protobuf body in a frame (gRPC's limit too)
    max_payload_bytes: int = 64 << 20  # largest bulk payload accepted in a frame
    write_buffer_bytes: int = 4 << 20  # unsent bytes per connection before senders wait
    stall_timeout_s: float = 30.0  # a peer that reads nothing this long is disconnected
    secret_file: str = ""  # cluster secret (services): authenticate calls and peers ("": off)
    token_file: str = ""  # a client's credential (FUSE: its mount token); "": see fs3.rpc.auth
    tls_ca: str = ""  # CA certificate (PEM): clients verify servers with it ("": plaintext)
    tls_cert: str = ""  # servers: certificate (PEM) for TCP listeners ("": plaintext)
    tls_key: str = ""  # servers: its private key (PEM)

    def validate(self) -> None:
        _check(self.transport in {"native", "grpc"}, "transport must be native or grpc")
        _check(self.event_loop in {"uvloop", "asyncio"}, "event_loop must be uvloop or asyncio")
        _check(self.max_inflight_calls >= 1, "max_inflight_calls must be >= 1")
        _check(self.max_inflight_bytes >= 1 << 20, "max_inflight_bytes must be >= 1 MiB")
        _check(self.max_message_bytes >= 4096, "max_message_bytes must be >= 4096")
        _check(self.max_payload_bytes >= 4096, "max_payload_bytes must be >= 4096")
        _check(self.write_buffer_bytes >= 65536, "write_buffer_bytes must be >= 64 KiB")
        _check(self.stall_timeout_s > 0, "stall_timeout_s must be > 0")
        _check(-1 <= self.grpc_port <= 65535, "grpc_port must be -1..65535")
        _check(len(self.socket_dir) < 64, "socket_dir must be shorter than 64 characters")
        _check(bool(self.tls_cert) == bool(self.tls_key), "tls_cert and tls_key go together")


@dataclass
class ClientSection:
    """Client library (Python API, FUSE daemon, meta's own storage client)."""

    retry_deadline_s: float = 60.0  # keep retrying transient errors this long
    connect_timeout_s: float = 10.0  # connect(): give up if no mgmtd leader answers within this
    rpc_timeout_s: float = 10.0
    io_depth: int = 16  # chunk requests in flight per file operation
    readahead_chunks: int = (
        4  # Python API: chunks prefetched ahead of a sequential reader (0 = off)
    )
    eof_length_from_storage: bool = False  # a read reaching meta's EOF also asks storage (QueryLastChunk) for unreported writes of other clients
    length_report_interval_s: float = 5.0  # long writers report file length this often
    routing_refresh_s: float = 2.0
    dir_cache_s: float = 1.0  # Python API: directories on a path are reused this long unasked, like FUSE's entry_timeout_s (0 = off)
    sync_meta: bool = True  # Python API: meta calls (stat, create, open) from the calling thread on a connection of its own, not through the loop thread (native transport only; fs3.rpc.native.sync_client)

    def validate(self) -> None:
        _check(self.retry_deadline_s > 0, "retry_deadline_s must be > 0")
        _check(self.dir_cache_s >= 0, "dir_cache_s must be >= 0")
        _check(self.connect_timeout_s > 0, "connect_timeout_s must be > 0")
        _check(self.io_depth >= 1, "io_depth must be >= 1")
        _check(self.readahead_chunks >= 0, "readahead_chunks must be >= 0")


@dataclass
class FuseSection:
    # kernel caches (README "Mount options"; the defaults the suite's JuiceFS mount uses too)
    attr_timeout_s: float = 1.0  # attributes (stat) of any inode
    entry_timeout_s: float = 1.0  # a name -> inode lookup of a non-directory
    dir_entry_timeout_s: float = 1.0  # a name -> inode lookup of a directory
    negative_timeout_s: float = 0.0  # "no such entry" (0: not cached)
    max_readahead_kb: int = 16384
    writeback_cache: bool = False
    allow_other: bool = True
    log_file: str = (
        ""  # daemon log; empty: /var/log/fs3 (root) or ~/.local/state/fs3, mount-<mountpoint>.log
    )
    max_background: int = 64  # kernel: async requests (readahead, writeback) in flight per mount
    max_tasks: int = 256  # pyfuse3 worker tasks (requests served concurrently)
    write_buffer: bool = True  # coalesce small sequential writes into chunk-sized storage writes
    write_behind_chunks: int = 8  # buffered chunk writes in flight per mount before write() waits
    write_buffer_age_s: float = 1.0  # a partly filled write buffer is flushed after this long

    def validate(self) -> None:
        _check(self.attr_timeout_s >= 0, "attr_timeout_s must be >= 0")
        _check(self.entry_timeout_s >= 0, "entry_timeout_s must be >= 0")
        _check(self.dir_entry_timeout_s >= 0, "dir_entry_timeout_s must be >= 0")
        _check(self.negative_timeout_s >= 0, "negative_timeout_s must be >= 0")
        _check(self.max_readahead_kb >= 0, "max_readahead_kb must be >= 0")
        _check(1 <= self.max_background <= 65535, "max_background must be 1..65535")
        _check(self.max_tasks >= 1, "max_tasks must be >= 1")
        _check(self.write_behind_chunks >= 1, "write_behind_chunks must be >= 1")
        _check(self.write_buffer_age_s > 0, "write_buffer_age_s must be > 0")


@dataclass
class SecuritySection:
    """How long chunk capabilities live (fs3/security/capability.py); their key derives from
    the cluster secret named by ``[rpc] secret_file``."""

    capability_ttl_s: float = 120.0  # meta: life of a chunk capability (clients renew at half)

    def validate(self) -> None:
        _check(self.capability_ttl_s >= 1, "capability_ttl_s must be >= 1")


# --------------------------------------------------------------------------- services


@dataclass
class MgmtdConfig:
    node: NodeSection = field(default_factory=lambda: NodeSection(id=1))
    cluster: ClusterSection = field(default_factory=ClusterSection)
    kv: KvSection = field(default_factory=KvSection)
    log: LogSection = field(default_factory=LogSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    mgmtd: MgmtdSection = field(default_factory=MgmtdSection)
    rpc: RpcSection = field(default_factory=RpcSection)


@dataclass
class MetaConfig:
    node: NodeSection = field(default_factory=lambda: NodeSection(id=100))
    cluster: ClusterSection = field(default_factory=ClusterSection)
    kv: KvSection = field(default_factory=KvSection)
    log: LogSection = field(default_factory=LogSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    meta: MetaSection = field(default_factory=MetaSection)
    client: ClientSection = field(default_factory=ClientSection)
    transport: TransportSection = field(default_factory=TransportSection)
    rpc: RpcSection = field(default_factory=RpcSection)
    security: SecuritySection = field(default_factory=SecuritySection)


@dataclass
class StorageConfig:
    node: NodeSection = field(default_factory=lambda: NodeSection(id=10001))
    cluster: ClusterSection = field(default_factory=ClusterSection)
    log: LogSection = field(default_factory=LogSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    storage: StorageSection = field(default_factory=StorageSection)
    transport: TransportSection = field(default_factory=TransportSection)
    client: ClientSection = field(default_factory=ClientSection)
    rpc: RpcSection = field(default_factory=RpcSection)
    security: SecuritySection = field(default_factory=SecuritySection)


@dataclass
class ClientConfig:
    """Config of a client process (Python API or FUSE daemon)."""

    cluster: ClusterSection = field(default_factory=ClusterSection)
    client: ClientSection = field(default_factory=ClientSection)
    transport: TransportSection = field(default_factory=TransportSection)
    fuse: FuseSection = field(default_factory=FuseSection)
    log: LogSection = field(default_factory=LogSection)
    rpc: RpcSection = field(default_factory=RpcSection)


SERVICE_CONFIGS: dict[str, type] = {
    "mgmtd": MgmtdConfig,
    "meta": MetaConfig,
    "storage": StorageConfig,
    "client": ClientConfig,
}

# --------------------------------------------------------------------------- loading

C = TypeVar("C")


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check/convert one value to the declared field type."""
    origin = typing.get_origin(tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {
            "1",
            "true",
            "yes",
            "on",
            "0",
            "false",
            "no",
            "off",
        }:
            return value.lower() in {"1", "true", "yes", "on"}
        raise ConfigError(f"{where}: expected a boolean, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value, 0)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):  # env override: comma-separated
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (types.UnionType, typing.Union):
        raise ConfigError(f"{where}: unsupported union type")
    raise ConfigError(f"{where}: unsupported type {tp!r}")


def from_dict(
    cls: type[C],
    data: Mapping[str, Any],
    *,
    source: str = "<dict>",
    env: Mapping[str, str] | None = None,
) -> C:
    """Build and validate a service config from parsed TOML and env overrides."""
    hints = typing.get_type_hints(cls)
    sections: dict[str, Any] = {}
    for name in data:
        if name not in hints:
            raise ConfigError(f"{source}: unknown section [{name}] (known: {', '.join(hints)})")
    for sec_name, sec_tp in hints.items():
        raw = data.get(sec_name, {})
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{source}: [{sec_name}] must be a table")
        default_sec = [f for f in dataclasses.fields(cls) if f.name == sec_name][0]  # type: ignore[arg-type]
        sec = default_sec.default_factory()  # type: ignore[misc,operator]
        sec_hints = typing.get_type_hints(sec_tp)
        for key in raw:
            if key not in sec_hints:
                raise ConfigError(
                    f"{source}: unknown key {key!r} in [{sec_name}] (known: {', '.join(sec_hints)})"
                )
            setattr(sec, key, _coerce(raw[key], sec_hints[key], f"{source}: [{sec_name}] {key}"))
        if env:
            for key, tp in sec_hints.items():
                var = f"FS3_{sec_name.upper()}_{key.upper()}"
                if var in env:
                    setattr(sec, key, _coerce(env[var], tp, f"environment {var}"))
        validate = getattr(sec, "validate", None)
        if validate is not None:
            try:
                validate()
            except ValueError as e:
                raise ConfigError(f"{source}: [{sec_name}] {e}") from None
        sections[sec_name] = sec
    return cls(**sections)


def load(
    cls: type[C], path: str | os.PathLike[str] | None, *, env: Mapping[str, str] | None = None
) -> C:
    """Load a service config from a TOML file (None: defaults only) plus env overrides."""
    if env is None:
        env = os.environ
    data: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file {source} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{source}: not valid TOML: {e}") from None
    return from_dict(cls, data, source=source, env=env)


def to_toml(cfg: Any) -> str:
    """Render a config as TOML (every key, so files list their defaults)."""
    lines: list[str] = []
    for f in dataclasses.fields(cfg):
        sec = getattr(cfg, f.name)
        lines.append(f"[{f.name}]")
        for sf in dataclasses.fields(sec):
            lines.append(f"{sf.name} = {_toml_value(getattr(sec, sf.name))}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot render {v!r} as TOML")


# --------------------------------------------------------------------------- cluster file


@dataclass(frozen=True)
class ClusterFile:
    cluster_id: str
    mgmtd_addresses: tuple[str, ...]

    def render(self) -> str:
        return f"{self.cluster_id}@{','.join(self.mgmtd_addresses)}\n"


def parse_cluster_file_text(text: str, source: str = "<cluster file>") -> ClusterFile:
    """Parse ``<cluster_id>@host:port,host:port`` (comments with #)."""
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    if len(lines) != 1 or "@" not in lines[0]:
        raise ConfigError(f"{source}: expected one line '<cluster_id>@host:port[,host:port...]'")
    cid, _, addrs = lines[0].partition("@")
    addresses = tuple(a.strip() for a in addrs.split(",") if a.strip())
    if not cid or not addresses:
        raise ConfigError(f"{source}: cluster id and at least one mgmtd address are required")
    for a in addresses:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{source}: bad mgmtd address {a!r} (want host:port)")
    return ClusterFile(cid, addresses)


def read_cluster_file(path: str | os.PathLike[str]) -> ClusterFile:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"cluster file {path} does not exist", errno=_errno.ENOENT) from None
    except OSError as e:
        raise ConfigError(
            f"cannot read cluster file {path}: {e.strerror or e}", errno=e.errno or _errno.EIO
        ) from None
    return parse_cluster_file_text(text, str(path))
