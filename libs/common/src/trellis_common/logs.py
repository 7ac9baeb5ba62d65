"""Structured logging: one event per line, ``key=value`` or JSON.

Modules log with the standard library (``log.info("cert.issued cn=%s serial=%x", ...)``):
the first word is the event name and the rest are ``key=value`` pairs. :func:`configure`
sets the root handler once per process; the JSON format wraps the same line so log
shippers get ``{"ts": ..., "level": ..., "logger": ..., "event": ..., "msg": ...}``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Literal


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=info logger=x msg`` with exceptions on one line."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"logger={record.name} {record.getMessage()}"
        )
        if record.exc_info:
            exc = self.formatException(record.exc_info).replace("\n", " | ")
            line = f"{line} exc={exc!r}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``event`` is the first word of the message."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        payload: dict[str, object] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": message.split(" ", 1)[0],
            "msg": message,
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, separators=(",", ":"))


def configure(fmt: Literal["kv", "json"] = "kv", level: str = "INFO", service: str = "") -> None:
    """Install one stderr handler on the root logger (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # grpc/uvicorn/httpx are chatty at INFO; their warnings still come through.
    for noisy in ("uvicorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if service:
        logging.getLogger("trellis").info("service.starting service=%s", service)
