"""Config rendering for the launcher: one self-describing TOML per process, plus ``--set`` overrides."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from typing import Any

from fs3 import config as fs3config
from fs3.errors import FsError
from fs3.launcher.layout import ROLE_CONFIGS, LauncherError

# --------------------------------------------------------------------------- config rendering


def render_config(
    role: str, settings: dict[str, dict[str, Any]], optional: dict[str, dict[str, Any]], source: str
) -> str:
    """TOML for one process: every key at its default, then ``settings`` (must exist), then
    ``optional`` (applied only where the config class has that key).

    The text is loaded back through :func:`fs3.config.from_dict` so a bad value fails here,
    with the file name, and not later inside a child process.
    """
    cls = ROLE_CONFIGS[role]
    cfg = cls()
    for sec, keys in optional.items():
        obj = getattr(cfg, sec, None)
        for key, value in keys.items():
            if obj is not None and hasattr(obj, key):
                setattr(obj, key, value)
    for sec, keys in settings.items():
        obj = getattr(cfg, sec, None)
        for key, value in keys.items():
            if obj is None or not hasattr(obj, key):
                raise LauncherError(f"{source}: {role} config has no key [{sec}] {key}")
            setattr(obj, key, value)
    text = (
        f"# {role} config written by `fs3 cluster up`; every key is listed.\n"
        + fs3config.to_toml(cfg)
    )
    try:
        fs3config.from_dict(cls, tomllib.loads(text), source=source, env={})
    except FsError as e:
        raise LauncherError(e.message) from None
    return text


def _merge(*layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for sec, keys in layer.items():
            out.setdefault(sec, {}).update(keys)
    return out


def parse_set(items: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """``role.section.key=value`` (value parsed as TOML, else taken as a string)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for item in items:
        lhs, sep, rhs = item.partition("=")
        parts = lhs.strip().split(".")
        if not sep or len(parts) != 3 or not all(parts):
            raise LauncherError(
                f"--set {item!r}: expected ROLE.SECTION.KEY=VALUE, e.g. storage.storage.fsync=false"
            )
        try:
            value = tomllib.loads(f"v = {rhs.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = rhs.strip()
        out.setdefault(parts[0], {}).setdefault(parts[1], {})[parts[2]] = value
    return out
