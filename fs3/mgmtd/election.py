"""Leader election: a lease in the KV, renewed by its holder (3FS ``MgmtdLeaseExtender``).

Every mgmtd runs :meth:`Elector.run_once` periodically. In one KV transaction
:func:`extend_lease` takes the lease if it is free or expired, renews it if the
caller holds it, and otherwise leaves it alone. Because the transaction is
serializable on every engine, at most one process holds an unexpired lease.

Holding the lease in the KV is not enough to *act* as leader: a process can be
paused (SIGSTOP, GC, swap) past its lease and wake up believing it still
leads. Two defences, both from 3FS:

* **Trust window.** A holder trusts its lease only until
  ``renewal_start + (lease_end - wall_at_renewal) - safety_margin`` measured on
  its *monotonic* clock, taken before the renewing transaction started. A paused
  process's monotonic clock keeps running, so on wake-up the window has closed
  and it answers NOT_LEADER at once, before its next renewal attempt.
* **Fencing.** Every write transaction of the leader re-reads the lease key
  (:meth:`Elector.fence`) and aborts with NOT_LEADER unless the lease is still
  its own, in the same term (``lease_start``) and unexpired. The read joins the
  transaction's conflict set, so a concurrent takeover makes the write fail.

A leader that cannot renew (KV unavailable) keeps leading only until its trust
window closes, then steps down and logs why; it takes the lease again when the
KV is back and nobody else holds it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fs3.clock import Clock, SystemClock
from fs3.config import MgmtdSection
from fs3.errors import Code, FsError
from fs3.kv import Database, Transaction
from fs3.logs import event
from fs3.mgmtd import store
from fs3.proto import mgmtd_pb2

log = logging.getLogger("fs3.mgmtd.election")


class Fenced(Exception):
    """Raised inside a transaction by :meth:`Elector.fence`.

    Deliberately not an ``FsError``: ``Database.run`` must not retry it (a
    NOT_LEADER error is retryable for *clients*, who go to the new leader, but
    retrying the transaction here would only spin). :meth:`Elector.fenced_error`
    turns it into the NOT_LEADER error to answer with.
    """

    def __init__(self, message: str, leader: str) -> None:
        super().__init__(message)
        self.leader = leader


# Protocol release of this mgmtd; a lease held by a newer release is never taken
# over by an older one (3FS releaseVersion).
RELEASE = 1


def extend_lease(
    tr: Transaction,
    node_id: int,
    address: str,
    now: float,
    length_s: float,
    release: int = RELEASE,
) -> mgmtd_pb2.MgmtdLease:
    """Take, renew or observe the lease; returns the lease as it stands after ``tr``.

    The 3FS rules, in order: free → take; held by a newer release → leave;
    already valid for ``length_s`` or more → leave; expired → take (new term);
    held by the caller → extend (same term: ``lease_start`` unchanged);
    held by someone else → leave.
    """
    cur = store.get_lease(tr)
    new = mgmtd_pb2.MgmtdLease(
        node_id=node_id,
        address=address,
        lease_start=now,
        lease_end=now + length_s,
        release=release,
    )
    if cur is None:
        store.set_lease(tr, new)
        return new
    if release < cur.release:
        return cur
    if cur.lease_end >= now + length_s:
        return cur
    if cur.lease_end < now:
        store.set_lease(tr, new)
        return new
    if cur.node_id == node_id:
        new.lease_start = cur.lease_start
        store.set_lease(tr, new)
        return new
    return cur


@dataclass(frozen=True)
class LeaseView:
    """What one renewal attempt concluded."""

    leader: bool
    term: float | None  # lease_start of our term when leader
    lease: mgmtd_pb2.MgmtdLease | None


class Elector:
    """Runs the lease protocol for one mgmtd process.

    Args:
        db: the KV.
        node_id, address: identity written into the lease (followers redirect to it).
        cfg: timings (lease_length_s, lease_renew_interval_s, lease_safety_margin_s).
        clock: wall clock for lease times, monotonic clock for the trust window.
        on_gained: awaited with the term when this process becomes leader.
        on_lost: awaited (with a reason) when it stops being leader.
    """

    def __init__(
        self,
        db: Database,
        node_id: int,
        address: str,
        cfg: MgmtdSection,
        *,
        clock: Clock | None = None,
        on_gained: Callable[[float], Awaitable[None]] | None = None,
        on_lost: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.db = db
        self.node_id = node_id
        self.address = address
        self.cfg = cfg
        self.clock: Clock = clock or SystemClock()
        self.on_gained = on_gained
        self.on_lost = on_lost
        self.lease: mgmtd_pb2.MgmtdLease | None = None  # last lease seen in the KV
        self._term: float | None = None
        self._trusted_until = 0.0  # monotonic
        self.last_error: FsError | None = None
        self.renewals = 0

    # -- queries (cheap, used on every request) ------------------------------------------

    def is_leader(self) -> bool:
        """True while this process holds the lease and is inside its trust window."""
        return self._term is not None and self.clock.monotonic() < self._trusted_until

    @property
    def term(self) -> float | None:
        """The current term (lease start) if leading, else None."""
        return self._term if self.is_leader() else None

    def leader_address(self) -> str:
        """The address of whoever holds an unexpired lease, as last seen ("" if unknown)."""
        if self.is_leader():
            return self.address
        lease = self.lease
        if lease is None or lease.lease_end <= self.clock.time() or lease.node_id == self.node_id:
            return ""
        return lease.address

    def leader_node_id(self) -> int:
        if self.is_leader():
            return self.node_id
        lease = self.lease
        if lease is None or lease.lease_end <= self.clock.time() or lease.node_id == self.node_id:
            return 0
        return int(lease.node_id)

    def not_leader(self, what: str = "") -> FsError:
        """The NOT_LEADER error a follower answers with (carrying the leader's address)."""
        addr = self.leader_address()
        msg = f"mgmtd {self.node_id} is not the leader" + (f" ({what})" if what else "")
        msg += f"; leader is {addr}" if addr else "; no leader known yet"
        return FsError(Code.NOT_LEADER, msg, leader=addr)

    def fence(self, tr: Transaction, term: float) -> None:
        """Abort ``tr`` unless the lease in the KV is still ours, in ``term``, unexpired.

        Call first in every write transaction of the leader. The lease read is a
        conflicting read, so a takeover committed meanwhile fails this commit.
        Raises :class:`Fenced` (not retried by ``Database.run``).
        """
        lease = store.get_lease(tr)
        now = self.clock.time()
        if (
            lease is None
            or lease.node_id != self.node_id
            or lease.lease_start != term
            or lease.lease_end <= now
            or not self.is_leader()
        ):
            holder = lease.address if lease is not None and lease.lease_end > now else ""
            if holder == self.address:
                holder = ""
            raise Fenced(f"mgmtd {self.node_id} lost the lease (fenced write)", holder)

    @staticmethod
    def fenced_error(exc: Fenced) -> FsError:
        return FsError(Code.NOT_LEADER, str(exc), leader=exc.leader)

    # -- the renewal loop ----------------------------------------------------------------

    async def run_once(self) -> LeaseView:
        """One renewal attempt; fires on_gained/on_lost on transitions."""
        mono0 = self.clock.monotonic()
        wall0 = self.clock.time()
        length = self.cfg.lease_length_s
        try:
            lease = await self.db.run_async(
                lambda tr: extend_lease(tr, self.node_id, self.address, wall0, length),
                timeout_s=max(self.cfg.lease_renew_interval_s, 0.5),
                max_retries=20,
            )
        except Exception as e:  # KV unavailable or failing: keep trusting only the window
            err = (
                e
                if isinstance(e, FsError)
                else FsError(Code.KV_UNAVAILABLE, f"{type(e).__name__}: {e}")
            )
            if self.last_error is None or self.last_error.message != err.message:
                event(
                    log,
                    "lease renewal failed",
                    logging.WARNING,
                    node=self.node_id,
                    error=err.message,
                )
            self.last_error = err
            await self._check_expired("cannot renew the lease: " + err.message)
            return LeaseView(self.is_leader(), self.term, self.lease)
        if self.last_error is not None:
            event(log, "kv reachable again", node=self.node_id)
        self.last_error = None
        self.lease = lease
        self.renewals += 1
        if lease.node_id == self.node_id and lease.lease_end > wall0:
            trusted = mono0 + (lease.lease_end - wall0) - self.cfg.lease_safety_margin_s
            if self._term is not None and self._term != lease.lease_start:
                # Our old term ended (e.g. expired unseen) and we took a new one.
                await self._lose("term changed")
            if self._term is None:
                if self.clock.monotonic() >= trusted:
                    return LeaseView(False, None, lease)  # renewal took too long to trust
                self._term = lease.lease_start
                self._trusted_until = trusted
                event(
                    log,
                    "lease gained",
                    node=self.node_id,
                    address=self.address,
                    term=f"{lease.lease_start:.3f}",
                    lease_end=f"{lease.lease_end:.3f}",
                )
                if self.on_gained is not None:
                    await self.on_gained(lease.lease_start)
            else:
                self._trusted_until = trusted
        else:
            if self._term is not None:
                await self._lose(f"lease held by node {lease.node_id}")
        return LeaseView(self.is_leader(), self.term, lease)

    async def _check_expired(self, reason: str) -> None:
        if self._term is not None and not self.is_leader():
            await self._lose(reason)

    async def _lose(self, reason: str) -> None:
        if self._term is None:
            return
        self._term = None
        self._trusted_until = 0.0
        event(log, "lease lost", logging.WARNING, node=self.node_id, reason=reason)
        if self.on_lost is not None:
            await self.on_lost(reason)

    def next_delay(self) -> float:
        """How long to wait before the next attempt.

        Leaders renew every ``lease_renew_interval_s`` (and re-check right when
        their trust window closes); followers retry exactly when the current
        lease expires, so a failover takes about one lease length.
        """
        interval = self.cfg.lease_renew_interval_s
        if self._term is not None:
            left = self._trusted_until - self.clock.monotonic()
            return max(0.0, min(interval, left + 0.001))
        lease = self.lease
        if lease is not None and self.last_error is None:
            until_expiry = lease.lease_end - self.clock.time()
            if until_expiry < interval:
                return max(0.01, until_expiry + 0.01)
        return interval

    async def run(self, stop: asyncio.Event) -> None:
        """Renew until ``stop`` is set, then give the lease up (no waiting for expiry)."""
        while not stop.is_set():
            await self.run_once()
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.next_delay())
            except TimeoutError:
                pass
        await self.release()

    async def release(self) -> None:
        """Give the lease up now (clean shutdown): expire it in the KV if still ours."""
        term = self._term
        await self._lose("released")
        if term is None:
            return

        def _release(tr: Transaction) -> None:
            lease = store.get_lease(tr)
            if lease is not None and lease.node_id == self.node_id and lease.lease_start == term:
                lease.lease_end = min(lease.lease_end, self.clock.time())
                store.set_lease(tr, lease)

        try:
            await self.db.run_async(_release, timeout_s=2.0, max_retries=5)
        except Exception as e:
            log.warning("could not release the lease: %s", e)
