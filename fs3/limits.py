"""Limits every service and the client must agree on, defined once.

A file's layout is chosen by meta at create (or set on a directory), applied by
the client to split I/O into chunks, and enforced by storage when it stages a
chunk. If the three disagreed, meta could hand out a layout that storage then
refuses on the first write (meta used to accept chunks up to 1 GiB while storage
refused anything above 64 MiB). So meta validation (:mod:`fs3.meta.layout`), the
client's layout math (:mod:`fs3.client.layout`), the storage chunk engine and
replicator (:mod:`fs3.storage.chunk_engine`, :mod:`fs3.storage.craq`) and the
``[meta] default_chunk_size`` check (:mod:`fs3.config`) all import from here.

The chunk size is a power of two in ``[MIN_CHUNK_SIZE, MAX_CHUNK_SIZE]``: at
least one 4 KiB page and at most 64 MiB, which bounds what storage holds in memory for one staged
chunk and what one replication step copies (3FS caps chunks at 64 MiB too).
A chunk index fits in 32 bits, so a file holds at most
``(MAX_CHUNK_INDEX + 1) * chunk_size`` bytes.
"""

from __future__ import annotations

MIN_CHUNK_SIZE = 4 << 10
MAX_CHUNK_SIZE = 64 << 20
MAX_CHUNK_INDEX = (1 << 32) - 1


def valid_chunk_size(cs: int) -> bool:
    """True if ``cs`` is a power of two in ``[MIN_CHUNK_SIZE, MAX_CHUNK_SIZE]``."""
    return MIN_CHUNK_SIZE <= cs <= MAX_CHUNK_SIZE and cs & (cs - 1) == 0


def chunk_size_rule() -> str:
    """The rule, worded once for every error message that refuses a chunk size."""
    return f"a power of two in [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]"


# One read request (a BatchRead, or one request on a ReadStream): at most this many
# ios, asking for at most this many bytes together. The client's read batcher
# (:mod:`fs3.client.storage_client`) sends at most 16 MiB per batch, or one piece
# (at most a chunk) alone; storage (:mod:`fs3.storage.operator`) refuses more before
# it reads anything, so no request makes a server hold more than a chunk's worth.
MAX_READ_IOS = 1024
MAX_READ_BATCH_BYTES = MAX_CHUNK_SIZE
# Ops of one TruncateChunks / RemoveChunks / QueryLastChunk request, and chunks one
# RemoveChunks op removes per call (the caller repeats while ``more``).
MAX_CHUNK_OPS = 1024
MAX_REMOVE_PER_CALL = 1024
