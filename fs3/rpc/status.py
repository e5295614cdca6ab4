"""The one place where fs3 errors become gRPC statuses and back.

A server-side :class:`~fs3.errors.FsError` is sent as a gRPC status code chosen
from its fs3 code/errno plus an ``ErrorDetail`` message in the trailing metadata
key ``fs3-error-bin``. Any other exception escaping a handler is logged on the
server and sent as ``INTERNAL`` with a one-line message, never a traceback.
On the client side :func:`from_rpc_error` rebuilds the ``FsError``; an RPC
failure without detail (connection refused, deadline) becomes a retryable
``UNAVAILABLE``/``TIMEOUT``.
"""

from __future__ import annotations

import errno as _errno

import grpc

from fs3.errors import Code, FsError
from fs3.proto import common_pb2

DETAIL_KEY = "fs3-error-bin"

_POSIX_STATUS = {
    _errno.ENOENT: grpc.StatusCode.NOT_FOUND,
    _errno.EEXIST: grpc.StatusCode.ALREADY_EXISTS,
    _errno.EACCES: grpc.StatusCode.PERMISSION_DENIED,
    _errno.EPERM: grpc.StatusCode.PERMISSION_DENIED,
    _errno.EINVAL: grpc.StatusCode.INVALID_ARGUMENT,
    _errno.ENAMETOOLONG: grpc.StatusCode.INVALID_ARGUMENT,
    _errno.ENOSPC: grpc.StatusCode.RESOURCE_EXHAUSTED,
}

_CODE_STATUS = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    Code.NOT_IMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
    Code.KV_CONFLICT: grpc.StatusCode.ABORTED,
    Code.KV_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.NOT_LEADER: grpc.StatusCode.FAILED_PRECONDITION,
    Code.NO_SPACE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Code.CHUNK_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.UNKNOWN_NODE: grpc.StatusCode.NOT_FOUND,
    Code.UNKNOWN_TARGET: grpc.StatusCode.NOT_FOUND,
    Code.UNKNOWN_CHAIN: grpc.StatusCode.NOT_FOUND,
    Code.UNKNOWN_CHAIN_TABLE: grpc.StatusCode.NOT_FOUND,
    Code.DUPLICATE_NODE: grpc.StatusCode.ALREADY_EXISTS,
    Code.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Code.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Code.CAPABILITY_EXPIRED: grpc.StatusCode.PERMISSION_DENIED,
}


def status_for(err: FsError) -> grpc.StatusCode:
    """The gRPC status code that best describes ``err``."""
    if err.code == Code.POSIX:
        return _POSIX_STATUS.get(err.errno, grpc.StatusCode.FAILED_PRECONDITION)
    if err.code in _CODE_STATUS:
        return _CODE_STATUS[err.code]
    if err.retryable:
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.FAILED_PRECONDITION


def detail_of(err: FsError) -> bytes:
    return common_pb2.ErrorDetail(
        code=int(err.code),
        errno=err.errno,
        message=err.message,
        retryable=err.retryable,
        leader=err.leader,
    ).SerializeToString()


def trailing_metadata(err: FsError) -> tuple[tuple[str, bytes], ...]:
    return ((DETAIL_KEY, detail_of(err)),)


def from_rpc_error(e: grpc.RpcError, what: str = "rpc") -> FsError:
    """Rebuild the FsError a server sent, or classify a transport failure."""
    md = None
    try:
        md = e.trailing_metadata()  # type: ignore[attr-defined]
    except Exception:
        md = None
    for key, value in md or ():
        if key == DETAIL_KEY:
            d = common_pb2.ErrorDetail.FromString(value)
            return FsError(d.code, d.message, errno=d.errno, retryable=d.retryable, leader=d.leader)
    code = e.code() if hasattr(e, "code") else None  # type: ignore[attr-defined]
    details = ""
    try:
        details = e.details() or ""  # type: ignore[attr-defined]
    except Exception:
        pass
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return FsError(Code.TIMEOUT, f"{what}: deadline exceeded", retryable=True)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
        return FsError(Code.UNAVAILABLE, f"{what}: {details or code}", retryable=True)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return FsError(Code.INVALID_ARGUMENT, f"{what}: {details or 'message too large'}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return FsError(Code.NOT_IMPLEMENTED, f"{what}: {details or 'not implemented'}")
    return FsError(Code.INTERNAL, f"{what}: {details or code}")
