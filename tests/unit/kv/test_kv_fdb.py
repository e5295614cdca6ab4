"""The fdb engine's own logic: FDB error mapping and failing clearly without libfdb_c.

Its transaction semantics are covered by tests/contract/test_kv.py when
FS3_FDB_CLUSTER_FILE names a cluster.
"""

from __future__ import annotations

import ctypes.util

import pytest

from fs3.errors import Code, FsError
from fs3.kv import open_database
from fs3.kv.fdb import classify_fdb_error

HAVE_LIBFDB = ctypes.util.find_library("fdb_c") is not None


@pytest.mark.parametrize(
    ("code", "retryable", "maybe_committed", "in_commit", "want", "want_retry"),
    [
        (1020, True, False, True, Code.KV_CONFLICT, True),  # not_committed
        (1007, True, False, False, Code.KV_CONFLICT, True),  # transaction_too_old
        (1021, True, True, True, Code.KV_COMMIT_UNKNOWN, True),  # commit_unknown_result
        (1031, False, False, True, Code.KV_COMMIT_UNKNOWN, True),  # timed out during commit
        (1031, False, False, False, Code.KV_UNAVAILABLE, False),  # timed out reading
        (1037, True, False, False, Code.KV_UNAVAILABLE, True),  # process_behind
        (1009, True, False, False, Code.KV_UNAVAILABLE, True),  # future_version
        (2101, False, False, True, Code.KV_TOO_LARGE, False),  # transaction_too_large
        (2103, False, False, False, Code.KV_TOO_LARGE, False),  # value_too_large
        (2000, False, False, False, Code.KV_UNAVAILABLE, False),  # client_invalid_operation
    ],
)
@pytest.mark.timeout(5)
def test_fdb_errors_map_to_fs3_codes(
    code, retryable, maybe_committed, in_commit, want, want_retry
) -> None:
    e = classify_fdb_error(
        code, "desc", retryable=retryable, maybe_committed=maybe_committed, in_commit=in_commit
    )
    assert isinstance(e, FsError)
    assert e.code == want and e.retryable == want_retry
    assert str(code) in e.message and "desc" in e.message


@pytest.mark.skipif(HAVE_LIBFDB, reason="libfdb_c is installed here")
@pytest.mark.timeout(10)
def test_open_without_libfdb_c_is_a_clear_kv_unavailable() -> None:
    for url in ("fdb://", "fdb:///etc/foundationdb/fdb.cluster"):
        with pytest.raises(FsError) as ei:
            open_database(url)
        assert ei.value.code == Code.KV_UNAVAILABLE and not ei.value.retryable
        assert "libfdb_c" in ei.value.message


class _FakeFdbError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
        self.description = "fake"


class _Future:
    def __init__(self, log: list[str], key: bytes, value: bytes | None) -> None:
        self.log, self.key, self._value = log, key, value

    @property
    def value(self) -> bytes | None:
        self.log.append(f"wait {self.key!r}")
        if self._value == b"!":
            raise _FakeFdbError(1031)
        return self._value


class _FakeTr:
    def __init__(self, data: dict[bytes, bytes], log: list[str]) -> None:
        self.data, self.log = data, log
        self.snapshot = self

    def get(self, key: bytes) -> _Future:
        self.log.append(f"get {key!r}")
        return _Future(self.log, key, self.data.get(key))

    def cancel(self) -> None:
        self.log.append("cancel")


@pytest.mark.timeout(5)
def test_fdb_snapshot_get_issues_every_read_before_waiting() -> None:
    """One round trip: all snapshot gets go out before the first answer is awaited."""
    from types import SimpleNamespace

    from fs3.kv.fdb import FdbDatabase

    log: list[str] = []
    data = {b"a": b"1", b"b": b"2", b"bad": b"!"}
    db = object.__new__(FdbDatabase)
    db._fdb = SimpleNamespace(  # type: ignore[attr-defined]
        FDBError=_FakeFdbError,
        predicates=SimpleNamespace(
            is_retryable=lambda e: False, is_maybe_committed=lambda e: False
        ),
    )
    db._db = SimpleNamespace(create_transaction=lambda: _FakeTr(data, log))  # type: ignore[attr-defined]
    assert db.snapshot_get([b"a", b"missing", b"b"]) == [b"1", None, b"2"]
    assert log == [
        "get b'a'",
        "get b'missing'",
        "get b'b'",
        "wait b'a'",
        "wait b'missing'",
        "wait b'b'",
        "cancel",
    ]
    with pytest.raises(FsError) as ei:
        db.snapshot_get([b"bad"])
    assert ei.value.code == Code.KV_UNAVAILABLE
    assert log[-1] == "cancel"
