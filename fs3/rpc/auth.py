"""Who is calling: credentials on both transports, checked once per connection.

Clients present a token (``fs3.security.tokens``):

* native transport: right after the preface the client sends one ``AUTH``
  frame whose body is the token (``fs3.rpc.native.wire``). The server checks it
  once, before it reads any call of that connection, and keeps the resulting
  :class:`Principal` on the connection; every call's context carries it, so a
  call costs a dict lookup (the method's :data:`POLICY`) and nothing else;
* gRPC: every call carries the token in the ``fs3-token`` metadata key; the
  server caches verified tokens (:class:`Authenticator`), so a repeated token
  costs a dict lookup too.

Whichever carried it, :meth:`Authenticator.check` (called by the guard every
handler passes through, ``fs3.rpc.server.guard_servicer``) then enforces

* the method's level (:data:`OPEN` health probes, :data:`USER`,
  :data:`ADMIN`, :data:`SERVICE`), and
* identity: a request's ``user`` field (``common.UserInfo``, what meta checks
  permissions against) must be the token's own uid/gid/groups unless the
  principal may act for others (service and mount credentials, as an NFS
  server trusts a mount).

User tokens can be revoked (``fs3 admin user remove``, rotation): a user
principal is re-confirmed against the user records (:attr:`Authenticator.lookup`:
the KV on mgmtd, mgmtd's ``GetUser`` elsewhere) every ``RECHECK_S`` seconds,
also on long-lived connections.

Authentication is on when the process has the cluster secret (``[rpc]
secret_file``); a server without one serves unauthenticated, as 3FS does with
``authenticate = false`` (docs: docs/security.md). ``fs3 cluster up`` and the
deploy templates always give services the secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpc import aio

from fs3.errors import Code, FsError
from fs3.security.keys import find_secret
from fs3.security.tokens import Claims, Signer, Verifier

log = logging.getLogger("fs3.rpc.auth")

METADATA_KEY = "fs3-token"
RECHECK_S = 5.0  # a user principal is re-confirmed (not removed, not rotated) this often
LOOKUP_TIMEOUT_S = 5.0  # one confirmation (mgmtd's GetUser) may take this long
CACHE_ENTRIES = 4096  # verified gRPC tokens kept

# Method levels.
OPEN = 0  # anyone, unauthenticated: health probes only (they reveal nothing secret)
USER = 1  # any authenticated principal
ADMIN = 2  # an admin user token or a service credential
SERVICE = 3  # fs3 processes only (service credentials)

LEVEL_NAMES = {OPEN: "open", USER: "user", ADMIN: "admin", SERVICE: "service"}
_ARTICLE = {OPEN: "an", USER: "a", ADMIN: "an", SERVICE: "a"}

# Every method that is not USER. Keyed "Service/Method" (the proto service's short name).
POLICY: dict[str, int] = {
    # mgmtd
    "MgmtdService/GetLeader": OPEN,  # docker-compose healthchecks (fs3 cluster probe)
    "MgmtdService/RegisterNode": SERVICE,
    "MgmtdService/Heartbeat": SERVICE,
    "MgmtdService/ReportTargetError": SERVICE,
    "MgmtdService/CreateChainTable": ADMIN,
    "MgmtdService/SetTargetState": ADMIN,
    "MgmtdService/AddUser": ADMIN,
    "MgmtdService/RemoveUser": ADMIN,
    "MgmtdService/ListUsers": ADMIN,
    "MgmtdService/UserToken": ADMIN,
    "MgmtdService/GetUser": SERVICE,
    # meta: session and GC maintenance
    "MetaService/PruneSessions": ADMIN,
    "MetaService/ListGc": ADMIN,
    "MetaService/AckGc": ADMIN,
    # storage: replication and resync between storage nodes; inventory
    "StorageService/Update": SERVICE,
    "StorageService/SyncStart": SERVICE,
    "StorageService/SyncDone": SERVICE,
    "StorageService/ListChunks": ADMIN,
}


def level_of(service: str, method: str) -> int:
    """The level of ``method`` of proto service ``service`` (full or short name)."""
    return POLICY.get(f"{service.rsplit('.', 1)[-1]}/{method}", USER)


@dataclass
class Principal:
    """An authenticated caller (one per native connection; one per token on gRPC)."""

    kind: str  # service | mount | user (fs3.security.tokens.KINDS)
    name: str
    uid: int = 0
    gid: int = 0
    groups: frozenset[int] = field(default_factory=frozenset)
    admin: bool = False
    token_id: str = ""
    checked: float = 0.0  # monotonic time of the last confirmation (user principals)
    revoked: str = ""  # why this principal no longer counts ("" while valid)

    @property
    def acts_for_others(self) -> bool:
        """Service and mount credentials pass on their callers' identities."""
        return self.kind in ("service", "mount")

    def level(self) -> int:
        if self.kind == "service":
            return SERVICE
        if self.admin:
            return ADMIN
        return USER

    def describe(self) -> str:
        if self.kind == "user":
            return f"user {self.name} (uid {self.uid})"
        return f"{self.kind} {self.name}"


