"""``admission.k8s.io/v1`` AdmissionReview: reading a request, writing a response.

The API server POSTs ``{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
"request": {...}}``; the answer is an AdmissionReview of the same version whose
``response`` echoes ``request.uid`` and says ``allowed``, with, for a mutation,
``patchType: JSONPatch`` and ``patch`` (the base64 of the RFC 6902 operations), with
``status`` (code and message, shown to the user) for a denial, and with ``warnings``
(shown by kubectl) either way. The Python ``kubernetes`` client has no models for these:
they are plain dicts, checked here. A body that is not such a request is
:class:`MalformedReview`, whose message names what is missing (the webhook answers 400).

The request's ``timeout`` (the API server's ``?timeout=10s``, a Go duration) is parsed by
:func:`parse_timeout`, so the webhook can answer before the API server gives up.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"

#: Kubernetes warns that longer warnings may be truncated.
MAX_WARNING: Final = 256

_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_UNIT_SECONDS: Final = {
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "ns": 1e-9,
}


class MalformedReview(ValueError):
    """The body is not an AdmissionReview request this webhook can read."""


@dataclass(frozen=True, slots=True)
class Review:
    """What the webhook needs of one AdmissionReview request."""

    uid: str
    namespace: str
    operation: str
    kind: str  # the object's kind: "Pod"
    group: str
    obj: dict[str, Any] = field(repr=False)
    dry_run: bool = False
    version: str = "v1"
    resource: dict[str, Any] = field(default_factory=dict, repr=False)
    sub_resource: str = ""
    name: str = ""

    def inconsistency(self) -> str | None:
        """What in a pod CREATE does not hold together, as the API server would never send
        it (a forged review), or None. Checked again here rather than trusted."""
        meta = self.obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        problems = [
            (self.version != "v1", f"request.kind.version is {self.version!r}, not v1"),
            (
                bool(self.resource)
                and (self.resource.get("group"), self.resource.get("resource")) != ("", "pods"),
                f"request.resource is {self.resource!r}, not pods",
            ),
            (bool(self.sub_resource), f"request.subResource is {self.sub_resource!r}"),
            (not self.namespace, "request.namespace is empty"),
            (
                self.obj.get("kind", "Pod") != "Pod" or self.obj.get("apiVersion", "v1") != "v1",
                "request.object is not a v1 Pod",
            ),
            (
                meta.get("namespace", self.namespace) != self.namespace,
                f"the pod's namespace {meta.get('namespace')!r} is not the request's "
                f"{self.namespace!r}",
            ),
            (
                bool(self.name) and meta.get("name", self.name) != self.name,
                f"the pod's name {meta.get('name')!r} is not the request's {self.name!r}",
            ),
        ]
        found = [message for wrong, message in problems if wrong]
        return "; ".join(found) if found else None

    @property
    def is_pod_create(self) -> bool:
        return self.kind == "Pod" and self.group == "" and self.operation == "CREATE"

    @property
    def pod_name(self) -> str:
        """The pod's name, or its ``generateName`` prefix followed by ``*``."""
        metadata = self.obj.get("metadata")
        if not isinstance(metadata, dict):
            return "?"
        name = metadata.get("name") or ""
        return str(name) if name else f"{metadata.get('generateName') or ''}*"


def _field(holder: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = holder.get(key)
    if not isinstance(value, kind):
        raise MalformedReview(f"{where}{key} must be a {kind.__name__}, got {value!r:.60}")
    return value


def parse_review(body: Any) -> Review:
    """The request of an ``admission.k8s.io/v1`` AdmissionReview, checked."""
    if not isinstance(body, dict):
        raise MalformedReview("the body must be a JSON object (an AdmissionReview)")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != KIND:
        raise MalformedReview(
            f"expected apiVersion {API_VERSION} and kind {KIND}, got "
            f"{body.get('apiVersion')!r} and {body.get('kind')!r}"
        )
    request = _field(body, "request", dict, "")
    uid = _field(request, "uid", str, "request.")
    if not uid:
        raise MalformedReview("request.uid is empty")
    operation = _field(request, "operation", str, "request.")
    kind = _field(request, "kind", dict, "request.")
    obj = request.get("object")
    if operation in ("CREATE", "UPDATE") and not isinstance(obj, dict):
        raise MalformedReview(f"request.object must be an object for {operation}")
    namespace = request.get("namespace") or ""
    if not isinstance(namespace, str):
        raise MalformedReview("request.namespace must be a string")
    return Review(
        uid=uid,
        namespace=namespace,
        operation=operation,
        kind=str(kind.get("kind", "")),
        group=str(kind.get("group", "")),
        obj=obj if isinstance(obj, dict) else {},
        dry_run=request.get("dryRun") is True,
        version=str(kind.get("version", "v1")),
        resource=resource if isinstance(resource := request.get("resource"), dict) else {},
        sub_resource=str(request.get("subResource") or ""),
        name=str(request.get("name") or ""),
    )


def parse_timeout(text: str | None) -> float | None:
    """Seconds of a Go duration such as ``10s`` or ``1m30s``; None if absent or unreadable."""
    if not text:
        return None
    total, at = 0.0, 0
    for match in _DURATION.finditer(text):
        if match.start() != at:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        at = match.end()
    return total if at == len(text) and total > 0 else None


def _review(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _warnings(warnings: Sequence[str]) -> dict[str, Any]:
    return {"warnings": [w[:MAX_WARNING] for w in warnings]} if warnings else {}


def allow(
    uid: str, patch: list[dict[str, Any]] | None = None, warnings: Sequence[str] = ()
) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True, **_warnings(warnings)}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return _review(response)


def deny(uid: str, code: int, message: str, warnings: Sequence[str] = ()) -> dict[str, Any]:
    return _review(
        {
            "uid": uid,
            "allowed": False,
            "status": {"code": code, "message": message},
            **_warnings(warnings),
        }
    )
