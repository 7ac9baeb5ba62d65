"""Answering one AdmissionReview: decide, onboard the pod's proxy, store its Secret, patch.

:class:`SidecarInjector` is what ``POST /mutate`` calls with a parsed review. It never
raises for a review it can read, and it answers within the time it is given (the API
server's ``?timeout=`` less a margin, at most the ``webhook_timeout`` setting):

* not a pod CREATE: allowed, untouched (``ignored``);
* the pod opts out, already has ``envoy``, or uses the node's network: allowed, untouched
  (``skipped_opt_out``, ``skipped_already``, ``skipped_host_network``);
* a bad annotation or a pod whose names clash with the sidecar's: denied with the reason
  (``denied_invalid``), before any certificate is issued;
* otherwise the proxy is onboarded through the same :class:`~trellis_injector.onboarder.Onboarder`
  as a VM's (the injector makes the key, certmanager signs the CSR, the catalog is told to
  expect the proxy), its files go into a Secret in the pod's namespace, and the answer is
  the patch (``injected``).

When that cannot be done in time (certmanager, the catalog or the API server down or slow)
the answer follows the failure policy (``failure_policy`` setting, which should match the
MutatingWebhookConfiguration's ``failurePolicy``): ``Fail`` denies the pod with a message
naming what is down (its controller retries), ``Ignore`` lets it run without a sidecar with
a warning. Either way it is logged and counted as ``error``. Without a Kubernetes API (a
local ``trellis up``) the patch is still made, and the Secret is not: logged, counted
(``trellis_injector_proxy_secrets_total{outcome="skipped"}``) and said in a warning.

A ``dryRun`` review issues nothing and stores nothing: its patch carries a fresh UUID.
Nothing here logs a key.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Literal, Protocol

from trellis_common.kube import injection
from trellis_injector.domain import admission
from trellis_injector.domain.admission import Review
from trellis_injector.domain.injection import (
    InvalidPod,
    Sidecar,
    check_pod,
    pod_patch,
    proxy_id_of,
    proxy_request,
    secret,
)
from trellis_injector.domain.onboarding import InvalidOnboarding
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.onboarder import Onboarder, Refused, Unavailable

log = logging.getLogger(__name__)

FailurePolicy = Literal["Fail", "Ignore"]

#: Left of the API server's timeout for the answer to travel back.
MARGIN = 0.5


class SecretFailed(Exception):
    """The API server did not store the proxy's Secret."""


class SecretStore(Protocol):
    async def create_secret(self, namespace: str, body: dict[str, Any]) -> None:
        """Create the Secret ``body`` in ``namespace``; :class:`SecretFailed` if not done."""
        ...


