"""The injector's one write to the Kubernetes API: the webhook's caBundle.

It goes through the official (synchronous) ``kubernetes`` client, in a worker thread, with
a request timeout, so a slow API server never blocks the event loop nor holds an
AdmissionReview past its deadline.

The caBundle: the API server checks the webhook's serving certificate (the injector's
component certificate, from certmanager, renewed on its own) against the
MutatingWebhookConfiguration's ``webhooks[].clientConfig.caBundle``. That must be the mesh's
trust bundle, which changes only when the CA rotates; a renewal of the serving certificate
alone changes nothing there. :class:`CaBundleSync` writes the current bundle into every
webhook of the named configuration at start, after each renewal of the identity (the
bundle comes with it), and every ``resync`` seconds (a ``helm upgrade`` may have reset it).
A failure raises, so the supervisor retries it with backoff and ``/readyz`` shows the loop
down meanwhile. The configuration is read as plain JSON (not the client's models, which
refuse a field they do not know) and patched with RFC 6902 ``replace``/``add`` operations,
each guarded by a ``test`` of the webhook's name, so a configuration changed in between is
not written blindly.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from trellis_injector.metrics import InjectorMetrics
from trellis_kube import objects

log = logging.getLogger(__name__)


def _reason(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


def ca_bundle_patch(configuration: dict[str, Any], bundle: str) -> list[dict[str, Any]]:
    """The operations that set ``bundle`` (base64) on every webhook lacking it."""
    ops: list[dict[str, Any]] = []
    for index, webhook in enumerate(configuration.get("webhooks") or []):
        if not isinstance(webhook, dict):
            continue
        config = webhook.get("clientConfig")
        if isinstance(config, dict) and config.get("caBundle") == bundle:
            continue
        ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook.get("name")})
        if isinstance(config, dict):
            ops.append(
                {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": bundle}
            )
        else:
            value = {"caBundle": bundle}
            ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig", "value": value})
    return ops


class CaBundleSync:
    """Keeps the named MutatingWebhookConfiguration's caBundle on the mesh trust bundle."""

    def __init__(
        self,
        api: client.ApiClient,
        name: str,
        trust_bundle: Callable[[], bytes],
        metrics: InjectorMetrics,
        *,
        timeout: float = 5.0,
        resync: float = 300.0,
    ) -> None:
        self._client = api
        self._api = client.AdmissionregistrationV1Api(api)
        self.name = name
        self._trust_bundle = trust_bundle
        self._metrics = metrics
        self._timeout = timeout
        self._resync = resync
        self._wake = asyncio.Event()

    def renewed(self) -> None:
        """The identity was renewed (its trust bundle may be new): sync now."""
        self._wake.set()

    def _sync(self) -> int | None:
        """Webhooks patched; None when the configuration does not exist."""
        bundle = base64.b64encode(self._trust_bundle()).decode()
        found = objects.read_mutating_webhook_configuration(self._client, self.name, self._timeout)
        if found is None:
            return None
        ops = ca_bundle_patch(found, bundle)
        if ops:
            self._api.patch_mutating_webhook_configuration(
                self.name, ops, _request_timeout=self._timeout, _preload_content=False
            )
        return sum(1 for op in ops if op["op"] == "add")

    async def sync(self) -> None:
        """One sync; raises (and counts) if the API server did not take it."""
        try:
            patched = await asyncio.to_thread(self._sync)
        except Exception as exc:  # counted and raised: the supervisor retries, /readyz shows it
            self._metrics.ca_bundle_patches.labels("failed").inc()
            log.error(
                "webhook.ca_bundle_failed configuration=%s reason=%r", self.name, _reason(exc)
            )
            raise
        if patched is None:
            # nothing to keep in step: a cluster without the chart's configuration, or a
            # local API server; said and counted each time, not a failure of the injector
            self._metrics.ca_bundle_patches.labels("missing").inc()
            log.warning(
                "webhook.ca_bundle_missing configuration=%s reason='the "
                "MutatingWebhookConfiguration does not exist (the Helm chart makes it; the "
                "webhook_configuration setting names it)'",
                self.name,
            )
            return
        self._metrics.ca_bundle_patches.labels("patched" if patched else "unchanged").inc()
        log.info(
            "webhook.ca_bundle_synced configuration=%s webhooks_patched=%d", self.name, patched
        )

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            await self.sync()
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            try:
                await asyncio.wait(waits, timeout=self._resync, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
