"""The cluster secret on disk and per-purpose keys derived from it.

The secret is 32 random bytes in a file of mode 0600 (``fs3.secret`` beside
the cluster file). It is read, never logged, and never sent over the wire:
peers prove they hold it through keys derived with HKDF-SHA256, one per
purpose, so no two mechanisms share a key.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fs3.durable import write_durably
from fs3.errors import Code, FsError

SECRET_BYTES = 32
KEY_BYTES = 32
SECRET_FILE_NAME = "fs3.secret"

# Purposes of derived keys. A new mechanism gets a new purpose, never an old one.
PURPOSE_RPC_AUTH = "fs3 rpc auth v1"
PURPOSE_USER_TOKEN = "fs3 user token v1"
PURPOSE_CAPABILITY = "fs3 chunk capability v1"


def create_secret(path: str | os.PathLike[str]) -> bytes:
    """Create a new cluster secret at ``path`` (mode 0600, durable); refuse to overwrite.

    Overwriting would silently invalidate every token and capability the
    cluster has issued, so an existing file is an error, not a reset.
    """
    p = Path(path)
    if p.exists():
        raise FsError(Code.INVALID_ARGUMENT, f"cluster secret {p} already exists")
    secret = secrets.token_bytes(SECRET_BYTES)
    write_durably(p, secret, mode=0o600, tmp=p.with_name(f".{p.name}.{os.getpid()}.tmp"))
    os.chmod(p, 0o600)
    return secret


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """Read the cluster secret; refuse one that other users could read or one of the wrong size."""
    p = Path(path)
    try:
        st = p.stat()
        data = p.read_bytes()
    except FileNotFoundError:
        raise FsError(Code.UNAUTHENTICATED, f"cluster secret {p} does not exist") from None
    except PermissionError:
        raise FsError(
            Code.PERMISSION_DENIED, f"cluster secret {p} is not readable by this user"
        ) from None
    except OSError as e:  # a directory, an I/O error: not a secret this process can use
        raise FsError(Code.INVALID_ARGUMENT, f"cluster secret {p} cannot be read: {e}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise FsError(
            Code.PERMISSION_DENIED,
            f"cluster secret {p} has mode {stat.S_IMODE(st.st_mode):o}: others may read it "
            f"(chmod 600 {p})",
        )
    if len(data) != SECRET_BYTES:
        raise FsError(
            Code.INVALID_ARGUMENT, f"cluster secret {p} is {len(data)} bytes, not {SECRET_BYTES}"
        )
    return data


def secret_path(secret_file: str | None, cluster_file: str | None) -> Path | None:
    """Where this process's cluster secret is: ``secret_file`` (``[rpc] secret_file``)
    if set, else :data:`SECRET_FILE_NAME` beside ``cluster_file``; None with neither."""
    if secret_file:
        return Path(secret_file)
    if cluster_file:
        return Path(os.path.dirname(os.path.abspath(cluster_file))) / SECRET_FILE_NAME
    return None


def find_secret(secret_file: str | None = None, cluster_file: str | None = None) -> bytes | None:
    """The cluster secret this process holds, or None if the cluster has none.

    The one lookup every user of the secret goes through (RPC authentication,
    capability keys, minting a client's token). A configured ``secret_file``
    must exist and be valid (a typo must not silently switch security off);
    the default place beside ``cluster_file`` may be empty (a cluster started
    without a secret). A secret that exists but cannot be used (mode, size,
    permissions) raises :class:`FsError` in both cases.
    """
    p = secret_path(secret_file, cluster_file)
    if p is None or (not secret_file and not p.exists()):
        return None
    return load_secret(p)


def derive_key(secret: bytes, purpose: str) -> bytes:
    """The key for one purpose (``PURPOSE_*``), derived from the cluster secret with HKDF-SHA256."""
    if len(secret) != SECRET_BYTES:
        raise FsError(Code.INVALID_ARGUMENT, f"cluster secret must be {SECRET_BYTES} bytes")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=purpose.encode())
    return hkdf.derive(secret)