# A user record as the servers need it: (uid, gid, groups, admin, token_id), or None if absent.
UserLookup = Callable[[str], Awaitable[Any]]


class Authenticator:
    """Verifies tokens and enforces :data:`POLICY` for one server process.

    ``lookup(name)`` returns the user's record (a ``mgmtd.UserRecord``) or
    None; without one user tokens are refused (only service and mount tokens
    work), which is what a server that cannot reach the user records must do.
    """

    def __init__(self, verifier: Verifier, *, lookup: UserLookup | None = None) -> None:
        self.verifier = verifier
        self.lookup = lookup
        self._cache: dict[str, Principal] = {}

    # -- tokens -------------------------------------------------------------------

    async def authenticate(self, token: str | bytes | None) -> Principal:
        """The principal a token proves; ``FsError(UNAUTHENTICATED)`` otherwise."""
        if not token:
            raise FsError(
                Code.UNAUTHENTICATED,
                "no credential: this cluster requires authentication (run on a host with the "
                "cluster secret, or pass a user token: fs3.connect(token=...), FS3_TOKEN or "
                "FS3_TOKEN_FILE; `fs3 admin user token NAME` prints one)",
            )
        claims = self.verifier.verify(token)
        p = _principal(claims)
        if p.kind == "user":
            await self._confirm(p)
        return p

    async def _confirm(self, p: Principal) -> None:
        """Check that user ``p`` still exists with the same token (not removed, not rotated)."""
        if self.lookup is None:
            raise FsError(
                Code.UNAUTHENTICATED,
                "user tokens are not accepted here: this server cannot read the user records",
            )
        try:
            rec = await asyncio.wait_for(self.lookup(p.name), LOOKUP_TIMEOUT_S)
        except TimeoutError:
            raise FsError(
                Code.UNAVAILABLE,
                f"cannot confirm user {p.name}: the user records did not answer in "
                f"{LOOKUP_TIMEOUT_S:.0f} s",
                retryable=True,
            ) from None
        if rec is None:
            p.revoked = f"user {p.name} has been removed"
        elif rec.token_id != p.token_id:
            p.revoked = f"the token of user {p.name} has been replaced (fs3 admin user token)"
        else:
            p.uid, p.gid = int(rec.uid), int(rec.gid)
            p.groups = frozenset(int(g) for g in rec.groups)
            p.admin = bool(rec.admin)
            p.checked = time.monotonic()
            return
        raise FsError(Code.UNAUTHENTICATED, f"credential revoked: {p.revoked}")

    async def principal_of(self, context: Any) -> Principal | None:
        """The caller of one call: the native connection's, or the gRPC metadata token's."""
        p = getattr(context, "principal", None)
        if isinstance(p, FsError):
            raise p  # native: the connection's AUTH was refused
        if p is not None or hasattr(context, "principal"):
            return p  # native: decided once per connection (None: no AUTH frame)
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == METADATA_KEY:
                token = value if isinstance(value, str) else value.decode("ascii", "replace")
                break
        if not token:
            return None
        p = self._cache.get(token)
        if p is None:
            p = _principal(self.verifier.verify(token))  # a forgery is refused here, uncached
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.pop(next(iter(self._cache)))
            # cached before its user is confirmed: a revoked token keeps being refused
            # from the cache instead of costing a lookup per call
            self._cache[token] = p
            if p.kind == "user":
                p.checked = 0.0  # confirmed by check() before any use
        return p

    # -- per call ---------------------------------------------------------------------

    def check_now(self, context: Any, level: int, request: Any, what: str) -> bool:
        """The common case without a coroutine: a native connection's confirmed principal.

        True: allowed (raises if refused); False: :meth:`check` must decide (gRPC
        metadata, a user due for its recheck, no principal).
        """
        if level == OPEN:
            return True
        p = getattr(context, "principal", None)
        if not isinstance(p, Principal) or (
            p.kind == "user" and (p.revoked or time.monotonic() - p.checked > RECHECK_S)
        ):
            return False
        self._authorize(p, level, request, what)
        return True

    async def check(self, context: Any, level: int, request: Any, what: str) -> None:
        """Refuse the call unless its caller may call ``what`` (of ``level``) with ``request``."""
        if level == OPEN:
            return
        p = await self.principal_of(context)
        if p is None:
            await self.authenticate(None)  # raises the explanation
            return
        if p.kind == "user" and (p.revoked or time.monotonic() - p.checked > RECHECK_S):
            if p.revoked:
                raise FsError(Code.UNAUTHENTICATED, f"credential revoked: {p.revoked}")
            try:
                await self._confirm(p)
            except FsError as e:
                if e.code == Code.UNAUTHENTICATED or p.checked == 0.0:
                    raise  # revoked, or never confirmed: not admitted on a failed lookup
                # the records cannot be read now (mgmtd failing over): keep serving the
                # user confirmed before, and ask again at the next recheck
                log.debug("cannot recheck %s: %s", p.describe(), e)
                p.checked = time.monotonic()
        self._authorize(p, level, request, what)

    @staticmethod
    def _authorize(p: Principal, level: int, request: Any, what: str) -> None:
        if p.level() < level:
            raise FsError(
                Code.PERMISSION_DENIED,
                f"{what} needs {_ARTICLE[level]} {LEVEL_NAMES[level]} credential; {p.describe()} is not one",
            )
        if not p.acts_for_others:
            check_identity(p, request, what)


