"""Reading single objects from the API server as plain JSON.

The official client's models validate every field they know and refuse what does not fit
(see ``shared/notes/kubernetes-testing-facts.md``); a tool that only looks at a few fields
of an object (``trellis inject check``, the injector's caBundle sync) reads it as JSON
instead, and treats 404 as "there is none" rather than an error; any other failure is an
:class:`ApiError` naming it.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException


def transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the client's transport failing (urllib3: refused, timed out, cut
    off). urllib3 is the client's own dependency, so it is recognised, not imported."""
    return isinstance(exc, OSError) or any(
        cls.__module__.split(".")[0] == "urllib3" for cls in type(exc).__mro__
    )


class ApiError(RuntimeError):
    """The API server could not be asked, or answered with an error other than 404."""


def _read(call: Any, name: str, timeout: float) -> dict[str, Any] | None:
    try:
        answer = call(name, _preload_content=False, _request_timeout=timeout)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise ApiError(f"{exc.status} {exc.reason}") from exc
    except Exception as exc:
        if not transport_error(exc):
            raise
        raise ApiError(f"{type(exc).__name__}: {exc}") from exc
    found: dict[str, Any] = json.loads(answer.data)
    return found


def read_namespace(api: client.ApiClient, name: str, timeout: float = 5.0) -> dict[str, Any] | None:
    return _read(client.CoreV1Api(api).read_namespace, name, timeout)


def read_mutating_webhook_configuration(
    api: client.ApiClient, name: str, timeout: float = 5.0
) -> dict[str, Any] | None:
    return _read(
        client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration, name, timeout
    )
