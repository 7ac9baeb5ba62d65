"""The injected proxies' Secrets, kept after admission: renewed before expiry, deleted once
their pod is gone.

**Renewal.** An injected proxy's certificate (its xDS client certificate) lives
``proxy_cert_validity`` (24 h by default), and its Secret volume is read-only: the pod
cannot renew it the way a VM's ``trellis proxy renew`` does. The injector does it for the
pod: once ``renew_fraction`` (2/3) of a certificate's lifetime has passed, it makes a new
key, has certmanager sign a CSR for the same proxy (``IssueCertificate``, proxy kind, the
same proxy UUID: certmanager revokes the old serial, one key per proxy) and patches the
Secret's certificate, key and trust bundle together. The kubelet swaps the files of a
Secret volume at once (a new ``..data`` directory), and Envoy's file-based SDS watches the
folder, so the new pair is used on the next connection. Between the revocation and the
kubelet's sync (about a minute) proxy-cp refuses the old certificate: the proxy's xDS
stream waits, while its data plane keeps serving with the configuration it has.

**Orphans.** At admission the pod has no uid yet, so the Secret cannot be owned by it;
a Secret whose ``trellis.dev/proxy-uuid`` no pod carries any more, and older than
``orphan_grace`` (the pod may not be created yet), is deleted.

Both read the Secrets and pods through informers (labelled ones only), and sweep every
``interval`` seconds; a failed renewal is logged and counted, and retried on the next
sweep. Nothing here logs a key.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

from cryptography import x509
from kubernetes import client

from trellis_common import ids
from trellis_common.identity import csr_for, new_key
from trellis_common.kube import injection
from trellis_common.kube.informer import Informer, Object
from trellis_common.lifecycle import run_components
from trellis_injector.domain.injection import MANAGED_BY
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.onboarder import CertificateIssuer

log = logging.getLogger(__name__)

CERT, KEY, BUNDLE = "cert.pem", "key.pem", "ca.pem"
SERVICE_ACCOUNT_ANNOTATION = "trellis.dev/proxy-service-account"


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def _pem(secret: Object, name: str) -> bytes:
    return base64.b64decode(((secret.get("data") or {}).get(name)) or "")


def renewal_due(cert_pem: bytes, fraction: float, now: dt.datetime) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= start + (end - start) * fraction


class ProxySecrets:
    def __init__(
        self,
        api: client.ApiClient,
        issuer: CertificateIssuer,
        metrics: InjectorMetrics,
        *,
        renew_fraction: float = 2 / 3,
        interval: float = 60.0,
        orphan_grace: float = 600.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._core: Any = client.CoreV1Api(api)
        self._issuer = issuer
        self._metrics = metrics
        self._fraction = renew_fraction
        self._interval = interval
        self._grace = orphan_grace
        self._timeout = timeout
        self._clock = clock
        self.secrets = Informer(
            "proxy-secrets",
            self._core.list_secret_for_all_namespaces,
            label_selector=_selector(MANAGED_BY),
        )
        self.pods = Informer(
            "proxy-pods", self._core.list_pod_for_all_namespaces,
            label_selector=injection.PROXY_UUID_LABEL,
        )  # fmt: skip

    async def run(self, stop: asyncio.Event) -> None:
        await run_components([self.secrets.run, self.pods.run, self._sweeping], stop)

    async def _sweeping(self, stop: asyncio.Event) -> None:
        await self.secrets.synced.wait()
        await self.pods.synced.wait()
        while not stop.is_set():
            await self.sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval)

    async def sweep(self) -> None:
        """Renew what is due, delete what is orphaned (one Secret's failure is its own)."""
        worn = {
            (p.get("metadata") or {}).get("labels", {}).get(injection.PROXY_UUID_LABEL)
            for p in self.pods.objects.values()
        }
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        for (namespace, name), secret in list(self.secrets.objects.items()):
            proxy_id = (
                (secret.get("metadata") or {}).get("labels", {}).get(injection.PROXY_UUID_LABEL)
            )
            try:
                if proxy_id not in worn and self._older_than_grace(secret, now):
                    await self._delete(namespace, name, proxy_id)
                elif renewal_due(_pem(secret, CERT), self._fraction, now):
                    await self._renew(namespace, name, secret)
            except Exception as exc:  # noqa: BLE001  # the next sweep tries again
                self._metrics.secret_upkeep.labels("failed").inc()
                log.warning(
                    "proxy_secret.upkeep_failed namespace=%s secret=%s error=%r",
                    namespace,
                    name,
                    str(exc),
                )

    def _older_than_grace(self, secret: Object, now: dt.datetime) -> bool:
        created = (secret.get("metadata") or {}).get("creationTimestamp")
        if not created:
            return False
        born = dt.datetime.fromisoformat(str(created).replace("Z", "+00:00"))
        return (now - born).total_seconds() >= self._grace

    async def _delete(self, namespace: str, name: str, proxy_id: str | None) -> None:
        await asyncio.to_thread(
            self._core.delete_namespaced_secret, name, namespace, _request_timeout=self._timeout
        )
        self._metrics.secret_upkeep.labels("orphan_deleted").inc()
        log.info(
            "proxy_secret.orphan_deleted namespace=%s secret=%s proxy=%s",
            namespace,
            name,
            proxy_id,
        )

    async def _renew(self, namespace: str, name: str, secret: Object) -> None:
        meta = secret.get("metadata") or {}
        common_name = ids.ProxyCommonName.parse(
            (meta.get("annotations") or {}).get("trellis.dev/proxy-common-name", "")
        )
        account = (meta.get("annotations") or {}).get(SERVICE_ACCOUNT_ANNOTATION, "")
        key_pem, key = new_key()
        issued = await self._issuer.issue_proxy_certificate(
            common_name.namespace,
            common_name.service,
            account,
            csr_for(key, common_name.format()),
            proxy_id=common_name.proxy_id,
        )
        data = {
            CERT: issued.cert_chain_pem.encode(),
            KEY: key_pem,
            BUNDLE: issued.trust_bundle_pem.encode(),
        }
        patch = {"data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
        await asyncio.to_thread(
            self._core.patch_namespaced_secret,
            name,
            namespace,
            patch,
            _request_timeout=self._timeout,
        )
        self._metrics.secret_upkeep.labels("renewed").inc()
        log.info(
            "proxy_secret.renewed namespace=%s secret=%s proxy=%s",
            namespace,
            name,
            common_name.format(),
        )
