"""TLS handshakes the process refused, seen: gRPC's core reports them on stderr only.

A caller without a certificate, with one of a foreign CA, or with an expired one never
reaches Python: gRPC's TLS layer (C core) refuses the handshake and writes one line to the
process's stderr (``Handshake failed with error SSL_ERROR_SSL: ...: certificate has
expired``). To log and count those refusals like every other, :class:`HandshakeTap` puts a
pipe in front of file descriptor 2: a thread copies every byte through to the real stderr
unchanged, and for each handshake failure it sees, logs ``tls.handshake_failed reason=...``
and counts ``trellis_tls_handshake_failures_total{reason}``. The line does not name the
peer, and it is the same whichever side of the connection failed (a server refusing a
client, or this process refusing a server it called); the reason says what was wrong.
gRPC writes these lines at info level: the launchers (``trellis up``, the test harness, the
Helm chart) run services with ``GRPC_VERBOSITY=INFO``, and ``GRPC_VERBOSITY=ERROR`` would hide
them. The raw line is replaced by the structured one, and gRPC's note that info level is
"not suitable for production" is dropped; every other line passes unchanged.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import re
import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

_ADVICE = b"is not suitable for production"
_LINE = re.compile(rb"Handshake failed with (?:fatal )?error (\w+)(?:: (.*))?")

#: (what OpenSSL says, the reason counted), first match wins.
REASONS: tuple[tuple[bytes, str], ...] = (
    (b"PEER_DID_NOT_RETURN_A_CERTIFICATE", "no_certificate"),
    (b"certificate has expired", "expired"),
    (b"certificate is not yet valid", "not_yet_valid"),
    (b"unable to get local issuer certificate", "unknown_ca"),
    (b"self-signed certificate", "unknown_ca"),
    (b"self signed certificate", "unknown_ca"),
    (b"certificate signature failure", "unknown_ca"),  # another CA of the same name
    (b"certificate revoked", "revoked"),
    (b"WRONG_VERSION_NUMBER", "not_tls"),
    (b"HTTP_REQUEST", "not_tls"),
)


def reason_of(line: bytes) -> str | None:
    """The reason a gRPC core line reports a failed handshake for, else ``None``."""
    found = _LINE.search(line)
    if found is None:
        return None
    for words, reason in REASONS:
        if words in line:
            return reason
    return "other"


class HandshakeTap(Collector):
    """See the module docstring; :meth:`install` once per process, before gRPC starts."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._installed = False
        self._to_log: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()

    def install(self, fd: int = 2) -> None:
        if self._installed:
            return
        real = os.dup(fd)
        read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        thread = threading.Thread(
            target=self._pump, args=(read, real), name="stderr-tap", daemon=True
        )
        thread.start()
        threading.Thread(target=self._log, name="stderr-tap-log", daemon=True).start()
        self._installed = True

        def drain() -> None:
            """At exit: put stderr back, and let the thread copy what is still in the pipe
            (a traceback written just before the end must not be lost)."""
            os.dup2(real, fd)  # the pipe's last writer is gone: the thread reads to its end
            thread.join(timeout=2.0)

        atexit.register(drain)

    def _pump(self, read: int, real: int) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(read, 65536)
            except OSError:
                return
            if not chunk:
                if pending:
                    self._copy(real, pending)
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > 65536:  # no newline in sight: pass it on as it is
                self._copy(real, pending)
                pending = b""
            kept = [line for line in lines if self._keep(line)]
            if kept:
                self._copy(real, b"".join(line + b"\n" for line in kept))

    @staticmethod
    def _copy(real: int, data: bytes) -> None:
        with contextlib.suppress(OSError):  # stderr closed: drain, so writers never block
            os.write(real, data)

    def _keep(self, line: bytes) -> bool:
        """Whether to copy ``line`` through: a handshake failure is replaced by the
        structured line :meth:`seen` logs, and gRPC's advice against the info level it
        runs at (so that these lines are written) is dropped."""
        if _ADVICE in line:
            return False
        return not self.seen(line)

    def seen(self, line: bytes) -> bool:
        """Count and log ``line`` if it reports a failed handshake (then True)."""
        reason = reason_of(line)
        if reason is None:
            return False
        with self._lock:
            self.counts[reason] += 1
        detail = line.split(b"Handshake failed with", 1)[1][:200].decode(errors="replace")
        # Logged from another thread: the log line goes to stderr, which is this thread's
        # pipe, and a thread that writes to the pipe it alone drains could block forever.
        self._to_log.put((reason, detail.strip()))
        return True

    def _log(self) -> None:
        while True:
            reason, detail = self._to_log.get()
            log.warning("tls.handshake_failed reason=%s detail=%r", reason, detail)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "trellis_tls_handshake_failures",
            "TLS handshakes that failed in gRPC (a peer without a valid mesh certificate), "
            "by reason",
            labels=["reason"],
        )
        with self._lock:
            for reason, count in sorted(self.counts.items()):
                family.add_metric([reason], count)
        yield family


#: The process's tap (one stderr per process).
TAP = HandshakeTap()
