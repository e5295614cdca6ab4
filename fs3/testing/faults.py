"""Fault helpers for the fault tests: network namespaces, slow links, small disks, corruption.

Everything here acts only on things it created itself and undoes exactly that:
a network namespace and veth pair with a unique name, iptables rules carrying a
unique comment, a tmpfs mounted on a directory it was given, bytes of one chunk
file. Killing and restarting processes is :class:`fs3.testing.cluster.ProcessCluster`'s
job (``kill``/``restart`` by name); :func:`pause`/:func:`resume` add SIGSTOP/SIGCONT.

Network namespaces (why it looks like this)
-------------------------------------------
A partitioned process must be *cut off, not killed*, and must keep using the
same addresses (``127.0.0.1:port``) that the rest of the cluster knows from
routing info and the cluster file. So the process runs inside its own network
namespace, joined to the host by a veth pair (host ``10.199.N.1``, namespace
``10.199.N.2``), with NAT making both sides transparent:

* host ``OUTPUT``: connections to ``127.0.0.1:<its ports>`` go to ``10.199.N.2``;
* namespace ``PREROUTING``: arrivals on the veth go to the namespace's ``127.0.0.1``;
* namespace ``OUTPUT``: connections to ``127.0.0.1:<any other port>`` (mgmtd,
  other storage nodes) go to ``10.199.N.1``, and host ``PREROUTING`` hands them to
  the host's ``127.0.0.1``;
* ``MASQUERADE`` on both veth ends and ``route_localnet`` so loopback-addressed
  packets may cross the veth.

So every byte between that process and the rest of the cluster crosses the veth,
and :meth:`NetnsLink.partition` (DROP on the namespace side of the veth, both
directions: a silent blackhole, like a pulled cable — connections hang, they are
not refused) cuts it off completely; :meth:`NetnsLink.heal` removes the DROP. A
slow node is made with a qdisc on both veth ends (:meth:`NetnsLink.slow`): netem
delay where the kernel has ``sch_netem``, otherwise a ``tbf`` rate limit (this
machine's kernel has no netem; the scenario says which one it used).

The process enters the namespace through :func:`netns_command`: the launcher's
recorded command becomes ``python -m fs3.testing.faults netns-exec NS ROLE
--config FILE``, which joins the namespace (``setns``) and then runs the normal
service entry point in-process, so ``/proc/PID/cmdline`` stays the recorded
command and the launcher's kill/restart/down keep working unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
_PREFIX = "fs3f"


def _run(
    cmd: Sequence[str], *, check: bool = True, ns: str | None = None
) -> subprocess.CompletedProcess[str]:
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    r = subprocess.run(full, capture_output=True, text=True, timeout=30, check=False)
    if check and r.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(full)}` failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}"
        )
    return r


# --------------------------------------------------------------------------- capability checks


def netns_unavailable() -> str | None:
    """Why network-namespace partitions cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables", "sysctl"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"{_PREFIX}-probe-{secrets.token_hex(2)}"
    r = _run(["ip", "netns", "add", probe], check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    try:
        r = _run(["iptables", "-t", "nat", "-S"], check=False, ns=probe)
        if r.returncode != 0:
            return f"iptables NAT does not work in a namespace: {r.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def qdisc_kinds() -> dict[str, bool]:
    """Which of netem/tbf this kernel supports (probed on a throwaway veth)."""
    if os.geteuid() != 0 or shutil.which("tc") is None:
        return {"netem": False, "tbf": False}
    dev = f"{_PREFIX}q{secrets.token_hex(2)}"
    if (
        _run(
            ["ip", "link", "add", dev, "type", "veth", "peer", "name", dev + "p"], check=False
        ).returncode
        != 0
    ):
        return {"netem": False, "tbf": False}
    try:
        out = {}
        for kind, args in (
            ("netem", ["delay", "10ms"]),
            ("tbf", ["rate", "1mbit", "burst", "32kbit", "latency", "100ms"]),
        ):
            r = _run(["tc", "qdisc", "add", "dev", dev, "root", kind, *args], check=False)
            out[kind] = r.returncode == 0
            _run(["tc", "qdisc", "del", "dev", dev, "root"], check=False)
        return out
    finally:
        _run(["ip", "link", "del", dev], check=False)


# --------------------------------------------------------------------------- namespaces


@dataclass
class NetnsLink:
    """A network namespace plus veth pair that one process runs in (see the module docstring).

    ``index`` (1..250) picks the subnet 10.199.index.0/30; use different indexes for
    links that exist at the same time.
    """

    index: int
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    ports: list[int] = field(default_factory=list)
    created: bool = False
    partitioned: bool = False
    shaped: str = ""  # "" | "netem" | "tbf"

    @property
    def ns(self) -> str:
        return f"{_PREFIX}-{self.tag}"

    @property
    def host_if(self) -> str:
        return f"{_PREFIX}{self.tag}h"  # <= 15 chars

    @property
    def ns_if(self) -> str:
        return f"{_PREFIX}{self.tag}n"

    @property
    def host_ip(self) -> str:
        return f"10.199.{self.index}.1"

    @property
    def ns_ip(self) -> str:
        return f"10.199.{self.index}.2"

    @property
    def comment(self) -> str:
        return f"fs3-fault-{self.tag}"

    def _host_nat(self, chain: str, *rule: str) -> None:
        _run(
            [
                "iptables",
                "-t",
                "nat",
                "-A",
                chain,
                *rule,
                "-m",
                "comment",
                "--comment",
                self.comment,
            ]
        )

    def setup(self, ports: Sequence[int]) -> NetnsLink:
        """Create the namespace and veth, and NAT ``127.0.0.1:<ports>`` of the host into it."""
        if not 1 <= self.index <= 250:
            raise ValueError("index must be 1..250")
        if not ports or len(ports) > 15:
            raise ValueError("between 1 and 15 ports (one iptables multiport rule)")
        self.ports = list(ports)
        plist = ",".join(str(p) for p in self.ports)
        try:
            _run(["ip", "netns", "add", self.ns])
            self.created = True
            _run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if])
            _run(["ip", "link", "set", self.ns_if, "netns", self.ns])
            _run(["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if])
            _run(["ip", "link", "set", self.host_if, "up"])
            _run(["sysctl", "-qw", f"net.ipv4.conf.{self.host_if}.route_localnet=1"])
            _run(["ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if], ns=self.ns)
            _run(["ip", "link", "set", self.ns_if, "up"], ns=self.ns)
            _run(["ip", "link", "set", "lo", "up"], ns=self.ns)
            _run(["sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1"], ns=self.ns)
            _run(["sysctl", "-qw", f"net.ipv4.conf.{self.ns_if}.route_localnet=1"], ns=self.ns)
            # host side
            self._host_nat(
                "PREROUTING",
                "-i",
                self.host_if,
                "-d",
                self.host_ip,
                "-p",
                "tcp",
                "-j",
                "DNAT",
                "--to-destination",
                "127.0.0.1",
            )
            self._host_nat(
                "OUTPUT",
                "-d",
                "127.0.0.1",
                "-p",
                "tcp",
                "-m",
                "multiport",
                "--dports",
                plist,
                "-j",
                "DNAT",
                "--to-destination",
                self.ns_ip,
            )
            self._host_nat("POSTROUTING", "-o", self.host_if, "-j", "MASQUERADE")
            # namespace side (rules vanish with the namespace)
            for rule in (
                [
                    "PREROUTING",
                    "-i",
                    self.ns_if,
                    "-d",
                    self.ns_ip,
                    "-p",
                    "tcp",
                    "-j",
                    "DNAT",
                    "--to-destination",
                    "127.0.0.1",
                ],
                [
                    "OUTPUT",
                    "-d",
                    "127.0.0.1",
                    "-p",
                    "tcp",
                    "-m",
                    "multiport",
                    "!",
                    "--dports",
                    plist,
                    "-j",
                    "DNAT",
                    "--to-destination",
                    self.host_ip,
                ],
                ["POSTROUTING", "-o", self.ns_if, "-j", "MASQUERADE"],
            ):
                _run(["iptables", "-t", "nat", "-A", *rule], ns=self.ns)
        except BaseException:
            self.cleanup()
            raise
        return self

    def wrap(self, command: Sequence[str]) -> list[str]:
        """The launcher command ``[python, -m, fs3.cli.main, ROLE, ...]`` run inside this namespace."""
        return netns_command(self.ns, command)

    def partition(self) -> None:
        """Cut the namespace off (silent DROP both ways on its veth end)."""
        if self.partitioned:
            return
        _run(["iptables", "-I", "INPUT", "-i", self.ns_if, "-j", "DROP"], ns=self.ns)
        _run(["iptables", "-I", "OUTPUT", "-o", self.ns_if, "-j", "DROP"], ns=self.ns)
        self.partitioned = True

    def heal(self) -> None:
        if not self.partitioned:
            return
        _run(["iptables", "-D", "INPUT", "-i", self.ns_if, "-j", "DROP"], ns=self.ns, check=False)
        _run(["iptables", "-D", "OUTPUT", "-o", self.ns_if, "-j", "DROP"], ns=self.ns, check=False)
        self.partitioned = False

    def slow(self, *, delay_ms: int = 50, rate_mbit: float = 16.0) -> str:
        """Make the link slow both ways: netem ``delay_ms`` if available, else tbf at ``rate_mbit``.

        Returns a description of what was applied.
        """
        self.unslow()
        kinds = qdisc_kinds()
        if kinds.get("netem"):
            args = ["netem", "delay", f"{delay_ms}ms"]
            what = f"netem delay {delay_ms} ms each way"
            self.shaped = "netem"
        elif kinds.get("tbf"):
            burst = max(16, int(rate_mbit * 1000 / 8 / 10))  # kbit: ~10 ms worth of bytes
            args = ["tbf", "rate", f"{rate_mbit}mbit", "burst", f"{burst}kbit", "latency", "1s"]
            what = (
                f"tbf rate {rate_mbit} Mbit/s each way (sch_netem is not available in this kernel)"
            )
            self.shaped = "tbf"
        else:
            raise RuntimeError("neither netem nor tbf qdiscs are available")
        _run(["tc", "qdisc", "add", "dev", self.host_if, "root", *args])
        _run(["tc", "qdisc", "add", "dev", self.ns_if, "root", *args], ns=self.ns)
        return what

    def unslow(self) -> None:
        if not self.shaped:
            return
        _run(["tc", "qdisc", "del", "dev", self.host_if, "root"], check=False)
        _run(["tc", "qdisc", "del", "dev", self.ns_if, "root"], ns=self.ns, check=False)
        self.shaped = ""

    def cleanup(self) -> None:
        """Remove the host NAT rules, the veth and the namespace (idempotent)."""
        r = _run(["iptables", "-t", "nat", "-S"], check=False)
        for line in r.stdout.splitlines():
            if self.comment in line and line.startswith("-A "):
                parts = _split_rule(line)
                _run(["iptables", "-t", "nat", "-D", *parts[1:]], check=False)
        _run(["ip", "link", "del", self.host_if], check=False)
        if self.created or os.path.exists(os.path.join(NETNS_DIR, self.ns)):
            _run(["ip", "netns", "del", self.ns], check=False)
        self.created = False
        self.partitioned = False
        self.shaped = ""


def _split_rule(line: str) -> list[str]:
    import shlex

    return shlex.split(line)


def leftover_netns() -> list[str]:
    """Namespaces of this module still present (a crashed test run); for diagnostics."""
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(_PREFIX + "-"))
    except FileNotFoundError:
        return []


def netns_command(ns: str, command: Sequence[str]) -> list[str]:
    """Rewrite ``[python, -m, fs3.cli.main, ARGS...]`` to run ARGS inside namespace ``ns``."""
    cmd = list(command)
    if len(cmd) < 4 or cmd[1:3] != ["-m", "fs3.cli.main"]:
        raise ValueError(f"not a launcher service command: {cmd}")
    return [cmd[0], "-m", "fs3.testing.faults", "netns-exec", ns, *cmd[3:]]


def _setns(ns: str) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns({ns}): {os.strerror(e)}")
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- cluster preparation


def create_cluster_with_netns(pc: Any, links: dict[str, NetnsLink]) -> None:
    """Lay out a new :class:`~fs3.testing.cluster.ProcessCluster` with the named processes in namespaces.

    Writes the configs and state the launcher would (its own :meth:`~fs3.launcher.LocalCluster.create`), sets up each link for that process's ports and records
    the namespaced command, so the following ``pc.start()`` starts them inside
    from the beginning (no extra restart, no extra failover).
    """
    lc = pc.launcher
    if lc.load_state() is not None:
        raise RuntimeError(f"{pc.dir} already holds a cluster")
    pc.spec.validate()
    st = lc.create(pc.spec)
    for name, link in links.items():
        rec = st.proc(name)
        if not link.created:
            link.setup(rec.ports)
        rec.command = link.wrap(rec.command)
    lc.save_state(st)


def storage_target_dirs(pc: Any) -> dict[int, Path]:
    """target id -> target directory, from the storage configs the launcher wrote."""
    out: dict[int, Path] = {}
    for rec in pc.launcher.load_state().by_role("storage"):
        cfg = tomllib.loads(Path(rec.config).read_text())
        sec = cfg.get("storage", {})
        for tid, path in zip(sec.get("target_ids", []), sec.get("targets", []), strict=False):
            out[int(tid)] = Path(path)
    return out


def target_node(target_id: int) -> str:
    """The launcher's process name of a target's node (target i*100+j is on storage-i)."""
    return f"storage-{target_id // 100}"


# --------------------------------------------------------------------------- signals


def pause(pc: Any, name: str) -> None:
    """SIGSTOP a process (it keeps its sockets and files but does nothing: a frozen node)."""
    rec = pc.process(name)
    if not pc.alive(name):
        raise RuntimeError(f"{name} is not running")
    os.kill(rec.pid, signal.SIGSTOP)


def resume(pc: Any, name: str) -> None:
    rec = pc.process(name)
    with contextlib.suppress(ProcessLookupError):
        os.kill(rec.pid, signal.SIGCONT)


# --------------------------------------------------------------------------- small file systems


@dataclass
class SmallFs:
    """A size-limited tmpfs mounted on ``path`` (a storage target's directory before start)."""

    path: Path
    size_mb: int
    mounted: bool = False

    def mount(self) -> SmallFs:
        if os.geteuid() != 0:
            raise PermissionError("mounting a tmpfs needs root")
        self.path.mkdir(parents=True, exist_ok=True)
        if any(self.path.iterdir()):
            raise RuntimeError(
                f"{self.path} is not empty; mount the small fs before the target is used"
            )
        _run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={self.size_mb}m,mode=0755",
                "tmpfs",
                str(self.path),
            ]
        )
        self.mounted = True
        return self

    def resize(self, size_mb: int) -> None:
        """Grow (or shrink) the file system in place: 'space freed' without touching its data."""
        _run(["mount", "-o", f"remount,size={size_mb}m", str(self.path)])
        self.size_mb = size_mb

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave_bytes: int) -> Path:
        """Take space with a ballast file until only ``leave_bytes`` are free."""
        ballast = self.path / "ballast.fill"
        want = self.free_bytes() - leave_bytes
        if want > 0:
            with open(ballast, "ab") as f:
                block = b"\0" * (1 << 20)
                while want > 0:
                    n = min(want, len(block))
                    try:
                        f.write(block[:n])
                        f.flush()
                    except OSError:
                        break
                    want -= n
        return ballast

    def unmount(self) -> None:
        if not self.mounted:
            return
        r = _run(["umount", str(self.path)], check=False)
        if r.returncode != 0:
            _run(["umount", "-l", str(self.path)], check=False)
        self.mounted = False


