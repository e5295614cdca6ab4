"""Optional encodings of stored pieces: lossless zlib and int8-quantised deltas (both off by default).

``q8`` stores ``new - ref`` of a floating-point piece as int8 with one float32
scale per group of ``Q8_GROUP`` elements: ``scale = max|Δ| / 127`` over the
group, ``q = round(Δ / scale)``. Decoding adds ``q * scale`` back to the
reference, so the error of every restored element is at most ``scale / 2 =
max|Δ_group| / 254``, plus the rounding of the sum to the tensor's dtype
(half an ulp). Deltas are always taken against the *restored* reference (the
saver keeps the decoded values as its reference), so errors never accumulate
along an incremental chain. Pieces whose delta is not finite, or whose dtype
is not float16/32/64, are stored exactly.
"""

from __future__ import annotations

import zlib

import numpy as np

Q8_GROUP = 4096
_FLOATS = ("float16", "float32", "float64")


def q8_supported(dtype: str) -> bool:
    return dtype in _FLOATS


def q8_encode(new: memoryview, ref: memoryview, dtype: str) -> tuple[bytes, np.ndarray] | None:
    """Encode ``new`` against ``ref``; returns (stored bytes, decoded values) or None if not encodable."""
    dt = np.dtype(dtype)
    n = np.frombuffer(new, dtype=dt).astype(np.float64)
    r = np.frombuffer(ref, dtype=dt).astype(np.float64)
    d = n - r
    if not np.all(np.isfinite(d)):
        return None
    count = d.size
    groups = (count + Q8_GROUP - 1) // Q8_GROUP
    pad = np.zeros(groups * Q8_GROUP)
    pad[:count] = d
    g = pad.reshape(groups, Q8_GROUP)
    scale = (np.abs(g).max(axis=1) / 127.0).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0).astype(np.float64)
    q = np.clip(np.rint(g / safe[:, None]), -127, 127).astype(np.int8)
    decoded = (
        r + (q.astype(np.float64) * scale.astype(np.float64)[:, None]).reshape(-1)[:count]
    ).astype(dt)
    return scale.tobytes() + q.reshape(-1)[:count].tobytes(), decoded


def q8_decode(
    stored: memoryview, ref: memoryview, dtype: str, first: int = 0, count: int | None = None
) -> np.ndarray:
    """Decode elements ``[first, first + len(ref))`` of a piece of ``count`` elements.

    ``ref`` holds the reference values of just those elements, so a reader
    that needs part of a piece (a rank's rows after re-sharding) decodes only that part.
    """
    dt = np.dtype(dtype)
    r = np.frombuffer(ref, dtype=dt).astype(np.float64)
    total = r.size if count is None else count
    groups = (total + Q8_GROUP - 1) // Q8_GROUP
    scale = np.frombuffer(stored[: groups * 4], dtype=np.float32).astype(np.float64)
    q = np.frombuffer(stored[groups * 4 + first : groups * 4 + first + r.size], dtype=np.int8)
    idx = (np.arange(first, first + r.size) // Q8_GROUP) if r.size else np.zeros(0, dtype=np.int64)
    return (r + q.astype(np.float64) * scale[idx]).astype(dt)


def zlib_encode(raw: memoryview) -> bytes | None:
    """zlib level 1, or None if it does not make the piece smaller."""
    out = zlib.compress(raw, 1)
    return out if len(out) < len(raw) else None


def zlib_decode(stored: memoryview, rawlen: int) -> bytes:
    out = zlib.decompress(stored)
    if len(out) != rawlen:
        raise ValueError(f"zlib piece decodes to {len(out)} bytes, expected {rawlen}")
    return out
