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

import contextlib
import json
import logging
import queue
import re
import sys
import threading
import time
from typing import Any, Literal, TextIO

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


class WriterThreadHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler whose writes happen on a thread of their own.

    A service logs from its event loop, and a write to stderr is a system call that can
    block: on a pipe that is full (a slow reader), and on the interpreter lock, which the
    write gives up and must take back from whichever thread took it meanwhile (gRPC's,
    the TLS tap's); a profile of proxy-cp put a third of a snapshot's build in that write,
    though end-to-end runs could not tell the difference from noise. Here the
    calling thread formats the line (so the line says what it said when it was logged)
    and queues it; a daemon thread writes what is queued, in order, many lines per write.
    :meth:`flush` waits until everything queued so far is written: ``logging.shutdown``
    calls it at exit, so no line is lost by a process that ends normally.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._lines: queue.SimpleQueue[str | threading.Event | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, name="log-writer", daemon=True)
        self._writer.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.put(self.format(record) + self.terminator)
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 (as StreamHandler: reported, never raised)
            self.handleError(record)

    def flush(self) -> None:
        """Wait (at most 5 s) until the lines queued before this call are written."""
        if not self._writer.is_alive():
            return
        written = threading.Event()
        self._lines.put(written)
        written.wait(timeout=5.0)

    def close(self) -> None:
        """Write what is queued, then end the thread (``None``: its last item)."""
        self.flush()
        self._lines.put(None)
        if self._writer is not threading.current_thread():
            self._writer.join(timeout=5.0)
        super().close()

    def _write(self) -> None:
        while True:
            batch = [self._lines.get()]
            while True:
                try:
                    batch.append(self._lines.get_nowait())
                except queue.Empty:
                    break
            text = "".join(item for item in batch if isinstance(item, str))
            if text:
                # stderr closed or broken: the lines are dropped, the writers never wait
                with contextlib.suppress(Exception):
                    self.stream.write(text)
                    self.stream.flush()
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()
            if None in batch:
                return


def configure(fmt: Literal["kv", "json"] = "kv", level: str = "INFO", service: str = "") -> None:
    """Install one stderr handler on the root logger (idempotent); its lines are written
    from a thread of its own (:class:`WriterThreadHandler`)."""
    handler = WriterThreadHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, WriterThreadHandler):  # ours: its thread ends after its lines
            old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())
    # No format of ours names where a line was logged (file, line, function), so the
    # logger need not find its caller: that walk costs a stack inspection per line, and
    # keeps the frame object of every coroutine that ever logged (each xDS stream's)
    # alive for as long as it runs (the Logging HOWTO's "Optimization" section).
    logging._srcfile = None
    # grpc/uvicorn/httpx are chatty at INFO; their warnings still come through.
    for noisy in ("uvicorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if service:
        logging.getLogger("trellis").info("service.starting service=%s", service)
