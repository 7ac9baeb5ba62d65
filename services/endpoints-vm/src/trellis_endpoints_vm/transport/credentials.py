"""Who may register, heartbeat and deregister a workload, and the refusals of all others.

* **Register** (``POST /v1/workloads``): the admin token, or an onboarding token scoped to the
  workload's namespace, service and service account (:mod:`trellis_identity.onboarding`; the
  injector makes them, endpoints-vm reads them from Redis), for as many new workloads as it
  allows (uses counted here). A scoped token may not take over a workload of that name
  registered under another service account, nor register a workload for a service whose
  other workloads run under another account: the answer (409) names both accounts, so a
  token holder never moves a service's identity (and the policy that goes with it). The
  operator (admin token) may still give a service workloads of several accounts, as OSM
  allows.
* **Heartbeat**: only the workload's own heartbeat token, which its registration answered
  with. The admin token is refused (an operator has no business beating for a workload, and
  a leaked admin token must not keep a dead workload in service), as is another workload's
  token or an onboarding token.
* **Deregister**: the workload's own heartbeat token, or the admin token: operators keep a
  way to take any workload out (and to delete a stored record refused at load).

Each refusal is answered 401 (no token) or 403 naming why, logged
(``workload.refused operation=... reason=... workload=... token_id=...``; never a token)
and counted in ``trellis_endpoints_vm_credential_refusals_total{operation, reason}``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable

from trellis_endpoints_vm.domain.views import ServiceKey
from trellis_endpoints_vm.domain.workloads import Workload, holds_token
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_identity import onboarding
from trellis_identity.tokens import AdminToken

log = logging.getLogger(__name__)


class Reason(enum.StrEnum):
    """Refusals of heartbeat and deregistration credentials (registration's are
    :class:`~trellis_identity.onboarding.Refusal`)."""

    NO_TOKEN = "no-token"
    ADMIN_TOKEN = "admin-token"  # not a workload's credential
    WRONG_TOKEN = "wrong-token"  # another workload's, an onboarding token, or junk
    NO_HEARTBEAT_TOKEN = "no-heartbeat-token"  # stored before heartbeat tokens: register again
    OTHER_ACCOUNT = "other-service-account"  # a scoped token taking over another's workload
    SERVICE_ACCOUNT_MISMATCH = "service-account-mismatch"  # not the service's established one


class Refused(Exception):
    def __init__(self, status: int, reason: str, detail: str, token_id: str = "-") -> None:  # noqa: S107
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail
        self.token_id = token_id


class Credentials:
    def __init__(
        self, admin_token: AdminToken, tokens: onboarding.TokenStore, metrics: EndpointMetrics
    ) -> None:
        self._admin = admin_token
        self._tokens = tokens
        self._metrics = metrics

    def _is_admin(self, bearer: str) -> bool:
        return self._admin.matches(bearer)

    def _refuse(self, operation: str, workload_id: str, refused: Refused) -> Refused:
        self._metrics.credential_refusals.labels(operation, refused.reason).inc()
        log.warning(
            "workload.refused operation=%s reason=%s workload=%s token_id=%s detail=%r",
            operation,
            refused.reason,
            workload_id,
            refused.token_id,
            refused.detail,
        )
        return refused

    def _token_refused(self, workload_id: str, exc: onboarding.TokenRefused) -> Refused:
        """A registration's onboarding-token refusal, logged and counted."""
        refused = Refused(exc.status, exc.reason.value, exc.detail, exc.token_id)
        return self._refuse("register", workload_id, refused)

    async def registrant(self, bearer: str | None) -> onboarding.Caller:
        """The admin token or a valid onboarding token, checked before the body is read (a
        caller without one learns nothing about what it sent); :class:`Refused` otherwise."""
        try:
            return await onboarding.authenticate(bearer, self._admin, self._tokens)
        except onboarding.TokenRefused as exc:
            raise self._token_refused("-", exc) from None

    async def take_use(self, caller: onboarding.Caller, workload: Workload) -> None:
        """A scoped token's use, for a new workload; :class:`Refused` once they are spent."""
        if caller.token is None:
            return
        try:
            await self._tokens.take_use(caller.token)
        except onboarding.TokenRefused as exc:
            raise self._token_refused(workload.id, exc) from None

    def may_join(
        self,
        caller: onboarding.Caller,
        workload: Workload,
        members: Callable[[ServiceKey], Iterable[Workload]],
    ) -> None:
        """Refuse (409) a scoped token's workload whose account is not the one its services'
        other workloads (``members`` of each) run under. The operator may still give a
        service workloads of several accounts, as OSM allows (a TrafficTarget then admits
        each by its account). Only a scoped token's registration looks at the members, and
        only at those of its own services."""
        if caller.token is None:
            return
        account = workload.service_account or "default"
        for service in workload.services:
            established = sorted(
                {
                    o.service_account or "default"
                    for o in members(ServiceKey(workload.namespace, service))
                    if o.id != workload.id
                }
            )
            if established and account not in established:
                raise self._refuse(
                    "register",
                    workload.id,
                    Refused(
                        409,
                        Reason.SERVICE_ACCOUNT_MISMATCH,
                        f"service {workload.namespace}/{service} runs as service account "
                        f"{', '.join(repr(a) for a in established)}; workload {workload.id} "
                        f"asks for {account!r}: register it under that account, or as "
                        "another service",
                    ),
                )

    def may_register(
        self, caller: onboarding.Caller, workload: Workload, existing: Workload | None
    ) -> None:
        """A scoped token registers its own service's workloads only, and does not take
        over a workload registered under another service account; :class:`Refused`
        otherwise."""
        account = workload.service_account or "default"
        try:
            for service in workload.services or ("",):
                caller.check(workload.namespace, service, account)
        except onboarding.TokenRefused as exc:
            raise self._token_refused(workload.id, exc) from None
        previous = (existing.service_account or "default") if existing is not None else account
        if caller.token is not None and previous != account:
            raise self._refuse(
                "register",
                workload.id,
                Refused(
                    403,
                    Reason.OTHER_ACCOUNT,
                    f"workload {workload.id} is registered for service account {previous!r}: "
                    f"an onboarding token for {account!r} cannot replace it",
                    caller.token_id,
                ),
            )

    def may_beat(self, bearer: str | None, workload: Workload) -> None:
        """Only the workload's own heartbeat token."""
        refused = self._check_own(bearer, workload, admin_ok=False)
        if refused is not None:
            raise self._refuse("heartbeat", workload.id, refused)

    def may_beat_unknown(self, bearer: str | None, workload_id: str) -> None:
        """A heartbeat for no workload: 404 for a caller with a token, 401 without one (a
        caller without a token learns nothing)."""
        if not bearer:
            raise self._refuse("heartbeat", workload_id, _no_token())

    def may_deregister(
        self, bearer: str | None, workload: Workload | None, workload_id: str
    ) -> str:
        """The workload's heartbeat token, or the admin token; returns which."""
        if bearer and self._is_admin(bearer):
            return "admin"
        if not bearer:
            raise self._refuse("deregister", workload_id, _no_token())
        if workload is None:  # a record refused at load, or none: only operators
            refused = Refused(403, Reason.WRONG_TOKEN, "only the admin token removes this record")
            raise self._refuse("deregister", workload_id, refused)
        own = self._check_own(bearer, workload, admin_ok=True)
        if own is not None:
            raise self._refuse("deregister", workload_id, own)
        return "workload"

    def _check_own(self, bearer: str | None, workload: Workload, admin_ok: bool) -> Refused | None:
        if not bearer:
            return _no_token()
        if not admin_ok and self._is_admin(bearer):
            return Refused(
                403,
                Reason.ADMIN_TOKEN,
                f"the admin token does not heartbeat workload {workload.id}: send the "
                "workload's own heartbeat token",
                "admin",
            )
        if not workload.heartbeat_digest:
            return Refused(
                403,
                Reason.NO_HEARTBEAT_TOKEN,
                f"workload {workload.id} was registered before heartbeat tokens: register it "
                "again to get one",
            )
        if not holds_token(workload, bearer):
            return Refused(
                403,
                Reason.WRONG_TOKEN,
                f"this is not workload {workload.id}'s heartbeat token",
                onboarding.token_id(bearer) or "-",
            )
        return None


def _no_token() -> Refused:
    return Refused(
        401,
        Reason.NO_TOKEN,
        "send 'Authorization: Bearer <heartbeat token>': the token the workload's "
        "registration answered with (`trellis vm register` keeps it)",
    )
