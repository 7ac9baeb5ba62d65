"""certmanager's process: wiring and lifecycle only.

Connects to Redis (waiting for it), loads or creates the CA, then runs the gRPC API, the
admin REST API, the rotation loop, the store guard, the registry announcement and the
outbox of ``certificates`` signals under one TaskGroup until SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from trellis_api import certmanager_pb2_grpc
from trellis_certmanager.domain.authority import CertificateAuthority, load_provided
from trellis_certmanager.domain.errors import CAError
from trellis_certmanager.domain.issuer import IssuancePolicy
from trellis_certmanager.manager import TOPIC, CertificateManager, utcnow
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.settings import CertManagerSettings
from trellis_certmanager.store import RedisCertificateStore
from trellis_certmanager.transport import grpc_api, rest
from trellis_common import lifecycle, logs
from trellis_common.runtime import ServiceRuntime
from trellis_common.settings import given, service_parser

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


async def serve(settings: CertManagerSettings, stop: asyncio.Event) -> None:
    runtime = await ServiceRuntime.connect(settings, "certmanager", stop)
    if runtime is None:
        return
    publisher = runtime.publisher

    async def announce(kind: str, key: str) -> int:
        # Through the outbox: a signal Redis does not take now is kept and sent later.
        return await runtime.outbox.signal(TOPIC, kind, key)

    manager = CertificateManager(
        RedisCertificateStore(runtime.redis),
        announce,
        IssuancePolicy(
            service_validity=settings.service_cert_validity,
            proxy_validity=settings.proxy_cert_validity,
            jitter=settings.validity_jitter,
            renew_fraction=settings.renew_fraction,
            trust_domain=settings.trust_domain,
            cluster_domain=settings.cluster_domain,
        ),
        settings.key_algorithm,
        CertMetrics.create(runtime.metrics),
        root_validity=settings.root_validity,
        rejections=runtime.health.rejections,
        prune_after=settings.prune_after,
    )
    try:
        await manager.start(
            provided_ca(settings), marker=settings.state_dir / "certmanager" / "root-fingerprint"
        )
    except CAError as exc:  # no CA we may use: say why and how to fix it, without a traceback
        log.critical("ca.fatal error=%r action=exiting", str(exc))
        await runtime.redis.aclose()
        raise SystemExit(1) from None
    manager.revision = await publisher.current_revision(TOPIC)
    servicer = grpc_api.CertificateManagerServicer(manager, runtime.health.rejections)
    grpc_server = runtime.grpc_server(
        [
            lambda server: certmanager_pb2_grpc.add_CertificateManagerServicer_to_server(
                servicer, server
            )
        ],
        [grpc_api.SERVICE_NAME],
    )
    app = runtime.admin_app({"ca": manager.ready.is_set})
    rest.add_routes(app, manager, runtime.guard)
    await runtime.serve(
        stop,
        grpc_server,
        app,
        {
            "rotation": lambda s: manager.run_rotation(s, settings.rotation_interval),
            "store guard": manager.guard_store,
        },
        attributes={"root": manager.ca.fingerprint},
    )


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    parser = service_parser(
        "trellis-certmanager",
        "Trellis certmanager: the mesh CA.",
        "TRELLIS_CERTMANAGER_",
    )
    parser.add_argument("--ca-cert-file")
    parser.add_argument("--ca-key-file")
    parser.add_argument("--ca-bundle-file")
    parser.add_argument("--key-algorithm", choices=["ecdsa-p256", "rsa-2048"])
    return given(parser, argv)


def main(argv: list[str] | None = None) -> int:
    settings = CertManagerSettings(**parse_args(argv))
    logs.configure(settings.log_format, settings.log_level, "certmanager")
    return lifecycle.main(lambda stop: serve(settings, stop))


if __name__ == "__main__":
    raise SystemExit(main())
