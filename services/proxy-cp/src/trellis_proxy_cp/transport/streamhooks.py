"""How the rest of proxy-cp learns what happens on xDS streams: :class:`StreamHooks`.

The hooks feed the metrics, the catalog's RegisterProxy and the admin API. They are called
synchronously on the stream's task and must not block: schedule I/O elsewhere. An
exception in a hook is logged and ignored (:class:`SafeHooks`), never allowed to end the
stream. :class:`NoHooks` does nothing, for a server that needs none.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from trellis_proxy_cp.types import TypeUrl

if TYPE_CHECKING:
    from trellis_proxy_cp.transport.streams import ProxyStream, StreamRefused

log = logging.getLogger(__name__)


class StreamHooks(Protocol):
    def on_refused(self, proxy_id: str, protocol: str, refused: StreamRefused) -> None:
        """A stream was refused or ended for ``refused`` (``proxy_id``: the certificate's
        common name or, before authorization, the node id the proxy claims)."""
        ...

    def on_open(self, stream: ProxyStream) -> None: ...
    def on_close(self, stream: ProxyStream) -> None: ...
    def on_sent(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None: ...
    def on_ack(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None: ...
    def on_nack(
        self, stream: ProxyStream, type_url: TypeUrl, version: str, error_message: str
    ) -> None: ...


class NoHooks:
    """Hooks that do nothing."""

    def on_refused(self, proxy_id: str, protocol: str, refused: StreamRefused) -> None:
        pass

    def on_open(self, stream: ProxyStream) -> None:
        pass

    def on_close(self, stream: ProxyStream) -> None:
        pass

    def on_sent(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None:
        pass

    def on_ack(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None:
        pass

    def on_nack(
        self, stream: ProxyStream, type_url: TypeUrl, version: str, error_message: str
    ) -> None:
        pass


class SafeHooks:
    """Wraps hooks so that an exception in one is logged instead of ending the stream."""

    def __init__(self, hooks: StreamHooks) -> None:
        self._hooks = hooks

    def _call(self, name: str, stream: ProxyStream, *args: str) -> None:
        try:
            getattr(self._hooks, name)(stream, *args)
        except Exception:
            log.exception("ads.hook_failed hook=%s proxy=%s", name, stream.proxy_id)

    def on_refused(self, proxy_id: str, protocol: str, refused: StreamRefused) -> None:
        try:
            self._hooks.on_refused(proxy_id, protocol, refused)
        except Exception:
            log.exception("ads.hook_failed hook=on_refused proxy=%s", proxy_id)

    def on_open(self, stream: ProxyStream) -> None:
        self._call("on_open", stream)

    def on_close(self, stream: ProxyStream) -> None:
        self._call("on_close", stream)

    def on_sent(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None:
        self._call("on_sent", stream, type_url, version)

    def on_ack(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None:
        self._call("on_ack", stream, type_url, version)

    def on_nack(
        self, stream: ProxyStream, type_url: TypeUrl, version: str, error_message: str
    ) -> None:
        self._call("on_nack", stream, type_url, version, error_message)
