"""Signed credentials: service, mount and user tokens.

A token is ``fs3t1.<claims>.<mac>``: the claims are compact JSON (base64url),
the MAC is HMAC-SHA256 over the claims' base64 text. Which key signs depends
on the kind (:data:`KINDS`):

* ``service``: a fs3 process (or an operator) holding the cluster secret;
  signed with the ``PURPOSE_RPC_AUTH`` key. May do everything, including admin
  RPCs, and may act for any uid (services pass their callers' identities on).
* ``mount``: a FUSE daemon; signed with the same key. May act for any local
  uid (the kernel tells it who is calling), as an NFS server trusts a mount;
  not an admin.
* ``user``: one person (``fs3 admin user token``); signed with the
  ``PURPOSE_USER_TOKEN`` key. Acts only as its own uid/gid/groups; servers also
  check that the user still exists with the same ``token_id`` (removal and
  rotation revoke).

Keys are derived per purpose (``fs3.security.keys``), so a key leaked for user
tokens cannot mint service tokens. Tokens are bearer credentials: without TLS
(``fs3 cluster up --tls``) they cross the network in clear, as 3FS's do.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any

from fs3.errors import Code, FsError
from fs3.security.keys import PURPOSE_RPC_AUTH, PURPOSE_USER_TOKEN, derive_key

PREFIX = "fs3t1"
KINDS = ("service", "mount", "user")
MAX_TOKEN_BYTES = 4096  # a token is a few hundred bytes; longer ones are refused unparsed
MAX_GROUPS = 64
MAX_NAME = 64


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Claims:
    """Who a token says its holder is (verified by :class:`Verifier`)."""

    kind: str
    name: str
    uid: int = 0
    gid: int = 0
    groups: tuple[int, ...] = field(default_factory=tuple)
    admin: bool = False
    token_id: str = ""  # user tokens: must match the user record (revocation)
    issued: int = 0  # unix seconds

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "k": self.kind,
                "n": self.name,
                "u": self.uid,
                "g": self.gid,
                "gs": list(self.groups),
                "a": self.admin,
                "i": self.token_id,
                "t": self.issued,
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Claims:
        d: Any = json.loads(raw)
        if not isinstance(d, dict):
            raise ValueError("claims are not an object")
        groups = d.get("gs", [])
        if not isinstance(groups, list) or len(groups) > MAX_GROUPS:
            raise ValueError("bad groups")
        c = cls(
            kind=str(d["k"]),
            name=str(d["n"]),
            uid=int(d.get("u", 0)),
            gid=int(d.get("g", 0)),
            groups=tuple(int(g) for g in groups),
            admin=bool(d.get("a", False)),
            token_id=str(d.get("i", "")),
            issued=int(d.get("t", 0)),
        )
        c.check()
        return c

    def check(self) -> None:
        """Refuse claims no issuer would sign (raises ValueError)."""
        if self.kind not in KINDS:
            raise ValueError(f"unknown token kind {self.kind!r}")
        if not self.name or len(self.name) > MAX_NAME:
            raise ValueError("token name must be 1..64 characters")
        for v in (self.uid, self.gid, *self.groups):
            if not 0 <= v < 1 << 32:
                raise ValueError("uid/gid out of range")


def key_purpose(kind: str) -> str:
    """Which derived key signs tokens of ``kind``."""
    return PURPOSE_USER_TOKEN if kind == "user" else PURPOSE_RPC_AUTH


def new_token_id() -> str:
    return secrets.token_hex(8)


class Signer:
    """Mints tokens; only holders of the cluster secret have one."""

    def __init__(self, secret: bytes) -> None:
        self._keys = {p: derive_key(secret, p) for p in (PURPOSE_RPC_AUTH, PURPOSE_USER_TOKEN)}

    def sign(self, claims: Claims) -> str:
        claims.check()
        body = _b64(claims.to_json())
        mac = hmac.new(self._keys[key_purpose(claims.kind)], body.encode(), sha256).digest()
        return f"{PREFIX}.{body}.{_b64(mac)}"

    def service_token(self, name: str) -> str:
        return self.sign(Claims(kind="service", name=name, admin=True, issued=int(time.time())))

    def mount_token(self, name: str) -> str:
        return self.sign(Claims(kind="mount", name=name, issued=int(time.time())))

    def verifier(self) -> Verifier:
        return Verifier(self._keys)


class Verifier:
    """Checks a token's MAC and returns its claims (no revocation check: see fs3.rpc.auth)."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        self._keys = keys

    @classmethod
    def from_secret(cls, secret: bytes) -> Verifier:
        return Signer(secret).verifier()

    def verify(self, token: str | bytes) -> Claims:
        """The claims of a genuine token; ``FsError(UNAUTHENTICATED)`` for anything else."""
        if isinstance(token, bytes | bytearray | memoryview):
            if len(token) > MAX_TOKEN_BYTES:
                raise _bad("too long")
            try:
                token = bytes(token).decode("ascii")
            except UnicodeDecodeError:
                raise _bad("not ASCII") from None
        if len(token) > MAX_TOKEN_BYTES:
            raise _bad("too long")
        parts = token.strip().split(".")
        if len(parts) != 3 or parts[0] != PREFIX:
            raise _bad(f"not an {PREFIX} token")
        _, body, mac_text = parts
        try:
            raw = _unb64(body)
            mac = _unb64(mac_text)
            kind = json.loads(raw).get("k")
        except (binascii.Error, ValueError, AttributeError, RecursionError):
            raise _bad("malformed") from None
        key = self._keys.get(key_purpose(str(kind)))
        if key is None or not isinstance(kind, str) or kind not in KINDS:
            raise _bad("unknown kind")
        want = hmac.new(key, body.encode(), sha256).digest()
        if not hmac.compare_digest(want, mac):
            raise _bad("signature does not match (forged, tampered, or from another cluster)")
        try:
            return Claims.from_json(raw)
        except (KeyError, TypeError, ValueError) as e:
            raise _bad(f"bad claims: {e}") from None


def peek(token: str) -> Claims | None:
    """A token's claims without checking its signature (a client learning its own identity).

    Never use for a decision: only :class:`Verifier` says whether a token is genuine.
    """
    parts = (token or "").strip().split(".")
    if len(parts) != 3 or parts[0] != PREFIX or len(token) > MAX_TOKEN_BYTES:
        return None
    try:
        return Claims.from_json(_unb64(parts[1]))
    except (binascii.Error, KeyError, TypeError, ValueError, RecursionError):
        return None


def _bad(why: str) -> FsError:
    return FsError(Code.UNAUTHENTICATED, f"invalid credential: {why}")


__all__ = [
    "Claims",
    "Signer",
    "Verifier",
    "KINDS",
    "PREFIX",
    "MAX_TOKEN_BYTES",
    "new_token_id",
    "peek",
]
