"""certmanager's process: wiring and lifecycle only.

Connects to Redis (waiting for it), loads or creates the CA, then runs the gRPC API, the
admin REST API, the rotation loop, the store guard and the registry announcement under one
TaskGroup until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from typing import Any

from prometheus_client import CollectorRegistry

from trellis_api import certmanager_pb2_grpc
from trellis_certmanager.domain.authority import CertificateAuthority, load_provided
from trellis_certmanager.domain.issuer import IssuancePolicy
from trellis_certmanager.manager import TOPIC, CertificateManager, utcnow
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.settings import CertManagerSettings
from trellis_certmanager.store import RedisCertificateStore
from trellis_certmanager.transport import grpc_api, rest
from trellis_common import admin, lifecycle, logs, redisconn, statefile, tokens
from trellis_common.grpcserver import GrpcServer
from trellis_common.registry import Announcer, ServiceRecord
from trellis_common.signaling import Publisher

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
    redis = redisconn.connect(settings.redis_url)
    await redisconn.wait_for_redis(redis, stop)
    if stop.is_set():
        return
    registry = CollectorRegistry()
    publisher = Publisher(redis, sender=settings.instance_name)

    async def announce(kind: str, key: str) -> int:
        return (await publisher.publish(TOPIC, kind, key)).revision

    manager = CertificateManager(
        RedisCertificateStore(redis),
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
        CertMetrics.create(registry),
        root_validity=settings.root_validity,
    )
    await manager.start(
        provided_ca(settings), marker=settings.state_dir / "certmanager" / "root-fingerprint"
    )
    manager.revision = await publisher.current_revision(TOPIC)

    grpc_server = GrpcServer(
        f"{settings.bind_host}:{settings.grpc_port}",
        [
            lambda server: certmanager_pb2_grpc.add_CertificateManagerServicer_to_server(
                grpc_api.CertificateManagerServicer(manager), server
            )
        ],
        [grpc_api.SERVICE_NAME],
    )
    await grpc_server.start()

    async def redis_ok() -> bool:
        return bool(await redis.ping())

    token = tokens.load_or_create_admin_token(settings.state_dir, settings.admin_token)
    app = admin.create_app("certmanager", registry, {"ca": manager.ready.is_set, "redis": redis_ok})
    rest.add_routes(app, manager, admin.token_guard(token))

    def advertise(admin_port: int) -> None:
        statefile.write_endpoint(
            settings.state_dir,
            statefile.ServiceEndpoint(
                name="certmanager",
                admin_url=f"http://{settings.bind_host}:{admin_port}",
                grpc_address=f"{settings.bind_host}:{grpc_server.port}",
                pid=os.getpid(),
            ),
        )

    admin_server = admin.AdminServer(app, settings.bind_host, settings.admin_port, advertise)
    record = ServiceRecord(
        kind="certmanager",
        name=settings.instance_name,
        grpc_address=f"{settings.bind_host}:{grpc_server.port}",
        admin_address=f"{settings.bind_host}:{settings.admin_port}",
        started_at=time.time(),
        attributes=(("root", manager.ca.fingerprint),),
    )
    announcer = Announcer(redis, record, ttl=settings.registry_ttl)
    try:
        await lifecycle.run_components(
            [
                grpc_server.run,
                admin_server.run,
                lambda s: manager.run_rotation(s, settings.rotation_interval),
                manager.guard_store,
                announcer.run,
            ],
            stop,
        )
    finally:
        statefile.remove_endpoint(settings.state_dir, "certmanager", os.getpid())
        await redis.aclose()


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="trellis-certmanager",
        description="Trellis certmanager: the mesh CA. Settings also come from "
        "TRELLIS_CERTMANAGER_* and TRELLIS_* environment variables.",
    )
    parser.add_argument("--grpc-port", type=int)
    parser.add_argument("--admin-port", type=int)
    parser.add_argument("--bind-host")
    parser.add_argument("--state-dir")
    parser.add_argument("--redis-url")
    parser.add_argument("--ca-cert-file")
    parser.add_argument("--ca-key-file")
    parser.add_argument("--ca-bundle-file")
    parser.add_argument("--key-algorithm", choices=["ecdsa-p256", "rsa-2048"])
    args = parser.parse_args(argv)
    return {k: v for k, v in vars(args).items() if v is not None}


def main(argv: list[str] | None = None) -> int:
    settings = CertManagerSettings(**parse_args(argv))
    logs.configure(settings.log_format, settings.log_level, "certmanager")
    return lifecycle.main(lambda stop: serve(settings, stop))


if __name__ == "__main__":
    raise SystemExit(main())
