"""Joining with a Kubernetes ServiceAccount token: checked by the API server (TokenReview).

In a pod, a component joins with its projected ServiceAccount token (audience
``join_audience``, ``trellis`` by default). certmanager does not read the token itself: it
asks the API server (``POST /apis/authentication.k8s.io/v1/tokenreviews``), which checks
its signature, expiry and audience, and answers who the token belongs to. The answer must
be a service account of the control plane's namespace whose name is a component's
(``system:serviceaccount:trellis-system:catalog``): that component is who joins. A token
works once, like a join token: its digest is spent in Redis until the token expires.

Every refusal names its reason (``not_authenticated``, ``wrong_audience``,
``not_control_plane``, ``not_a_component``); the API server being unreachable is not a
refusal but a 503, and the component retries.

A pod's agent enrolling its proxy is reviewed the same way
(:meth:`ServiceAccountReviewer.workload`):
the token must be bound to a pod (the API server then answers its name and uid, and stops
accepting the token once that pod is gone), and must not be of the control plane's
namespace (reasons ``not_bound``, ``control_plane_namespace``). Who the pod is comes from
that answer only, never from the pod's labels or annotations.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes import client

from trellis_certmanager.domain.errors import StoreUnavailable
from trellis_common import components

PREFIX = "system:serviceaccount:"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
#: How long a spent token is remembered when its own expiry cannot be read.
DEFAULT_SPENT_SECONDS = 3600


class ReviewRefused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BoundPod:
    """What a pod-bound token proves: the pod's namespace, ServiceAccount, name and uid."""

    namespace: str
    service_account: str
    pod_name: str
    pod_uid: str


class ServiceAccountReviewer:
    def __init__(
        self, api: client.ApiClient, audience: str, namespace: str, timeout: float = 5.0
    ) -> None:
        from kubernetes import client  # only a certmanager that reviews tokens

        self._api: Any = client.AuthenticationV1Api(api)
        self.audience = audience
        self.namespace = namespace
        self.timeout = timeout

    async def _review(self, token: str) -> dict[str, Any]:
        """The API server's ``status`` for ``token``, authenticated for our audience."""
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        try:
            response = await asyncio.to_thread(
                self._api.create_token_review,
                review,
                _request_timeout=self.timeout,
                _preload_content=False,
            )
            status: dict[str, Any] = json.loads(response.data).get("status") or {}
        except Exception as exc:  # the API server's trouble is not the caller's fault
            raise StoreUnavailable(f"cannot review the token with the API server: {exc}") from exc
        if not status.get("authenticated"):
            error = status.get("error") or "not authenticated"
            reason = "wrong_audience" if "audience" in error else "not_authenticated"
            raise ReviewRefused(reason, f"service account token refused: {error}")
        if self.audience not in (status.get("audiences") or []):
            raise ReviewRefused(
                "wrong_audience", f"service account token is not for audience {self.audience!r}"
            )
        return status

    async def component(self, token: str) -> str:
        """The component ``token`` belongs to, as the API server says."""
        status = await self._review(token)
        username = (status.get("user") or {}).get("username") or ""
        namespace, _, account = username.removeprefix(PREFIX).partition(":")
        if not username.startswith(PREFIX) or namespace != self.namespace:
            raise ReviewRefused(
                "not_control_plane",
                f"{username or 'the token'} is not a service account of {self.namespace}",
            )
        if account not in components.COMPONENTS:
            raise ReviewRefused(
                "not_a_component", f"service account {account!r} is no control plane component"
            )
        return account

    async def workload(self, token: str) -> BoundPod:
        """The pod ``token`` is bound to, as the API server says."""
        status = await self._review(token)
        user = status.get("user") or {}
        username = user.get("username") or ""
        namespace, _, account = username.removeprefix(PREFIX).partition(":")
        if not username.startswith(PREFIX) or not namespace or not account:
            raise ReviewRefused(
                "not_a_service_account", f"{username or 'the token'} is not a ServiceAccount's"
            )
        if namespace == self.namespace:
            raise ReviewRefused(
                "control_plane_namespace",
                f"{username} is of the control plane's namespace: no proxy is enrolled in it",
            )
        extra = user.get("extra") or {}
        names, uids = extra.get(POD_NAME) or [], extra.get(POD_UID) or []
        if len(names) != 1 or len(uids) != 1:
            raise ReviewRefused(
                "not_bound",
                f"{username}'s token is not bound to a pod: mount a projected "
                "serviceAccountToken (the kubelet binds it to the pod)",
            )
        return BoundPod(namespace, account, str(names[0]), str(uids[0]))


def spent_key_and_expiry(token: str) -> tuple[str, int]:
    """A digest to spend the token under (never the token), and until when to keep it."""
    digest = hashlib.sha256(token.encode()).hexdigest()
    expires = int(time.time()) + DEFAULT_SPENT_SECONDS
    parts = token.split(".")
    if len(parts) == 3:
        try:
            padded = parts[1] + "=" * (-len(parts[1]) % 4)
            claims = json.loads(base64.urlsafe_b64decode(padded))
            expires = int(claims["exp"])
        except (ValueError, KeyError, TypeError):
            pass  # the API server accepted it; remember it for the default time
    return f"sa-{digest}", expires
