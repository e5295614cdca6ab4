"""Structured logging: one logger per component under ``fs3.<component>``.

Lines are ``key=value`` pairs after a fixed prefix so they can be grepped and
parsed; :func:`setup` is called once by each process entry point.
"""

from __future__ import annotations

import logging
import sys


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = (
            f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d} "
            f"{record.levelname:<7} {record.name} pid={record.process} {record.getMessage()}"
        )
        extra = getattr(record, "kv", None)
        if extra:
            base += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base


def setup(level: str = "INFO", file: str = "") -> None:
    """Configure the root fs3 logger (stderr or ``file``)."""
    handler: logging.Handler = (
        logging.FileHandler(file) if file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(_Formatter())
    root = logging.getLogger("fs3")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def event(logger: logging.Logger, msg: str, level: int = logging.INFO, **kv: object) -> None:
    """Log a state change with structured fields: ``event(log, "lease gained", node=1)``."""
    logger.log(level, msg, extra={"kv": kv})
