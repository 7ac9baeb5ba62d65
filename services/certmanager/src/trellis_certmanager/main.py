"""certmanager's process: what it is made of; the skeleton (trellis_runtime.service) runs it.

It loads (or makes, on first start) the key-encryption key that seals every private key it
stores, loads or creates the CA, then serves the gRPC API and the admin REST API, and runs the
rotation loop and the store guard; its ``certificates`` signals go through the outbox.

Any number of replicas may run on one Redis: each one issues (claims per common name,
:mod:`trellis_certmanager.claims`), follows the others' signals
(:mod:`trellis_certmanager.coherence`), and the rotation runs on the elected leader only.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from fastapi import FastAPI

from trellis_api import certmanager_pb2_grpc
from trellis_certmanager import kek, rotation
from trellis_certmanager.coherence import ReplicaFollower
from trellis_certmanager.componentcerts import ComponentCertificates
from trellis_certmanager.domain.authority import CertificateAuthority, load_provided
from trellis_certmanager.domain.errors import CAError, PlantedCA, StoreUnavailable
from trellis_certmanager.domain.issuer import IssuancePolicy
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_certmanager.domain.sealed import Sealer
from trellis_certmanager.enrollment import ProxyEnrollment
from trellis_certmanager.identities import ComponentIssuer
from trellis_certmanager.manager import TOPIC, CertificateManager, utcnow
from trellis_certmanager.metrics import CertMetrics, EarliestExpiry
from trellis_certmanager.settings import CertManagerSettings
from trellis_certmanager.store import RedisCertificateStore
from trellis_certmanager.tokenreview import ServiceAccountReviewer
from trellis_certmanager.transport import grpc_api, rest
from trellis_common import components
from trellis_identity import jointoken
from trellis_identity.identity import ComponentIdentity, Issued, Material, csr_for, new_key
from trellis_kube import client as kube
from trellis_kube import leadership
from trellis_runtime.identityrevocation import IDENTITIES_TOPIC
from trellis_runtime.runtime import ServiceRuntime
from trellis_runtime.service import Parts, Service

log = logging.getLogger(__name__)


def provided_ca(settings: CertManagerSettings) -> CertificateAuthority | None:
    if settings.ca_cert_file is None and settings.ca_key_file is None:
        return None
    if settings.ca_cert_file is None or settings.ca_key_file is None:
        raise ValueError("ca_cert_file and ca_key_file go together")
    bundle = settings.ca_bundle_file.read_bytes() if settings.ca_bundle_file else b""
    return load_provided(
        settings.ca_cert_file.read_bytes(), settings.ca_key_file.read_bytes(), bundle, utcnow()
    )


def fatal(event: str, error: Exception) -> NoReturn:
    """Stop the process with one critical line saying why and what to do; no traceback."""
    log.critical("%s error=%r action=exiting", event, str(error))
    raise SystemExit(1) from None


def own_identity(identities: ComponentIssuer) -> ComponentIdentity:
    """certmanager's own certificate, for a key made here; renewed in-process."""

    async def renew(csr_pem: bytes) -> Issued:
        return identities.own(csr_pem)

    key_pem, key = new_key()
    issued = identities.own(csr_for(key, components.CERTMANAGER))
    return ComponentIdentity(components.CERTMANAGER, Material.of(issued, key_pem), renew)


def components_named(record: CertificateRecord) -> tuple[str, ...]:
    """The components a certificate of the control plane's namespace names: by its account
    (its SPIFFE id) first, then by its service (its DNS names and common name)."""
    named = (record.service_account, record.service)
    return tuple(dict.fromkeys(n for n in named if n in components.COMPONENTS))


async def adopt_control_plane_records(
    manager: CertificateManager, certs: ComponentCertificates
) -> None:
    """Service certificates of the control plane's namespace an earlier version issued
    (proxy-cp served xDS with one): each is recorded as its components' first, so that
    ``trellis identity revoke`` reaches it until it expires, then deleted, so it is never
    served or rotated again."""
    reserved = manager.issuer.policy.reserved
    records = [r for r in manager.list(CertificateKind.SERVICE) if reserved(r.namespace)]
    for record in records:
        named = components_named(record)
        if named and record.not_after > utcnow():
            await certs.adopt(named, record.serial, record.not_before, record.not_after)
    await manager.drop(records, "control_plane_namespace")


