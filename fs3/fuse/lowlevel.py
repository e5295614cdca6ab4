"""libfuse low-level operations that pyfuse3 does not bind: ``fallocate``.

pyfuse3 (3.5.0, the newest release) fills libfuse's ``fuse_lowlevel_ops``
without a ``fallocate`` entry, so libfuse answers every FUSE_FALLOCATE with
ENOSYS and the kernel then fails fallocate(2) with EOPNOTSUPP for the life of
the mount. This module adds the entry to the running session:

* libfuse copies the ops table into its ``struct fuse_session`` when pyfuse3
  creates the session (``pyfuse3.init``). pyfuse3 keeps both, the table it
  filled and the session pointer, in module globals of its extension; their
  addresses come from the extension's ELF symbol table (it is built unstripped
  by pip). The copy inside the session is found by its contents (the table
  pyfuse3 filled), so no layout of libfuse's private struct is assumed. The
  slot of ``fallocate`` is its index in the public ``fuse_lowlevel_ops``
  (fuse_lowlevel.h, ABI-stable across libfuse 3.x); the neighbouring slots
  are checked against what pyfuse3 sets before anything is written.
* The C callback runs on the loop's thread, inside pyfuse3's
  ``fuse_session_process_buf`` call; it starts an asyncio task that runs the
  handler and answers the request with ``fuse_reply_err`` (0 = success), once.

If anything does not match (another pyfuse3 build, a stripped extension), the
hook is not installed, a warning is logged and fallocate stays EOPNOTSUPP.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import struct
from collections.abc import Callable, Coroutine
from typing import Any

import pyfuse3

log = logging.getLogger("fs3.fuse")

# Indexes in struct fuse_lowlevel_ops (fuse_lowlevel.h, libfuse 3.x).
_SLOT_FORGET_MULTI = 38
_SLOT_FLOCK = 39
_SLOT_FALLOCATE = 40
_SLOT_READDIRPLUS = 41
_SLOTS_COMPARED = 42
_FH_OFFSET = 16  # struct fuse_file_info: int flags; 2 x 32 bits of bit fields; uint64_t fh
_SESSION_SCAN = 1024  # bytes of struct fuse_session searched for the ops table

FallocateHandler = Callable[[int, int, int, int, int], Coroutine[Any, Any, None]]

_FALLOCATE_T = ctypes.CFUNCTYPE(
    None,
    ctypes.c_void_p,  # fuse_req_t
    ctypes.c_uint64,  # fuse_ino_t
    ctypes.c_int,  # mode
    ctypes.c_int64,  # offset
    ctypes.c_int64,  # length
    ctypes.c_void_p,  # struct fuse_file_info *
)


def _elf_symbols(path: str, names: set[str]) -> dict[str, int]:
    """Values of the named symbols in an ELF64 little-endian file's .symtab."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return {}
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    out: dict[str, int] = {}
    for sh in sections:
        if sh[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sh[6]]
        str_off = strtab[4]
        for i in range(sh[5] // 24):
            name_off, _info, _other, _shndx, value, _size = struct.unpack_from(
                "<IBBHQQ", data, sh[4] + i * 24
            )
            end = data.index(b"\0", str_off + name_off)
            name = data[str_off + name_off : end].decode("ascii", "replace")
            if name in names:
                out[name] = value
    return out


def _load_base(path: str) -> int | None:
    """Where the shared object ``path`` is mapped in this process (its offset-0 mapping)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == path and int(parts[2], 16) == 0:
                return int(parts[0].split("-")[0], 16)
    return None


class LowLevelHooks:
    """Installs the ``fallocate`` entry into pyfuse3's libfuse session (see module doc)."""

    def __init__(self) -> None:
        self._cb: Any = None  # the ctypes callback: must outlive the session
        self._tasks: set[asyncio.Task[None]] = set()
        self._reply_err: Any = None

    def install_fallocate(self, handler: FallocateHandler) -> bool:
        """Make FUSE_FALLOCATE call ``handler(ino, fh, mode, offset, length)``.

        ``handler`` raises pyfuse3.FUSEError for an errno; anything else is
        answered EIO (the handler is expected to guard itself). Returns False
        (and logs why) when the session could not be patched.
        """
        try:
            return self._install(handler)
        except (OSError, ValueError, struct.error) as e:
            log.warning("fallocate not available on this mount: %s", e)
            return False

    def _install(self, handler: FallocateHandler) -> bool:
        so = _extension_path()
        if not so:
            raise ValueError("pyfuse3's extension module not found")
        syms = _elf_symbols(so, {"__pyx_v_7pyfuse3_fuse_ops", "__pyx_v_7pyfuse3_session"})
        if len(syms) != 2:
            raise ValueError(f"{so} has no symbols for pyfuse3's ops table and session")
        base = _load_base(so)
        if base is None:
            raise ValueError(f"{so} is not mapped in this process")
        ptr = ctypes.sizeof(ctypes.c_void_p)
        table = (ctypes.c_void_p * _SLOTS_COMPARED).from_address(
            base + syms["__pyx_v_7pyfuse3_fuse_ops"]
        )
        if (
            not table[_SLOT_READDIRPLUS]
            or not table[_SLOT_FORGET_MULTI]
            or table[_SLOT_FLOCK]
            or table[_SLOT_FALLOCATE]
        ):
            raise ValueError("pyfuse3's ops table does not have the expected layout")
        want = ctypes.string_at(ctypes.addressof(table), _SLOTS_COMPARED * ptr)
        session = ctypes.c_void_p.from_address(base + syms["__pyx_v_7pyfuse3_session"]).value
        if not session:
            raise ValueError("no libfuse session (call after pyfuse3.init)")
        area = ctypes.string_at(session, _SESSION_SCAN)
        at = area.find(want)
        if at < 0 or at % ptr:
            raise ValueError("the ops table was not found in the libfuse session")
        libfuse = ctypes.CDLL(ctypes.util.find_library("fuse3") or "libfuse3.so.3")
        reply = libfuse.fuse_reply_err
        reply.argtypes = [ctypes.c_void_p, ctypes.c_int]
        reply.restype = ctypes.c_int
        self._reply_err = reply
        loop = asyncio.get_running_loop()

        def on_fallocate(req: int, ino: int, mode: int, off: int, length: int, fi: int) -> None:
            # An exception escaping a ctypes callback is only printed: the request
            # would never be answered and the caller would hang. Answer EIO instead.
            try:
                fh = ctypes.c_uint64.from_address(fi + _FH_OFFSET).value if fi else 0
                task = loop.create_task(self._serve(req, handler(ino, fh, mode, off, length)))
            except Exception:  # noqa: BLE001
                log.exception("fallocate request could not be started (answered EIO)")
                reply(ctypes.c_void_p(req), errno.EIO)
                return
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self._cb = _FALLOCATE_T(on_fallocate)
        slot = ctypes.c_void_p.from_address(session + at + _SLOT_FALLOCATE * ptr)
        slot.value = ctypes.cast(self._cb, ctypes.c_void_p).value
        log.info("fallocate bound into the libfuse session (pyfuse3 does not bind it)")
        return True

    async def stop(self) -> None:
        """Answer (EINTR) and finish every request still running; before the session closes.

        A reply after ``pyfuse3.close`` would use the freed session.
        """
        while self._tasks:
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, req: int, work: Coroutine[Any, Any, None]) -> None:
        err = 0
        try:
            await work
        except pyfuse3.FUSEError as e:
            err = e.errno
        except asyncio.CancelledError:
            err = errno.EINTR
        except Exception:  # noqa: BLE001 - the kernel must get an answer
            log.exception("fallocate failed (answered EIO)")
            err = errno.EIO
        self._reply_err(ctypes.c_void_p(req), err)


def _extension_path() -> str | None:
    """The file of pyfuse3's compiled extension (the module that holds the session)."""
    import importlib.machinery
    import os

    path = pyfuse3.__file__ or ""
    if path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        return os.path.realpath(path)
    return None
