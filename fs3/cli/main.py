"""The ``fs3`` command: dispatches to one module per subcommand.

Each subcommand lives in its own package and exposes ``main(argv) -> int``;
they are imported lazily so ``fs3 mgmtd`` never loads FUSE and ``fs3 mount``
never loads the storage engine.

    fs3 cluster up|status|down|kill|restart ...   local cluster launcher
    fs3 mgmtd|meta|storage --config FILE          one service in the foreground
    fs3 mount --cluster FILE MOUNTPOINT           the FUSE client agent
    fs3 admin ...                                 cluster administration
    fs3 bench PATH                                built-in benchmark
    fs3 ckpt ls|verify|rm|interval ...            training checkpoints (fs3.ckpt)
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("fs3.cli.cluster", "start, inspect and stop a local cluster"),
    "mgmtd": ("fs3.mgmtd.server", "run the cluster manager"),
    "meta": ("fs3.meta.server", "run a metadata server"),
    "storage": ("fs3.storage.server", "run a storage server"),
    "mount": ("fs3.fuse.main", "mount fs3 with FUSE"),
    "admin": ("fs3.cli.admin", "administer a cluster (nodes, targets, chains)"),
    "bench": ("fs3.cli.bench", "benchmark a mounted fs3 directory"),
    "ckpt": ("fs3.cli.ckpt", "list, verify and remove checkpoints; advise the interval"),
}


def usage() -> str:
    lines = ["usage: fs3 COMMAND [ARGS...]", "", "commands:"]
    for name, (_, help_) in COMMANDS.items():
        lines.append(f"  {name:<9} {help_}")
    lines.append("")
    lines.append("Run 'fs3 COMMAND --help' for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        from importlib.metadata import version

        print(f"fs3 {version('fs3')}")
        return 0
    cmd = args[0]
    if cmd not in COMMANDS:
        print(f"fs3: unknown command {cmd!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[cmd][0])
    rc = module.main(args[1:])
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
