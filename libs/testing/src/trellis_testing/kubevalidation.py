"""What the API server's validation refuses, for the kinds the test server checks.

kmock's emulator stores whatever it is sent. A client that writes a malformed object would
pass every test and fail against a real API server, so :mod:`.kubeserver` checks, on create
and on replace, the fields of the kinds whose shape our code writes itself:

* ``coordination.k8s.io`` Leases (leader election): ``leaseDurationSeconds`` an integer
  over 0, ``leaseTransitions`` an integer not below 0, ``acquireTime`` and ``renewTime`` as
  ``metav1.MicroTime`` writes them (RFC 3339 with exactly six fractional digits,
  ``2006-01-02T15:04:05.000000Z``). A refusal is 422 ``Invalid`` naming every bad field.
"""

from __future__ import annotations

import re
from typing import Any

from kmock._internal import k8s

LEASES = ("coordination.k8s.io", "leases")
#: metav1.MicroTime's wire format.
MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")


def check(group: str, plural: str, name: str, obj: dict[str, Any]) -> None:
    """Raise the API server's 422 if ``obj`` (of ``group``/``plural``) is invalid."""
    if (group, plural) != LEASES:
        return
    spec = obj.get("spec") or {}
    problems = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and (not _integer(duration) or duration <= 0):
        problems.append(f"spec.leaseDurationSeconds: Invalid value: {duration!r}: must be > 0")
    transitions = spec.get("leaseTransitions")
    if transitions is not None and (not _integer(transitions) or transitions < 0):
        problems.append(f"spec.leaseTransitions: Invalid value: {transitions!r}: must be >= 0")
    for field in ("acquireTime", "renewTime"):
        value = spec.get(field)
        if value is not None and not (isinstance(value, str) and MICRO_TIME.fullmatch(value)):
            problems.append(f"spec.{field}: Invalid value: {value!r}: not a MicroTime")
    if problems:
        message = f'Lease.coordination.k8s.io "{name}" is invalid: ' + ", ".join(problems)
        raise k8s.KubernetesError(status=422, reason="Invalid", message=message, details={})


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
