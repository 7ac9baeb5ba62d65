"""ServiceAccount tokens and TokenReview for the test API server.

A real API server signs projected ServiceAccount tokens (JWTs) and answers
``POST /apis/authentication.k8s.io/v1/tokenreviews`` about them. :class:`TokenAuthority`
does both for tests: :meth:`issue` makes a JWT-shaped token for a namespace, service
account, audiences and lifetime (its signature is random: only this authority knows it),
and :meth:`review` answers a TokenReview the way the API server does: authenticated with
the user ``system:serviceaccount:<ns>:<sa>``, its groups and the audiences that matched,
or not authenticated with the API server's error text (unknown token, expired, wrong
audience).
"""

from __future__ import annotations

import base64
import json
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class _Issued:
    namespace: str
    service_account: str
    uid: str
    audiences: tuple[str, ...]
    expires_at: float


@dataclass
class TokenAuthority:
    tokens: dict[str, _Issued] = field(default_factory=dict)
    reviews: int = 0

    def issue(
        self,
        namespace: str,
        service_account: str,
        *,
        audiences: tuple[str, ...] = ("trellis",),
        lifetime: float = 600.0,
    ) -> str:
        now = time.time()
        issued = _Issued(namespace, service_account, str(uuid.uuid4()), audiences, now + lifetime)
        claims = {
            "iss": "https://kubernetes.default.svc.cluster.local",
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "aud": list(audiences),
            "iat": int(now),
            "nbf": int(now),
            "exp": int(issued.expires_at),
            "jti": str(uuid.uuid4()),
            "kubernetes.io": {
                "namespace": namespace,
                "serviceaccount": {"name": service_account, "uid": issued.uid},
            },
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
            },
            "audiences": matched or list(issued.audiences),
        }
        return answer
