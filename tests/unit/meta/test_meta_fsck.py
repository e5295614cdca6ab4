"""fsck must notice each kind of broken invariant (so tests that rely on it can fail)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from fs3.kv import Database, Transaction, open_database
from fs3.meta import schema as S
from fs3.meta.fsck import check_namespace
from fs3.meta.layout import StaticChainTables
from fs3.meta.operator import MetaOperator
from fs3.proto import common_pb2, meta_pb2

pytestmark = pytest.mark.timeout(20)

ROOT = common_pb2.UserInfo(uid=0, gid=0)


def build() -> tuple[Database, dict[str, int]]:
    db = open_database("memory://")
    op = MetaOperator(db, chains=StaticChainTables({1: [1]}))
    a = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, parent=1, name=b"a", mode=0o755)).attr
    b = op.mkdir(meta_pb2.MkdirRequest(user=ROOT, parent=a.inode, name=b"b", mode=0o755)).attr
    f = op.create(
        meta_pb2.CreateRequest(user=ROOT, parent=a.inode, name=b"f", mode=0o644, flags=os.O_RDONLY)
    )
    op.close(meta_pb2.CloseRequest(user=ROOT, inode=f.attr.inode, session_id=f.session_id))
    assert check_namespace(db).ok
    return db, {"a": a.inode, "b": b.inode, "f": f.attr.inode}


def mutate_attr(db: Database, ino: int, fn: Callable[[meta_pb2.Attr], None]) -> None:
    def txn(tr: Transaction) -> None:
        rec = meta_pb2.InodeRecord.FromString(tr.get(S.inode_key(ino)) or b"")
        fn(rec.attr)
        tr.set(S.inode_key(ino), rec.SerializeToString())

    db.run(txn)


def problems(db: Database) -> str:
    rep = check_namespace(db)
    assert not rep.ok
    return "\n".join(rep.problems)


def test_dangling_entry() -> None:
    db, i = build()
    db.run(lambda tr: tr.set(S.dentry_key(i["a"], b"ghost"), S.encode_dentry(999999, 0o100000)))
    assert "missing inode 999999" in problems(db)


def test_wrong_file_nlink_and_leak() -> None:
    db, i = build()
    mutate_attr(db, i["f"], lambda a: setattr(a, "nlink", 2))
    assert "nlink 2 != 1 entries" in problems(db)
    db, i = build()
    db.run(lambda tr: tr.clear(S.dentry_key(i["a"], b"f")))
    assert "leaked" in problems(db)


def test_wrong_dir_nlink() -> None:
    db, i = build()
    mutate_attr(db, i["a"], lambda a: setattr(a, "nlink", 2))
    assert "subdirectories" in problems(db)


def test_duplicated_directory_entry() -> None:
    db, i = build()
    db.run(lambda tr: tr.set(S.dentry_key(1, b"dup"), S.encode_dentry(i["b"], 0o040000)))
    assert "named by 2 entries" in problems(db)


def test_cycle() -> None:
    db, i = build()
    mutate_attr(db, i["a"], lambda a: setattr(a, "parent", i["b"]))
    out = problems(db)
    assert "cycle" in out or "parent field" in out


def test_type_mismatch_and_gc_of_live_inode() -> None:
    db, i = build()
    db.run(lambda tr: tr.set(S.dentry_key(i["a"], b"f"), S.encode_dentry(i["f"], 0o120000)))
    assert "type" in problems(db)
    db, i = build()
    db.run(
        lambda tr: tr.set(S.gc_key(1, i["f"]), meta_pb2.GcEntry(inode=i["f"]).SerializeToString())
    )
    assert "still exists" in problems(db)