_USER_FIELD: dict[Any, bool] = {}  # message class -> has a ``user`` (UserInfo) field


def _has_user(cls: Any) -> bool:
    has = _USER_FIELD.get(cls)
    if has is None:
        f = cls.DESCRIPTOR.fields_by_name.get("user")
        has = _USER_FIELD[cls] = f is not None and f.message_type is not None
    return has


def check_identity(p: Principal, request: Any, what: str) -> None:
    """A user principal may only speak for itself in a request's ``user`` field.

    An unset ``user`` reads as uid 0 / gid 0, so leaving it out claims root too.
    """
    if request is None or not _has_user(type(request)):
        return  # a request stream's messages, or a request that names nobody
    user = request.user
    if user.uid == p.uid and user.gid == p.gid:
        allowed = p.groups
        for g in user.groups:
            if g not in allowed and g != p.gid:
                break
        else:
            return
    raise FsError(
        Code.PERMISSION_DENIED,
        f"{what}: {p.describe()} may not act as uid {user.uid} gid {user.gid} "
        f"groups {list(user.groups)} (a user token acts only as its own uid/gid/groups)",
    )


def _principal(c: Claims) -> Principal:
    return Principal(
        kind=c.kind,
        name=c.name,
        uid=c.uid,
        gid=c.gid,
        groups=frozenset(c.groups),
        admin=c.admin or c.kind == "service",
        token_id=c.token_id,
        checked=time.monotonic(),
    )


# ------------------------------------------------------------------------ process setup


def process_signer() -> Signer | None:
    """A token signer from this process's cluster secret (``[rpc] secret_file``), if any."""
    from fs3.rpc import settings

    secret = find_secret(settings.current().secret_file)
    return Signer(secret) if secret is not None else None


def server_authenticator(rpc: Any) -> Authenticator | None:
    """The authenticator of a server configured by ``rpc`` (``[rpc]``); None: unauthenticated."""
    secret = find_secret(getattr(rpc, "secret_file", ""))
    if secret is None:
        return None
    return Authenticator(Verifier.from_secret(secret))


