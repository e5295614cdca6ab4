"""Namespace invariant checker (fsck) over meta's KV records.

Reused by the meta integration tests and the fault tests: after any mix of
concurrent operations, crashes and retries the namespace must satisfy

* every directory entry points at a live inode of the entry's type;
* a non-directory's nlink equals the number of entries naming it; nlink 0 is
  allowed only while an open session holds the inode (an orphan);
* a directory (other than the root) is named by exactly one entry, in the
  directory its ``parent`` field names, and its nlink is 2 + its number of
  subdirectories; the root is named by no entry;
* following ``parent`` from any directory reaches the root (no cycle, nothing
  detached);
* every inode is reachable (nlink > 0 non-directories have entries, see above);
* sessions, xattrs, directory times and GC entries refer to the right inodes
  (sessions/xattrs/times to live ones, GC entries to deleted ones).

The check reads everything in one snapshot transaction, so it sees one
consistent state even while servers keep running (it can then be slow on a
large namespace, which is fine for tests and offline checks).
"""

from __future__ import annotations

import stat
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from fs3.kv import Database, Transaction
from fs3.meta import schema as S
from fs3.proto import meta_pb2


@dataclass
class FsckReport:
    """What fsck found: counts, and one line per broken invariant."""

    inodes: int = 0
    directories: int = 0
    entries: int = 0
    orphans: int = 0
    sessions: int = 0
    gc_entries: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = (
            f"inodes={self.inodes} dirs={self.directories} entries={self.entries} "
            f"orphans={self.orphans} sessions={self.sessions} gc={self.gc_entries}"
        )
        return head + "".join(f"\n  {p}" for p in self.problems[:50])


def _scan(tr: Transaction, rng: tuple[bytes, bytes], page: int = 5000) -> list[tuple[bytes, bytes]]:
    begin, end = rng
    out: list[tuple[bytes, bytes]] = []
    while True:
        rows = tr.get_range(begin, end, limit=page, snapshot=True)
        out.extend(rows)
        if len(rows) < page:
            return out
        begin = rows[-1][0] + b"\x00"


def check_namespace(db: Database, *, max_problems: int = 1000) -> FsckReport:
    """Check every namespace invariant; returns a report (``report.ok``)."""

    def read(tr: Transaction) -> tuple[list, list, list, list]:  # type: ignore[type-arg]
        return (
            _scan(tr, S.inode_range()),
            _scan(tr, S.all_dentries_range()),
            _scan(tr, S.all_sessions_range()),
            _scan(tr, S.gc_range()),
        )

    inode_rows, dentry_rows, session_rows, gc_rows = db.run(read, timeout_s=120.0)
    rep = FsckReport()

    def bad(msg: str) -> None:
        if len(rep.problems) < max_problems:
            rep.problems.append(msg)

    inodes: dict[int, meta_pb2.Attr] = {}
    xattr_owners: set[int] = set()
    times_owners: set[int] = set()
    for k, v in inode_rows:
        t = S.K.unpack(k)
        if len(t) == 2:
            rec = meta_pb2.InodeRecord.FromString(v)
            if rec.attr.inode != t[1]:
                bad(f"inode key {t[1]} holds record of inode {rec.attr.inode}")
            inodes[int(t[1])] = rec.attr
        elif len(t) == 4 and t[2] == "x":
            xattr_owners.add(int(t[1]))
        elif len(t) == 3 and t[2] == "t":
            times_owners.add(int(t[1]))
        else:
            bad(f"unexpected key in inode subspace: {t!r}")
    rep.inodes = len(inodes)

    sessions: Counter[int] = Counter()
    for k, _ in session_rows:
        sessions[int(S.K.unpack(k)[1])] += 1
    rep.sessions = sum(sessions.values())

    links: Counter[int] = Counter()
    dir_entries: dict[int, list[int]] = defaultdict(list)  # dir ino -> parents naming it
    subdirs: Counter[int] = Counter()
    for k, v in dentry_rows:
        _, parent, name = S.K.unpack(k)
        ino, ftype = S.decode_dentry(v)
        rep.entries += 1
        pa = inodes.get(int(parent))
        if pa is None:
            bad(f"entry {name!r} lives in missing directory {parent}")
        elif not stat.S_ISDIR(pa.mode):
            bad(f"entry {name!r} lives in non-directory {parent}")
        child = inodes.get(ino)
        if child is None:
            bad(f"entry {parent}/{name!r} points at missing inode {ino}")
            continue
        if stat.S_IFMT(child.mode) != ftype:
            bad(
                f"entry {parent}/{name!r} type {oct(ftype)} != inode {ino} type {oct(stat.S_IFMT(child.mode))}"
            )
        if stat.S_ISDIR(child.mode):
            dir_entries[ino].append(int(parent))
            subdirs[int(parent)] += 1
        else:
            links[ino] += 1

    if S.ROOT_INODE not in inodes:
        bad("root inode 1 is missing")
    for ino, a in inodes.items():
        if stat.S_ISDIR(a.mode):
            rep.directories += 1
            names = dir_entries.get(ino, [])
            if ino == S.ROOT_INODE:
                if names:
                    bad(f"root is named by entries in {names}")
            elif len(names) != 1:
                bad(f"directory {ino} is named by {len(names)} entries (in {names})")
            elif names[0] != a.parent:
                bad(f"directory {ino} is in {names[0]} but its parent field says {a.parent}")
            want = 2 + subdirs[ino]
            if a.nlink != want:
                bad(f"directory {ino} nlink {a.nlink} != 2 + {subdirs[ino]} subdirectories")
        else:
            n = links[ino]
            if a.nlink != n:
                bad(f"inode {ino} nlink {a.nlink} != {n} entries")
            if n == 0:
                if sessions[ino]:
                    rep.orphans += 1
                else:
                    bad(f"inode {ino} has no entries and no open session (leaked)")

    # every directory reaches the root through parent links
    for ino, a in inodes.items():
        if not stat.S_ISDIR(a.mode):
            continue
        seen = {ino}
        cur = ino
        while cur != S.ROOT_INODE:
            p = inodes.get(cur)
            if p is None:
                bad(f"directory {ino}: ancestor {cur} missing")
                break
            cur = int(p.parent)
            if cur in seen and cur != S.ROOT_INODE:
                bad(f"directory {ino}: cycle through {cur}")
                break
            seen.add(cur)

    for ino in sessions:
        if ino not in inodes:
            bad(f"session on missing inode {ino}")
    for ino in xattr_owners:
        if ino not in inodes:
            bad(f"xattrs of missing inode {ino}")
    for ino in times_owners:
        if ino not in inodes or not stat.S_ISDIR(inodes[ino].mode):
            bad(f"directory times of missing or non-directory inode {ino}")
    for k, _ in gc_rows:
        rep.gc_entries += 1
        ino = int(S.K.unpack(k)[2])
        if ino in inodes:
            bad(f"GC entry for inode {ino} that still exists")
    return rep


def check_kv(url: str) -> FsckReport:
    """:func:`check_namespace` over the KV at ``url`` (opened for this check, then closed)."""
    from fs3.kv import open_database

    db = open_database(url)
    try:
        return check_namespace(db)
    finally:
        close = getattr(db, "close", None)
        if close is not None:
            close()