def write_trust_bundle(path: Path, bundle: bytes) -> None:
    """Where the other components (and the CLI) find the roots to check TLS servers against:
    public, so 0644, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(bundle)
    tmp.chmod(0o644)
    tmp.replace(path)
    log.info("trust_bundle.written path=%s", path)


async def build(runtime: ServiceRuntime, settings: CertManagerSettings) -> Parts:
    try:
        sealer = Sealer(
            kek.load_or_create(settings.kek_path),
            [kek.load(path) for path in settings.previous_kek_files],
        )
    except kek.KekFileError as exc:
        fatal("kek.fatal", exc)
    log.info(
        "kek.loaded path=%s kek_id=%s previous=%d",
        settings.kek_path,
        sealer.current.id,
        len(settings.previous_kek_files),
    )

    async def announce(kind: str, key: str) -> int:
        # Through the outbox: a signal Redis does not take now is kept and sent later.
        return await runtime.outbox.signal(TOPIC, kind, key)

    metrics = CertMetrics(runtime.metrics)
    manager = CertificateManager(
        RedisCertificateStore(
            runtime.redis,
            sealer,
            claim_ttl=settings.claim_seconds,
            refused=metrics.replica_refused,
            min_replicas_ack=settings.redis_min_replicas_ack,
        ),
        announce,
        IssuancePolicy(
            service_validity=settings.service_cert_validity,
            proxy_validity=settings.proxy_cert_validity,
            jitter=settings.validity_jitter,
            renew_fraction=settings.renew_fraction,
            trust_domain=settings.trust_domain,
            cluster_domain=settings.cluster_domain,
            control_plane_namespace=settings.control_plane_namespace,
            proxy_cp_extra_sans=settings.proxy_cp_extra_sans,
        ),
        settings.key_algorithm,
        metrics,
        root_validity=settings.root_validity,
        rejections=runtime.health.rejections,
        prune_after=settings.prune_after,
    )
    runtime.metrics.register(EarliestExpiry(manager.records))
    try:
        await manager.start(
            provided_ca(settings), marker=settings.state_dir / "certmanager" / "root-fingerprint"
        )
    except PlantedCA as exc:
        fatal("ca.planted", exc)
    except CAError as exc:  # no CA we may use: say why and how to fix it, without a traceback
        fatal("ca.fatal", exc)

    async def guard_store(stop: asyncio.Event) -> None:
        """The store guard; a CA in Redis that is not ours stops the whole service (cleanly:
        the other parts wind down on ``stop``), and the process then exits 1."""
        try:
            await manager.guard_store(stop)
        except CAError as exc:  # planted, or unreadable: never adopted, never served over
            event = "ca.planted" if isinstance(exc, PlantedCA) else "ca.fatal"
            log.critical("%s error=%r action=exiting", event, str(exc))
            EXIT.code = 1
            stop.set()

    try:
        join_key = jointoken.load_or_create_key(settings.join_key_path)
    except jointoken.InvalidJoinToken as exc:
        fatal("join_key.fatal", exc)
    certs = ComponentCertificates(
        runtime.redis, utcnow, min_replicas_ack=settings.redis_min_replicas_ack
    )
    try:
        await certs.load()
        await adopt_control_plane_records(manager, certs)
    except StoreUnavailable as exc:
        fatal("identities.fatal", exc)
    reviews = reviewer(settings)
    identities = ComponentIssuer(
        lambda: manager.issuer,
        runtime.redis,
        join_key,
        settings.component_cert_validity,
        runtime.metrics,
        utcnow,
        reviews,
        certs,
        min_replicas_ack=settings.redis_min_replicas_ack,
    )
    enrollment = ProxyEnrollment(manager, reviews, runtime.metrics)
    runtime.signals.follow(ReplicaFollower(manager, certs))  # the other replicas' changes
    runtime.revoked_serial = certs.is_revoked
    runtime.identity = own_identity(identities)
    runtime.identity.server_check.count_in(runtime.metrics)
    write_trust_bundle(settings.trust_bundle_path, manager.ca.trust_bundle_pem)

    manager.revision = await runtime.publisher.current_revision(TOPIC)
    servicer = grpc_api.CertificateManagerServicer(
        manager, runtime.health.rejections, identities, enrollment
    )
    # rotation and pruning: on the elected replica only (a Lease in a cluster, else a
    # Redis lock), with its fencing token; /v1/status shows the election's role
    election = leadership.elect_for(settings, redis=runtime.redis, health=runtime.health)

    async def rotate(stop: asyncio.Event) -> None:
        await rotation.run(manager, stop, settings.rotation_interval, election)

    return Parts(
        components={
            "leader election": election.run,
            "rotation": rotate,
            "store guard": guard_store,
        },
        grpc=[
            lambda server: certmanager_pb2_grpc.add_CertificateManagerServicer_to_server(
                servicer, server
            )
        ],
        grpc_services=[grpc_api.SERVICE_NAME],
        readiness={"ca": manager.ready.is_set},
        routes=lambda app: routes(app, runtime, manager, identities),
        attributes={"root": manager.ca.fingerprint},
    )


def routes(
    app: FastAPI,
    runtime: ServiceRuntime,
    manager: CertificateManager,
    identities: ComponentIssuer,
) -> None:
    rest.add_routes(app, manager, runtime.guard, identities)

    async def announce(component: str) -> object:
        return await runtime.outbox.signal(IDENTITIES_TOPIC, "revoked", component)

    rest.add_identity_routes(app, identities, runtime.guard, announce)


def reviewer(settings: CertManagerSettings) -> ServiceAccountReviewer | None:
    """Who reviews ServiceAccount tokens at join: the API server, when there is one."""
    if settings.kubeconfig is None and not kube.in_cluster():
        return None
    try:
        api = kube.api_client(settings.kubeconfig)
    except kube.NoKubernetes as exc:
        fatal("kubernetes.fatal", exc)
    log.info(
        "join.service_accounts audience=%s namespace=%s",
        settings.join_audience,
        settings.control_plane_namespace,
    )
    return ServiceAccountReviewer(api, settings.join_audience, settings.control_plane_namespace)


class ExitCode:
    """The exit code a part asked for while the service ran (0: none did)."""

    code = 0


EXIT = ExitCode()
service = Service(CertManagerSettings, "certmanager", build, joins=False)


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: the service's own exit code, else the one a part asked for."""
    return service.main(argv) or EXIT.code


if __name__ == "__main__":
    raise SystemExit(main())