# --------------------------------------------------------------------------- chunk files


@dataclass(frozen=True)
class ChunkFile:
    target_id: int
    inode: int
    index: int
    commit_ver: int
    length: int
    checksum: int
    path: Path


def list_chunk_files(
    target_dir: Path, target_id: int = 0, inode: int | None = None
) -> list[ChunkFile]:
    """Committed chunks of a target read straight from its ``meta.db`` (works while it runs: WAL)."""
    db_path = target_dir / "meta.db"
    if not db_path.exists():
        return []
    con = sqlite3.connect(str(db_path), timeout=10)
    try:
        q = "SELECT inode, idx, commit_ver, length, checksum, file FROM chunks"
        args: tuple[Any, ...] = ()
        if inode is not None:
            q += " WHERE inode = ?"
            args = (_i64(inode),)
        rows = con.execute(q, args).fetchall()
    finally:
        con.close()
    return [
        ChunkFile(
            target_id,
            r[0] & 0xFFFFFFFFFFFFFFFF,
            r[1],
            r[2],
            r[3],
            r[4] & 0xFFFFFFFF,
            target_dir / "data" / r[5] if r[5] else Path(),
        )
        for r in rows
    ]


def _i64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def corrupt_chunk(
    cf: ChunkFile, *, offset: int | None = None, nbytes: int = 16
) -> tuple[int, bytes]:
    """Flip ``nbytes`` bytes of a chunk file in place (silent corruption: size and metadata unchanged).

    Returns (offset, original bytes).
    """
    if cf.length <= 0 or not cf.path.is_file():
        raise ValueError(f"chunk {cf.inode}:{cf.index} on target {cf.target_id} has no data file")
    off = cf.length // 2 if offset is None else offset
    n = max(1, min(nbytes, cf.length - off))
    fd = os.open(cf.path, os.O_RDWR)
    try:
        orig = os.pread(fd, n, off)
        os.pwrite(fd, bytes(b ^ 0xFF for b in orig), off)
        os.fsync(fd)
    finally:
        os.close(fd)
    return off, orig


