"""Bulk payloads of a call, for handlers: the same calls whatever transport served it.

Over the native transport (:mod:`fs3.rpc.native`) a request may carry bulk
bytes after its protobuf body, received straight into their own buffer, and an
answer may carry bulk bytes after its body, sent from the handler's buffers
without a copy. gRPC has no such thing: there the request has no payload and
an answer cannot carry one (callers of gRPC put the bytes inside the message).
Handlers never see sockets; they ask the context through these two functions.
"""

from __future__ import annotations

from typing import Any

from fs3.rpc.native.server import NativeContext, StreamItem


def request_payload(context: Any) -> memoryview | None:
    """The bulk payload that came with this request (None: none, or a gRPC call)."""
    if isinstance(context, NativeContext):
        p = context.payload
        if isinstance(p, list):  # the server receives into one buffer; be safe anyway
            return memoryview(b"".join(p))
        return p
    return None


def can_reply_payload(context: Any) -> bool:
    """True if this call's answer can carry bulk bytes (the native transport)."""
    return isinstance(context, NativeContext)


def set_reply_payload(context: Any, buffers: list[Any]) -> None:
    """Send ``buffers`` (in order) as the answer's bulk payload; keep them unchanged until then."""
    if not isinstance(context, NativeContext):
        raise TypeError("only native calls carry a bulk payload")
    context.reply_payload = [memoryview(b).cast("B") for b in buffers] if buffers else None


def with_payload(context: Any, message: Any, buffers: list[Any]) -> Any:
    """A response-stream item: ``message`` followed by ``buffers`` as its bulk payload.

    Only for calls that :func:`can_reply_payload`; without buffers it is the message itself.
    """
    if not buffers:
        return message
    if not isinstance(context, NativeContext):
        raise TypeError("only native calls carry a bulk payload")
    return StreamItem(message, [memoryview(b).cast("B") for b in buffers])
