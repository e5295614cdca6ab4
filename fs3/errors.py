"""The fs3 error vocabulary.

Every failure that crosses a module or process boundary is an :class:`FsError`:
an fs3 error code (one numeric range per module, like 3FS's StatusCode), a POSIX
errno (what a file-system caller finally sees), a human message, and whether a
retry may succeed. ``fs3.rpc.status`` is the only place that turns these into
gRPC statuses and back, so a client never sees a server's Python traceback.
"""

from __future__ import annotations

import errno as _errno
from enum import IntEnum


class Code(IntEnum):
    """fs3 error codes. Never renumber: the values cross the wire."""

    OK = 0
    # 1xxx: generic
    INVALID_ARGUMENT = 1001
    INTERNAL = 1002
    UNAVAILABLE = 1003
    TIMEOUT = 1004
    NOT_IMPLEMENTED = 1005
    CANCELLED = 1006
    # 2xxx: KV
    KV_CONFLICT = 2001
    KV_UNAVAILABLE = 2002
    KV_TOO_LARGE = 2003
    KV_COMMIT_UNKNOWN = 2004
    # 3xxx: mgmtd
    NOT_LEADER = 3001
    UNKNOWN_NODE = 3002
    DUPLICATE_NODE = 3003
    CANNOT_SATISFY = 3004
    LEASE_LOST = 3005
    UNKNOWN_TARGET = 3006
    STALE_HEARTBEAT = 3007
    UNKNOWN_CHAIN_TABLE = 3008
    # 4xxx: meta (errno carries the POSIX meaning)
    POSIX = 4000
    # 5xxx: storage
    CHAIN_VERSION_MISMATCH = 5001
    NOT_COMMITTED = 5002
    CHECKSUM_MISMATCH = 5003
    NO_SPACE = 5004
    CHUNK_NOT_FOUND = 5005
    UNKNOWN_CHAIN = 5006
    TARGET_NOT_SERVING = 5007
    STALE_UPDATE = 5008
    TRANSPORT = 5009
    SUCCESSOR_UNAVAILABLE = 5010
    NOT_HEAD = 5011
    CHUNK_BUSY = 5012
    MISSING_UPDATE = 5013
    # 6xxx: client / usrbio
    RING_FULL = 6001
    BAD_FD = 6002
    # 7xxx: security (fs3/security)
    UNAUTHENTICATED = 7001
    PERMISSION_DENIED = 7002
    CAPABILITY_EXPIRED = 7003


# Codes a caller may retry (after refreshing routing or backing off).
RETRYABLE_CODES = frozenset(
    {
        Code.UNAVAILABLE,
        Code.TIMEOUT,
        Code.KV_CONFLICT,
        Code.KV_UNAVAILABLE,
        Code.KV_COMMIT_UNKNOWN,
        Code.NOT_LEADER,
        Code.LEASE_LOST,
        Code.CHAIN_VERSION_MISMATCH,
        Code.NOT_COMMITTED,
        Code.TARGET_NOT_SERVING,
        Code.SUCCESSOR_UNAVAILABLE,
        Code.TRANSPORT,
        Code.NOT_HEAD,
        Code.CHUNK_BUSY,
        Code.MISSING_UPDATE,
    }
)

# The errno a POSIX caller sees for each non-POSIX code.
_DEFAULT_ERRNO: dict[Code, int] = {
    Code.INVALID_ARGUMENT: _errno.EINVAL,
    Code.INTERNAL: _errno.EIO,
    Code.UNAVAILABLE: _errno.EIO,
    Code.TIMEOUT: _errno.ETIMEDOUT,
    Code.NOT_IMPLEMENTED: _errno.ENOSYS,
    Code.CANCELLED: _errno.EINTR,
    Code.KV_CONFLICT: _errno.EAGAIN,
    Code.KV_UNAVAILABLE: _errno.EIO,
    Code.KV_TOO_LARGE: _errno.E2BIG,
    Code.KV_COMMIT_UNKNOWN: _errno.EIO,
    Code.NO_SPACE: _errno.ENOSPC,
    Code.CHUNK_NOT_FOUND: _errno.ENOENT,
    Code.CHECKSUM_MISMATCH: _errno.EIO,
    Code.RING_FULL: _errno.EAGAIN,
    Code.BAD_FD: _errno.EBADF,
    Code.UNAUTHENTICATED: _errno.EACCES,
    Code.PERMISSION_DENIED: _errno.EACCES,
    Code.CAPABILITY_EXPIRED: _errno.EACCES,
}


class FsError(Exception):
    """An fs3 failure with a code, an errno and a message.

    Args:
        code: the fs3 error code (``Code``).
        message: what went wrong, for a human.
        errno: the POSIX errno; defaults from the code.
        retryable: override whether a retry may succeed; defaults from the code.
        leader: for ``NOT_LEADER``, the address of the current leader if known.
    """

    def __init__(
        self,
        code: Code | int,
        message: str = "",
        *,
        errno: int | None = None,
        retryable: bool | None = None,
        leader: str = "",
    ) -> None:
        self.code = Code(code) if code in Code._value2member_map_ else Code.INTERNAL
        self.errno = errno if errno is not None else _DEFAULT_ERRNO.get(self.code, _errno.EIO)
        self.message = message or self.code.name
        self.retryable = retryable if retryable is not None else self.code in RETRYABLE_CODES
        self.leader = leader
        super().__init__(f"[{self.code.name}] {self.message}")

    def to_oserror(self) -> OSError:
        """The ``OSError`` a POSIX-facing caller should raise."""
        return OSError(self.errno, self.message)


def posix(err: int, message: str = "") -> FsError:
    """A metadata error whose meaning is exactly a POSIX errno."""
    return FsError(Code.POSIX, message or _errno.errorcode.get(err, str(err)), errno=err)


def invalid(message: str) -> FsError:
    """A malformed request: missing fields, bad types, out-of-range values."""
    return FsError(Code.INVALID_ARGUMENT, message)


def is_retryable(exc: BaseException) -> bool:
    """True if ``exc`` is an fs3 error a caller may retry."""
    return isinstance(exc, FsError) and exc.retryable
