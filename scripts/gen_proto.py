#!/usr/bin/env python3
"""Regenerate fs3/proto/ from proto/*.proto (the only way generated code changes).

Usage: python scripts/gen_proto.py [--check]

grpc_tools writes flat imports (``import common_pb2``); they are rewritten to
package-relative ones so the generated modules live inside ``fs3.proto``.
With --check nothing is written; the exit status is 1 if the committed code
differs from what would be generated (tests/unit/test_proto_fresh.py runs this).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "fs3" / "proto"


def generate(out: Path) -> None:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    files = sorted(str(p.name) for p in PROTO_DIR.glob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    names = [Path(f).stem for f in files]
    pat = re.compile(r"^import (" + "|".join(names) + r")_pb2( as \S+)?$", re.M)
    for p in out.glob("*.py*"):
        text = p.read_text()
        text = pat.sub(lambda m: f"from . import {m.group(1)}_pb2{m.group(2) or ''}", text)
        p.write_text(text)
    (out / "__init__.py").write_text(
        '"""Generated gRPC/protobuf code (scripts/gen_proto.py). Do not edit."""\n'
    )


def main() -> int:
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        generate(tmpd)
        fresh = {p.name: p.read_text() for p in tmpd.iterdir() if p.is_file()}
    current = (
        {p.name: p.read_text() for p in OUT_DIR.iterdir() if p.is_file()}
        if OUT_DIR.exists()
        else {}
    )
    if check:
        if fresh != current:
            stale = sorted(
                set(fresh) ^ set(current) | {n for n in fresh if current.get(n) != fresh[n]}
            )
            print("generated code is stale; run: python scripts/gen_proto.py", file=sys.stderr)
            print("differs: " + ", ".join(stale), file=sys.stderr)
            return 1
        return 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in set(current) - set(fresh):
        (OUT_DIR / name).unlink()
    for name, text in fresh.items():
        (OUT_DIR / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
