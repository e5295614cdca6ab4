"""Client of the cluster manager: finds the leader, follows redirects, retries.

Every fs3 process talks to mgmtd through :class:`MgmtdClient` (storage and meta
heartbeat and watch routing; clients read routing; ``fs3 admin`` administers).
Only the leader serves; a follower answers ``NOT_LEADER`` carrying the leader's
address (3FS ``kNotPrimary``), which the client follows at once. Connection
failures and timeouts make it try the next known address, backing off between
rounds until ``retry_deadline_s`` has passed, so callers ride through a leader
failover without doing anything (3FS ``MgmtdClient.cc`` probes every address
the same way).

All methods are coroutines for asyncio (grpc.aio); the channels belong to the
event loop of the first call (a new loop gets new channels).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fs3.config import read_cluster_file
from fs3.errors import Code, FsError
from fs3.proto import mgmtd_pb2, mgmtd_pb2_grpc
from fs3.rpc.auth import credential_for_cluster
from fs3.rpc.channel import ChannelPool, call
from fs3.rpc.status import from_rpc_error

log = logging.getLogger("fs3.client.mgmtd")

T = TypeVar("T")

# Longest pause between retry rounds. A failover takes about one lease length;
# a short cap means callers notice the new leader within ~this of it taking over.
MAX_BACKOFF_S = 0.4

# Codes after which another address (or the same one, later) may succeed.
_TRY_ELSEWHERE = frozenset({Code.UNAVAILABLE, Code.TIMEOUT, Code.CANCELLED})


class MgmtdClient:
    """Leader-following client of ``MgmtdService``.

    Args:
        addresses: every known mgmtd ``host:port`` (from the cluster file).
        cluster_id: sent in registration and heartbeats; mgmtd refuses others.
        timeout_s: deadline of one RPC attempt.
        retry_deadline_s: give up retrying transient failures after this long
            (then the last error is raised; it is retryable, so the caller may
            keep going).
    """

    def __init__(
        self,
        addresses: Sequence[str],
        cluster_id: str,
        *,
        timeout_s: float = 5.0,
        retry_deadline_s: float = 60.0,
        transport: str | None = None,
        credential: Any = None,
    ) -> None:
        addrs = [a.strip() for a in addresses if a and a.strip()]
        if not addrs:
            raise FsError(Code.INVALID_ARGUMENT, "MgmtdClient needs at least one mgmtd address")
        self.addresses: list[str] = list(dict.fromkeys(addrs))
        self.cluster_id = cluster_id
        self.timeout_s = timeout_s
        self.retry_deadline_s = retry_deadline_s
        self._leader: str | None = None
        self._pool: ChannelPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stubs: dict[str, mgmtd_pb2_grpc.MgmtdServiceStub] = {}
        self._hb_version = 0
        self._rng = random.Random()
        self._closed = False
        self.transport = transport  # native | grpc; None: the process's [rpc] transport
        self.credential = credential  # fs3.rpc.auth.Credential; None: the process's

    @classmethod
    def from_cluster_file(cls, path: str, **kwargs: Any) -> MgmtdClient:
        """A client for the cluster named in ``path`` (``<cluster_id>@host:port,...``)."""
        cf = read_cluster_file(path)
        if kwargs.get("credential") is None:
            kwargs["credential"] = credential_for_cluster(path)
        return cls(cf.mgmtd_addresses, cf.cluster_id, **kwargs)

    @property
    def leader_address(self) -> str | None:
        """The address believed to be the leader (None until learned)."""
        return self._leader

    # -- public API ----------------------------------------------------------------

    async def get_leader(self) -> mgmtd_pb2.GetLeaderResponse:
        """The leader's identity, asked from any mgmtd (retries until one leads)."""
        deadline = time.monotonic() + self.retry_deadline_s
        delay = 0.05
        last: FsError | None = None
        while True:
            for addr in self._candidates():
                try:
                    r = await call(
                        self._stub(addr).GetLeader,
                        mgmtd_pb2.GetLeaderRequest(),
                        timeout=self.timeout_s,
                        what=f"GetLeader@{addr}",
                    )
                except FsError as e:
                    if not e.retryable:
                        raise
                    last = e
                    continue
                if r.is_leader:
                    self._leader = addr
                    return r
                if r.address:
                    self._learn(r.address)
                last = FsError(Code.NOT_LEADER, f"{addr} is not the leader", leader=r.address)
            delay = await self._backoff(deadline, delay, last)

    async def register_node(
        self, req: mgmtd_pb2.RegisterNodeRequest
    ) -> mgmtd_pb2.RegisterNodeResponse:
        """Register a node and its targets; answers with the current routing."""
        if not req.cluster_id:
            req.cluster_id = self.cluster_id
        return await self._call("RegisterNode", req)

    async def heartbeat(self, req: mgmtd_pb2.HeartbeatRequest) -> mgmtd_pb2.HeartbeatResponse:
        """Send one heartbeat.

        ``hb_version`` 0 means "let the client number it": versions are then
        strictly increasing even across restarts of the calling process
        (microseconds of wall time, or last + 1). A STALE_HEARTBEAT answer (e.g. a
        retried heartbeat that had in fact arrived) makes it jump past the
        leader's last version and resend once.
        """
        if not req.cluster_id:
            req.cluster_id = self.cluster_id
        auto = req.hb_version == 0
        if auto:
            req.hb_version = self._next_hb_version()
        try:
            return await self._call("Heartbeat", req)
        except FsError as e:
            if e.code != Code.STALE_HEARTBEAT or not auto:
                raise
            last = _parse_last_version(e.message)
            self._hb_version = max(self._hb_version, last)
            req.hb_version = self._next_hb_version()
            return await self._call("Heartbeat", req)

    async def get_routing(self, known_version: int = 0) -> mgmtd_pb2.RoutingInfo | None:
        """Routing newer than ``known_version`` (0: always), or None if the caller is current."""
        r = await self._call(
            "GetRoutingInfo", mgmtd_pb2.GetRoutingInfoRequest(known_version=known_version)
        )
        return r.routing if r.has_routing else None

    async def watch_routing(self, known_version: int = 0) -> AsyncIterator[mgmtd_pb2.RoutingInfo]:
        """Yield every routing newer than the last one yielded, forever.

        Follows the leader across failovers (reconnects with backoff); never
        yields a version lower than or equal to one already yielded. Stop by
        breaking out of the loop (or cancelling the consuming task).
        """
        version = known_version
        delay = 0.05
        while not self._closed:
            addr = self._leader or self.addresses[0]
            stream = self._stub(addr).WatchRoutingInfo(
                mgmtd_pb2.WatchRoutingInfoRequest(known_version=version)
            )
            try:
                async for info in stream:
                    delay = 0.05
                    self._leader = addr
                    if info.version > version:
                        version = info.version
                        yield info
            except asyncio.CancelledError:
                stream.cancel()
                raise
            except Exception as e:  # grpc errors: map, then decide where to go next
                err = e if isinstance(e, FsError) else _map_error(e, f"WatchRoutingInfo@{addr}")
                if err.code == Code.NOT_LEADER and err.leader and err.leader != addr:
                    self._learn(err.leader)
                    continue  # go straight to the leader
                if not err.retryable:
                    raise err from None
                self._rotate(addr)
            finally:
                stream.cancel()
            await asyncio.sleep(delay * (0.5 + self._rng.random()))
            delay = min(delay * 2, MAX_BACKOFF_S)

    async def create_chain_table(
        self,
        table_id: int,
        replicas: int,
        node_ids: Sequence[int] = (),
        desc: str = "",
    ) -> mgmtd_pb2.CreateChainTableResponse:
        """Create (or extend with free targets) chain table ``table_id``; see mgmtd docs."""
        req = mgmtd_pb2.CreateChainTableRequest(
            table_id=table_id, replicas=replicas, node_ids=list(node_ids), desc=desc
        )
        return await self._call("CreateChainTable", req)

    # -- users (admin credential; GetUser: services) ------------------------------------

    async def add_user(
        self, name: str, uid: int, gid: int, groups: Sequence[int] = (), admin: bool = False
    ) -> mgmtd_pb2.UserTokenResponse:
        """Add a user; the answer carries its token."""
        req = mgmtd_pb2.AddUserRequest(
            name=name, uid=uid, gid=gid, groups=list(groups), admin=admin
        )
        return await self._call("AddUser", req)

    async def remove_user(self, name: str) -> None:
        """Remove a user: its token stops working."""
        await self._call("RemoveUser", mgmtd_pb2.RemoveUserRequest(name=name))

    async def list_users(self) -> list[mgmtd_pb2.UserRecord]:
        return list((await self._call("ListUsers", mgmtd_pb2.ListUsersRequest())).users)

    async def user_token(self, name: str, rotate: bool = False) -> mgmtd_pb2.UserTokenResponse:
        """The user's token (``rotate``: a new one; the old one stops working)."""
        return await self._call("UserToken", mgmtd_pb2.UserTokenRequest(name=name, rotate=rotate))

    async def get_user(self, name: str) -> mgmtd_pb2.UserRecord | None:
        """The full user record (servers confirming a user token), or None if absent."""
        r = await self._call("GetUser", mgmtd_pb2.GetUserRequest(name=name))
        return r.user if r.found else None

    async def set_target_state(self, target_id: int, offline: bool) -> mgmtd_pb2.ChainInfo:
        """Mark a target administratively offline (True) or clear the mark (False)."""
        r = await self._call(
            "SetTargetState", mgmtd_pb2.SetTargetStateRequest(target_id=target_id, offline=offline)
        )
        return r.chain

    async def report_target_error(
        self, target_id: int, node_id: int, kind: str, detail: str = ""
    ) -> None:
        """Tell mgmtd a target produced an error (e.g. a checksum mismatch)."""
        await self._call(
            "ReportTargetError",
            mgmtd_pb2.ReportTargetErrorRequest(
                target_id=target_id, node_id=node_id, kind=kind, detail=detail
            ),
        )

    async def close(self) -> None:
        """Close every channel (the client must not be used afterwards)."""
        self._closed = True
        pool, self._pool = self._pool, None
        self._stubs.clear()
        if pool is not None:
            await pool.close()

    async def __aenter__(self) -> MgmtdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals -------------------------------------------------------------------

    def _next_hb_version(self) -> int:
        self._hb_version = max(self._hb_version + 1, time.time_ns() // 1000)
        return self._hb_version

    def _stub(self, addr: str) -> mgmtd_pb2_grpc.MgmtdServiceStub:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            # grpc.aio channels belong to one loop; a new loop needs new ones.
            self._pool = ChannelPool(self.transport, self.credential)
            self._loop = loop
            self._stubs = {}
        stub = self._stubs.get(addr)
        if stub is None:
            stub = mgmtd_pb2_grpc.MgmtdServiceStub(self._pool.get(addr))
            self._stubs[addr] = stub
        return stub

    def _learn(self, addr: str) -> None:
        """Remember ``addr`` as the leader (and as a known address)."""
        self._leader = addr
        if addr not in self.addresses:
            self.addresses.append(addr)

    def _rotate(self, failed: str) -> None:
        """Forget ``failed`` as leader; next attempts start with the next address."""
        if self._leader == failed:
            self._leader = None
        if failed in self.addresses and len(self.addresses) > 1:
            i = self.addresses.index(failed)
            self._leader = self.addresses[(i + 1) % len(self.addresses)]

    def _candidates(self) -> list[str]:
        """Addresses to try in one round: the believed leader first."""
        if self._leader and self._leader in self.addresses:
            i = self.addresses.index(self._leader)
            return self.addresses[i:] + self.addresses[:i]
        if self._leader:
            return [self._leader, *self.addresses]
        return list(self.addresses)

    async def _backoff(self, deadline: float, delay: float, last: FsError | None) -> float:
        if time.monotonic() + delay > deadline:
            if last is not None:
                raise last
            raise FsError(Code.UNAVAILABLE, "no mgmtd answered")
        await asyncio.sleep(delay * (0.5 + self._rng.random()))
        return min(delay * 2, MAX_BACKOFF_S)

    async def _call(self, method: str, req: Any) -> Any:
        """Call ``method`` on the leader: follow redirects, try every address, back off."""
        deadline = time.monotonic() + self.retry_deadline_s
        delay = 0.05
        last: FsError | None = None
        while True:
            tried: set[str] = set()
            queue = self._candidates()
            while queue:
                addr = queue.pop(0)
                if addr in tried:
                    continue
                tried.add(addr)
                try:
                    result = await call(
                        getattr(self._stub(addr), method),
                        req,
                        timeout=self.timeout_s,
                        what=f"{method}@{addr}",
                    )
                    self._leader = addr
                    return result
                except FsError as e:
                    last = e
                    if e.code == Code.NOT_LEADER:
                        if e.leader and e.leader not in tried:
                            self._learn(e.leader)
                            queue.insert(0, e.leader)
                        elif self._leader == addr:
                            self._leader = None
                        continue
                    if e.code in _TRY_ELSEWHERE:
                        if self._leader == addr:
                            self._leader = None
                        continue
                    if e.retryable:  # e.g. KV_UNAVAILABLE, LEASE_LOST on the leader: wait
                        break
                    raise
            delay = await self._backoff(deadline, delay, last)


def _map_error(e: BaseException, what: str) -> FsError:
    if hasattr(e, "code") and callable(e.code):
        return from_rpc_error(e, what)  # type: ignore[arg-type]
    return FsError(Code.UNAVAILABLE, f"{what}: {type(e).__name__}: {e}")


def _parse_last_version(message: str) -> int:
    """The leader's last hb version from a STALE_HEARTBEAT message ("... last=N ...")."""
    for part in message.replace(",", " ").split():
        if part.startswith("last="):
            try:
                return int(part[5:])
            except ValueError:
                return 0
    return 0


async def retry_forever(
    fn: Callable[[], Awaitable[T]], *, what: str = "", max_delay_s: float = 2.0
) -> T:
    """Call ``fn`` until it succeeds, backing off on retryable errors (for service loops)."""
    delay = 0.05
    while True:
        try:
            return await fn()
        except FsError as e:
            if not e.retryable:
                raise
            log.debug("%s failed (%s); retrying", what or "mgmtd call", e)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay_s)


__all__ = ["MgmtdClient", "retry_forever"]
