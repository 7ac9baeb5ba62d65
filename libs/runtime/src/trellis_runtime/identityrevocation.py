"""Revoked control plane certificates, as every component knows them.

certmanager owns the list (``ListRevokedComponentCertificates``) and signals each change on
the topic ``identities`` (kind ``revoked``, key: the component). Every other component
follows it through the one event path (:class:`RevokedIdentities`: a full read on every
resync and on every signal; the list is short, one entry per revoked certificate until it
expires) and its :class:`~trellis_identity.authz.Authorizer` refuses a call made with a
revoked serial (reason ``revoked``). certmanager checks its own list in process.

A component that finds its own serial in the list cannot make a call any other component
accepts, nor renew: it says so (``identity.revoked``) and exits, so that its supervisor
starts it again with a new join token and a new key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from trellis_identity.tls import serial_of as serial_of
from trellis_runtime.events import Follower
from trellis_runtime.signaling import Event

log = logging.getLogger(__name__)

IDENTITIES_TOPIC = "identities"

Fetch = Callable[[], Awaitable[dict[str, str]]]  # serial (lowercase hex) -> component


class IdentityRevoked(RuntimeError):
    """This component's own certificate was revoked."""


class RevokedIdentities(Follower):
    topics = (IDENTITIES_TOPIC,)

    def __init__(self, fetch: Fetch, own_serial: Callable[[], str]) -> None:
        super().__init__("revoked identities")
        self._fetch = fetch
        self._own_serial = own_serial
        self.serials: dict[str, str] = {}
        self.own_revoked = asyncio.Event()

    def __contains__(self, serial: object) -> bool:
        return serial in self.serials

    async def resync(self, topic: str) -> None:
        await self._refresh()

    async def changed(self, event: Event) -> None:
        await self._refresh()

    async def _refresh(self) -> None:
        self.serials = await self._fetch()
        self.synced.set()
        own = self._own_serial()
        if own in self.serials and not self.own_revoked.is_set():
            log.critical(
                "identity.revoked component=%s serial=%s action=exiting "
                "reason='an operator revoked this certificate; a restart joins with a new key'",
                self.serials[own],
                own,
            )
            self.own_revoked.set()

    async def exit_when_revoked(self, stop: asyncio.Event) -> None:
        """A part of the service: ends it (an error) once its own certificate is revoked."""
        waits = {asyncio.ensure_future(self.own_revoked.wait()), asyncio.ensure_future(stop.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if self.own_revoked.is_set():
            raise IdentityRevoked(f"certificate {self._own_serial()} was revoked")