class SidecarInjector:
    def __init__(
        self,
        onboarder: Onboarder,
        secrets: SecretStore | None,
        sidecar: Sidecar,
        metrics: InjectorMetrics,
        *,
        failure_policy: FailurePolicy = "Fail",
        timeout: float = 8.0,
    ) -> None:
        self._onboarder = onboarder
        #: None without a Kubernetes API: patches are made, Secrets are not stored
        self.secrets = secrets
        self._sidecar = sidecar
        self._metrics = metrics
        self.failure_policy = failure_policy
        self.timeout = timeout

    def budget(self, api_server_timeout: float | None) -> float:
        """Seconds this review may take: the setting, within the API server's timeout."""
        if api_server_timeout is None:
            return self.timeout
        return max(0.1, min(self.timeout, api_server_timeout - MARGIN))

    async def review(
        self, review: Review, api_server_timeout: float | None = None
    ) -> dict[str, Any]:
        started = time.monotonic()
        budget = self.budget(api_server_timeout)
        try:
            outcome, answer = await self._review(review, budget)
        except Exception as exc:  # a bug must still get an answer, not a 500
            log.exception("webhook.unexpected uid=%s", review.uid)
            outcome, answer = self._failed(review.uid, f"uid={review.uid}", exc, budget)
        self._metrics.admissions.labels(outcome).inc()
        self._metrics.admission_seconds.observe(time.monotonic() - started)
        return answer

    async def _review(self, review: Review, budget: float) -> tuple[str, dict[str, Any]]:
        uid, pod = review.uid, review.obj
        where = f"namespace={review.namespace} pod={review.pod_name} uid={uid}"
        if not review.is_pod_create:
            kind, operation = review.kind, review.operation
            log.info("webhook.ignored %s kind=%s operation=%s", where, kind, operation)
            return "ignored", admission.allow(uid)
        decision = injection.decide(pod)
        if decision.outcome == "denied_invalid":
            return self._invalid(uid, where, decision.reason)
        if not decision.inject:
            log.info("webhook.%s %s reason=%r", decision.outcome, where, decision.reason)
            return decision.outcome, admission.allow(uid)
        try:
            check_pod(pod)
            request = proxy_request(pod, review.namespace, self._sidecar)
        except InvalidPod as exc:
            return self._invalid(uid, where, str(exc))
        if review.dry_run:
            patch = pod_patch(pod, self._sidecar, str(uuid.uuid4()), decision.exclusions)
            log.info("webhook.dry_run %s", where)
            warning = (
                "dry run: no proxy was onboarded, and MeshConfig's sidecar settings were not read"
            )
            return "injected", admission.allow(uid, patch, [warning])
        try:
            async with asyncio.timeout(budget):
                onboarded, key_pem = await self._onboarder.onboard_with_local_key(request)
                proxy_id = proxy_id_of(onboarded.common_name)
                warnings = await self._store(review.namespace, secret(onboarded, key_pem), where)
        except InvalidOnboarding as exc:
            return self._invalid(uid, where, str(exc))
        except (Unavailable, Refused, SecretFailed, TimeoutError) as exc:
            return self._failed(uid, where, exc, budget)
        mesh = onboarded.sidecar  # MeshConfig's, merged with the pod's own (as OSM does)
        exclusions = mesh.exclusions.union(decision.exclusions)
        patch = pod_patch(pod, self._sidecar, proxy_id, exclusions, mesh.log_level)
        log.info(
            "webhook.injected %s proxy=%s identity=%s",
            where,
            onboarded.common_name,
            request.identity,
        )
        return "injected", admission.allow(uid, patch, warnings)

    async def _store(self, namespace: str, body: dict[str, Any], where: str) -> list[str]:
        name = body["metadata"]["name"]
        if self.secrets is None:
            self._metrics.proxy_secrets.labels("skipped").inc()
            log.warning("webhook.secret_skipped %s secret=%s reason=no-kubernetes-api", where, name)
            return [f"no Kubernetes API: the proxy's Secret {name} was not created"]
        try:
            await self.secrets.create_secret(namespace, body)
        except SecretFailed:
            self._metrics.proxy_secrets.labels("failed").inc()
            raise
        self._metrics.proxy_secrets.labels("created").inc()
        return []

    def _invalid(self, uid: str, where: str, reason: str) -> tuple[str, dict[str, Any]]:
        log.warning("webhook.denied %s reason=%r", where, reason)
        return "denied_invalid", admission.deny(uid, 400, f"trellis sidecar injection: {reason}")

    def _failed(
        self, uid: str, where: str, exc: Exception, budget: float
    ) -> tuple[str, dict[str, Any]]:
        reason = f"not done within {budget:.1f}s" if isinstance(exc, TimeoutError) else str(exc)
        log.error(
            "webhook.failed %s reason=%r failure_policy=%s", where, reason, self.failure_policy
        )
        if self.failure_policy == "Ignore":
            return "error", admission.allow(
                uid,
                warnings=[f"trellis: no sidecar injected ({reason}); the pod is outside the mesh"],
            )
        return "error", admission.deny(
            uid,
            500,
            f"trellis sidecar injection failed: {reason} (failure policy Fail: the pod is "
            "refused until the injector can onboard its proxy)",
        )
