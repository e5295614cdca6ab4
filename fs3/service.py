"""Process entry-point plumbing shared by ``fs3 mgmtd|meta|storage``.

:func:`service_main` parses ``--config FILE``, loads and validates the config
(printing a clear error and exiting 2 if it is bad), sets up logging and the
Prometheus endpoint, runs the service's ``serve(cfg, stop_event)`` coroutine on
the event loop its ``[rpc] event_loop`` names (uvloop by default; see
``fs3.rpc.loop``), with its ``[rpc]`` section adopted for every RPC it makes,
and stops it cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fs3 import config as _config
from fs3 import logs
from fs3.errors import FsError
from fs3.rpc import settings
from fs3.rpc.loop import run as run_loop

C = TypeVar("C")

log = logging.getLogger("fs3.service")


def start_metrics(port: int) -> int | None:
    """Serve Prometheus metrics on ``port`` (0: free port; -1: disabled); returns the port."""
    if port < 0:
        return None
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr="127.0.0.1")
    return int(server.server_port)


def service_main(
    argv: list[str],
    prog: str,
    config_cls: type[C],
    serve: Callable[[C, asyncio.Event], Awaitable[Any]],
) -> int:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", "-c", help="TOML config file (defaults if omitted)")
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective config and exit"
    )
    args = parser.parse_args(argv)
    try:
        cfg = _config.load(config_cls, args.config)
    except FsError as e:
        print(f"{prog}: {e.message}", file=sys.stderr)
        return 2
    if args.print_config:
        print(_config.to_toml(cfg))
        return 0
    log_cfg = getattr(cfg, "log", None)
    logs.setup(getattr(log_cfg, "level", "INFO"), getattr(log_cfg, "file", ""))
    metrics = getattr(cfg, "metrics", None)
    if metrics is not None:
        try:
            port = start_metrics(metrics.port)
            if port is not None:
                log.info("metrics on http://127.0.0.1:%d/metrics", port)
        except OSError as e:
            print(f"{prog}: cannot serve metrics on port {metrics.port}: {e}", file=sys.stderr)
            return 2

    async def _run() -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await serve(cfg, stop)

    rpc_cfg = getattr(cfg, "rpc", None)
    if rpc_cfg is not None:
        settings.configure(rpc_cfg)
    try:
        rc = run_loop(_run(), rpc_cfg.event_loop if rpc_cfg is not None else "uvloop")
    except FsError as e:
        log.error("%s failed: %s", prog, e)
        print(f"{prog}: {e.message}", file=sys.stderr)
        return 1
    return int(rc or 0)
