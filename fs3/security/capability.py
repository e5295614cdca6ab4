"""Capabilities: meta's signed, short-lived grant of chunk access that storage verifies.

Storage has no permission model (it sees chunk ids, not paths, owners or
modes), so meta decides and signs: when a file is opened or created, or when a
client asks for a fresh grant, meta returns a capability naming the inode, the
rights (read, write), the chunk index range and an expiry, with an
HMAC-SHA256 under ``derive_key(secret, PURPOSE_CAPABILITY)``. Every storage
read, write, truncate and remove carries one; storage checks it before it
touches anything, so a client that talks to storage directly cannot reach a
chunk meta would not have let it reach.

Services that hold the cluster secret (meta's garbage collector, a storage node
forwarding an update down its chain or repairing a replica) mint *service*
capabilities for themselves (:class:`ServiceToken`): they cover every inode,
so only a holder of the secret can make one.

The token is opaque bytes on the wire: a fixed 36-byte body (version, rights,
inode, first and last chunk index, issue and expiry times in Unix milliseconds)
followed by the 32-byte MAC of the body. The issue time lets a client know a
grant's life without trusting its own clock to agree with meta's. Fixed layout rather than a protobuf body, so what is
signed is exactly what is parsed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from fs3.errors import Code, FsError
from fs3.limits import MAX_CHUNK_INDEX
from fs3.security.keys import PURPOSE_CAPABILITY, derive_key, find_secret

READ = 1
WRITE = 2
SERVICE = 4  # any inode, any chunk: minted only by services holding the cluster secret
_ALL_RIGHTS = READ | WRITE | SERVICE

VERSION = 1
_BODY = struct.Struct("<BBHQIIQQ")  # version, rights, reserved, inode, first, last, issued, expires
MAC_BYTES = 32
TOKEN_BYTES = _BODY.size + MAC_BYTES

# Clocks of meta and storage hosts differ a little; a grant is honoured this
# long past its expiry so a skew of a second or two does not fail fresh grants.
CLOCK_SKEW_S = 2.0
DEFAULT_TTL_S = 120.0
OPEN_CLUSTER_RECHECK_S = 60.0  # a client of a cluster without a secret asks meta again after this
SERVICE_TTL_S = 300.0


@dataclass(frozen=True)
class Capability:
    """What a token grants (after its MAC was checked, or as peeked by a client)."""

    inode: int
    rights: int
    first: int  # first chunk index covered
    last: int  # last chunk index covered (inclusive)
    issued_ms: int  # Unix time in milliseconds (meta's clock)
    expires_ms: int

    def allows(self, need: int) -> bool:
        return self.rights & SERVICE != 0 or self.rights & need == need

    def covers(self, inode: int, first: int, last: int) -> bool:
        if self.rights & SERVICE:
            return True
        return inode == self.inode and self.first <= first and last <= self.last


def rights_name(rights: int) -> str:
    names = [
        n for bit, n in ((READ, "read"), (WRITE, "write"), (SERVICE, "service")) if rights & bit
    ]
    return "+".join(names) or "none"


def peek(token: bytes) -> Capability | None:
    """Parse a token without checking its MAC (clients: to know when to refresh)."""
    if len(token) != TOKEN_BYTES:
        return None
    version, rights, _res, inode, first, last, issued_ms, expires_ms = _BODY.unpack_from(token)
    if version != VERSION:
        return None
    return Capability(inode, rights, first, last, issued_ms, expires_ms)


class CapabilitySigner:
    """Mints capabilities (meta for users; every service for itself)."""

    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self._clock = clock

    def issue(
        self,
        inode: int,
        rights: int,
        ttl_s: float = DEFAULT_TTL_S,
        first: int = 0,
        last: int = MAX_CHUNK_INDEX,
    ) -> bytes:
        if rights & ~_ALL_RIGHTS or not rights:
            raise FsError(Code.INVALID_ARGUMENT, f"bad capability rights {rights:#x}")
        if not 0 <= first <= last <= MAX_CHUNK_INDEX:
            raise FsError(Code.INVALID_ARGUMENT, f"bad chunk range [{first}, {last}]")
        issued_ms = int(self._clock() * 1000)
        expires_ms = issued_ms + int(ttl_s * 1000)
        body = _BODY.pack(VERSION, rights, 0, inode, first, last, issued_ms, expires_ms)
        return body + hmac.digest(self._key, body, hashlib.sha256)

    def service(self, ttl_s: float = SERVICE_TTL_S) -> bytes:
        return self.issue(0, SERVICE | READ | WRITE, ttl_s)


class CapabilityVerifier:
    """Storage's check: the MAC, the expiry, the rights and the chunk range.

    A verified token is remembered (by its bytes, bounded) so a client that
    sends the same grant with every chunk pays for one HMAC, not one per chunk;
    the expiry is still checked on every use.
    """

    def __init__(
        self,
        key: bytes,
        clock: Callable[[], float] = time.time,
        skew_s: float = CLOCK_SKEW_S,
        cache_size: int = 4096,
    ) -> None:
        self._key = key
        self._clock = clock
        self._skew_ms = int(skew_s * 1000)
        self._cache: dict[bytes, Capability] = {}
        self._cache_size = cache_size

    def _parse(self, token: bytes, what: str) -> Capability:
        cap = self._cache.get(token)
        if cap is not None:
            return cap
        if not token:
            raise FsError(
                Code.PERMISSION_DENIED, f"{what}: no capability (ask meta: open the file)"
            )
        if len(token) != TOKEN_BYTES:
            raise FsError(
                Code.PERMISSION_DENIED,
                f"{what}: malformed capability ({len(token)} bytes, want {TOKEN_BYTES})",
            )
        body, mac = token[: _BODY.size], token[_BODY.size :]
        if not hmac.compare_digest(hmac.digest(self._key, body, hashlib.sha256), mac):
            raise FsError(Code.PERMISSION_DENIED, f"{what}: capability signature does not verify")
        cap = peek(token)
        if cap is None:
            raise FsError(Code.PERMISSION_DENIED, f"{what}: unknown capability version")
        if len(self._cache) >= self._cache_size:
            self._cache.clear()  # bounded; a re-verify costs one HMAC
        self._cache[bytes(token)] = cap
        return cap

    def check(
        self, token: bytes, inode: int, first: int, last: int, need: int, what: str
    ) -> Capability:
        """The grant of ``token`` if it allows ``need`` on chunks [first, last] of ``inode``.

        Raises PERMISSION_DENIED (missing, forged, tampered, wrong inode, range or
        rights) or CAPABILITY_EXPIRED (retryable: the client fetches a new one).
        """
        cap = self._parse(token, what)
        if self._clock() * 1000 > cap.expires_ms + self._skew_ms:
            raise FsError(
                Code.CAPABILITY_EXPIRED,
                f"{what}: capability expired {int(self._clock() * 1000) - cap.expires_ms} ms ago",
                retryable=True,
            )
        if not cap.allows(need):
            raise FsError(
                Code.PERMISSION_DENIED,
                f"{what}: capability grants {rights_name(cap.rights)}, {rights_name(need)} needed",
            )
        if not cap.covers(inode, first, last):
            raise FsError(
                Code.PERMISSION_DENIED,
                f"{what}: capability for inode {cap.inode} chunks [{cap.first}, {cap.last}] "
                f"does not cover inode {inode} chunks [{first}, {last}]",
            )
        return cap

    def check_service(self, token: bytes, what: str) -> Capability:
        """A service capability (service-to-service calls: chain forwarding, resync)."""
        return self.check(token, 0, 0, 0, SERVICE, what)


class ServiceToken:
    """A service's own capability, re-minted when half its life has passed."""

    def __init__(self, signer: CapabilitySigner, ttl_s: float = SERVICE_TTL_S) -> None:
        self._signer = signer
        self._ttl_s = ttl_s
        self._token = b""
        self._renew_at = 0.0

    def token(self) -> bytes:
        now = time.monotonic()
        if now >= self._renew_at:
            self._token = self._signer.service(self._ttl_s)
            self._renew_at = now + self._ttl_s / 2
        return self._token