@dataclass(frozen=True)
class Credential:
    """What a client presents: a token, and the CA that signs servers' TLS certificates."""

    token: str = ""
    tls_ca: str = ""  # PEM file; "" = plaintext
    tls_server_name: str = "fs3"  # the name every fs3 service certificate carries

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((METADATA_KEY, self.token),) if self.token else ()

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client TLS context trusting only the cluster's CA (None: plaintext)."""
        return client_ssl_context(self.tls_ca) if self.tls_ca else None


NO_CREDENTIAL = Credential()


def service_name() -> str:
    import socket

    return f"{socket.gethostname()}-{os.getpid()}"


def credential_from(
    *,
    token: str | None = None,
    token_file: str | None = None,
    secret_file: str | None = None,
    cluster_file: str | None = None,
    tls_ca: str = "",
    kind: str = "service",
) -> Credential:
    """Resolve a client's credential (first that applies):

    ``token``, ``token_file``, ``secret_file`` (mint a ``kind`` token), ``$FS3_TOKEN``,
    ``$FS3_TOKEN_FILE``, the cluster secret beside ``cluster_file`` if this user may
    read it (the local operator who ran ``fs3 cluster up``), else no token. The TLS CA:
    ``tls_ca``, ``$FS3_RPC_TLS_CA``, else ``tls/ca.pem`` beside the cluster file.
    """
    ca = tls_ca or os.environ.get("FS3_RPC_TLS_CA", "")
    if not ca and cluster_file:
        cand = Path(cluster_file).parent / "tls" / "ca.pem"
        if cand.is_file():
            ca = str(cand)
    tok = _resolve_token(token, token_file, secret_file, cluster_file, kind)
    return Credential(token=tok, tls_ca=ca)


def _resolve_token(
    token: str | None,
    token_file: str | None,
    secret_file: str | None,
    cluster_file: str | None,
    kind: str,
) -> str:
    if token:
        return token.strip()
    if token_file:
        return _read_token_file(token_file)
    if secret_file:
        secret = find_secret(secret_file)  # a configured secret: raises if missing or unusable
        if secret is not None:
            return _mint(secret, kind)
    env = os.environ.get("FS3_TOKEN", "").strip()
    if env:
        return env
    env_file = os.environ.get("FS3_TOKEN_FILE", "")
    if env_file:
        return _read_token_file(env_file)
    if cluster_file:
        with contextlib.suppress(FsError):  # one this user may not read or use: no token
            secret = find_secret(cluster_file=cluster_file)
            if secret is not None:
                return _mint(secret, kind)
    return ""


def _mint(secret: bytes, kind: str) -> str:
    s = Signer(secret)
    return s.mount_token(service_name()) if kind == "mount" else s.service_token(service_name())


