"""TLS material for a cluster: one CA, one certificate per service (``cryptography``).

``fs3 cluster up --tls`` (and the docker-compose setup) call :func:`ensure_ca`
and :func:`issue` once per service. Every service certificate carries the DNS
name :data:`SERVICE_NAME` besides its own name and addresses, and clients
verify servers against that name with the cluster CA only
(``fs3.rpc.auth.Credential``): addresses in routing info change, the CA's
signature is what proves a server belongs to the cluster. Clients prove who
they are with tokens, not certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fs3.durable import write_durably

SERVICE_NAME = "fs3"  # in every service certificate; clients check it
CA_DAYS = 3650
CERT_DAYS = 825


def _write(path: Path, data: bytes, mode: int) -> None:
    write_durably(path, data, mode=mode, tmp=path.with_name(f".{path.name}.{os.getpid()}.tmp"))
    os.chmod(path, mode)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def ensure_ca(directory: str | os.PathLike[str], cluster_id: str = "fs3") -> tuple[Path, Path]:
    """The CA (``ca.pem``, ``ca.key`` mode 0600) in ``directory``, created if absent."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = d / "ca.pem", d / "ca.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"fs3 cluster CA {cluster_id}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path, key_path


def issue(
    directory: str | os.PathLike[str],
    name: str,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
) -> tuple[Path, Path]:
    """``<name>.pem``/``<name>.key`` signed by the CA in ``directory`` (kept if present).

    ``hosts``: extra DNS names or IP addresses the certificate is valid for.
    """
    d = Path(directory)
    cert_path, key_path = d / f"{name}.pem", d / f"{name}.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    ca_cert = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(SERVICE_NAME)]
    for h in dict.fromkeys([name, *hosts]):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path, key_path
