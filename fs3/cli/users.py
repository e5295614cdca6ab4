"""``fs3 admin user``: the users of a cluster and their tokens (an admin credential is needed).

    fs3 admin user add NAME --uid UID --gid GID [--groups 10,20] [--admin]   # prints the token
    fs3 admin user list
    fs3 admin user token NAME [--rotate]    # the token again (--rotate: a new one, old revoked)
    fs3 admin user remove NAME              # its token stops working

A token goes to its user, who passes it to ``fs3.connect(token=...)`` or sets
``FS3_TOKEN`` / ``FS3_TOKEN_FILE``; the calls it makes act as that uid/gid/groups only.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fs3.errors import Code, FsError


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    u = sub.add_parser("user", help="users and their tokens", parents=[common])
    us = u.add_subparsers(dest="user_command", required=True)
    a = us.add_parser("add", help="add a user and print its token", parents=[common])
    a.add_argument("name")
    a.add_argument("--uid", type=int, required=True)
    a.add_argument("--gid", type=int, required=True)
    a.add_argument("--groups", default="", help="comma-separated supplementary gids")
    a.add_argument("--admin", action="store_true", help="may call admin RPCs")
    us.add_parser("list", help="list users", parents=[common])
    t = us.add_parser("token", help="print a user's token", parents=[common])
    t.add_argument("name")
    t.add_argument("--rotate", action="store_true", help="issue a new token; the old one stops")
    r = us.add_parser("remove", help="remove a user (revokes its token)", parents=[common])
    r.add_argument("name")


def _groups(text: str) -> list[int]:
    try:
        return [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise FsError(Code.INVALID_ARGUMENT, f"--groups: not a list of gids: {text!r}") from None


def _row(u: Any) -> dict[str, Any]:
    return {
        "name": u.name,
        "uid": u.uid,
        "gid": u.gid,
        "groups": list(u.groups),
        "admin": u.admin,
    }


async def dispatch(client: Any, args: argparse.Namespace) -> int:
    cmd = args.user_command
    if cmd == "add":
        for v, what in ((args.uid, "--uid"), (args.gid, "--gid")):
            if not 0 <= v < 1 << 32:
                raise FsError(Code.INVALID_ARGUMENT, f"{what} must be 0..4294967295")
        r = await client.add_user(
            args.name, args.uid, args.gid, _groups(args.groups), admin=args.admin
        )
        _out(args, {**_row(r.user), "token": r.token}, r.token)
    elif cmd == "token":
        r = await client.user_token(args.name, rotate=args.rotate)
        _out(args, {**_row(r.user), "token": r.token}, r.token)
    elif cmd == "remove":
        await client.remove_user(args.name)
        _out(args, {"removed": args.name}, f"user {args.name} removed; its token is revoked")
    else:
        users = await client.list_users()
        rows = [_row(u) for u in users]
        lines = ["NAME  UID  GID  GROUPS  ADMIN"] + [
            f"{r['name']}  {r['uid']}  {r['gid']}  {','.join(map(str, r['groups'])) or '-'}  "
            f"{'yes' if r['admin'] else ''}"
            for r in rows
        ]
        _out(args, rows, "\n".join(lines))
    return 0


def _out(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else text)
