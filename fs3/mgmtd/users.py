"""Users of the file system: records in the KV and the tokens that name them.

A record lives at ``("mg", "user", name)`` (``mgmtd.UserRecord``). Its token
(``fs3.security.tokens``, kind ``user``) carries name, uid, gid, groups, the
admin flag and the record's ``token_id``; servers accept the token only while
a record of that name with the same ``token_id`` exists
(``fs3.rpc.auth.Authenticator``), so ``remove`` and ``token --rotate`` revoke it.

Any mgmtd may serve these calls: the records are in the shared KV, each call is
one transaction, and minting needs only the cluster secret every mgmtd has.
"""

from __future__ import annotations

import re
import time

from fs3.errors import Code, FsError
from fs3.kv import Database, Transaction
from fs3.kv.keys import MGMTD, pack, prefix_range
from fs3.proto import mgmtd_pb2
from fs3.security.tokens import MAX_GROUPS, Claims, Signer, new_token_id

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
MAX_USERS_LISTED = 10_000


def user_key(name: str) -> bytes:
    return pack(MGMTD, "user", name)


def get_user(tr: Transaction, name: str) -> mgmtd_pb2.UserRecord | None:
    raw = tr.get(user_key(name))
    return mgmtd_pb2.UserRecord.FromString(raw) if raw is not None else None


def _public(rec: mgmtd_pb2.UserRecord) -> mgmtd_pb2.UserRecord:
    out = mgmtd_pb2.UserRecord()
    out.CopyFrom(rec)
    out.token_id = ""
    return out


def _check_name(name: str) -> None:
    if not NAME_RE.match(name):
        raise FsError(
            Code.INVALID_ARGUMENT,
            f"bad user name {name!r}: 1-64 of letters, digits, '_', '.', '-', not starting "
            "with a digit, '.' or '-'",
        )


class Users:
    """User management on one mgmtd (``signer`` holds the cluster secret's keys)."""

    def __init__(self, db: Database, signer: Signer | None) -> None:
        self.db = db
        self.signer = signer

    def _sign(self, rec: mgmtd_pb2.UserRecord) -> str:
        if self.signer is None:
            raise FsError(
                Code.UNAUTHENTICATED,
                "this mgmtd has no cluster secret ([rpc] secret_file): it cannot issue tokens",
            )
        return self.signer.sign(
            Claims(
                kind="user",
                name=rec.name,
                uid=rec.uid,
                gid=rec.gid,
                groups=tuple(rec.groups),
                admin=rec.admin,
                token_id=rec.token_id,
                issued=int(time.time()),
            )
        )

    async def add(self, req: mgmtd_pb2.AddUserRequest) -> mgmtd_pb2.UserTokenResponse:
        _check_name(req.name)
        if len(req.groups) > MAX_GROUPS:
            raise FsError(Code.INVALID_ARGUMENT, f"at most {MAX_GROUPS} groups")
        rec = mgmtd_pb2.UserRecord(
            name=req.name,
            uid=req.uid,
            gid=req.gid,
            groups=sorted(set(req.groups)),
            admin=req.admin,
            token_id=new_token_id(),
            created=time.time(),
        )

        def txn(tr: Transaction) -> None:
            if get_user(tr, req.name) is not None:
                raise FsError(Code.INVALID_ARGUMENT, f"user {req.name} already exists")
            tr.set(user_key(req.name), rec.SerializeToString())

        token = self._sign(rec)  # before the write: a mgmtd that cannot sign adds nobody
        await self.db.run_async(txn)
        return mgmtd_pb2.UserTokenResponse(user=_public(rec), token=token)

    async def remove(self, name: str) -> None:
        _check_name(name)

        def txn(tr: Transaction) -> None:
            if get_user(tr, name) is None:
                raise FsError(Code.INVALID_ARGUMENT, f"no user {name}")
            tr.clear(user_key(name))

        await self.db.run_async(txn)

    async def token(self, req: mgmtd_pb2.UserTokenRequest) -> mgmtd_pb2.UserTokenResponse:
        _check_name(req.name)

        def txn(tr: Transaction) -> mgmtd_pb2.UserRecord:
            rec = get_user(tr, req.name)
            if rec is None:
                raise FsError(Code.INVALID_ARGUMENT, f"no user {req.name}")
            if req.rotate:
                rec.token_id = new_token_id()
                tr.set(user_key(req.name), rec.SerializeToString())
            return rec

        if self.signer is None:
            self._sign(mgmtd_pb2.UserRecord())  # raises the explanation
        rec = await self.db.run_async(txn)
        return mgmtd_pb2.UserTokenResponse(user=_public(rec), token=self._sign(rec))

    async def list(self) -> mgmtd_pb2.ListUsersResponse:
        def txn(tr: Transaction) -> list[mgmtd_pb2.UserRecord]:
            out = []
            for _k, v in tr.get_range(*prefix_range(MGMTD, "user"), limit=MAX_USERS_LISTED):
                out.append(_public(mgmtd_pb2.UserRecord.FromString(v)))
            return out

        return mgmtd_pb2.ListUsersResponse(users=await self.db.run_async(txn))

    async def lookup(self, name: str) -> mgmtd_pb2.UserRecord | None:
        """The full record (with token_id) for token checks, or None."""
        if not NAME_RE.match(name):
            return None
        return await self.db.run_async(lambda tr: get_user(tr, name))