def read_chunk_bytes(cf: ChunkFile) -> bytes:
    """The committed bytes of a chunk file (``length`` bytes)."""
    if cf.length == 0:
        return b""
    with open(cf.path, "rb") as f:
        return f.read(cf.length)


def read_replica(
    pc: Any, target_id: int, inode: int, index: int, length: int = 1 << 20
) -> tuple[int, bytes]:
    """Read one chunk from one chosen replica over ``BatchRead`` (bypassing the client's replica choice).

    Returns (fs3 error code or 0, data). Used to make sure a corrupt replica is
    actually read (which is what triggers its detection and repair).
    """
    from fs3.proto import storage_pb2, storage_pb2_grpc
    from fs3.rpc.channel import call_sync, sync_channel
    from fs3.security.capability import CapabilitySigner, capability_key

    s = pc.status()
    t = next(x for x in s["targets"] if x["id"] == target_id)
    chain = next(c for c in s["chains"] if c["id"] == t["chain"])
    addr = next(p["address"] for p in s["processes"] if p["name"] == t["node"])
    ch = sync_channel(addr)
    try:
        io = storage_pb2.ReadIO(
            chain_id=chain["id"],
            chain_version=chain["version"],
            chunk=storage_pb2.ChunkId(inode=inode, index=index),
            offset=0,
            length=length,
            target_id=target_id,
        )
        # A cluster with a secret checks chunk capabilities: read as a service would.
        key = capability_key("", pc.cluster_file)
        if key is not None:
            io.capability = CapabilitySigner(key).service(60)
        r = call_sync(
            storage_pb2_grpc.StorageServiceStub(ch).BatchRead,
            storage_pb2.BatchReadRequest(ios=[io]),
            timeout=10,
        )
        res = r.results[0]
        return int(res.error.code), bytes(res.data)
    finally:
        ch.close()


# --------------------------------------------------------------------------- entry point


@contextlib.contextmanager
def cleanup_all(links: Sequence[NetnsLink] = (), fss: Sequence[SmallFs] = ()) -> Iterator[None]:
    """Undo links and small file systems however the block ends."""
    try:
        yield
    finally:
        for link in links:
            link.cleanup()
        for fs in fss:
            fs.unmount()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fs3.testing.faults netns-exec NS ROLE --config FILE``: run a service inside NS."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] != "netns-exec":
        print(
            "usage: python -m fs3.testing.faults netns-exec NETNS ROLE [ARGS...]", file=sys.stderr
        )
        return 2
    _setns(args[1])
    from fs3.cli.main import main as fs3_main

    return int(fs3_main(args[2:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