def _read_token_file(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as e:
        raise FsError(Code.UNAUTHENTICATED, f"cannot read token file {path}: {e}") from None


_default: Credential | None = None
_resolved: tuple[Any, Credential] | None = None  # (the [rpc] section it came from, credential)


def set_default(cred: Credential | None) -> None:
    """This process's credential for channels created without one (None: resolve again)."""
    global _default, _resolved
    _default = cred
    _resolved = None


def default_credential() -> Credential:
    """The process's credential: :func:`set_default`'s, else from its ``[rpc]`` settings
    (``secret_file``: a service token; ``token_file``), else the environment."""
    global _resolved
    if _default is not None:
        return _default
    from fs3.rpc import settings

    r = settings.current()
    if _resolved is None or _resolved[0] is not r:
        env = os.environ  # CLI processes load no config: its FS3_RPC_* overrides apply here
        cred = credential_from(
            token_file=r.token_file or env.get("FS3_RPC_TOKEN_FILE") or None,
            secret_file=r.secret_file or env.get("FS3_RPC_SECRET_FILE") or None,
            tls_ca=r.tls_ca or env.get("FS3_RPC_TLS_CA", ""),
            cluster_file=env.get("FS3_CLUSTER_FILE") or None,
        )
        _resolved = (r, cred)
    return _resolved[1]


def credential_for_cluster(cluster_file: str) -> Credential:
    """The process's credential if it has a token, else one found for ``cluster_file``."""
    d = default_credential()
    if d.token:
        return d
    return credential_from(cluster_file=cluster_file, tls_ca=d.tls_ca)


# ------------------------------------------------------------------------ TLS contexts


def server_tls(rpc: Any) -> ssl.SSLContext | None:
    """The TCP listener's TLS context from ``[rpc] tls_cert/tls_key`` (None: plaintext)."""
    if not getattr(rpc, "tls_cert", ""):
        return None
    return server_ssl_context(rpc.tls_cert, rpc.tls_key)


def add_grpc_port(server: Any, address: str, rpc: Any) -> int:
    """A direct gRPC port (``[rpc] grpc_port``), with TLS when the server has a certificate."""
    import grpc

    if not getattr(rpc, "tls_cert", ""):
        return int(server.add_insecure_port(address))
    creds = grpc.ssl_server_credentials(
        [(Path(rpc.tls_key).read_bytes(), Path(rpc.tls_cert).read_bytes())]
    )
    return int(server.add_secure_port(address, creds))


def client_ssl_context(ca_file: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.set_alpn_protocols(["fs3"])
    return ctx


def server_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The native listener's context; it offers ``h2`` too, for gRPC clients it relays."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    ctx.set_alpn_protocols(["fs3", "h2"])
    return ctx


# ------------------------------------------------------------------------ gRPC client side


class _WithToken:
    def __init__(self, token: str) -> None:
        self._md = ((METADATA_KEY, token),)

    def _details(self, d: Any) -> Any:
        md = tuple(d.metadata or ()) + self._md
        return aio.ClientCallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready)


# grpc.aio files each interceptor under the first call kind it implements, so each kind
# needs an object of its own.
class _UnaryUnary(_WithToken, aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, d: Any, request: Any) -> Any:
        return await continuation(self._details(d), request)


class _UnaryStream(_WithToken, aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, d: Any, request: Any) -> Any:
        return await continuation(self._details(d), request)


class _StreamUnary(_WithToken, aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, d: Any, it: Any) -> Any:
        return await continuation(self._details(d), it)


class _StreamStream(_WithToken, aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, d: Any, it: Any) -> Any:
        return await continuation(self._details(d), it)


def aio_interceptors(cred: Credential) -> list[Any]:
    """grpc.aio client interceptors adding the token to every call's metadata."""
    if not cred.token:
        return []
    return [k(cred.token) for k in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]


def sync_metadata_interceptor(cred: Credential) -> Any:
    """A blocking-channel interceptor adding the token (None without one)."""
    import grpc

    if not cred.token:
        return None
    md = ((METADATA_KEY, cred.token),)

    class _Details(grpc.ClientCallDetails):  # type: ignore[misc]
        def __init__(self, d: Any) -> None:
            self.method = d.method
            self.timeout = d.timeout
            self.metadata = tuple(d.metadata or ()) + md
            self.credentials = d.credentials
            self.wait_for_ready = getattr(d, "wait_for_ready", None)
            self.compression = getattr(d, "compression", None)

    class _Sync(
        grpc.UnaryUnaryClientInterceptor,
        grpc.UnaryStreamClientInterceptor,
        grpc.StreamUnaryClientInterceptor,
        grpc.StreamStreamClientInterceptor,
    ):
        def intercept_unary_unary(self, cont: Any, d: Any, req: Any) -> Any:
            return cont(_Details(d), req)

        def intercept_unary_stream(self, cont: Any, d: Any, req: Any) -> Any:
            return cont(_Details(d), req)

        def intercept_stream_unary(self, cont: Any, d: Any, it: Any) -> Any:
            return cont(_Details(d), it)

        def intercept_stream_stream(self, cont: Any, d: Any, it: Any) -> Any:
            return cont(_Details(d), it)

    return _Sync()


__all__ = [
    "Authenticator",
    "Credential",
    "Principal",
    "POLICY",
    "OPEN",
    "USER",
    "ADMIN",
    "SERVICE",
    "level_of",
    "check_identity",
    "credential_from",
    "default_credential",
    "set_default",
    "server_authenticator",
    "client_ssl_context",
    "server_ssl_context",
]
