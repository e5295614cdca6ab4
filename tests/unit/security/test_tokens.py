"""Token signing and verification (fs3/security/tokens.py)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fs3.errors import Code, FsError
from fs3.security.tokens import MAX_TOKEN_BYTES, Claims, Signer, Verifier, peek

pytestmark = pytest.mark.timeout(60)

SECRET = bytes(range(32))
OTHER = bytes(range(1, 33))


def _user(**kw: object) -> Claims:
    base: dict[str, object] = dict(
        kind="user", name="alice", uid=1000, gid=100, groups=(10, 20), token_id="abc"
    )
    base.update(kw)
    return Claims(**base)  # type: ignore[arg-type]


def test_round_trip_of_every_kind() -> None:
    s = Signer(SECRET)
    v = s.verifier()
    for c in (
        _user(),
        Claims(kind="service", name="svc", admin=True),
        Claims(kind="mount", name="fuse@h"),
    ):
        assert v.verify(s.sign(c)) == c
        assert peek(s.sign(c)) == c


def test_a_token_of_another_cluster_is_refused() -> None:
    tok = Signer(OTHER).sign(_user())
    with pytest.raises(FsError) as e:
        Verifier.from_secret(SECRET).verify(tok)
    assert e.value.code == Code.UNAUTHENTICATED
    assert "signature" in e.value.message


def _forge(tok: str, **changes: object) -> str:
    prefix, body, mac = tok.split(".")
    d = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    d.update(changes)
    raw = base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return f"{prefix}.{raw}.{mac}"


@pytest.mark.parametrize(
    "changes", [{"u": 0}, {"g": 0}, {"a": True}, {"k": "service"}, {"k": "mount"}, {"i": "x"}]
)
def test_tampered_claims_are_refused(changes: dict[str, object]) -> None:
    s = Signer(SECRET)
    with pytest.raises(FsError) as e:
        s.verifier().verify(_forge(s.sign(_user()), **changes))
    assert e.value.code == Code.UNAUTHENTICATED


def test_user_key_cannot_mint_service_tokens() -> None:
    """A user token's MAC under the user key is no service token (keys differ per purpose)."""
    s = Signer(SECRET)
    user_tok = s.sign(_user())
    # the same MAC presented over service claims must fail
    _, body, mac = user_tok.split(".")
    svc_body = s.sign(Claims(kind="service", name="alice")).split(".")[1]
    with pytest.raises(FsError):
        s.verifier().verify(f"fs3t1.{svc_body}.{mac}")
    assert s.verifier().verify(f"fs3t1.{body}.{mac}").kind == "user"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "x",
        "fs3t1..",
        "fs3t1.e30.AAAA",
        "fs3t2.a.b",
        "a" * (MAX_TOKEN_BYTES + 1),
        "fs3t1.!!!.???",
    ],
)
def test_garbage_is_refused_with_unauthenticated(bad: str) -> None:
    with pytest.raises(FsError) as e:
        Verifier.from_secret(SECRET).verify(bad)
    assert e.value.code == Code.UNAUTHENTICATED
    assert peek(bad) is None


def test_claims_out_of_range_are_not_signed() -> None:
    with pytest.raises(ValueError):
        Signer(SECRET).sign(_user(uid=1 << 32))
    with pytest.raises(ValueError):
        Signer(SECRET).sign(_user(kind="root"))
    with pytest.raises(ValueError):
        Signer(SECRET).sign(_user(name=""))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.binary(max_size=6000))
def test_any_bytes_either_verify_or_raise_unauthenticated(data: bytes) -> None:
    v = Verifier.from_secret(SECRET)
    with pytest.raises(FsError) as e:
        v.verify(data)
    assert e.value.code == Code.UNAUTHENTICATED


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=300))
def test_any_text_after_the_prefix_is_refused(text: str) -> None:
    with pytest.raises(FsError):
        Verifier.from_secret(SECRET).verify("fs3t1." + text)


def test_deeply_nested_claims_are_refused_not_crashing() -> None:
    body = base64.urlsafe_b64encode(b"[" * 3000).rstrip(b"=").decode()
    with pytest.raises(FsError):
        Verifier.from_secret(SECRET).verify(f"fs3t1.{body}.AAAA")
    assert peek(f"fs3t1.{body}.AAAA") is None
