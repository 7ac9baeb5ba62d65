"""certmanager's admin REST routes: certificate metadata, the root, rotation and revocation.

Answers carry metadata and public certificates only; no route returns a private key.
Rotation and revocation change state, so they need the admin token, as does deleting a
stored record that was refused at load (corrupt): the only records DELETE removes.
Revoking a service certificate is refused with 409 (only proxy certificates are revoked).
The control plane's own certificates are listed and revoked per component under
``/v1/identities`` (:mod:`trellis_certmanager.componentcerts`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from trellis_certmanager.componentcerts import ComponentCert
from trellis_certmanager.domain.errors import (
    InvalidRequest,
    NotFound,
    NotRevocable,
    StoreUnavailable,
)
from trellis_certmanager.domain.records import CertificateKind
from trellis_certmanager.identities import ComponentIssuer, JoinRefused
from trellis_certmanager.manager import CertificateManager
from trellis_common import components


class JoinBody(BaseModel):
    """A component's first certificate: its join token and a CSR for the key it made."""

    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=8192, repr=False)
    csr_pem: str = Field(min_length=1, max_length=16384)


def add_routes(
    app: FastAPI,
    manager: CertificateManager,
    guard: Any,
    identities: ComponentIssuer | None = None,
) -> None:
    router = APIRouter(prefix="/v1", tags=["certificates"])

    if identities is not None:
        joining = identities

        @router.post("/join")
        async def join(body: JoinBody, request: Request) -> dict[str, Any]:
            """Trade a join token (once) and a CSR for the component's certificate; the
            token is the authentication, no admin token."""
            peer = request.client.host if request.client else "-"
            try:
                issued = await joining.join(body.token, body.csr_pem.encode(), peer)
            except JoinRefused as exc:
                raise HTTPException(401, str(exc)) from exc
            except InvalidRequest as exc:
                raise HTTPException(422, str(exc)) from exc
            except StoreUnavailable as exc:
                raise HTTPException(503, str(exc)) from exc
            return {
                "cert_chain_pem": issued.cert_chain_pem.decode(),
                "trust_bundle_pem": issued.trust_bundle_pem.decode(),
            }

    @router.get("/certificates")
    async def list_certificates(
        kind: CertificateKind | None = Query(None, description="service or proxy"),  # noqa: B008
        namespace: str = "",
    ) -> dict[str, Any]:
        records = manager.list(kind, namespace)
        return {
            "revision": manager.revision,
            "certificates": [r.metadata() for r in records],
        }

    @router.get("/certificates/{common_name}")
    async def get_certificate(common_name: str) -> dict[str, Any]:
        try:
            record = await manager.lookup(common_name, wanted=True)  # any replica's
        except NotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        body = record.metadata()
        body["cert_chain_pem"] = record.cert_chain_pem.decode()
        return body

    @router.post("/certificates/{common_name}/rotate", dependencies=[Depends(guard)])
    async def rotate(common_name: str) -> dict[str, Any]:
        try:
            record = await manager.rotate(common_name)
        except NotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        return {"rotated": True, "revision": manager.revision, "certificate": record.metadata()}

    @router.post("/certificates/{common_name}/revoke", dependencies=[Depends(guard)])
    async def revoke(common_name: str) -> dict[str, Any]:
        try:
            revocation = await manager.revoke(common_name)
        except NotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        except NotRevocable as exc:
            raise HTTPException(409, str(exc)) from exc
        except StoreUnavailable as exc:
            raise HTTPException(503, str(exc)) from exc
        return {"revoked": True, "revision": manager.revision, **revocation.metadata()}

    @router.get("/revoked")
    async def revoked(common_name: str = "") -> dict[str, Any]:
        return {"revoked": [r.metadata() for r in await manager.revocations.current(common_name)]}

    @router.delete("/certificates/{common_name}", dependencies=[Depends(guard)], status_code=204)
    async def delete_rejected(common_name: str) -> None:
        try:
            await manager.delete_rejected(common_name)
        except NotFound as exc:
            raise HTTPException(
                404, f"{exc} among the records refused at load; only those can be deleted"
            ) from exc

    @router.get("/root")
    async def root() -> dict[str, Any]:
        ca = manager.ca
        return {
            "origin": ca.origin,
            "fingerprint_sha256": ca.fingerprint,
            "subject": ca.roots[0].subject.rfc4514_string(),
            "not_after": ca.roots[0].not_valid_after_utc.isoformat(),
            "trust_bundle_pem": ca.trust_bundle_pem.decode(),
        }

    @router.get("/root.pem", response_class=PlainTextResponse)
    async def root_pem() -> str:
        return manager.ca.trust_bundle_pem.decode()

    app.include_router(router)


def add_identity_routes(
    app: FastAPI,
    identities: ComponentIssuer,
    guard: Any,
    announce: Callable[[str], Awaitable[object]],
) -> None:
    """The control plane's own certificates: listed, and revoked per component."""
    certs = identities.certs
    assert certs is not None
    router = APIRouter(prefix="/v1/identities", tags=["identities"])

    @router.get("")
    async def listed() -> dict[str, Any]:
        """Who holds which control plane certificate, and which are revoked (no keys)."""
        await certs.prune()
        return {
            "issued": [asdict(c) for c in sorted(certs.issued.values(), key=_by_component)],
            "revoked": [asdict(c) for c in sorted(certs.revoked.values(), key=_by_component)],
        }

    @router.post("/{component}/revoke", dependencies=[Depends(guard)])
    async def revoke(component: str) -> dict[str, Any]:
        """Revoke every unexpired certificate of ``component``: every service refuses it
        from now on, and the component joins again with a new key."""
        if component not in components.COMPONENTS or component == components.CERTMANAGER:
            who = ", ".join(c for c in components.COMPONENTS if c != components.CERTMANAGER)
            raise HTTPException(404, f"no component {component!r} to revoke (one of: {who})")
        try:
            fresh = await certs.revoke(component)
        except StoreUnavailable as exc:
            raise HTTPException(503, str(exc)) from exc
        if fresh:
            await announce(component)
        return {"component": component, "revoked": [c.serial for c in fresh]}

    app.include_router(router)


def _by_component(cert: ComponentCert) -> tuple[str, float]:
    return cert.component, cert.issued_at
