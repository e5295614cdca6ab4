"""Unit tests for fs3.errors, fs3.config and fs3.rpc.status."""

from __future__ import annotations

import errno

import grpc
import pytest

from fs3 import config
from fs3.errors import Code, FsError, posix
from fs3.rpc.status import DETAIL_KEY, detail_of, from_rpc_error, status_for


def test_posix_error_keeps_errno_and_is_not_retryable() -> None:
    e = posix(errno.ENOTEMPTY)
    assert e.errno == errno.ENOTEMPTY and not e.retryable
    assert isinstance(e.to_oserror(), OSError) and e.to_oserror().errno == errno.ENOTEMPTY


def test_storage_codes_are_retryable_where_a_retry_can_help() -> None:
    assert FsError(Code.CHAIN_VERSION_MISMATCH).retryable
    assert not FsError(Code.CHECKSUM_MISMATCH).retryable
    assert FsError(Code.NO_SPACE).errno == errno.ENOSPC


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, md: tuple = (), details: str = "") -> None:
        self._code, self._md, self._details = code, md, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def trailing_metadata(self) -> tuple:
        return self._md

    def details(self) -> str:
        return self._details


def test_error_detail_round_trips_through_metadata() -> None:
    err = FsError(Code.NOT_LEADER, "ask the other one", leader="127.0.0.1:5")
    back = from_rpc_error(_FakeRpcError(status_for(err), ((DETAIL_KEY, detail_of(err)),)))
    assert (back.code, back.message, back.leader, back.retryable) == (
        Code.NOT_LEADER,
        "ask the other one",
        "127.0.0.1:5",
        True,
    )


def test_transport_failures_become_retryable_unavailable() -> None:
    e = from_rpc_error(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, details="connection refused"))
    assert e.code == Code.UNAVAILABLE and e.retryable
    assert from_rpc_error(_FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED)).code == Code.TIMEOUT


def test_config_defaults_env_overrides_and_validation(tmp_path) -> None:
    p = tmp_path / "m.toml"
    p.write_text(
        "[mgmtd]\nlease_length_s = 6\nlease_renew_interval_s = 1\nlease_safety_margin_s = 2\n"
    )
    cfg = config.load(config.MgmtdConfig, p, env={"FS3_KV_URL": "memory://", "FS3_NODE_ID": "7"})
    assert cfg.mgmtd.lease_length_s == 6.0 and cfg.kv.url == "memory://" and cfg.node.id == 7
    assert cfg.mgmtd.heartbeat_timeout_s == 60.0  # default kept


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[mgmtd]\nbogus = 1\n", "unknown key 'bogus'"),
        ("[nosuch]\n", "unknown section [nosuch]"),
        ("[node]\nport = 'x'\n", "expected an integer"),
        ("[node]\nport = 70000\n", "port must be 0..65535"),
        ("[mgmtd]\nlease_length_s = 5\nlease_renew_interval_s = 10\n", "lease_renew_interval_s"),
        ("not toml = = =", "not valid TOML"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(tmp_path, text: str, needle: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(config.ConfigError) as ei:
        config.load(config.MgmtdConfig, p, env={})
    assert needle in ei.value.message and str(p) in ei.value.message


def test_bad_env_override_names_the_variable() -> None:
    with pytest.raises(config.ConfigError, match="FS3_NODE_PORT"):
        config.load(config.MgmtdConfig, None, env={"FS3_NODE_PORT": "eighty"})


def test_rendered_config_loads_back_identically(tmp_path) -> None:
    for cls in config.SERVICE_CONFIGS.values():
        p = tmp_path / f"{cls.__name__}.toml"
        p.write_text(config.to_toml(cls()))
        assert config.load(cls, p, env={}) == cls()


def test_cluster_file_parsing() -> None:
    cf = config.parse_cluster_file_text("# c\nprod@127.0.0.1:9000,127.0.0.1:9001\n")
    assert cf.cluster_id == "prod" and cf.mgmtd_addresses == ("127.0.0.1:9000", "127.0.0.1:9001")
    assert config.parse_cluster_file_text(cf.render()) == cf
    for bad in ["", "noat", "x@", "x@host", "x@host:99999"]:
        with pytest.raises(config.ConfigError):
            config.parse_cluster_file_text(bad)
