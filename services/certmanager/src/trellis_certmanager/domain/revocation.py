"""A revoked proxy certificate: which serial, whose, and until when it must be remembered.

A proxy certificate is revoked by the operator (``trellis proxy revoke``) or when it is
rotated (the old serial must not open an xDS stream any more). proxy-cp refuses a revoked
serial even if the catalog still expects the common name. A revocation is kept until the
certificate it names has expired (plus the store's grace): past that the TLS handshake
refuses the certificate anyway, so the revoked set stays small.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trellis_common.ids import InvalidIdentifier, ProxyCommonName


class RevocationReason(enum.StrEnum):
    REVOKED = "revoked"
    """The operator revoked it: the proxy may no longer connect with this common name's
    certificate until it is onboarded again."""
    ROTATED = "rotated"
    """A newer certificate of the same common name replaced it."""


@dataclass(frozen=True, slots=True)
class Revocation:
    serial: int
    common_name: str
    not_after: dt.datetime
    """The revoked certificate's expiry: the revocation is pruned after it."""
    revoked_at: dt.datetime
    reason: RevocationReason

    def metadata(self) -> dict[str, Any]:
        return {
            "serial": f"{self.serial:x}",
            "common_name": self.common_name,
            "not_after": self.not_after.isoformat(),
            "revoked_at": self.revoked_at.isoformat(),
            "reason": self.reason.value,
        }

    def to_json(self) -> str:
        return json.dumps(self.metadata(), separators=(",", ":"))

    @classmethod
    def from_json(cls, field: str, text: str | bytes) -> Revocation:
        """One stored revocation (the hash field is its hex serial); ``ValueError`` says
        what is wrong with it."""
        try:
            body = json.loads(text)
            revocation = cls(
                serial=int(body["serial"], 16),
                common_name=body["common_name"],
                not_after=dt.datetime.fromisoformat(body["not_after"]),
                revoked_at=dt.datetime.fromisoformat(body["revoked_at"]),
                reason=RevocationReason(body["reason"]),
            )
            ProxyCommonName.parse(revocation.common_name)
        except (KeyError, TypeError, ValueError, AttributeError, InvalidIdentifier) as exc:
            raise ValueError(f"malformed revocation: {exc!r}") from exc
        if f"{revocation.serial:x}" != field:
            raise ValueError(f"stored under {field!r} but revokes serial {revocation.serial:x}")
        if revocation.not_after.tzinfo is None or revocation.revoked_at.tzinfo is None:
            raise ValueError("malformed revocation: a time has no time zone")
        return revocation


def expired(
    revocations: Iterable[Revocation], now: dt.datetime, grace: dt.timedelta
) -> list[Revocation]:
    """The revocations whose certificate expired more than ``grace`` ago."""
    return [r for r in revocations if r.not_after + grace <= now]
