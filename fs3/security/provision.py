"""Credentials of a cluster's processes, as ``fs3 cluster up`` (and deploy/) hands them out.

Layout of a cluster directory (beside the cluster file ``fs3.cluster``):

* ``fs3.secret`` (0600): the cluster secret. Services are given its path
  (``[rpc] secret_file``): they verify every call with keys derived from it
  and present a service token to each other. The operator who ran ``up`` can
  read it, so ``fs3.connect``, ``fs3 admin`` and ``fs3 cluster status`` work
  for them with no extra step (``fs3.rpc.auth.credential_from``).
* ``fuse.token`` (0600): the FUSE daemon's mount token (``[rpc] token_file``):
  it may act for the local users whose requests the kernel hands it, and holds
  no secret.
* ``tls/`` (``--tls``): ``ca.pem``/``ca.key`` and ``<process>.pem``/``.key``
  (``fs3.security.tls``); services get ``[rpc] tls_cert/tls_key/tls_ca``,
  clients find ``tls/ca.pem`` beside the cluster file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from fs3.durable import write_durably
from fs3.security import tls as _tls
from fs3.security.keys import SECRET_FILE_NAME, create_secret, load_secret
from fs3.security.tokens import Signer

MOUNT_TOKEN_FILE = "fuse.token"
TLS_DIR = "tls"


def ensure_secret(root: str | os.PathLike[str]) -> Path:
    """``root/fs3.secret``, created (0600) if absent."""
    path = Path(root) / SECRET_FILE_NAME
    if not path.exists():
        create_secret(path)
    return path


def service_settings(
    root: str | os.PathLike[str], name: str, *, tls: bool, hosts: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``[rpc]`` keys of service ``name``: the secret and, with ``tls``, its certificate."""
    r = Path(root)
    out: dict[str, Any] = {"secret_file": str(ensure_secret(r))}
    if tls:
        d = r / TLS_DIR
        ca, _ = _tls.ensure_ca(d)
        cert, key = _tls.issue(d, name, ("127.0.0.1", "localhost", *hosts))
        out.update(tls_ca=str(ca), tls_cert=str(cert), tls_key=str(key))
    return out


def mount_settings(root: str | os.PathLike[str], *, tls: bool) -> dict[str, Any]:
    """``[rpc]`` keys of the FUSE daemon: a mount token file and, with ``tls``, the CA."""
    r = Path(root)
    path = r / MOUNT_TOKEN_FILE
    if path.exists():
        out: dict[str, Any] = {"token_file": str(path)}
        if tls:
            out["tls_ca"] = str(_tls.ensure_ca(r / TLS_DIR)[0])
        return out
    token = Signer(load_secret(ensure_secret(r))).mount_token(f"fuse@{os.uname().nodename}")
    write_durably(path, token.encode(), mode=0o600, tmp=path.with_name(f".{path.name}.tmp"))
    os.chmod(path, 0o600)
    out = {"token_file": str(path)}
    if tls:
        ca, _ = _tls.ensure_ca(r / TLS_DIR)
        out["tls_ca"] = str(ca)
    return out


def use_local_credential(cluster_file: str | os.PathLike[str]) -> None:
    """Make the cluster's credential this process's default (the launcher's own calls)."""
    from fs3.rpc import auth

    auth.set_default(auth.credential_from(cluster_file=str(cluster_file)))


def create_all(
    root: str | os.PathLike[str], *, tls: bool, services: list[str], mount_token: bool = True
) -> list[str]:
    """Everything a deployment's processes need, in ``root`` (``fs3 cluster credentials``).

    ``services``: ``NAME`` or ``NAME=HOST[,HOST...]`` (the names and addresses its
    certificate is valid for, besides :data:`fs3.security.tls.SERVICE_NAME`).
    Existing files are kept, so running it again changes nothing.
    """
    r = Path(root)
    r.mkdir(parents=True, exist_ok=True)
    made = [f"secret {ensure_secret(r)}"]
    if mount_token:
        made.append(f"mount token {mount_settings(r, tls=False)['token_file']}")
    if tls:
        for spec in services:
            name, _, hosts = spec.partition("=")
            extra = tuple(h for h in hosts.split(",") if h)
            cert = service_settings(r, name, tls=True, hosts=extra)["tls_cert"]
            made.append(f"certificate {cert}")
    return made


def remove_all(root: str | os.PathLike[str]) -> None:
    """Delete what this module created in ``root`` (``fs3 cluster down --wipe``)."""
    r = Path(root)
    for f in (r / SECRET_FILE_NAME, r / MOUNT_TOKEN_FILE):
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    shutil.rmtree(r / TLS_DIR, ignore_errors=True)
