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
import time
import uuid
from collections.abc import Callable, Sequence
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
    """A fresh idempotency id for one logical mutation (keep it across retries)."""
    return uuid.uuid4().hex


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
        self.failovers = 0  # how often the client switched server (tests, metrics)

    # ------------------------------------------------------------------ servers

    def servers(self) -> list[str]:
        """Known meta addresses: online META nodes of routing, then static ones."""
        r = self._routing()
        addrs = [
            n.address
            for n in r.nodes(mgmtd_pb2.NODE_TYPE_META)
            if n.address and n.status != mgmtd_pb2.NODE_STATUS_OFFLINE
        ]
        for a in self._static:
            if a not in addrs:
                addrs.append(a)
        if not addrs:  # nothing online: try offline-marked ones too (mgmtd may lag)
            addrs = [n.address for n in r.nodes(mgmtd_pb2.NODE_TYPE_META) if n.address]
        return addrs

    def _choose(self) -> str:
        addrs = self.servers()
        if self._current in addrs:
            return self._current  # type: ignore[return-value]
        now = time.monotonic()
        healthy = [a for a in addrs if self._failed.get(a, 0.0) <= now]
        pick_from = healthy or addrs
        if not pick_from:
            raise FsError(Code.UNAVAILABLE, "no meta server known (routing lists none)")
        self._current = self._rng.choice(pick_from)
        return self._current

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
        """
        policy = self._policy
        if deadline_s is not None:
            policy = RetryPolicy(
                deadline_s, policy.initial_backoff_s, policy.max_backoff_s, policy.rpc_timeout_s
            )
        overall = Deadline(policy.deadline_s)
        used: dict[str, str] = {}

        async def attempt(_n: int) -> Any:
            try:
                address = self._choose()
            except FsError:
                await self._refresh_quietly()
                address = self._choose()
            used["address"] = address
            fn = getattr(self._stub(address), method)
            timeout = max(0.05, min(policy.rpc_timeout_s, overall.remaining()))
            return await call(fn, request, timeout=timeout, what=f"meta.{method}@{address}")

        async def on_error(err: FsError, _n: int) -> None:
            address = used.get("address")
            if err.code in _SERVER_DOWN and address:
                self._mark_failed(address)
                if len(self.servers()) <= 1:
                    await self._refresh_quietly()

        return await retrying(attempt, policy, what=f"meta.{method}", on_error=on_error)

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
