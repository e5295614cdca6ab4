"""The KV contract: every engine behaves the same (fs3.kv.database docstring).

One fixture, parametrized over memory, sqlite and fdb (fdb only when
FS3_FDB_CLUSTER_FILE names a cluster). The multi-process tests run on the engines
whose data is shared between OS processes (sqlite, fdb).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from fs3 import faults
from fs3.errors import Code, FsError
from fs3.kv import Database, Transaction, open_database
from fs3.kv.database import MAX_KEY_SIZE, MAX_SNAPSHOT_KEYS, MAX_VALUE_SIZE
from fs3.kv.keys import unpack
from fs3.testing.kv import ENGINES, SHARED_ENGINES, TestKV, open_test_database, unavailable_reason


@pytest.fixture(params=ENGINES)
def kv(request: pytest.FixtureRequest, tmp_path) -> Iterator[TestKV]:
    reason = unavailable_reason(request.param)
    if reason:
        pytest.skip(reason)
    t = open_test_database(request.param, str(tmp_path))
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def shared_kv(kv: TestKV) -> TestKV:
    if kv.engine not in SHARED_ENGINES:
        pytest.skip(f"{kv.engine} engine is private to one process")
    return kv


def _children() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
            for f in (p.stdin, p.stdout, p.stderr):
                if f:
                    f.close()


children = pytest.fixture(_children)


def _spawn(procs: list[subprocess.Popen[str]], *args: str) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-m", "fs3.testing.kv", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(p)
    return p


def _read(db: Database, key: bytes) -> bytes | None:
    return db.run(lambda tr: tr.get(key))


def _counter(db: Database, key: bytes) -> int:
    return int(_read(db, key) or b"0")


def _inc(key: bytes):
    def fn(tr: Transaction) -> int:
        n = int(tr.get(key) or b"0") + 1
        tr.set(key, str(n).encode())
        return n

    return fn


# -- ordering and range reads ----------------------------------------------------


@pytest.mark.timeout(30)
def test_tuple_packed_keys_order_like_their_tuples(kv: TestKV) -> None:
    ints = [-(2**40), -65536, -300, -1, 0, 1, 2, 255, 256, 65535, 2**40]
    strs = ["", "a", "a\x00", "a\x00b", "ab", "b", "z" * 50, "é"]  # UTF-8 bytewise
    mixed = [b"", b"\x00", b"x", "", "x", -5, 0, 7]  # tuple layer: bytes < str < int
    items = [("i", v) for v in ints] + [("s", v) for v in strs] + [("m", v) for v in mixed]
    shuffled = items[::3] + items[1::3] + items[2::3]

    def write(tr: Transaction) -> None:
        for sub, v in shuffled:
            tr.set(kv.k(sub, v), repr(v).encode())

    kv.db.run(write)
    for sub, expected in (("i", ints), ("s", strs), ("m", mixed)):
        got = kv.db.run(lambda tr, sub=sub: tr.get_range(*kv.range(sub)))
        assert [unpack(k)[-1] for k, _ in got] == expected
        assert [v for _, v in got] == [repr(x).encode() for x in expected]
    # and the subspaces themselves order by their first element: "i" < "m" < "s"
    everything = kv.db.run(lambda tr: tr.get_range(*kv.range()))
    assert [unpack(k)[2] for k, _ in everything] == ["i"] * len(ints) + ["m"] * len(mixed) + [
        "s"
    ] * len(strs)


@pytest.mark.timeout(30)
def test_get_range_begin_end_limit_reverse(kv: TestKV) -> None:
    kv.db.run(lambda tr: [tr.set(kv.k("r", i), b"%d" % i) for i in range(10)])

    def ids(pairs):
        return [unpack(k)[-1] for k, _ in pairs]

    b, e = kv.range("r")

    def rd(begin: bytes, end: bytes, **kw):
        return ids(kv.db.run(lambda tr: tr.get_range(begin, end, **kw)))

    assert rd(b, e) == list(range(10))
    assert rd(b, e, limit=0) == list(range(10))
    assert rd(b, e, limit=3) == [0, 1, 2]
    assert rd(b, e, reverse=True) == list(range(9, -1, -1))
    assert rd(b, e, limit=3, reverse=True) == [9, 8, 7]
    assert rd(kv.k("r", 3), kv.k("r", 7)) == [3, 4, 5, 6]  # begin inclusive, end exclusive
    assert rd(kv.k("r", 3), kv.k("r", 7), reverse=True, limit=2) == [6, 5]
    assert rd(kv.k("r", 7), kv.k("r", 3)) == []
    assert rd(kv.k("r", 5), kv.k("r", 5)) == []
    assert rd(b, e, limit=100) == list(range(10))


# -- transaction semantics ------------------------------------------------------


@pytest.mark.timeout(30)
def test_reads_see_own_writes_including_clear_range_then_set(kv: TestKV) -> None:
    kv.db.run(lambda tr: [tr.set(kv.k("w", i), b"old") for i in range(6)])

    def fn(tr: Transaction) -> None:
        tr.set(kv.k("w", 1), b"new1")
        assert tr.get(kv.k("w", 1)) == b"new1"
        tr.clear(kv.k("w", 0))
        assert tr.get(kv.k("w", 0)) is None
        tr.clear_range(kv.k("w", 2), kv.k("w", 5))  # removes 2, 3, 4
        assert tr.get(kv.k("w", 3)) is None
        tr.set(kv.k("w", 3), b"new3")  # set inside the cleared range
        tr.set(kv.k("w", 9), b"new9")
        assert tr.get(kv.k("w", 3)) == b"new3"
        assert tr.get(kv.k("w", 4)) is None
        want = [(1, b"new1"), (3, b"new3"), (5, b"old"), (9, b"new9")]
        got = [(unpack(k)[-1], v) for k, v in tr.get_range(*kv.range("w"))]
        assert got == want
        rev = [(unpack(k)[-1], v) for k, v in tr.get_range(*kv.range("w"), reverse=True, limit=3)]
        assert rev == want[::-1][:3]
        lim = [(unpack(k)[-1], v) for k, v in tr.get_range(*kv.range("w"), limit=2)]
        assert lim == want[:2]

    kv.db.run(fn)
    after = [(unpack(k)[-1], v) for k, v in kv.db.run(lambda tr: tr.get_range(*kv.range("w")))]
    assert after == [(1, b"new1"), (3, b"new3"), (5, b"old"), (9, b"new9")]


@pytest.mark.timeout(30)
def test_snapshot_read_of_concurrently_written_key_does_not_conflict(kv: TestKV) -> None:
    key, other = kv.k("snap", "k"), kv.k("snap", "other")
    kv.db.run(lambda tr: tr.set(key, b"0"))
    t1 = kv.db.create_transaction()
    assert t1.get(key, snapshot=True) == b"0"
    t2 = kv.db.create_transaction()
    t2.set(key, b"2")
    t2.commit()
    assert t1.get(key, snapshot=True) == b"0"  # still t1's snapshot
    t1.set(other, b"1")
    t1.commit()  # no conflict: the read was a snapshot read
    assert _read(kv.db, other) == b"1"
    assert _read(kv.db, key) == b"2"


@pytest.mark.timeout(30)
def test_serializable_read_of_concurrently_written_key_conflicts(kv: TestKV) -> None:
    key, other = kv.k("ser", "k"), kv.k("ser", "other")
    kv.db.run(lambda tr: tr.set(key, b"0"))
    t1 = kv.db.create_transaction()
    assert t1.get(key) == b"0"
    t2 = kv.db.create_transaction()
    t2.set(key, b"2")
    t2.commit()
    t1.set(other, b"1")
    with pytest.raises(FsError) as ei:
        t1.commit()
    assert ei.value.code == Code.KV_CONFLICT and ei.value.retryable
    assert _read(kv.db, other) is None  # nothing of t1 was applied


def test_commit_now_commits_or_leaves_nothing_and_never_skips_validation(kv: TestKV) -> None:
    """``commit_now`` (an event loop's commit: never waits for others) either commits,
    visibly, or returns False having written nothing; a transaction whose read was
    overwritten never commits through it."""
    key, other = kv.k("now", "k"), kv.k("now", "other")
    t = kv.db.create_transaction()
    assert t.get(key) is None
    t.set(key, b"0")
    if t.commit_now():
        assert _read(kv.db, key) == b"0"
    else:
        assert _read(kv.db, key) is None
        kv.db.run(lambda tr: tr.set(key, b"0"))
    t1 = kv.db.create_transaction()
    assert t1.get(key) == b"0"
    kv.db.run(lambda tr: tr.set(key, b"2"))
    t1.set(other, b"1")
    try:
        committed = t1.commit_now()
    except FsError as e:
        assert e.code == Code.KV_CONFLICT and e.retryable
        committed = False
    assert not committed
    assert _read(kv.db, other) is None


@pytest.mark.timeout(30)
def test_range_read_conflicts_with_insert_into_range(kv: TestKV) -> None:
    kv.db.run(lambda tr: [tr.set(kv.k("ph", i), b"x") for i in (0, 10, 20)])
    # Phantom: a key inserted into a range we read makes us conflict.
    t1 = kv.db.create_transaction()
    assert len(t1.get_range(*kv.range("ph"))) == 3
    t2 = kv.db.create_transaction()
    t2.set(kv.k("ph", 5), b"new")
    t2.commit()
    t1.set(kv.k("out"), b"1")
    with pytest.raises(FsError) as ei:
        t1.commit()
    assert ei.value.code == Code.KV_CONFLICT
    # A limited read only covers what it returned: a write after the last key is fine.
    t3 = kv.db.create_transaction()
    assert [unpack(k)[-1] for k, _ in t3.get_range(*kv.range("ph"), limit=2)] == [0, 5]
    t4 = kv.db.create_transaction()
    t4.set(kv.k("ph", 30), b"new")
    t4.commit()
    t3.set(kv.k("out"), b"3")
    t3.commit()
    assert _read(kv.db, kv.k("out")) == b"3"


@pytest.mark.timeout(30)
def test_explicit_read_conflict_range_is_honoured(kv: TestKV) -> None:
    a, b, c, z = (kv.k("rc", x) for x in ("a", "b", "c", "z"))
    t1 = kv.db.create_transaction()
    # A snapshot read fixes t1's read version (FDB takes it at the first read) ...
    assert t1.get(kv.k("rc", "other"), snapshot=True) is None
    t1.add_read_conflict_range(a, c)  # ... and [a, c) is guarded without being read
    t2 = kv.db.create_transaction()
    t2.set(b, b"2")
    t2.commit()
    t1.set(z, b"1")
    with pytest.raises(FsError) as ei:
        t1.commit()
    assert ei.value.code == Code.KV_CONFLICT and ei.value.retryable
    assert _read(kv.db, z) is None

    # A write outside the range (and c itself: the end is exclusive) does not conflict.
    t3 = kv.db.create_transaction()
    t3.get(kv.k("rc", "other"), snapshot=True)
    t3.add_read_conflict_range(a, c)
    t3.add_read_conflict_key(z)
    t4 = kv.db.create_transaction()
    t4.set(c, b"4")
    t4.commit()
    t3.set(kv.k("rc", "y"), b"3")
    t3.commit()

    # add_read_conflict_key covers exactly that key.
    t5 = kv.db.create_transaction()
    t5.get(kv.k("rc", "other"), snapshot=True)
    t5.add_read_conflict_key(z)
    t6 = kv.db.create_transaction()
    t6.set(z, b"6")
    t6.commit()
    t5.set(kv.k("rc", "w"), b"5")
    with pytest.raises(FsError):
        t5.commit()


@pytest.mark.timeout(30)
def test_unrelated_concurrent_commit_does_not_conflict(kv: TestKV) -> None:
    t1 = kv.db.create_transaction()
    assert t1.get(kv.k("u", "read")) is None
    t1.get_range(*kv.range("u", "dir"))
    t2 = kv.db.create_transaction()
    t2.set(kv.k("u", "elsewhere"), b"2")
    t2.commit()
    t1.set(kv.k("u", "mine"), b"1")
    t1.commit()  # conflicts are per range, not "anyone committed"
    assert _read(kv.db, kv.k("u", "mine")) == b"1"


@pytest.mark.timeout(30)
def test_snapshot_is_stable_while_many_transactions_commit(kv: TestKV) -> None:
    kv.db.run(lambda tr: [tr.set(kv.k("st", i), b"0") for i in range(5)])
    reader = kv.db.create_transaction()
    before = reader.get_range(*kv.range("st"))
    for n in range(1, 301):  # enough commits to trigger every engine's housekeeping
        kv.db.run(lambda tr, n=n: (tr.set(kv.k("st", n % 5), b"%d" % n), tr.clear(kv.k("st", 0))))
    assert reader.get_range(*kv.range("st")) == before
    assert reader.get(kv.k("st", 3)) == b"0"
    reader.cancel()
    now = dict(kv.db.run(lambda tr: tr.get_range(*kv.range("st"))))
    assert kv.k("st", 0) not in now and now[kv.k("st", 4)] == b"299"


@pytest.mark.timeout(60)
def test_concurrent_transfers_keep_the_total(kv: TestKV) -> None:
    """Serializability: random transfers between accounts never create or lose money,
    and every consistent read of all accounts sees the same total."""
    n_accounts, total = 8, 8 * 100
    kv.db.run(lambda tr: [tr.set(kv.k("acct", i), b"100") for i in range(n_accounts)])
    errors: list[BaseException] = []
    sums: list[int] = []

    def transfer(a: int, b: int, amount: int):
        def fn(tr: Transaction) -> None:
            va = int(tr.get(kv.k("acct", a)) or b"0")
            vb = int(tr.get(kv.k("acct", b)) or b"0")
            moved = min(va, amount)
            tr.set(kv.k("acct", a), b"%d" % (va - moved))
            tr.set(kv.k("acct", b), b"%d" % (vb + moved))

        return fn

    def worker(seed: int) -> None:
        import random

        rng = random.Random(seed)
        try:
            for _ in range(60):
                a, b = rng.sample(range(n_accounts), 2)
                kv.db.run(transfer(a, b, rng.randint(1, 50)))
                if rng.random() < 0.2:
                    sums.append(
                        sum(
                            int(v) for _, v in kv.db.run(lambda tr: tr.get_range(*kv.range("acct")))
                        )
                    )
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=50)
    assert not errors
    assert sums and all(s == total for s in sums)
    final = kv.db.run(lambda tr: tr.get_range(*kv.range("acct")))
    assert len(final) == n_accounts and sum(int(v) for _, v in final) == total


@pytest.mark.timeout(30)
def test_blind_writes_do_not_conflict(kv: TestKV) -> None:
    key = kv.k("blind")
    t1 = kv.db.create_transaction()
    t2 = kv.db.create_transaction()
    t1.set(key, b"1")
    t2.set(key, b"2")
    t2.commit()
    t1.commit()  # no reads: last writer wins, like FDB
    assert _read(kv.db, key) == b"1"


@pytest.mark.timeout(30)
def test_a_function_that_raises_leaves_nothing(kv: TestKV) -> None:
    key = kv.k("raise")
    kv.db.run(lambda tr: tr.set(key, b"before"))

    def bad(tr: Transaction) -> None:
        tr.set(key, b"after")
        tr.set(kv.k("raise", 2), b"x")
        tr.clear_range(*kv.range())
        raise ValueError("boom")

    with pytest.raises(ValueError):
        kv.db.run(bad)

    def bad_fs(tr: Transaction) -> None:
        tr.set(key, b"after")
        raise FsError(Code.INVALID_ARGUMENT, "bad request")

    with pytest.raises(FsError) as ei:
        kv.db.run(bad_fs)
    assert ei.value.code == Code.INVALID_ARGUMENT
    assert kv.db.run(lambda tr: tr.get_range(*kv.range())) == [(key, b"before")]


@pytest.mark.timeout(30)
def test_cancelled_transaction_leaves_nothing_and_is_closed(kv: TestKV) -> None:
    tr = kv.db.create_transaction()
    tr.set(kv.k("c"), b"1")
    tr.cancel()
    with pytest.raises(FsError):
        tr.get(kv.k("c"))
    tr2 = kv.db.create_transaction()
    tr2.set(kv.k("c2"), b"1")
    tr2.commit()
    with pytest.raises(FsError):
        tr2.commit()
    assert _read(kv.db, kv.k("c")) is None
    assert _read(kv.db, kv.k("c2")) == b"1"


@pytest.mark.timeout(60)
def test_threads_incrementing_one_key_end_exact(kv: TestKV) -> None:
    key = kv.k("ctr")
    n_threads, n_each = 4, 50
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(n_each):
                kv.db.run(_inc(key))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=50)
    assert not errors
    assert _counter(kv.db, key) == n_threads * n_each


@pytest.mark.timeout(60)
def test_run_async_concurrent_increments_end_exact(kv: TestKV) -> None:
    key = kv.k("actr")

    async def main() -> list[int]:
        return await asyncio.gather(*(kv.db.run_async(_inc(key)) for _ in range(60)))

    results = asyncio.run(main())
    assert sorted(results) == list(range(1, 61))  # each increment saw a distinct value
    assert _counter(kv.db, key) == 60


# -- snapshot_get: point reads outside a transaction -------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("n", [1, 2, 3, 20])  # 20: past SQLite's compound-select form
def test_snapshot_get_returns_each_key_in_order(kv: TestKV, n: int) -> None:
    keys = [kv.k("sg", i) for i in range(n)]

    def write(tr: Transaction) -> None:
        for i, k in enumerate(keys):
            if i % 2 == 0:
                tr.set(k, b"v%d" % i)

    kv.db.run(write)
    want = [b"v%d" % i if i % 2 == 0 else None for i in range(n)]
    assert kv.db.snapshot_get(keys) == want
    # the interface's default (snapshot gets in a throwaway transaction) answers alike
    assert Database.snapshot_get(kv.db, keys) == want
    assert kv.db.snapshot_get(list(reversed(keys))) == list(reversed(want))
    assert kv.db.snapshot_get([keys[0], keys[0]]) == [b"v0", b"v0"]
    assert kv.db.snapshot_get([]) == []
    # a later commit is seen by the next read
    kv.db.run(lambda tr: tr.set(keys[-1], b"new"))
    assert kv.db.snapshot_get(keys)[-1] == b"new"


@pytest.mark.timeout(60)
def test_snapshot_get_reads_all_keys_at_one_point(kv: TestKV) -> None:
    """A writer keeps two keys equal in each commit; no snapshot_get may see them differ."""
    a, b = kv.k("sg", "a"), kv.k("sg", "b")
    kv.db.run(lambda tr: (tr.set(a, b"0"), tr.set(b, b"0")))
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        n = 0
        try:
            while not stop.is_set():
                n += 1
                v = str(n).encode()
                kv.db.run(lambda tr, v=v: (tr.set(a, v), tr.set(b, v)))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    seen = set()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and len(seen) < 50:
            va, vb = kv.db.snapshot_get([a, b])
            assert va == vb
            seen.add(va)
    finally:
        stop.set()
        t.join(30)
    assert not errors
    assert len(seen) > 1, "the writer never committed while we read"


@pytest.mark.timeout(30)
def test_snapshot_get_bad_input_and_fault_point(kv: TestKV) -> None:
    with pytest.raises(FsError) as ei:
        kv.db.snapshot_get(["text"])  # type: ignore[list-item]
    assert ei.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(FsError) as ei:
        kv.db.snapshot_get([b"k" * (MAX_KEY_SIZE + 1)])
    assert ei.value.code == Code.KV_TOO_LARGE
    with pytest.raises(FsError) as ei:
        kv.db.snapshot_get([kv.k("sg", i) for i in range(MAX_SNAPSHOT_KEYS + 1)])
    assert ei.value.code == Code.INVALID_ARGUMENT
    key = kv.k("sg", "fault")
    kv.db.run(lambda tr: tr.set(key, b"x"))
    with faults.inject(1.0, points={"kv.get"}, max_faults=1) as scope:
        with pytest.raises(FsError) as ei:
            kv.db.snapshot_get([key])
        assert ei.value.retryable
        # one attempt per call: the caller retries (Database.run's loop does)
        assert kv.db.run(lambda _tr: kv.db.snapshot_get([key])) == [b"x"]
    assert scope.injected == {"kv.get": 1}


# -- limits and bad input -------------------------------------------------------


@pytest.mark.timeout(30)
def test_key_and_value_size_limits(kv: TestKV) -> None:
    prefix = kv.k("big")
    big_key = prefix + b"k" * (MAX_KEY_SIZE - len(prefix))
    kv.db.run(lambda tr: tr.set(big_key, b"v" * MAX_VALUE_SIZE))
    assert _read(kv.db, big_key) == b"v" * MAX_VALUE_SIZE
    for key, value in ((big_key + b"k", b"v"), (prefix, b"v" * (MAX_VALUE_SIZE + 1))):
        with pytest.raises(FsError) as ei:
            kv.db.run(lambda tr, key=key, value=value: tr.set(key, value))
        assert ei.value.code == Code.KV_TOO_LARGE and not ei.value.retryable
    with pytest.raises(FsError) as ei:
        kv.db.run(lambda tr: tr.get(big_key + b"k"))
    assert ei.value.code == Code.KV_TOO_LARGE
    assert [k for k, _ in kv.db.run(lambda tr: tr.get_range(*kv.range()))] == [big_key]


BAD_CALLS = {
    "get str": lambda tr, k: tr.get("key"),
    "get int": lambda tr, k: tr.get(5),
    "set str key": lambda tr, k: tr.set("key", b"v"),
    "set str value": lambda tr, k: tr.set(k, "v"),
    "set None value": lambda tr, k: tr.set(k, None),
    "clear str": lambda tr, k: tr.clear("key"),
    "range str begin": lambda tr, k: tr.get_range("a", k),
    "range None end": lambda tr, k: tr.get_range(k, None),
    "range negative limit": lambda tr, k: tr.get_range(k, k + b"\xff", limit=-1),
    "range str limit": lambda tr, k: tr.get_range(k, k + b"\xff", limit="3"),
    "clear_range str": lambda tr, k: tr.clear_range(k, "z"),
    "conflict range int": lambda tr, k: tr.add_read_conflict_range(1, k),
    "conflict key str": lambda tr, k: tr.add_read_conflict_key("k"),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("call", sorted(BAD_CALLS))
def test_bad_types_are_invalid_argument_and_change_nothing(kv: TestKV, call: str) -> None:
    key = kv.k("bad")

    def fn(tr: Transaction) -> None:
        tr.set(key, b"written")
        BAD_CALLS[call](tr, key)

    with pytest.raises(FsError) as ei:
        kv.db.run(fn)
    assert ei.value.code == Code.INVALID_ARGUMENT and not ei.value.retryable
    assert _read(kv.db, key) is None


def test_open_database_rejects_bad_urls() -> None:
    for url in ("nothing", "redis://x", "sqlite://"):
        with pytest.raises(FsError) as ei:
            open_database(url)
        assert ei.value.code == Code.INVALID_ARGUMENT


# -- fault injection ------------------------------------------------------------


@pytest.mark.timeout(60)
def test_scoped_faults_every_increment_takes_effect_once(kv: TestKV) -> None:
    key = kv.k("faults")
    with faults.inject(0.3, seed=1234) as scope:
        for _ in range(200):
            kv.db.run(_inc(key))
    assert scope.total > 0, "no fault was injected"
    assert set(scope.injected) <= {"kv.get", "kv.get_range", "kv.commit"}
    assert _counter(kv.db, key) == 200
    assert faults.active() is None


@pytest.mark.timeout(60)
def test_scoped_faults_follow_run_async(kv: TestKV) -> None:
    key = kv.k("afaults")

    async def main() -> int:
        with faults.inject(0.3, seed=99) as scope:
            for _ in range(50):
                await kv.db.run_async(_inc(key))
        return scope.total

    assert asyncio.run(main()) > 0
    assert _counter(kv.db, key) == 50


# -- several OS processes -------------------------------------------------------


@pytest.mark.timeout(120)
def test_two_processes_incrementing_one_key_end_at_exactly_2000(
    shared_kv: TestKV, children: list[subprocess.Popen[str]]
) -> None:
    key = shared_kv.k("mp")
    procs = [_spawn(children, "increment", shared_kv.url, key.hex(), "1000") for _ in range(2)]
    for p in procs:  # both have opened the database ...
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:  # ... and now start at once
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        out, err = p.communicate(timeout=110)
        assert p.returncode == 0, err
        assert out.startswith("done retries="), out
    assert _counter(shared_kv.db, key) == 2000


@pytest.mark.timeout(60)
def test_committed_data_survives_kill_9_of_the_writer(
    shared_kv: TestKV, children: list[subprocess.Popen[str]]
) -> None:
    prefix = shared_kv.k("dur")
    child = _spawn(children, "commit-forever", shared_kv.url, prefix.hex())
    assert child.stdout is not None
    reported: list[int] = []
    deadline = time.monotonic() + 40
    while len(reported) < 300 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        reported.append(int(line))
    assert len(reported) >= 300, (child.poll(), child.stderr.read() if child.stderr else "")
    os.kill(child.pid, signal.SIGKILL)  # mid-stream: it is still committing
    child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    # Whatever it printed after our last read was also committed; read those too.
    reported.extend(int(x) for x in child.stdout.read().split())
    assert reported == list(range(len(reported)))

    db = open_database(shared_kv.url)  # a fresh opener, as a restarted server would be
    try:
        got = db.run(lambda tr: tr.get_range(prefix, prefix + b"\xff"))
    finally:
        db.close()
    stored = {k[len(prefix) :].decode(): v for k, v in got}
    for i in reported:
        assert stored.get(str(i)) == b"v%d" % i
    # At most the one transaction in flight at the kill may be there unreported.
    assert len(stored) - len(reported) in (0, 1)


@pytest.mark.timeout(90)
def test_concurrent_committers_survive_kill_9_with_every_acknowledged_commit(
    shared_kv: TestKV, children: list[subprocess.Popen[str]]
) -> None:
    """Six threads commit at once (the sqlite engine groups them into shared fsyncs);
    whatever the process acknowledged before kill -9 is there afterwards."""
    prefix = shared_kv.k("gc")
    child = _spawn(children, "commit-concurrent", shared_kv.url, prefix.hex(), "6")
    assert child.stdout is not None
    acked: list[str] = []
    deadline = time.monotonic() + 60
    while len(acked) < 300 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        if not line.startswith("#"):
            acked.append(line.strip())
    assert len(acked) >= 300, (child.poll(), child.stderr.read() if child.stderr else "")
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    acked.extend(x for x in child.stdout.read().split("\n") if x and not x.startswith("#"))

    db = open_database(shared_kv.url)  # a fresh opener, as a restarted server would be
    try:
        got = db.run(lambda tr: tr.get_range(prefix, prefix + b"\xff"))
    finally:
        db.close()
    stored = {k[len(prefix) :].decode(): v.decode() for k, v in got}
    missing = [name for name in acked if stored.get(name) != name]
    assert not missing, missing[:10]
    # Per thread the acknowledged commits are a gapless sequence; at most the one
    # commit each thread had in flight at the kill may be stored unacknowledged.
    assert len(stored) - len(set(acked)) <= 6
