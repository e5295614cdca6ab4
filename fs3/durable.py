"""Writing small files and directories so that they survive a power cut.

Why: ``write_text`` + ``os.replace`` is atomic against a process crash but not
against power loss. After a cut the new name may point at a file whose data
never reached the disk (an empty file), or the rename (or a ``mkdir``) may not
have reached the disk at all: POSIX makes a directory entry durable only when
its *directory* is fsync'd. The order that is safe everywhere is: write a
temporary file, fsync it, rename it over the target, fsync the directory.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of directory ``path`` (creates, renames, unlinks in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(
    path: str | os.PathLike[str],
    data: bytes | str,
    mode: int = 0o644,
    *,
    tmp: str | os.PathLike[str] | None = None,
) -> None:
    """Replace ``path`` with ``data`` atomically and durably: after a power cut it holds
    either its old content or ``data``, never a mix or nothing.

    ``tmp`` names the staging file (default ``.NAME.tmp`` beside it); writers that may
    race on one path, or that sweep their own leftovers by name, choose their own.
    """
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = p.with_name(f".{p.name}.tmp") if tmp is None else Path(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, p)
    fsync_dir(p.parent)


def makedirs_durably(path: str | os.PathLike[str], mode: int = 0o755) -> None:
    """``mkdir -p`` whose new directories survive a power cut (each parent is fsync'd)."""
    p = Path(os.path.abspath(path))
    missing: list[Path] = []
    while not p.is_dir():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode)
        except FileExistsError:
            if not d.is_dir():
                raise
        fsync_dir(d.parent)
