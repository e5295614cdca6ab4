"""File layout math: file offset → chunk index → chain, and per-chunk splitting.

This is the data path's only dependency on metadata (docs/architecture.md#file-layout): a
file's layout is fixed when it is created (chunk size, stripe width, the chain
table id/version it was placed on and the stripe's window of chains), so every
client maps offsets to chains on its own, without asking meta per I/O.

Mapping, as 3FS does it:

* ``chunk_index = offset // chunk_size`` (must fit in u32);
* the file's stripe is an ordered list of ``stripe`` chains; chunk ``i`` lives on
  ``chains[i % stripe]``;
* the stripe list is either stored explicitly in the layout (``chain_ids``, what
  fs3's meta records at create time), or derived from the chain table: the window
  ``base_index .. base_index + stripe - 1`` (1-based, wrapping) of the table,
  permuted by a *portable* deterministic shuffle seeded by ``seed`` (3FS used
  libstdc++'s ``std::shuffle`` and got bitten when GCC changed it;
  we define our own Fisher–Yates over splitmix64 and never use Python's
  ``random``).

Everything here is pure and synchronous so it can be unit-tested exhaustively
and used by meta (placement at create), storage tools and the client alike.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass, field

from fs3.errors import Code, FsError, invalid
from fs3.limits import MAX_CHUNK_INDEX, chunk_size_rule, valid_chunk_size

_MASK64 = (1 << 64) - 1


def splitmix64(state: int) -> tuple[int, int]:
    """One splitmix64 step: returns ``(new_state, output)``.

    Chosen because it is tiny, fully specified by its constants and identical
    in every language, so placement never depends on a library version.
    """
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def portable_shuffle(items: Sequence[int], seed: int) -> list[int]:
    """Fisher–Yates shuffle driven by splitmix64(seed); same result everywhere.

    ``seed == 0`` means "no shuffle" (the identity), so layouts created without a
    seed keep the table's order.
    """
    out = list(items)
    if seed == 0:
        return out
    state = seed & _MASK64
    for i in range(len(out) - 1, 0, -1):
        state, r = splitmix64(state)
        j = r % (i + 1)
        out[i], out[j] = out[j], out[i]
    return out


def chain_window(
    table_chains: Sequence[int], base_index: int, stripe: int, seed: int = 0
) -> list[int]:
    """The ordered stripe of chain ids for a layout placed on a chain table.

    ``base_index`` is 1-based into ``table_chains`` (3FS convention); the window
    wraps around the table. With ``stripe > len(table)`` chains repeat, which is
    what 3FS does too (a stripe wider than the table just revisits chains).
    """
    if not table_chains:
        raise invalid("chain table is empty")
    if stripe < 1:
        raise invalid(f"stripe must be >= 1, got {stripe}")
    if base_index < 1:
        raise invalid(f"base_index is 1-based, got {base_index}")
    refs = portable_shuffle(range(base_index, base_index + stripe), seed)
    n = len(table_chains)
    return [int(table_chains[(r - 1) % n]) for r in refs]


@dataclass(frozen=True)
class Layout:
    """A file's layout (fixed at create).

    Attributes:
        chunk_size: bytes per chunk, a power of two in [4 KiB, 64 MiB] (fs3.limits).
        stripe: number of chains the file's chunks rotate over.
        chain_ids: the stripe's chain ids in order (``len == stripe``), if the
            layout stores them explicitly (fs3 meta does); empty otherwise.
        table_id, table_version: the chain table the file was placed on.
        base_index, seed: the window into that table and the shuffle seed, used
            when ``chain_ids`` is empty.
    """

    chunk_size: int = 1 << 20
    stripe: int = 1
    chain_ids: tuple[int, ...] = field(default_factory=tuple)
    table_id: int = 0
    table_version: int = 0
    base_index: int = 1
    seed: int = 0

    def validate(self) -> None:
        cs = self.chunk_size
        if not valid_chunk_size(cs):
            raise invalid(f"chunk_size must be {chunk_size_rule()}, got {cs}")
        if self.stripe < 1:
            raise invalid(f"stripe must be >= 1, got {self.stripe}")
        if self.chain_ids and len(self.chain_ids) != self.stripe:
            raise invalid(
                f"layout lists {len(self.chain_ids)} chains for a stripe of {self.stripe}"
            )
        if any(c <= 0 for c in self.chain_ids):
            raise invalid("chain ids must be > 0")

    def chains(self, table_chains: Sequence[int] | None = None) -> list[int]:
        """The stripe's chain ids; needs the chain table if not stored explicitly."""
        if self.chain_ids:
            return list(self.chain_ids)
        if table_chains is None:
            raise invalid("layout has no chain list and no chain table was given")
        return chain_window(table_chains, self.base_index, self.stripe, self.seed)

    def max_file_size(self) -> int:
        """Largest addressable file size (chunk index must fit in u32)."""
        return (MAX_CHUNK_INDEX + 1) * self.chunk_size


def chunk_index(offset: int, chunk_size: int) -> int:
    """Chunk holding byte ``offset``; EFBIG if it does not fit in u32."""
    if offset < 0:
        raise invalid(f"negative offset {offset}")
    idx = offset // chunk_size
    if idx > MAX_CHUNK_INDEX:
        raise FsError(
            Code.INVALID_ARGUMENT,
            f"offset {offset} beyond the largest chunk index",
            errno=errno.EFBIG,
        )
    return idx


def chain_of(chains: Sequence[int], index: int) -> int:
    """Chain of chunk ``index`` given the stripe's ordered chain list."""
    return int(chains[index % len(chains)])


@dataclass(frozen=True)
class ChunkPiece:
    """One per-chunk piece of a user I/O.

    ``buf_offset`` is where the piece starts in the caller's buffer; ``offset``
    is the offset inside the chunk; ``file_offset`` the absolute file offset.
    """

    index: int
    chain_id: int
    offset: int
    length: int
    buf_offset: int
    file_offset: int


def split(offset: int, length: int, chunk_size: int, chains: Sequence[int]) -> list[ChunkPiece]:
    """Split ``[offset, offset+length)`` into per-chunk pieces (3FS ``chunkIo``).

    The first piece runs to the chunk boundary, then whole chunks, then the
    partial last piece. ``length == 0`` gives no pieces.
    """
    if length < 0:
        raise invalid(f"negative length {length}")
    if not chains:
        raise invalid("layout has no chains")
    pieces: list[ChunkPiece] = []
    if length == 0:
        return pieces
    chunk_index(offset + length - 1, chunk_size)  # range check of the end
    pos = offset
    end = offset + length
    while pos < end:
        idx = pos // chunk_size
        in_chunk = pos - idx * chunk_size
        n = min(chunk_size - in_chunk, end - pos)
        pieces.append(ChunkPiece(idx, chain_of(chains, idx), in_chunk, n, pos - offset, pos))
        pos += n
    return pieces


def chunks_from(size: int, chunk_size: int) -> int:
    """Index of the first chunk that lies entirely at or after byte ``size``.

    Used by truncate: chunks ``>= chunks_from(size)`` are removed; chunk
    ``size // chunk_size`` (if ``size`` is not chunk-aligned) is cut to
    ``size % chunk_size``.
    """
    return (size + chunk_size - 1) // chunk_size
