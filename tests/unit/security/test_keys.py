"""The cluster secret file and per-purpose key derivation (fs3/security/keys.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fs3.errors import Code, FsError
from fs3.security import keys

pytestmark = pytest.mark.timeout(10)


def test_create_then_load_round_trips_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / keys.SECRET_FILE_NAME
    secret = keys.create_secret(path)
    assert len(secret) == keys.SECRET_BYTES
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert keys.load_secret(path) == secret


def test_create_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / keys.SECRET_FILE_NAME
    first = keys.create_secret(path)
    with pytest.raises(FsError):
        keys.create_secret(path)
    assert keys.load_secret(path) == first


def test_load_refuses_a_secret_others_can_read(tmp_path: Path) -> None:
    path = tmp_path / keys.SECRET_FILE_NAME
    keys.create_secret(path)
    os.chmod(path, 0o644)
    with pytest.raises(FsError) as err:
        keys.load_secret(path)
    assert err.value.code == Code.PERMISSION_DENIED


def test_load_refuses_a_missing_or_short_secret(tmp_path: Path) -> None:
    with pytest.raises(FsError):
        keys.load_secret(tmp_path / "absent")
    short = tmp_path / "short"
    short.write_bytes(b"x" * 5)
    os.chmod(short, 0o600)
    with pytest.raises(FsError):
        keys.load_secret(short)


def test_keys_differ_by_purpose_and_by_secret() -> None:
    a, b = b"a" * keys.SECRET_BYTES, b"b" * keys.SECRET_BYTES
    ka = keys.derive_key(a, keys.PURPOSE_RPC_AUTH)
    assert ka == keys.derive_key(a, keys.PURPOSE_RPC_AUTH)
    assert ka != keys.derive_key(a, keys.PURPOSE_CAPABILITY)
    assert ka != keys.derive_key(b, keys.PURPOSE_RPC_AUTH)
    assert len(ka) == keys.KEY_BYTES


def test_find_secret_configured_file_then_beside_the_cluster_file(tmp_path: Path) -> None:
    """The one lookup of the cluster secret (RPC auth, capability keys, client tokens)."""
    d = tmp_path / "cluster"
    d.mkdir()
    cf = str(d / "fs3.cluster")
    assert keys.find_secret(None, None) is None
    assert keys.find_secret("", cf) is None  # a cluster started without a secret
    beside = keys.create_secret(d / keys.SECRET_FILE_NAME)
    assert keys.find_secret("", cf) == beside
    assert keys.find_secret(cluster_file=os.path.relpath(cf)) == beside  # relative names too
    other = keys.create_secret(tmp_path / "configured")
    assert keys.find_secret(str(tmp_path / "configured"), cf) == other  # configured wins
    with pytest.raises(FsError) as err:  # a configured secret must exist: no silent "off"
        keys.find_secret(str(tmp_path / "typo"), cf)
    assert err.value.code == Code.UNAUTHENTICATED
    os.chmod(d / keys.SECRET_FILE_NAME, 0o644)
    with pytest.raises(FsError) as err:  # one beside the cluster file must be usable too
        keys.find_secret("", cf)
    assert err.value.code == Code.PERMISSION_DENIED


def test_find_secret_refuses_a_directory(tmp_path: Path) -> None:
    (tmp_path / keys.SECRET_FILE_NAME).mkdir(mode=0o700)
    with pytest.raises(FsError) as err:
        keys.find_secret(cluster_file=str(tmp_path / "fs3.cluster"))
    assert err.value.code == Code.INVALID_ARGUMENT
