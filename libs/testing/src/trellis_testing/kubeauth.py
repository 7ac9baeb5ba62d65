"""ServiceAccount tokens and TokenReview for the test API server.

A real API server signs projected ServiceAccount tokens (JWTs) and answers
``POST /apis/authentication.k8s.io/v1/tokenreviews`` about them. :class:`TokenAuthority`
does both for tests: :meth:`issue` makes a JWT-shaped token for a namespace, service
account, audiences and lifetime (its signature is random: only this authority knows it),
and :meth:`review` answers a TokenReview the way the API server does: authenticated with
the user ``system:serviceaccount:<ns>:<sa>``, its groups and the audiences that matched,
or not authenticated with the API server's error text (unknown token, expired, wrong
audience).

A token may be bound to a pod (its name and uid), as the kubelet's projected tokens are:
its claims then name the pod, a review answers the pod in ``status.user.extra`` (as
Kubernetes 1.30+ does), and the token stops working once that pod is gone from the API's
store or was recreated under another uid. The authority asks the store through
``pod_uid``, which the API server (:mod:`trellis_testing.kubeserver`) wires to its
own; an authority on its own knows no pods.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The issuer, and the audience a TokenRequest gets when it names none (the API server's).
API_SERVER = "https://kubernetes.default.svc.cluster.local"
_EXTRA = "authentication.kubernetes.io/"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class Issued:
    """What the authority knows of a token it issued."""

    namespace: str
    service_account: str
    uid: str
    audiences: tuple[str, ...]
    expires_at: float
    jti: str
    pod: tuple[str, str] | None  # (name, uid) of the pod the token is bound to


def _no_pods(namespace: str, name: str) -> str | None:
    return None


@dataclass
class TokenAuthority:
    """Issues ServiceAccount tokens and reviews them.

    ``pod_uid(namespace, name)`` answers the uid of that pod as the API's store holds it, or
    None when there is no such pod: a pod-bound token is good only while it answers the
    uid the token was bound to.
    """

    pod_uid: Callable[[str, str], str | None] = _no_pods
    tokens: dict[str, Issued] = field(default_factory=dict)
    reviews: int = 0

    def issue(
        self,
        namespace: str,
        service_account: str,
        *,
        audiences: tuple[str, ...] = ("trellis",),
        lifetime: float = 600.0,
        pod: tuple[str, str] | None = None,
        account_uid: str | None = None,
    ) -> str:
        """A token for ``service_account`` of ``namespace`` (whose uid is ``account_uid``,
        made up if not given), for ``audiences``, good for ``lifetime`` seconds; bound to
        ``pod`` (its name and uid) if given."""
        now = time.time()
        issued = Issued(
            namespace,
            service_account,
            account_uid or str(uuid.uuid4()),
            audiences,
            now + lifetime,
            str(uuid.uuid4()),
            pod,
        )
        kubernetes: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": service_account, "uid": issued.uid},
        }
        if pod is not None:
            kubernetes["pod"] = {"name": pod[0], "uid": pod[1]}
        claims = {
            "iss": API_SERVER,
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "aud": list(audiences),
            "iat": int(now),
            "nbf": int(now),
            "exp": int(issued.expires_at),
            "jti": issued.jti,
            "kubernetes.io": kubernetes,
        }
        header = {"alg": "RS256", "kid": "emulator"}
        token = ".".join(
            [
                _b64(json.dumps(header).encode()),
                _b64(json.dumps(claims).encode()),
                _b64(secrets.token_bytes(64)),
            ]
        )
        self.tokens[token] = issued
        return token

    def review(self, body: Any) -> dict[str, Any]:
        self.reviews += 1
        spec = (body or {}).get("spec") or {}
        token = spec.get("token") or ""
        wanted = spec.get("audiences") or []
        answer: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
        }
        issued = self.tokens.get(token)
        if issued is None:
            answer["status"] = {"authenticated": False, "error": "invalid bearer token"}
            return answer
        if issued.expires_at <= time.time():
            answer["status"] = {"authenticated": False, "error": "Token has expired."}
            return answer
        matched = [a for a in wanted if a in issued.audiences] if wanted else []
        if wanted and not matched:
            answer["status"] = {
                "authenticated": False,
                "error": "[invalid bearer token, token audiences "
                f"{list(issued.audiences)} is invalid for the target audiences {wanted}]",
            }
            return answer
        invalid = self._invalid_binding(issued)
        if invalid:
            answer["status"] = {
                "authenticated": False,
                "error": f"[invalid bearer token, {invalid}]",
            }
            return answer
        answer["status"] = {
            "authenticated": True,
            "user": {
                "username": f"system:serviceaccount:{issued.namespace}:{issued.service_account}",
                "uid": issued.uid,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{issued.namespace}",
                    "system:authenticated",
                ],
                "extra": _extra(issued),
            },
            "audiences": matched or list(issued.audiences),
        }
        return answer

    def _invalid_binding(self, issued: Issued) -> str | None:
        """Why a pod-bound token no longer holds (the API server's words), or None."""
        if issued.pod is None:
            return None
        name, uid = issued.pod
        current = self.pod_uid(issued.namespace, name)
        if current is None:
            return "service account token has been invalidated"
        if current != uid:
            return f"pod UID ({current}) does not match service account pod ref claim ({uid})"
        return None


def _extra(issued: Issued) -> dict[str, list[str]]:
    """``user.extra`` as Kubernetes 1.30+ answers it: the token's id, and its pod if bound."""
    extra = {f"{_EXTRA}credential-id": [f"JTI={issued.jti}"]}
    if issued.pod is not None:
        extra[f"{_EXTRA}pod-name"] = [issued.pod[0]]
        extra[f"{_EXTRA}pod-uid"] = [issued.pod[1]]
    return extra
