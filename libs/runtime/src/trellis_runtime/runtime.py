"""What every service's own logic runs on, in one place.

A :class:`ServiceRuntime` is what a service's ``build`` (:mod:`trellis_runtime.service`)
is given to make its objects with: a
Redis client that rides over restarts (waited for at start), the two ends of the one
event path (:mod:`trellis_runtime.events`: the ``outbox`` an owner signals its changes
with, the ``signals`` hub a consumer's followers run on, and ``locator`` to find the owner
to fetch from), the Prometheus registry, the admin token and app, and
:meth:`ServiceRuntime.serve`, which runs the gRPC server, the admin server (recording its
addresses in the state directory for the CLI), the registry announcement, the signals and
the service's own components until ``stop`` (the skeleton calls it).

Redis is reached as the service's own ACL user (:class:`~trellis_runtime.redisconn.RedisTarget`,
from ``redis_url``, ``redis_username`` and ``redis_password_file``), by the command client
and by every subscriber connection alike; with ``redis_audit_interval`` set, the service
also reads what Redis refused (:mod:`trellis_runtime.redisaudit`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import redis.asyncio as aioredis
from fastapi import FastAPI
from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)

from trellis_api import certmanager_pb2, certmanager_pb2_grpc
from trellis_common import components, statefile, version
from trellis_identity import tokens
from trellis_identity.authz import Authorizer
from trellis_identity.identity import ComponentIdentity, Issued
from trellis_runtime import (
    admin,
    joining,
    lifecycle,
    metricsport,
    redisacl,
    redisconn,
    registry,
)
from trellis_runtime.events import Outbox, Signals
from trellis_runtime.grpcserver import GrpcServer, Registration
from trellis_runtime.health import Health
from trellis_runtime.identityrevocation import RevokedIdentities
from trellis_runtime.locate import ChannelFactory, Locator
from trellis_runtime.looplag import LoopLag
from trellis_runtime.redisaudit import RedisAudit
from trellis_runtime.registry import Announcer, ServiceRecord
from trellis_runtime.settings import ServiceSettings
from trellis_runtime.signaling import Publisher

log = logging.getLogger(__name__)

#: The registry attribute naming the component a record's certificate is for.
COMPONENT_ATTRIBUTE = "component"


@dataclass
class ServiceRuntime:
    settings: ServiceSettings
    kind: str
    redis: aioredis.Redis
    publisher: Publisher
    metrics: CollectorRegistry
    health: Health
    outbox: Outbox
    signals: Signals
    locators: list[Locator]
    #: Set on SIGTERM: what a service's build waits on (a peer, a certificate) ends with it.
    stop: asyncio.Event
    #: The component's certificate (mTLS on its gRPC server and its calls, TLS on its admin
    #: API): joined before ``build`` runs (certmanager signs its own in ``build``).
    identity: ComponentIdentity | None = None
    #: serial (lowercase hex) -> revoked by an operator: certmanager sets its own list;
    #: the others follow it (``serve``, :mod:`trellis_runtime.identityrevocation`)
    revoked_serial: Callable[[str], bool] | None = None
    #: joined certmanager (every component but certmanager): follows its revoked list
    joined: bool = False
    _certmanager: Locator | None = None
    _admin: tokens.AdminToken | None = None

    @property
    def admin_token(self) -> tokens.AdminToken:
        """The admin token's digest, loaded the first time a route needs it (a service whose
        routes never check it never reads it; ``trellis_identity.tokens``)."""
        if self._admin is None:
            settings = self.settings
            self._admin = tokens.admin_token(
                settings.state_dir, settings.admin_token, settings.admin_token_sha256
            )
        return self._admin

    @classmethod
    async def connect(
        cls, settings: ServiceSettings, kind: str, stop: asyncio.Event
    ) -> ServiceRuntime | None:
        """Connect to Redis (waiting for it); ``None`` if ``stop`` came first.

        Raises ``ValueError`` (an unreadable password file) or
        :class:`~trellis_runtime.redisconn.RedisRefused` (Redis refused the user)."""
        target = redisconn.RedisTarget.create(
            settings.redis_url,
            settings.redis_username,
            settings.redis_password_file,
            settings.service_name,
        )
        log.info("redis.target %s", target.describe())
        redis = redisconn.connect(target)
        try:
            await redisconn.wait_for_redis(redis, stop)
        except redisconn.RedisRefused:
            await redis.aclose()
            raise
        if stop.is_set():
            await redis.aclose()
            return None
        metrics = CollectorRegistry()
        # the standard process, platform and garbage-collector series, as a default registry
        # has them (`process_*`, `python_info`, `python_gc_*`), then the build
        ProcessCollector(registry=metrics)
        PlatformCollector(registry=metrics)
        GCCollector(registry=metrics)
        version.count_build(metrics, settings.service_name)
        health = Health(metrics, instance=settings.instance_name)
        publisher = Publisher(redis, sender=settings.instance_name)
        return cls(
            settings=settings,
            kind=kind,
            redis=redis,
            publisher=publisher,
            metrics=metrics,
            health=health,
            outbox=Outbox(publisher, health),
            signals=Signals(target, health, client=settings.service_name),
            locators=[],
            stop=stop,
        )

    async def join(self) -> bool:
        """Get this component's first certificate (:mod:`trellis_runtime.joining`); False
        if ``stop`` came first."""
        settings = self.settings
        self.identity = await joining.join(
            settings.service_name,
            self.redis,
            token_file=settings.join_token_path,
            trust_bundle_file=settings.trust_bundle_path,
            service_account_token_file=settings.service_account_token_file,
            certmanager_address=settings.certmanager_admin_address,
            renew=self._renew,
            stop=self.stop,
        )
        self.joined = self.identity is not None
        if self.identity is not None:
            self.identity.server_check.count_in(self.metrics)
        return self.joined

    def count_identity(self) -> None:
        """``trellis_component_certificate_expiration_timestamp_seconds``: when the
        component's own certificate (joined, or certmanager's own) expires, read at scrape
        time, so a renewal shows at once."""
        identity = self.identity
        assert identity is not None
        Gauge(
            "trellis_component_certificate_expiration_timestamp_seconds",
            "When this component's own certificate expires (unix time; it renews itself at "
            "2/3 of its lifetime)",
            registry=self.metrics,
        ).set_function(lambda: identity.material.leaf.not_valid_after_utc.timestamp())

    async def _renew(self, csr_pem: bytes) -> Issued:
        """Renew over mTLS with the current certificate (certmanager's policy: any component,
        for its own identity)."""
        locator = self._certmanager or self.locator(components.CERTMANAGER)
        self._certmanager = locator
        request = certmanager_pb2.RenewComponentCertificateRequest(csr_pem=csr_pem)
        try:
            stub = certmanager_pb2_grpc.CertificateManagerStub(await locator.channel())
            answer = await stub.RenewComponentCertificate(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            locator.failed(exc)
            raise
        return Issued(answer.cert_chain_pem, answer.trust_bundle_pem)

    def channel_factory(self, kind: str) -> ChannelFactory:
        """Channels to ``kind``: mTLS with this component's identity."""
        identity = self.identity
        if identity is None:
            raise RuntimeError("no identity: join before making channels")
        return lambda address: identity.channel(address, kind)

    def locator(self, kind: str, configured: str = "") -> Locator:
        """Where the live ``kind`` is (``configured``, else the registry); closed at the end.
        Its channel is mTLS with this component's identity, and is replaced after a renewal."""
        found = Locator(self.redis, kind, configured, channel_factory=self.channel_factory(kind))
        assert self.identity is not None
        self.identity.on_renewed(found.reset)
        self.locators.append(found)
        return found

    async def replicas(self) -> list[str]:
        """The instance names of this component's live records in the registry (its own
        included): the records of its kind whose component is this one."""
        found = await registry.discover(self.redis, self.kind)
        name = self.settings.service_name
        return [r.name for r in found if r.attribute(COMPONENT_ATTRIBUTE) == name]

    def _is_revoked(self, serial: str) -> bool:
        return self.revoked_serial is not None and self.revoked_serial(serial)

    def _follow_revocations(self, identity: ComponentIdentity) -> lifecycle.Component:
        """Follow certmanager's revoked component certificates; the part that exits when
        this component's own is among them."""
        locator = self._certmanager or self.locator(components.CERTMANAGER)
        self._certmanager = locator

        async def fetch() -> dict[str, str]:
            stub = certmanager_pb2_grpc.CertificateManagerStub(await locator.channel())
            request = certmanager_pb2.ListRevokedComponentCertificatesRequest()
            try:
                answer = await stub.ListRevokedComponentCertificates(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                locator.failed(exc)
                raise
            return {r.serial: r.component for r in answer.revoked}

        revoked = RevokedIdentities(fetch, lambda: f"{identity.material.leaf.serial_number:x}")
        self.signals.follow(revoked)
        self.revoked_serial = revoked.__contains__
        return revoked.exit_when_revoked

    @property
    def guard(self) -> Any:
        return admin.token_guard(self.admin_token)

    async def redis_ready(self) -> bool:
        """Redis answers PING within a second (a frozen Redis must not hang /readyz)."""
        try:
            async with asyncio.timeout(1.0):
                return bool(await self.redis.ping())
        except TimeoutError:
            return False

    def admin_app(self, readiness: Mapping[str, admin.ReadinessCheck]) -> FastAPI:
        return admin.create_app(
            self.settings.service_name,
            self.metrics,
            {"redis": self.redis_ready, **readiness},
            self.health,
            debug_endpoints=self.settings.debug_endpoints,
            reads_token=lambda: self.admin_token,
        )

    def grpc_server(
        self, registrations: Sequence[Registration], service_names: Sequence[str]
    ) -> GrpcServer:
        """The internal API: mTLS, and every call checked against the policy (``authz``)."""
        identity = self.identity
        assert identity is not None
        return GrpcServer(
            f"{self.settings.bind_host}:{self.settings.grpc_port}",
            registrations,
            service_names,
            credentials=identity.server_credentials(),
            reflection=self.settings.debug_endpoints,
            interceptors=[Authorizer(identity.trust_domain, self.metrics, self._is_revoked)],
        )

    async def serve(
        self,
        stop: asyncio.Event,
        grpc_server: GrpcServer,
        app: FastAPI,
        components: Mapping[str, lifecycle.Component],
        attributes: Mapping[str, str] | None = None,
    ) -> None:
        """Serve until ``stop``. The ``components`` are supervised: restarted with backoff
        after a failure, and reported as loops by name meanwhile."""
        settings = self.settings
        host = settings.bind_host
        if not grpc_server.started.is_set():
            await grpc_server.start()

        identity = self.identity
        assert identity is not None
        admin_server = admin.AdminServer(
            app,
            host,
            settings.admin_port,
            lambda port: advertise(port),
            ssl_context=identity.server_ssl_context(),
        )

        def advertise(port: int) -> None:
            statefile.write_endpoint(
                settings.state_dir,
                statefile.ServiceEndpoint(
                    name=settings.instance_name,  # a replica has a file of its own
                    admin_url=f"{admin_server.scheme}://{host}:{port}",
                    grpc_address=f"{host}:{grpc_server.port}",
                    pid=os.getpid(),
                ),
            )

        admin_port = admin_server.bind()
        record = ServiceRecord.create(
            kind=self.kind,
            name=settings.instance_name,
            grpc_address=f"{host}:{grpc_server.port}",
            admin_address=f"{host}:{admin_port}",
            # the identity its certificate has: clients check the server is that component
            attributes={**(attributes or {}), COMPONENT_ATTRIBUTE: settings.service_name},
            started_at=time.time(),
        )
        announcer = Announcer(self.redis, record, ttl=settings.registry_ttl)
        own = [lifecycle.supervised(n, c, self.health.loops) for n, c in components.items()]
        own.append(lifecycle.supervised("loop-lag", LoopLag(self.metrics).run, self.health.loops))
        if self.joined and self.revoked_serial is None:  # certmanager keeps its own list
            own.append(self._follow_revocations(identity))
        if settings.redis_audit_interval > 0:
            users = (redisacl.ADMIN, *redisacl.COMPONENTS)
            audit = RedisAudit(self.redis, self.metrics, users, settings.redis_audit_interval)
            own.append(lifecycle.supervised("redis-audit", audit.run, self.health.loops))
        if settings.metrics_port is not None:  # plain HTTP, /metrics only: for Prometheus
            plain = admin.AdminServer(
                metricsport.metrics_app(self.metrics),
                settings.metrics_host or host,
                settings.metrics_port,
            )
            plain.bind()  # a port taken ends the start here, naming it
            own.append(plain.run)
        try:
            await lifecycle.run_components(
                [
                    grpc_server.run,
                    admin_server.run,
                    announcer.run,
                    self.outbox.run,
                    self.signals.run,
                    lifecycle.supervised("identity", identity.run, self.health.loops),
                    *own,
                ],
                stop,
            )
        finally:
            statefile.remove_endpoint(settings.state_dir, settings.instance_name, os.getpid())
            await self.close()

    async def close(self) -> None:
        """Close the locators and the Redis client (after serving, or when a build ends early)."""
        for locator in self.locators:
            await locator.close()
        await self.redis.aclose()
