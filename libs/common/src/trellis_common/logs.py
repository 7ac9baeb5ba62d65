"""Structured logging: one event per line, ``key=value`` or JSON.

Modules log with the standard library (``log.info("cert.issued cn=%s serial=%x", ...)``):
the first word is the event name and the rest are ``key=value`` pairs. :func:`configure`
sets the root handler once per process. The JSON format gives log shippers one object per
line with the event's fields as keys: ``{"ts": ..., "level": ..., "logger": ..., "event":
"cert.issued", "cn": ..., "serial": ..., "msg": ...}``. The fields are read from the
format string and its arguments, so a value keeps its type (numbers stay numbers) and a
value with spaces in it stays one field.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any, Literal

#: ``key=<one %-placeholder>`` in a format string, e.g. ``serial=%x`` or ``took_ms=%.1f``.
_FIELD = re.compile(r"^([A-Za-z_][\w.]*)=(%[-#0 +]*\d*(?:\.\d+)?[sdifrxXeEgGo])$")
_PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdifrxXeEgGo%]")
#: Keys every line has; a field of the same name is prefixed with ``field_``.
_RESERVED = frozenset({"ts", "level", "logger", "event", "msg", "exc"})


def _typed(spec: str, value: object) -> Any:
    text = spec % (value,)
    if isinstance(value, bool) and spec == "%s":
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and spec[-1] in "sdif":
        return float(text) if spec[-1] == "f" or isinstance(value, float) else int(text)
    return text


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``key=value`` fields of a record, read from its format string and arguments.

    Numbers and booleans passed as ``%s``/``%d``/``%f`` stay numbers and booleans; anything
    else is the formatted text (``%r`` gives the repr). Literal ``key=value`` words are
    fields too. A record whose format does not split cleanly yields what it can.
    """
    if not isinstance(record.msg, str):
        return {}
    args = record.args if isinstance(record.args, tuple) else ()
    found: dict[str, Any] = {}
    position = 0
    for word in record.msg.split(" ")[1:]:
        match = _FIELD.match(word)
        placeholders = [p for p in _PLACEHOLDER.findall(word) if p != "%%"]
        if match is not None and position < len(args):
            key, spec = match.groups()
            found[key] = _typed(spec, args[position])
        elif "=" in word and not placeholders:
            key, _, value = word.partition("=")
            if key.isidentifier():
                found[key] = value
        position += len(placeholders)
    return {(f"field_{k}" if k in _RESERVED else k): v for k, v in found.items()}


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
    """One JSON object per line: ``event`` is the first word of the message, and each
    ``key=value`` field is a key of its own (:func:`fields`)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        payload: dict[str, object] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": message.split(" ", 1)[0],
            **fields(record),
            "msg": message,
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, separators=(",", ":"), default=str)


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
