"""A process that never configures its RPC settings follows the environment."""

from __future__ import annotations

from typing import Any

import pytest

from fs3.config import RpcSection
from fs3.rpc import settings
from fs3.rpc.channel import ChannelPool

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _restore() -> Any:
    yield
    settings.configure(RpcSection())


def test_unconfigured_process_reads_fs3_rpc_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FS3_RPC_TRANSPORT", "grpc")
    monkeypatch.setenv("FS3_RPC_UNIX_SOCKETS", "false")
    settings._current = None
    assert settings.current().transport == "grpc"
    assert settings.current().unix_sockets is False
    assert ChannelPool().transport == "grpc"
    assert not ChannelPool().carries_payload


def test_unconfigured_default_is_native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FS3_RPC_TRANSPORT", raising=False)
    settings._current = None
    assert ChannelPool().transport == "native"


def test_configure_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FS3_RPC_TRANSPORT", "grpc")
    settings.configure(RpcSection(transport="native"))
    assert ChannelPool().transport == "native"
