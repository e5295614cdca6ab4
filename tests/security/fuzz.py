"""Hypothesis strategies for hostile requests: any protobuf message of the fs3 API,
built from its descriptor, with lengths and counts at and past the edges.

``message_of(descriptor)`` draws every field (scalars including extremes, short and
long strings/bytes, short repeated lists, nested messages to a small depth). Fields
named ``user`` are drawn as an unprivileged identity: claiming uid 0 is what per-user
authentication refuses, and a root identity may legitimately change the namespace.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

FD = FieldDescriptor

BIG = 1 << 20  # a "long" string/bytes field: 1 MiB

_INT_RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
}


def _int(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({lo, hi, 0 if lo <= 0 <= hi else lo, min(hi, 1), min(hi, 64 << 20), hi // 2})
    return st.one_of(st.sampled_from([e for e in edges if lo <= e <= hi]), st.integers(lo, hi))


def _scalar(f: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = f.type
    if t in _INT_RANGES:
        return _int(*_INT_RANGES[t])
    if t == FD.TYPE_BOOL:
        return st.booleans()
    if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return st.floats(
            allow_nan=True, allow_infinity=True, width=32 if t == FD.TYPE_FLOAT else 64
        )
    if t == FD.TYPE_ENUM:
        return st.integers(-1, 64)
    if t == FD.TYPE_STRING:
        return st.one_of(st.text(max_size=40), st.just("x" * BIG), st.just("../" * 100))
    if t == FD.TYPE_BYTES:
        return st.one_of(
            st.binary(max_size=64), st.just(b"\x00" * BIG), st.just(b"/" * 4096), st.just(b".")
        )
    raise AssertionError(f"unhandled field type {t}")


def _user() -> st.SearchStrategy[dict[str, Any]]:
    ids = st.integers(1000, 2**32 - 1)
    return st.fixed_dictionaries({"uid": ids, "gid": ids, "groups": st.lists(ids, max_size=4)})


def _field(f: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if f.type == FD.TYPE_MESSAGE:
        if f.name == "user" and f.message_type.name == "UserInfo":
            one: st.SearchStrategy[Any] = _user().map(
                lambda d: message_factory.GetMessageClass(f.message_type)(**d)
            )
        elif depth >= 3:
            one = st.just(message_factory.GetMessageClass(f.message_type)())
        else:
            one = message_of(f.message_type, depth + 1)
    else:
        one = _scalar(f)
    if f.is_repeated:
        return st.lists(one, max_size=4)
    return one


def message_of(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """Any message of type ``desc`` (fields drawn independently; oneofs: last one set wins)."""
    cls = message_factory.GetMessageClass(desc)
    fields = {f.name: _field(f, depth) for f in desc.fields}

    def build(values: dict[str, Any]) -> Any:
        m = cls()
        for name, v in values.items():
            f = desc.fields_by_name[name]
            if f.is_repeated:
                if f.type == FD.TYPE_MESSAGE:
                    for item in v:
                        getattr(m, name).add().CopyFrom(item)
                else:
                    getattr(m, name).extend(v)
            elif f.type == FD.TYPE_MESSAGE:
                getattr(m, name).CopyFrom(v)
            else:
                setattr(m, name, v)
        return m

    return st.fixed_dictionaries({}, optional=fields).map(build)


# Bytes that are not a protobuf message: field number 0, a truncated varint, a
# length-delimited field longer than the message, a deep group nesting.
malformed = st.one_of(
    st.binary(min_size=1, max_size=64).map(lambda b: b"\x00" + b),
    st.just(b"\x08" + b"\xff" * 11),
    st.just(b"\x0a\xff\xff\xff\xff\x0f"),
    st.just(b"\x0b" * 10000),
)
