"""Cluster CA and service certificates (fs3/security/tls.py) and the TLS contexts using them."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from fs3.rpc import auth
from fs3.security import provision, tls
from fs3.security.keys import load_secret
from fs3.security.tokens import Verifier

pytestmark = pytest.mark.timeout(30)


def test_ca_and_certificates_are_created_once_with_private_keys_0600(tmp_path: Path) -> None:
    ca, ca_key = tls.ensure_ca(tmp_path)
    cert, key = tls.issue(tmp_path, "storage-1", ("10.0.0.5", "node5"))
    assert os.stat(ca_key).st_mode & 0o777 == 0o600
    assert os.stat(key).st_mode & 0o777 == 0o600
    before = cert.read_bytes()
    assert tls.issue(tmp_path, "storage-1") == (cert, key)
    assert cert.read_bytes() == before
    assert tls.ensure_ca(tmp_path) == (ca, ca_key)
    c = x509.load_pem_x509_certificate(cert.read_bytes())
    san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = san.get_values_for_type(x509.DNSName)
    assert tls.SERVICE_NAME in names and "storage-1" in names and "node5" in names
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    c.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.read_bytes()))


def test_contexts_load_and_a_foreign_ca_does_not_verify(tmp_path: Path) -> None:
    tls.ensure_ca(tmp_path / "a")
    cert, key = tls.issue(tmp_path / "a", "meta-1")
    server = auth.server_ssl_context(str(cert), str(key))
    assert server.minimum_version >= ssl.TLSVersion.TLSv1_2
    other_ca, _ = tls.ensure_ca(tmp_path / "b")
    client = auth.client_ssl_context(str(other_ca))
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    c = x509.load_pem_x509_certificate(cert.read_bytes())
    with pytest.raises((ValueError, InvalidSignature)):
        c.verify_directly_issued_by(x509.load_pem_x509_certificate(other_ca.read_bytes()))


def test_provision_hands_services_the_secret_and_the_mount_a_token(tmp_path: Path) -> None:
    svc = provision.service_settings(tmp_path, "meta-1", tls=True)
    secret = load_secret(svc["secret_file"])
    assert Path(svc["tls_cert"]).is_file() and Path(svc["tls_key"]).is_file()
    mount = provision.mount_settings(tmp_path, tls=True)
    token = Path(mount["token_file"]).read_text()
    assert os.stat(mount["token_file"]).st_mode & 0o777 == 0o600
    assert Verifier.from_secret(secret).verify(token).kind == "mount"
    assert mount["tls_ca"] == svc["tls_ca"]
    assert "secret_file" not in mount  # the mount holds no secret
    # the operator's client finds the secret and the CA beside the cluster file
    cred = auth.credential_from(cluster_file=str(tmp_path / "fs3.cluster"))
    assert Verifier.from_secret(secret).verify(cred.token).kind == "service"
    assert cred.tls_ca == svc["tls_ca"]


def test_credential_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    provision.ensure_secret(tmp_path)
    cf = str(tmp_path / "fs3.cluster")
    monkeypatch.delenv("FS3_TOKEN", raising=False)
    monkeypatch.delenv("FS3_TOKEN_FILE", raising=False)
    assert auth.credential_from(token="t1", cluster_file=cf).token == "t1"
    f = tmp_path / "tok"
    f.write_text("t2\n")
    assert auth.credential_from(token_file=str(f), cluster_file=cf).token == "t2"
    monkeypatch.setenv("FS3_TOKEN", "t3")
    assert auth.credential_from(cluster_file=cf).token == "t3"
    monkeypatch.delenv("FS3_TOKEN")
    monkeypatch.setenv("FS3_TOKEN_FILE", str(f))
    assert auth.credential_from(cluster_file=cf).token == "t2"
    monkeypatch.delenv("FS3_TOKEN_FILE")
    assert auth.credential_from(cluster_file=cf).token.startswith("fs3t1.")
    assert auth.credential_from(cluster_file=str(tmp_path / "elsewhere" / "c")).token == ""
