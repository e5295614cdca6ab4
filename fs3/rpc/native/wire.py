"""The native frame format and the buffered receiver both ends share.

A connection starts with the client's 8-byte :data:`PREFACE` and, when the
client has a credential, one ``AUTH`` frame (checked once per connection, see
``fs3.rpc.auth``); after it both directions carry frames::

    header (28 bytes, little endian)
      u8  kind         CALL | MESSAGE | HALF_CLOSE | REPLY | END | ERROR | CANCEL
      u8  flags        HAS_MESSAGE: a protobuf body follows (CALL of a client stream may have none)
      u16 reserved     0
      u32 method_id    CRC-32 of the gRPC path (fs3.rpc.native.methods)
      u64 request_id   chosen by the client, unique per connection while the call lives
      u32 timeout_ms   CALL only: the caller's remaining deadline (0: none)
      u32 body_len     protobuf message (or common.ErrorDetail for ERROR)
      u32 payload_len  bulk bytes that follow the body, never inside a protobuf field
    body    (body_len bytes)
    payload (payload_len bytes)

A deadline travels as a relative timeout (like gRPC's ``grpc-timeout``): the
two hosts' clocks need not agree. Every length is checked against the
receiver's limits *before* anything is allocated, so no buffer is ever sized
from an unchecked number.

:class:`FrameReceiver` is an :class:`asyncio.BufferedProtocol`: small frames
are parsed out of one reusable receive buffer; a body too large for it gets a
buffer of exactly its (checked) size, and a bulk payload is received straight
into the destination the subclass names (:meth:`FrameReceiver.payload_buffer`),
e.g. the caller's read buffer, so bulk bytes are not copied by Python. The
destination may be a list of buffers (scatter: the payload of one BatchRead
answer lands in each read's own buffer); the frame's body is parsed by then,
so the subclass can lay the payload out from the message it describes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import struct
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fs3.rpc.native")

PREFACE = b"FS3RPC/1"
HTTP2_PREFACE_START = b"PRI * HT"  # what a gRPC (HTTP/2) client sends first

HEADER = struct.Struct("<BBHIQIII")
HEADER_SIZE = HEADER.size
PACK_HEADER = HEADER.pack

CALL = 1  # client -> server: start a call (unary and server-streaming: with the request)
MESSAGE = 2  # a stream message, either direction
HALF_CLOSE = 3  # client -> server: no more stream messages
REPLY = 4  # server -> client: the unary response (ends the call)
END = 5  # server -> client: a response stream ended well (ends the call)
ERROR = 6  # server -> client: the call failed; body = common.ErrorDetail (ends the call)
CANCEL = 7  # client -> server: abandon the call, answer nothing
AUTH = 8  # client -> server, first frame only: body = the caller's token (fs3.rpc.auth)

KINDS = frozenset({CALL, MESSAGE, HALF_CLOSE, REPLY, END, ERROR, CANCEL, AUTH})
KIND_NAMES = {
    CALL: "CALL",
    MESSAGE: "MESSAGE",
    HALF_CLOSE: "HALF_CLOSE",
    REPLY: "REPLY",
    END: "END",
    ERROR: "ERROR",
    CANCEL: "CANCEL",
    AUTH: "AUTH",
}

HAS_MESSAGE = 0x01

RECV_BUFFER_BYTES = 256 * 1024
# what a read may take while nothing is buffered: a bulk payload's first bytes
# arrive with its header in the shared buffer and are copied to their
# destination from there, the rest is read straight into it; a smaller first
# read copies less (a burst of small frames still fits, and a partial frame
# gets the whole buffer on the next read)
RECV_IDLE_BYTES = 64 * 1024
# Receive low-water marks for large payloads over TCP (FrameReceiver.watch_payloads).
LOWAT_MIN = 256 * 1024  # payloads from this size on wake the reader only when whole
LOWAT_MAX = 1024 * 1024  # the most a mark asks for (the rest: one wake-up per MiB)
_SO_RCVLOWAT = getattr(socket, "SO_RCVLOWAT", None)
CORK_BYTES = 64 * 1024  # gathered frames of one loop turn go out at least this often
# ... and at least every this many buffers: a burst of 64 answers goes out in four
# sends, so the peer starts on the first ones while the rest are computed (the two
# ends overlap instead of taking turns); a send costs far less than the handlers
# of 16 calls
CORK_BUFFERS = 16


# a frame's payload: one buffer, or several filled in order (scatter)
Payload = memoryview | list[memoryview]


def payload_len(payload: Payload | None) -> int:
    """Bytes of a received payload (0 for none)."""
    if payload is None:
        return 0
    if isinstance(payload, list):
        return sum(len(v) for v in payload)
    return len(payload)


class ProtocolViolation(Exception):
    """The peer sent something that is not a valid frame: the connection must close."""


def pack(
    kind: int,
    flags: int,
    method_id: int,
    request_id: int,
    timeout_ms: int,
    body: bytes,
    payload_len: int = 0,
) -> bytes:
    """Header plus body as one bytes object (one ``write`` for a small frame)."""
    return (
        HEADER.pack(kind, flags, 0, method_id, request_id, timeout_ms, len(body), payload_len)
        + body
    )


class FrameReceiver(asyncio.BufferedProtocol):
    """Parses frames out of the byte stream; subclasses handle them.

    Subclasses implement :meth:`frame_received` and may override
    :meth:`payload_buffer` (where a payload of a frame goes) and
    :meth:`violation` (what to do with a malformed stream).
    """

    max_body: int = 256 << 20
    max_payload: int = 64 << 20
    expect_preface: bool = False

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray(RECV_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._idle_view = self._view[:RECV_IDLE_BYTES]
        self._start = 0
        self._end = 0
        # a body or payload received outside the shared buffer
        self._direct: memoryview | None = None
        self._direct_pos = 0
        self._held: tuple[int, int, int, int, int, int] | None = None  # header of that frame
        self._held_body: bytes | memoryview = b""
        self._held_payload: Payload | None = None
        self._scatter: list[memoryview] = []  # buffers of a scattered payload still to fill
        self._preface_needed = self.expect_preface
        # no frame is parsed any more: a malformed stream, a closed connection, or
        # one whose bytes now go to ``_divert`` as they arrive (the server's gRPC relay)
        self._broken = False
        self._divert: Callable[[bytes], None] | None = None
        # set by a subclass that has stopped reading (flow control): frames
        # already buffered wait too, until it calls resume_parsing()
        self._parse_paused = False
        self._corked: list[Any] | None = None
        self._corked_bytes = 0
        self._cork_transport: Any = None
        # no frame written since bytes last arrived: the next one goes out at once
        self._lone = True
        # one timer per connection enforces the deadlines of all its calls
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf  # when it fires (inf: not armed)
        self._lowat_sock: Any = None  # see watch_payloads
        self._lowat = 1
        self._payload_left = 0

    # -- sending ---------------------------------------------------------------

    def write_frame(self, transport: Any, *bufs: Any) -> None:
        """Send one frame's buffers, coalescing the frames of one loop turn.

        The first frame written since bytes last arrived goes out at once: a
        lone call (or the answer to one) costs one ``write`` and nothing else,
        no loop callback. Frames that follow it before more bytes arrive, and
        frames written while a received burst of several frames is parsed, are
        gathered and written with one ``writelines`` at the end of the loop
        turn: with many calls in flight that is a few send syscalls for a burst
        of calls or answers instead of one each. Every :data:`CORK_BYTES` or
        :data:`CORK_BUFFERS` gathered go to the transport at once: the peer
        starts on them sooner, and the transport's write buffer limit
        (``pause_writing``, the sender's backpressure) still holds within a
        turn that answers many calls.
        """
        corked = self._corked
        if corked is None:
            if self._lone:
                self._lone = False
                if len(bufs) == 1:
                    transport.write(bufs[0])
                else:
                    transport.writelines(bufs)
                return
            corked = self._start_cork(transport)
        corked.extend(bufs)
        self._corked_bytes += sum(len(b) for b in bufs)
        if self._corked_bytes >= CORK_BYTES or len(corked) >= CORK_BUFFERS:
            self._flush_cork()

    def write_one(self, transport: Any, data: bytes) -> None:
        """:meth:`write_frame` of a frame that is one bytes object (no payload)."""
        corked = self._corked
        if corked is None:
            if self._lone:
                self._lone = False
                transport.write(data)
                return
            corked = self._start_cork(transport)
        corked.append(data)
        self._corked_bytes += len(data)
        if self._corked_bytes >= CORK_BYTES or len(corked) >= CORK_BUFFERS:
            self._flush_cork()

    def _start_cork(self, transport: Any) -> list[Any]:
        corked: list[Any] = []
        self._corked = corked
        self._corked_bytes = 0
        self._cork_transport = transport
        self._loop.call_soon(self._uncork)
        return corked

    def _flush_cork(self) -> None:
        out = self._corked
        if not out:
            return
        self._corked = []
        self._corked_bytes = 0
        t = self._cork_transport
        if t is not None and not t.is_closing():
            if len(out) == 1:
                t.write(out[0])
            else:
                t.writelines(out)

    def _uncork(self) -> None:
        self._flush_cork()
        self._corked = None
        self._cork_transport = None

    # -- deadlines -----------------------------------------------------------------

    def arm_deadline(self, when: float) -> None:
        """Have :meth:`expire_deadlines` run at loop time ``when``.

        A call with a deadline checks ``deadline < self._sweep_at`` and only
        then arms: calls with the same timeout come with later deadlines, so a
        busy connection arms about once per timeout period, not once per call.
        """
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep_at = when
        self._sweep = self._loop.call_at(when, self._run_sweep)

    def stop_deadlines(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._sweep_at = math.inf

    def _run_sweep(self) -> None:
        self._sweep = None
        self._sweep_at = math.inf
        if self._broken:
            return
        nxt = self.expire_deadlines(self._loop.time())
        if nxt < math.inf:
            self.arm_deadline(nxt)

    def expire_deadlines(self, now: float) -> float:
        """End the calls whose deadline is ``<= now``; return the next deadline (inf: none)."""
        return math.inf

    # -- what subclasses provide --------------------------------------------------

    def frame_received(
        self,
        kind: int,
        flags: int,
        method_id: int,
        request_id: int,
        timeout_ms: int,
        body: bytes | memoryview,
        payload: Payload | None,
    ) -> None:
        raise NotImplementedError

    def payload_buffer(
        self, kind: int, request_id: int, length: int, body: bytes | memoryview
    ) -> Payload:
        """Where the ``length`` payload bytes of this frame go (default: a new buffer).

        A list of buffers must add up to exactly ``length`` bytes (scatter).
        """
        return memoryview(bytearray(length))

    def preface_received(self, preface: bytes) -> bool:
        """The first 8 bytes of a server-side connection; False: stop parsing."""
        if preface != PREFACE:
            raise ProtocolViolation(f"not an fs3 native connection (starts with {preface!r})")
        return True

    def violation(self, message: str) -> None:
        raise NotImplementedError

    # -- asyncio.BufferedProtocol ------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        end = self._end
        if end == 0 and self._direct is None:
            # (also every read once the stream is diverted: nothing is kept then)
            return self._idle_view  # the usual case: every byte received so far is parsed
        if self._direct is not None:
            return self._direct[self._direct_pos :]
        if end == len(self._buf):
            # only the head of one partial frame can be left: move it to the front
            n = self._end - self._start
            self._buf[:n] = self._buf[self._start : self._end]  # (a copy: the ranges may overlap)
            self._start, self._end = 0, n
            if n == len(self._buf):
                # Full of whole frames not parsed yet: the transport resumed reading before
                # the deferred parse of what arrived while parsing was paused (a connection's
                # credential check, flow control) has run. The transport must never get an
                # empty buffer (it closes the connection), so take a larger one; it happens
                # only in that window and the paused reading bounds what was sent into it.
                grown = bytearray(2 * len(self._buf))
                grown[:n] = self._buf
                self._buf, self._view = grown, memoryview(grown)
                self._idle_view = self._view[:RECV_IDLE_BYTES]
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._broken:
            if self._divert is not None:  # (received at the start of the buffer: see get_buffer)
                self._divert(bytes(self._view[:nbytes]))
            return
        self._lone = True
        try:
            if self._direct is not None:
                self._direct_pos += nbytes
                if self._lowat != 1:
                    self._payload_left -= nbytes
                    self._set_lowat(self._payload_left)
                if self._direct_pos < len(self._direct):
                    return
                if self._scatter:  # the next buffer of a scattered payload
                    self._direct = self._scatter.pop()
                    self._direct_pos = 0
                    return
                self._direct_done()
            else:
                self._end += nbytes
            self._parse()
        except ProtocolViolation as e:
            self._broken = True
            self.violation(str(e))

    # -- parsing ---------------------------------------------------------------

    def resume_parsing(self) -> None:
        """Parse frames that arrived while parsing was paused."""
        self._parse_paused = False
        if self._broken or self._direct is not None:
            return
        try:
            self._parse()
        except ProtocolViolation as e:
            self._broken = True
            self.violation(str(e))

    def _parse(self) -> None:
        if self._preface_needed and not self._parse_preface():
            return
        buf = self._buf
        unpack = HEADER.unpack_from
        max_body = self.max_body
        max_payload = self.max_payload
        while self._direct is None and not self._broken and not self._parse_paused:
            start = self._start
            end = self._end
            if end - start < HEADER_SIZE:
                break
            kind, flags, _res, mid, rid, tmo, blen, plen = unpack(buf, start)
            if kind not in KINDS or blen > max_body or plen > max_payload:
                self._bad_header(kind, blen, plen)
            body_end = start + HEADER_SIZE + blen
            if body_end > end:
                if HEADER_SIZE + blen <= len(buf):
                    break  # the rest of the body comes into the shared buffer
                # a body larger than the receive buffer: its own buffer of the checked size
                body = bytearray(blen)
                have = end - start - HEADER_SIZE
                body[:have] = self._view[start + HEADER_SIZE : end]
                self._start = self._end = 0
                self._held = (kind, flags, mid, rid, tmo, plen)
                self._direct = memoryview(body)
                self._direct_pos = have
                self._held_body = b""
                self._held_payload = None
                return
            # a copy: the shared buffer is reused once the frame's callback returns
            body_bytes = self._view[start + HEADER_SIZE : body_end].tobytes()
            if plen:
                self._start = body_end
                self._begin_payload((kind, flags, mid, rid, tmo, plen), body_bytes)
                continue
            if body_end == end:
                self._start = self._end = 0
            else:
                self._start = body_end
                # more bytes follow: what this frame's callback writes waits for the
                # rest of the burst (one send for all of them, see write_frame)
                self._lone = False
            self.frame_received(kind, flags, mid, rid, tmo, body_bytes, None)
        if self._start == self._end and self._direct is None:
            self._start = self._end = 0

    def _parse_preface(self) -> bool:
        """Consume the connection's preface; False: not all here yet, or stop parsing."""
        start = self._start
        if self._end - start < len(PREFACE):
            return False
        self._preface_needed = False
        self._start = start + len(PREFACE)
        return self.preface_received(bytes(self._buf[start : start + len(PREFACE)]))

    def _bad_header(self, kind: int, blen: int, plen: int) -> None:
        if kind not in KINDS:
            raise ProtocolViolation(f"bad frame kind {kind}")
        if blen > self.max_body:
            raise ProtocolViolation(
                f"frame body of {blen} bytes exceeds the maximum {self.max_body}"
            )
        raise ProtocolViolation(
            f"frame payload of {plen} bytes exceeds the maximum {self.max_payload}"
        )

    def _begin_payload(
        self, head: tuple[int, int, int, int, int, int], body: bytes | memoryview
    ) -> None:
        kind, flags, mid, rid, tmo, plen = head
        dest = self.payload_buffer(kind, rid, plen, body)
        views = [v for v in dest if len(v)] if isinstance(dest, list) else [dest]
        if sum(len(v) for v in views) != plen:
            raise ProtocolViolation(f"payload buffers do not add up to the {plen}-byte payload")
        # bytes of the payload already in the receive buffer: copy them to the destination
        avail = min(self._end - self._start, plen)
        while views and avail:
            v = views[0]
            n = min(len(v), avail)
            v[:n] = self._view[self._start : self._start + n]  # no intermediate copy
            self._start += n
            avail -= n
            if n < len(v):
                views[0] = v[n:]
                break
            views.pop(0)
        if not views:
            self.frame_received(kind, flags, mid, rid, tmo, body, dest)
            return
        self._start = self._end = 0
        self._held = head
        self._held_body = body
        self._held_payload = dest
        views.reverse()  # popped from the end
        self._direct = views.pop()
        self._scatter = views
        self._direct_pos = 0
        if self._lowat_sock is not None and plen >= LOWAT_MIN:
            self._payload_left = len(self._direct) + sum(len(v) for v in views)
            self._set_lowat(self._payload_left)

    def watch_payloads(self, sock: Any, *, tls: bool) -> None:
        """Receive large payloads on TCP ``sock`` in one wake-up each, not one per segment burst.

        While a payload of :data:`LOWAT_MIN` bytes or more is received, the
        socket's ``SO_RCVLOWAT`` is the number of its bytes still to come (at
        most :data:`LOWAT_MAX`), so the loop is woken when they are all there
        instead of for every few segments; it goes back to 1 byte when the
        payload is complete. The sender has committed to every byte of the
        frame, so nothing waits for bytes that will not come; a closed or
        reset connection wakes the reader whatever the mark. Why: on this
        2-core VM, busy with other processes, each wake-up of the reader costs
        a trip through the run queue; a 1 MiB transfer over loopback TCP took
        three to five of them, and the native path lost to a blocking
        ``recv_into`` loop by up to 3x. Measured with the mark (interleaved
        rounds, benchmarks/results/rpc-20261202-3.md): 0.88-1.11x
        the plain loop both ways, against 0.33-0.70x without. Unix sockets
        ignore the mark in poll, so only TCP sockets are watched.

        Never under TLS (``tls``): the mark counts bytes in the kernel, which
        are ciphertext, while the payload left counts plaintext, and the TLS
        layer may already hold part of a record it has read; the bytes still to
        arrive can then be fewer than the mark, and the reader would never be
        woken. The receive buffer needs no cap of the mark: fs3 never sets
        ``SO_RCVBUF`` (which would lock it), and Linux grows an unlocked buffer to
        hold a mark when it is set (``tcp_set_rcvlowat``).
        """
        if _SO_RCVLOWAT is None or sock is None or tls:
            return
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            self._lowat_sock = sock

    def _set_lowat(self, n: int) -> None:
        n = max(1, min(n, LOWAT_MAX))
        if n != self._lowat:
            try:
                self._lowat_sock.setsockopt(socket.SOL_SOCKET, _SO_RCVLOWAT, n)
            except (OSError, AttributeError):  # gone, or no longer a socket: stop watching
                self._lowat_sock = None
                self._lowat = 1
                return
            self._lowat = n

    def _direct_done(self) -> None:
        head = self._held
        assert head is not None and self._direct is not None
        kind, flags, mid, rid, tmo, plen = head
        done, self._direct = self._direct, None
        if self._held_payload is None:
            # the large body is complete; a payload may follow
            body: bytes | memoryview = done
            if plen:
                self._begin_payload(head, body)
                return
            self._held = None
            self.frame_received(kind, flags, mid, rid, tmo, body, None)
            return
        body = self._held_body
        payload = self._held_payload
        self._held = None
        self._held_payload = None
        self._held_body = b""
        self.frame_received(kind, flags, mid, rid, tmo, body, payload)


def size_unix_send_buffer(sock: Any, nbytes: int) -> None:
    """Let a Unix socket hold ``nbytes`` unread (the kernel caps it at ``net.core.wmem_max``).

    Why: a Unix stream socket's sender may queue only its ``SO_SNDBUF``
    (``net.core.wmem_default``, 208 KiB) and, unlike loopback TCP, it never
    grows; a 1 MiB payload then crosses in five wake-ups of each event loop
    instead of one. TCP sockets keep the kernel's autotuning.
    """
    if sock is None or sock.family != socket.AF_UNIX:
        return
    with contextlib.suppress(OSError):
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < nbytes:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, nbytes)


def describe_peer(transport: Any) -> str:
    """``host:port`` or the socket path of a connection's peer, for log lines."""
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    if peer:
        return str(peer)
    sock = transport.get_extra_info("sockname") if transport is not None else None
    return f"unix:{sock}" if sock else "unknown peer"
