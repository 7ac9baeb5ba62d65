"""Answering one AdmissionReview: decide, prepare the pod's agent, patch. No side effects.

:class:`SidecarInjector` is what ``POST /mutate`` calls with a parsed review. It never
raises for a review it can read, and it answers within the time it is given (the API
server's ``?timeout=`` less a margin, at most the ``webhook_timeout`` setting):

* not a pod CREATE: allowed, untouched (``ignored``);
* the pod opts out, already has ``envoy``, or uses the node's network: allowed, untouched
  (``skipped_opt_out``, ``skipped_already``, ``skipped_host_network``);
* a review whose parts do not hold together (another namespace in the pod than in the
  request, not a v1 Pod, a sub-resource: what the API server never sends): denied
  (``denied_inconsistent``);
* a namespace the mesh does not monitor (with a Kubernetes API: the injector follows the
  monitored namespaces itself rather than trust that only the webhook's
  ``namespaceSelector`` sends pods): allowed, untouched (``skipped_unmonitored``); while that
  list is not yet read, the failure policy applies;
* a bad annotation or a pod whose names clash with the sidecar's: denied with the reason
  (``denied_invalid``);
* otherwise the answer is the patch (``injected``): the redirection, the pod's agent and
  Envoy (``domain/injection.py``). What the patch needs is read, never written: where
  proxy-cp's xDS and enrollment ports are, the mesh root the agent checks proxy-cp
  against (the injector's own trust bundle), and MeshConfig's sidecar settings (the
  catalog's ``GetSidecarSettings``).

The webhook issues no certificate and stores nothing, so ``sideEffects: None`` holds and a
``dryRun`` review is answered like any other. The pod's agent enrolls its proxy itself,
with the pod's own ServiceAccount token, once the pod runs (``trellis_cli.agent``).

When what the patch needs cannot be read in time (the catalog or proxy-cp's registration
down) the answer follows the failure policy (``failure_policy`` setting, which should match
the MutatingWebhookConfiguration's ``failurePolicy``): ``Fail`` denies the pod with a
message naming what is down (its controller retries), ``Ignore`` lets it run without a
sidecar with a warning. Either way it is logged and counted as ``error``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from trellis_injector.domain import admission
from trellis_injector.domain.admission import Review
from trellis_injector.domain.injection import (
    Agent,
    InvalidPod,
    Sidecar,
    check_pod,
    pod_patch,
    proxy_request,
)
from trellis_injector.domain.onboarding import (
    ControlPlane,
    InvalidOnboarding,
    MeshSidecar,
    ProxyRequest,
    XdsEndpoint,
    build_bootstrap,
)
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.onboarder import Refused, Unavailable
from trellis_kube import injection

log = logging.getLogger(__name__)

FailurePolicy = Literal["Fail", "Ignore"]

#: Left of the API server's timeout for the answer to travel back.
MARGIN = 0.5
#: The bootstrap's node id until the agent enrolls (the proxy certificate names the real one).
PENDING_NODE = "enrolling"


class ProxyCpLocator(Protocol):
    """Where proxies reach proxy-cp (``clients.XdsLocator``)."""

    async def xds_endpoint(self) -> XdsEndpoint: ...

    async def enroll_endpoint(self) -> XdsEndpoint: ...


class SidecarSettings(Protocol):
    """MeshConfig's sidecar settings (``clients.CatalogClient``)."""

    async def sidecar_settings(self) -> MeshSidecar: ...


class PodAgents:
    """Prepares a pod's agent: where to enroll, whom to trust, and its bootstrap."""

    def __init__(
        self,
        locator: ProxyCpLocator,
        catalog: SidecarSettings,
        trust_bundle: Callable[[], bytes],
        proxy_cp_spiffe_id: str,
        proxy_cp_name: str,
    ) -> None:
        self._locator = locator
        self._catalog = catalog
        self._trust_bundle = trust_bundle
        self._spiffe_id = proxy_cp_spiffe_id
        self._server_name = proxy_cp_name

    async def prepare(self, request: ProxyRequest) -> tuple[Agent, MeshSidecar]:
        xds = await self._locator.xds_endpoint()
        enroll = await self._locator.enroll_endpoint()
        mesh = await self._catalog.sidecar_settings()
        bootstrap = build_bootstrap(request, PENDING_NODE, ControlPlane(xds, self._spiffe_id))
        agent = Agent(
            address=str(enroll),
            server_name=self._server_name,
            ca_pem=self._trust_bundle().decode(),
            service=request.service,
            bootstrap=bootstrap,
        )
        return agent, mesh


class Agents(Protocol):
    async def prepare(self, request: ProxyRequest) -> tuple[Agent, MeshSidecar]: ...


class SidecarInjector:
    def __init__(
        self,
        agents: Agents,
        sidecar: Sidecar,
        metrics: InjectorMetrics,
        *,
        failure_policy: FailurePolicy = "Fail",
        timeout: float = 8.0,
        monitored: Callable[[str], bool | None] | None = None,
    ) -> None:
        self._agents = agents
        #: namespace -> monitored (None: not known yet); None without a Kubernetes API
        self._monitored = monitored
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
        inconsistent = review.inconsistency()
        if inconsistent is not None:
            log.warning("webhook.denied_inconsistent %s reason=%r", where, inconsistent)
            message = f"trellis sidecar injection: an inconsistent review: {inconsistent}"
            return "denied_inconsistent", admission.deny(uid, 400, message)
        if self._monitored is not None:
            monitored = self._monitored(review.namespace)
            if monitored is None:
                unknown = Unavailable("kubernetes", "the monitored namespaces are not read yet")
                return self._failed(uid, where, unknown, budget)
            if not monitored:
                log.warning("webhook.skipped_unmonitored %s", where)
                return "skipped_unmonitored", admission.allow(uid)
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
        try:
            async with asyncio.timeout(budget):
                agent, mesh = await self._agents.prepare(request)
        except InvalidOnboarding as exc:
            return self._invalid(uid, where, str(exc))
        except (Unavailable, Refused, TimeoutError) as exc:
            return self._failed(uid, where, exc, budget)
        exclusions = mesh.exclusions.union(decision.exclusions)  # MeshConfig's and the pod's
        patch = pod_patch(pod, self._sidecar, agent, exclusions, mesh.log_level)
        log.info(
            "webhook.injected %s service=%s service_account=%s enroll=%s%s",
            where,
            request.service,
            request.service_account,
            agent.address,
            " dry_run=true" if review.dry_run else "",
        )
        return "injected", admission.allow(uid, patch)

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
            "refused until the injector can reach the control plane)",
        )
