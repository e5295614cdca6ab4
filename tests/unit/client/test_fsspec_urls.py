"""fs3:// without a cluster: the entry point registers the class, and URLs map to fs3 paths."""

from __future__ import annotations

import fsspec
import pytest

from fs3.client.fsspec_fs import Fs3FileSystem

pytestmark = pytest.mark.timeout(30)


def test_entry_point_registers_fs3() -> None:
    # fsspec finds the class through the fsspec.specs entry point of pyproject.toml
    assert fsspec.get_filesystem_class("fs3") is Fs3FileSystem


@pytest.mark.parametrize(
    "url,path",
    [
        ("fs3:///data/x.csv", "/data/x.csv"),
        ("fs3://data/x.csv", "/data/x.csv"),
        ("fs3://data/dir/", "/data/dir"),
        ("fs3://", "/"),
        ("fs3:///", "/"),
        ("/plain/path", "/plain/path"),
        ("rel/path", "/rel/path"),
    ],
)
def test_strip_protocol(url: str, path: str) -> None:
    assert Fs3FileSystem._strip_protocol(url) == path


def test_unstrip_round_trips() -> None:
    fs = Fs3FileSystem(client=object(), skip_instance_cache=True)  # no connection needed
    url = fs.unstrip_protocol("/a/b")
    assert url == "fs3:///a/b"
    assert fs._strip_protocol(url) == "/a/b"


def test_url_names_no_cluster() -> None:
    assert Fs3FileSystem._get_kwargs_from_urls("fs3://host:1234/x") == {}