class CapabilitySource(Protocol):
    """Where a storage client gets the capability of a chunk request."""

    async def token(self, inode: int, write: bool) -> bytes: ...

    def invalidate(self, inode: int, token: bytes) -> None: ...


class ServiceCapabilities:
    """A :class:`CapabilitySource` for services: one service token for every inode."""

    def __init__(self, signer: CapabilitySigner) -> None:
        self._tok = ServiceToken(signer)

    async def token(self, inode: int, write: bool) -> bytes:
        return self._tok.token()

    def invalidate(self, inode: int, token: bytes) -> None:
        self._tok._renew_at = 0.0


class CapabilityCache:
    """A client's capabilities by (inode, right), fetched from meta and refreshed before expiry.

    ``fetch(inode, write)`` asks meta for a grant (``GetCapability``). Grants
    from Open/Create are :meth:`put` here so the first I/O needs no extra round
    trip. A grant is renewed when less than ``refresh_margin`` of its life (by
    this host's clock) is left; one fetch per (inode, right) at a time. If
    storage still refuses one as expired (clock skew), the storage client
    :meth:`invalidate`\\s it and retries with a fresh one, so long reads and
    writes never fail for an expiry.
    """

    def __init__(
        self,
        fetch: Callable[[int, bool], Awaitable[bytes]],
        clock: Callable[[], float] = time.time,
        refresh_margin: float = 0.5,
        max_entries: int = 65536,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._margin = refresh_margin
        self._max = max_entries
        self._tokens: dict[
            tuple[int, int], tuple[bytes, float]
        ] = {}  # (inode, right) -> (token, renew_at)
        self._inflight: dict[tuple[int, int], asyncio.Future[bytes]] = {}
        # Meta answered an empty grant (the cluster has no secret, storage checks
        # nothing): send none, without asking again, until this time.
        self._open_until = 0.0
        self.fetches = 0

    def put(self, token: bytes) -> None:
        """Remember a grant (an Open/Create answer's or a fetched one) under each right it has."""
        cap = peek(token)
        if cap is None:
            return
        now = self._clock()  # the grant's life by meta's clock, counted from now by ours
        renew_at = now + max(0, cap.expires_ms - cap.issued_ms) / 1000 * (1 - self._margin)
        if len(self._tokens) >= self._max:
            self._tokens.clear()  # bounded; a miss costs one GetCapability
        for right in (READ, WRITE):
            if cap.rights & right:
                self._tokens[(cap.inode, right)] = (token, renew_at)

    def invalidate(self, inode: int, token: bytes) -> None:
        """Storage refused ``token``: drop it so the next use fetches a new grant."""
        for right in (READ, WRITE):
            cur = self._tokens.get((inode, right))
            if cur is not None and cur[0] == token:
                del self._tokens[(inode, right)]

    def forget(self, inode: int) -> None:
        for right in (READ, WRITE):
            self._tokens.pop((inode, right), None)

    async def token(self, inode: int, write: bool) -> bytes:
        if self._open_until and self._clock() < self._open_until:
            return b""
        key = (inode, WRITE if write else READ)
        cur = self._tokens.get(key)
        if cur is not None and self._clock() < cur[1]:
            return cur[0]
        fut = self._inflight.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._fetch_one(inode, write))
            self._inflight[key] = fut
            fut.add_done_callback(lambda _f: self._inflight.pop(key, None))
        return await asyncio.shield(fut)

    async def _fetch_one(self, inode: int, write: bool) -> bytes:
        self.fetches += 1
        tok = await self._fetch(inode, write)
        if not tok:
            self._open_until = self._clock() + OPEN_CLUSTER_RECHECK_S
        else:
            self._open_until = 0.0
            self.put(tok)
        return tok


def capability_key(secret_file: str, cluster_file: str) -> bytes | None:
    """The capability key of this cluster, or None if it has no secret (checks are off).

    The secret is found by :func:`fs3.security.keys.find_secret` (a configured
    ``secret_file`` must exist; the place beside the cluster file may be empty).
    """
    secret = find_secret(secret_file, cluster_file)
    return None if secret is None else derive_key(secret, PURPOSE_CAPABILITY)
