"""MetaService client: server choice, failover and retries.

Meta servers are stateless (every request is one KV transaction), so any of
them can serve any request. Like 3FS's ``RandomFollow`` selection, a client
picks one server at random among the META nodes in routing info and sticks to
it; when it stops answering (UNAVAILABLE/TIMEOUT) the client marks it failed
for a while and moves to another one. Retryable errors (KV conflicts surfacing,
timeouts, servers restarting) are retried with backoff up to the client's
``retry_deadline_s``.

Mutations carry a ``request_id`` that the caller sets once (:func:`new_request_id`)
and that stays the same across retries, so a create/rename whose answer was
lost is applied once: the meta server stores an idempotency record with the
result in the same transaction.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fs3.client.retry import Deadline, RetryPolicy, retrying
from fs3.errors import Code, FsError
from fs3.proto import meta_pb2, meta_pb2_grpc, mgmtd_pb2
from fs3.routing import Routing
from fs3.rpc.channel import ChannelPool, call
from fs3.rpc.native.sync_client import SyncPool

log = logging.getLogger("fs3.client.meta")

# Errors that say "this server cannot answer now": try another server.
_SERVER_DOWN = frozenset({Code.UNAVAILABLE, Code.TIMEOUT, Code.CANCELLED})

FAILED_SERVER_COOLDOWN_S = 5.0

# gRPC path prefix of MetaService methods (what the native method ids hash)
_META_PATH = f"/{meta_pb2.DESCRIPTOR.services_by_name['MetaService'].full_name}/"


def new_request_id() -> str:
    """A fresh idempotency id for one logical mutation (keep it across retries).

    32 hex digits like a UUID, but time-ordered: the nanosecond clock, then 64
    random bits (unique without coordination). Meta keys its idempotency
    records by the id (docs/kv-schema.md, ``rq``), so a mutation's record goes
    next to the newest ones - the same few B-tree pages every commit - instead
    of into a random page of the whole table that must be read and written
    back; and records pruned by age sit together.
    """
    return f"{time.time_ns():016x}{secrets.randbits(64):016x}"


class MetaClient:
    """Calls MetaService methods on some live meta server.

    Args:
        routing: returns the current :class:`Routing` (META nodes are taken from it).
        refresh_routing: coroutine function fetching newer routing (called when
            no meta server is known or all failed).
        pool: the channel pool of the client's event loop.
        policy: deadlines and backoff.
        static_addresses: meta addresses to use in addition to routing (tests,
            or a cluster whose meta servers are not yet in routing).
        rng: randomness for server choice (seedable for tests).
    """

    def __init__(
        self,
        routing: Callable[[], Routing],
        refresh_routing: Callable[[], Any],
        pool: ChannelPool,
        policy: RetryPolicy,
        *,
        static_addresses: Sequence[str] = (),
        rng: random.Random | None = None,
    ) -> None:
        self._routing = routing
        self._refresh = refresh_routing
        self._pool = pool
        self._policy = policy
        self._static = list(static_addresses)
        self._rng = rng or random.Random()
        self._current: str | None = None
        self._failed: dict[str, float] = {}
        self._stubs: dict[str, meta_pb2_grpc.MetaServiceStub] = {}
        # (routing, its server list): rebuilt only when routing is replaced (it is
        # immutable and swapped whole), one attribute so other threads
        # (:meth:`call_now`) always read a matching pair
        self._server_list: tuple[Routing | None, tuple[str, ...]] = (None, ())
        # native channels raise FsError themselves (fs3.rpc.channel.call maps only
        # grpc's errors), so their stubs are awaited directly: one frame less per call
        self._direct = pool.carries_payload
        self.failovers = 0  # how often the client switched server (tests, metrics)

    # ------------------------------------------------------------------ servers

    def servers(self) -> list[str]:
        """Known meta addresses: online META nodes of routing, then static ones."""
        return list(self._servers())

    def _servers(self) -> tuple[str, ...]:
        """:meth:`servers`, computed once per routing object (routing changes replace it)."""
        r = self._routing()
        cached_for, addrs = self._server_list
        if cached_for is r:
            return addrs
        online = [
            n.address
            for n in r.nodes(mgmtd_pb2.NODE_TYPE_META)
            if n.address and n.status != mgmtd_pb2.NODE_STATUS_OFFLINE
        ]
        for a in self._static:
            if a not in online:
                online.append(a)
        if not online:  # nothing online: try offline-marked ones too (mgmtd may lag)
            online = [n.address for n in r.nodes(mgmtd_pb2.NODE_TYPE_META) if n.address]
        addrs = tuple(online)
        self._server_list = (r, addrs)
        return addrs

    def _choose(self) -> str:
        addrs = self._servers()
        current = self._current
        if current is not None and current in addrs:
            return current
        now = time.monotonic()
        healthy = [a for a in addrs if self._failed.get(a, 0.0) <= now]
        pick_from = healthy or addrs
        if not pick_from:
            raise FsError(Code.UNAVAILABLE, "no meta server known (routing lists none)")
        self._current = self._rng.choice(pick_from)
        return self._current

    async def _choose_after_refresh(self) -> str:
        """:meth:`_choose` once more after fetching routing (no server was known)."""
        await self._refresh_quietly()
        return self._choose()

    def _mark_failed(self, address: str) -> None:
        self._failed[address] = time.monotonic() + FAILED_SERVER_COOLDOWN_S
        if self._current == address:
            self._current = None
            self.failovers += 1
            log.info("meta server %s failed; failing over", address)

    def _stub(self, address: str) -> meta_pb2_grpc.MetaServiceStub:
        s = self._stubs.get(address)
        if s is None:
            s = meta_pb2_grpc.MetaServiceStub(self._pool.get(address))  # type: ignore[no-untyped-call]
            self._stubs[address] = s
        return s

    # ------------------------------------------------------------------ calls

    async def call(self, method: str, request: Any, *, deadline_s: float | None = None) -> Any:
        """Invoke ``MetaService.<method>(request)`` with failover and retries.

        Raises the server's ``FsError`` for permanent failures (POSIX errno etc.)
        and the last transient error once the deadline has passed.

        Every FUSE op pays this once per meta call, so the first attempt runs
        inline with no deadline object, closures or message strings (one float
        is the deadline). Only a retryable failure builds them and continues
        in :func:`fs3.client.retry.retrying` as attempt 2 (:meth:`_retry`), with
        the deadline counted from here, so the policy is the one retry loop's.
        """
        policy = self._policy
        if deadline_s is not None:
            policy = RetryPolicy(
                deadline_s, policy.initial_backoff_s, policy.max_backoff_s, policy.rpc_timeout_s
            )
        end = time.monotonic() + policy.deadline_s
        address: str | None = None
        try:
            try:
                address = self._choose()
            except FsError:
                address = await self._choose_after_refresh()
            return await self._start(method, request, address, policy, end)
        except FsError as e:
            if not e.retryable:
                raise
            first = e
        return await self._retry(method, request, policy, end, first, address)

    def _start(
        self, method: str, request: Any, address: str, policy: RetryPolicy, end: float
    ) -> Awaitable[Any]:
        """One attempt on ``address``, started: the caller awaits it.

        A plain function returning the call's awaitable (on a live native
        connection, that connection's own coroutine), so an attempt adds no
        coroutine frame of its own.
        """
        stub = self._stubs.get(address) or self._stub(address)
        rpc_timeout = policy.rpc_timeout_s
        remaining = end - time.monotonic()
        # max(0.05, min(rpc_timeout_s, time left)): an attempt never outlives the deadline
        if not 0.05 <= rpc_timeout <= remaining:
            rpc_timeout = max(0.05, min(rpc_timeout, remaining))
        if self._direct:
            return getattr(stub, method)(request, timeout=rpc_timeout)  # type: ignore[no-any-return]
        return call(
            getattr(stub, method), request, timeout=rpc_timeout, what=f"meta.{method}@{address}"
        )

    async def _retry(
        self,
        method: str,
        request: Any,
        policy: RetryPolicy,
        end: float,
        first: FsError,
        first_address: str | None,
    ) -> Any:
        """Attempts 2.. of :meth:`call` after its first one failed with ``first``.

        ``retrying`` sees attempt 1 fail with ``first`` (so failover, backoff and
        the give-up message are exactly those of a loop that ran it), under the
        deadline that started with the call.
        """
        overall = Deadline(policy.deadline_s)
        overall.end = end
        used = {"address": first_address}

        async def attempt(n: int) -> Any:
            if n == 1:
                raise first
            try:
                address = self._choose()
            except FsError:
                address = await self._choose_after_refresh()
            used["address"] = address
            return await self._start(method, request, address, policy, overall.end)

        async def on_error(err: FsError, _n: int) -> None:
            address = used.get("address")
            if err.code in _SERVER_DOWN and address:
                self._mark_failed(address)
                if len(self._servers()) <= 1:
                    await self._refresh_quietly()

        return await retrying(
            attempt, policy, what=f"meta.{method}", on_error=on_error, deadline=overall
        )

    def call_now(self, method: str, request: Any, pool: SyncPool) -> Any:
        """One attempt of :meth:`call` from the calling thread, on that thread's own
        connection (``fs3.rpc.native.sync_client``): for callers that are not on the
        client's loop (the Python API), with no hand-off to the loop thread.

        Raises the server's ``FsError``; a retryable failure (server down, deadline,
        connection lost) is raised too, and the caller then continues with
        :meth:`call` on the loop with the same ``request``: the one retry policy
        (failover, backoff, routing refresh), and a mutation's request id keeps it
        applied once. Thread-safe: the server choice reads routing (replaced whole,
        never changed in place) and this client's current server.
        """
        address = self._choose()
        return pool.get(address).call(
            _META_PATH + method, request, timeout=self._policy.rpc_timeout_s
        )

    async def _refresh_quietly(self) -> None:
        try:
            await self._refresh()
        except FsError as e:
            log.debug("routing refresh failed: %s", e)
