"""Tensors and arrays as flat byte views, and back (torch is optional).

A checkpoint stores bytes plus a dtype name and a shape. numpy arrays and
torch tensors (any device; non-CPU ones are copied to host by the snapshot)
map to a 1-D ``uint8`` view of their memory without a copy when they are
contiguous. dtype names are numpy's (``float32``) with ``bfloat16`` and the
float8 types added for torch, which numpy lacks; ``framework`` records which
kind of object to rebuild on load.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

try:  # torch is an optional extra (pip install fs3[ckpt])
    import torch
except ImportError:  # pragma: no cover - CI installs torch
    torch = None  # type: ignore[assignment]

_TORCH_ONLY = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def is_torch(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def is_tensor(x: Any) -> bool:
    """True for what a checkpoint stores as data (arrays and tensors); the rest is metadata."""
    return isinstance(x, np.ndarray) or is_torch(x)


def dtype_name(x: Any) -> str:
    if is_torch(x):
        return str(x.dtype).removeprefix("torch.")
    return str(np.asarray(x).dtype)


def framework(x: Any) -> str:
    return "torch" if is_torch(x) else "numpy"


def nbytes(x: Any) -> int:
    if is_torch(x):
        return int(x.numel() * x.element_size())
    return int(np.asarray(x).nbytes)


def byte_view(x: Any) -> memoryview:
    """A 1-D unsigned-byte view of ``x``'s memory (contiguous CPU data: no copy).

    Non-contiguous or device tensors are copied to a contiguous host array first.
    """
    if is_torch(x):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.numel() == 0:
            return memoryview(b"")
        return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")
    if isinstance(x, (bytes, bytearray, memoryview)):
        return memoryview(x).cast("B")
    a = np.ascontiguousarray(x)
    return memoryview(cast(Any, a.reshape(-1).view(np.uint8))).cast("B")


def element_size(dtype: str) -> int:
    if dtype in _TORCH_ONLY:
        return 2 if dtype == "bfloat16" else 1
    return int(np.dtype(dtype).itemsize)


def make_empty(dtype: str, shape: tuple[int, ...], fw: str) -> Any:
    """An uninitialised array/tensor to load into."""
    if fw == "torch" or dtype in _TORCH_ONLY:
        if torch is None:
            raise RuntimeError(f"loading {dtype} tensors needs torch (pip install 'fs3[ckpt]')")
        return torch.empty(shape, dtype=getattr(torch, dtype))
    return np.empty(shape, dtype=np.dtype(dtype))


def from_bytes(buf: Any, dtype: str, shape: tuple[int, ...], fw: str) -> Any:
    """An array/tensor over ``buf`` (no copy)."""
    if fw == "torch" or dtype in _TORCH_ONLY:
        if torch is None:
            raise RuntimeError(f"loading {dtype} tensors needs torch (pip install 'fs3[ckpt]')")
        u8 = (
            torch.frombuffer(buf, dtype=torch.uint8)
            if len(buf)
            else torch.empty(0, dtype=torch.uint8)
        )
        return u8.view(getattr(torch, dtype)).reshape(shape)
    return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape)


def as_numpy_float(view: memoryview, dtype: str) -> np.ndarray | None:
    """A float numpy view of a buffer for arithmetic (quantised deltas), or None if not float."""
    if dtype in ("float16", "float32", "float64"):
        return np.frombuffer(view, dtype=np.dtype(dtype))
    if dtype == "bfloat16":
        return None  # no numpy dtype; stored exactly instead
    return None
