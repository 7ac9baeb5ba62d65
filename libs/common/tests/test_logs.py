"""Structured log lines: one event per line, key=value or JSON, exceptions included."""

import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Literal

import pytest

from trellis_common import logs

NOISY = ("uvicorn.access", "httpx", "httpcore")

Configure = Callable[..., None]


@pytest.fixture
def configure() -> Iterator[Configure]:
    """``logs.configure`` that is undone after the test.

    Call it inside the test, once ``capsys`` has replaced ``sys.stderr``: the handler it
    installs writes to the stream of that moment.
    """
    root = logging.getLogger()
    level = root.level
    noisy_levels = {name: logging.getLogger(name).level for name in NOISY}
    at_setup = list(root.handlers)
    before_configure: list[logging.Handler] = []
    installed: list[logging.Handler] = []

    def configure(
        fmt: Literal["kv", "json"] = "kv", level: str = "INFO", service: str = ""
    ) -> None:
        if not before_configure:
            before_configure.extend(root.handlers)
        logs.configure(fmt, level, service)
        installed.extend(root.handlers)

    yield configure

    for handler in installed:
        root.removeHandler(handler)
        handler.close()
    # Put back the session-wide handlers pytest installed (those present both at setup and
    # during the call); the per-phase ones pytest manages itself.
    for handler in before_configure:
        if handler in at_setup:
            root.addHandler(handler)
    root.setLevel(level)
    for name, noisy_level in noisy_levels.items():
        logging.getLogger(name).setLevel(noisy_level)


def stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    for handler in logging.getLogger().handlers:
        handler.flush()  # the lines queued so far are written (a thread writes them)
    err = capsys.readouterr().err
    assert err.endswith("\n")
    return err.splitlines()


def test_kv_line(configure: Configure, capsys: pytest.CaptureFixture[str]) -> None:
    configure("kv")

    logging.getLogger("trellis.test").info("cert.issued cn=%s serial=%x", "bookstore", 255)

    [line] = stderr_lines(capsys)
    assert re.fullmatch(
        r"ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=info logger=trellis\.test "
        r"cert\.issued cn=bookstore serial=ff",
        line,
    ), line


def test_level_filters_and_names(configure: Configure, capsys: pytest.CaptureFixture[str]) -> None:
    configure("kv", level="warning")
    log = logging.getLogger("trellis.test")

    log.info("quiet.event")
    log.warning("loud.event key=1")

    [line] = stderr_lines(capsys)
    assert " level=warning " in line
    assert line.endswith(" loud.event key=1")


def test_kv_exception_stays_on_one_line(
    configure: Configure, capsys: pytest.CaptureFixture[str]
) -> None:
    configure("kv")

    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logging.getLogger("trellis.test").exception("store.failed key=%s", "a")

    [line] = stderr_lines(capsys)
    assert line.startswith("ts=")
    assert " level=error logger=trellis.test store.failed key=a exc=" in line
    assert "Traceback (most recent call last):" in line
    assert "ValueError: bad" in line


def test_json_line(configure: Configure, capsys: pytest.CaptureFixture[str]) -> None:
    configure("json")

    logging.getLogger("trellis.test").warning("proxy.disconnected proxy=%s", "ns/pod-1")

    [line] = stderr_lines(capsys)
    payload = json.loads(line)
    assert payload == {
        "ts": payload["ts"],
        "level": "warning",
        "logger": "trellis.test",
        "event": "proxy.disconnected",
        "proxy": "ns/pod-1",
        "msg": "proxy.disconnected proxy=ns/pod-1",
    }
    assert isinstance(payload["ts"], float)


def test_json_exception(configure: Configure, capsys: pytest.CaptureFixture[str]) -> None:
    configure("json")

    try:
        raise KeyError("missing")
    except KeyError:
        logging.getLogger("trellis.test").exception("lookup.failed")

    [line] = stderr_lines(capsys)
    payload = json.loads(line)
    assert payload["event"] == "lookup.failed"
    assert payload["level"] == "error"
    assert "KeyError: 'missing'" in payload["exc"]


def test_configure_is_idempotent_and_announces_the_service(
    configure: Configure, capsys: pytest.CaptureFixture[str]
) -> None:
    configure("kv")
    configure("json", service="catalog")

    assert len(logging.getLogger().handlers) == 1
    [line] = stderr_lines(capsys)
    assert json.loads(line)["msg"] == "service.starting service=catalog"


def test_noisy_libraries_are_quietened(
    configure: Configure, capsys: pytest.CaptureFixture[str]
) -> None:
    configure("kv", level="DEBUG")

    logging.getLogger("httpx").info("HTTP Request: GET http://t/healthz")
    logging.getLogger("httpx").warning("http.retry")
    logging.getLogger("trellis.test").debug("debug.event")

    lines = stderr_lines(capsys)
    assert [line.split(" ", 3)[3] for line in lines] == ["http.retry", "debug.event"]


def test_json_lines_carry_the_event_fields_as_keys(
    configure: Configure, capsys: pytest.CaptureFixture[str]
) -> None:
    configure("json")

    logging.getLogger("trellis.test").info(
        "catalog.views_changed revision=%d identities=%s took_ms=%.1f reason=%r ok=%s mode=fast",
        7,
        12,
        3.14159,
        "a reason, with spaces",
        True,
    )

    [line] = stderr_lines(capsys)
    payload = json.loads(line)
    assert payload["event"] == "catalog.views_changed"
    assert payload["revision"] == 7
    assert payload["identities"] == 12
    assert payload["took_ms"] == 3.1
    assert payload["reason"] == "'a reason, with spaces'"
    assert payload["ok"] is True
    assert payload["mode"] == "fast"
    assert payload["msg"].startswith("catalog.views_changed revision=7 identities=12")


def test_a_field_named_like_a_line_key_does_not_overwrite_it(
    configure: Configure, capsys: pytest.CaptureFixture[str]
) -> None:
    configure("json")

    logging.getLogger("trellis.test").warning("odd.line level=%s msg=%s", "x", "y")

    payload = json.loads(stderr_lines(capsys)[0])
    assert (payload["level"], payload["field_level"], payload["field_msg"]) == ("warning", "x", "y")


def test_the_writer_thread_writes_every_line_in_order_and_flush_waits_for_them() -> None:
    stream = io.StringIO()
    handler = logs.WriterThreadHandler(stream)
    handler.setFormatter(logs.KeyValueFormatter())
    logger = logging.getLogger("test.writer")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        for i in range(500):
            logger.warning("line.%d n=%d", i, i)
        handler.flush()
        lines = stream.getvalue().splitlines()
        assert [line.rsplit(" ", 2)[1] for line in lines] == [f"line.{i}" for i in range(500)]
        # formatted when logged: a later change to an argument does not show
        changing = ["before"]
        logger.warning("args.captured value=%s", changing)
        changing[0] = "after"
        handler.flush()
        assert stream.getvalue().splitlines()[-1].endswith("value=['before']")
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert not handler._writer.is_alive()  # close ended its thread
    handler.flush()  # and a flush after it returns at once


def test_a_stream_that_fails_never_blocks_the_writers() -> None:
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("stderr is gone")

    handler = logs.WriterThreadHandler(Broken())
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "lost.line", None, None)
    handler.emit(record)
    handler.flush()  # returns: the line was dropped, not retried forever
    handler.close()
