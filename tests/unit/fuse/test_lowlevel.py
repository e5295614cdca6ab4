"""fs3.fuse.lowlevel: finding pyfuse3's ops table and session, and the table's layout.

The end-to-end check (fallocate through a kernel mount) is in
tests/integration/test_fuse_posix_depth.py; these pin the pieces that decide
whether the hook can be installed at all on this pyfuse3 build.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from fs3.fuse import lowlevel

pytestmark = pytest.mark.timeout(30)

TABLE = "__pyx_v_7pyfuse3_fuse_ops"
SESSION = "__pyx_v_7pyfuse3_session"


def test_pyfuse3_extension_has_the_symbols_and_is_mapped() -> None:
    so = lowlevel._extension_path()
    assert so is not None and os.path.exists(so)
    syms = lowlevel._elf_symbols(so, {TABLE, SESSION})
    assert set(syms) == {TABLE, SESSION} and all(syms.values())
    assert lowlevel._load_base(so) is not None


def test_elf_symbols_of_a_non_elf_file_is_empty(tmp_path: Path) -> None:
    p = tmp_path / "x"
    p.write_bytes(b"not an ELF file at all" * 10)
    assert lowlevel._elf_symbols(str(p), {TABLE}) == {}


def test_install_refuses_without_a_session() -> None:
    """Before pyfuse3.init there is no session: the hook says so and changes nothing."""
    so = lowlevel._extension_path()
    assert so is not None
    base = lowlevel._load_base(so)
    assert base is not None
    session = lowlevel._elf_symbols(so, {SESSION})[SESSION]
    assert ctypes.c_void_p.from_address(base + session).value is None

    async def handler(ino: int, fh: int, mode: int, off: int, length: int) -> None:
        raise AssertionError("never called")

    assert lowlevel.LowLevelHooks().install_fallocate(handler) is False
