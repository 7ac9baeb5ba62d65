"""One service skeleton: everything a Trellis process does around its own logic.

A service's ``main.py`` declares a :class:`Service`: its settings class (which names it,
and whose docstring heads ``--help``), the kind it announces in the registry, and
``build(runtime, settings)``, which makes the service's own objects and returns their
:class:`Parts`. The skeleton does the rest, the same way for every service:

1. settings from the command line and the environment (:mod:`trellis_runtime.settings`);
   a bad value ends the process with one line naming the setting and exit code 2, before
   anything starts;
2. logging, configured once;
3. SIGTERM and SIGINT set ``stop`` (:func:`trellis_runtime.lifecycle.main`);
4. Redis, waited for (:meth:`ServiceRuntime.connect`);
5. the component's identity: joined with certmanager (:mod:`trellis_runtime.joining`);
   certmanager signs its own in its ``build``;
6. ``build``;
7. the gRPC server (mTLS, the policy of :mod:`trellis_identity.authz`), the admin app
   (TLS) with the readiness checks and routes the parts add, the
   registry announcement, the outbox, the signals hub and the parts' components, until
   ``stop`` (:meth:`ServiceRuntime.serve`).

``build`` may return ``None`` when ``stop`` came while it waited (for a peer, say): the
service then ends quietly. What it opened on the runtime is closed whichever way it ends.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic

from fastapi import FastAPI
from pydantic import ValidationError

from trellis_common import logs
from trellis_runtime import lifecycle, tlstap
from trellis_runtime.admin import ReadinessCheck
from trellis_runtime.grpcserver import GrpcServer, Registration
from trellis_runtime.runtime import ServiceRuntime
from trellis_runtime.settings import S, describe_error, from_command_line


def _no_routes(app: FastAPI) -> None:
    """The admin app's own routes (health, readiness, metrics) are all a service has."""


@dataclass(frozen=True)
class Parts:
    """What is specific to one service; the skeleton serves it."""

    #: Long-running parts, ``async def run(stop)``, by name: each is supervised (restarted
    #: with backoff after a failure, and reported as a loop on the admin API meanwhile).
    components: Mapping[str, lifecycle.Component] = field(default_factory=dict)
    #: The service's gRPC API on ``bind_host:grpc_port``: servicer registrations, and the
    #: service names health and reflection report.
    grpc: Sequence[Registration] = ()
    grpc_services: Sequence[str] = ()
    #: A gRPC server of the service's own instead (proxy-cp's xDS port: mTLS, its options).
    grpc_server: GrpcServer | None = None
    #: Checks ``/readyz`` runs besides Redis's.
    readiness: Mapping[str, ReadinessCheck] = field(default_factory=dict)
    #: Adds the service's REST routes to the admin app.
    routes: Callable[[FastAPI], None] = _no_routes
    #: Announced in the service's registry record.
    attributes: Mapping[str, str] = field(default_factory=dict)


Build = Callable[[ServiceRuntime, S], Awaitable[Parts | None]]


@dataclass(frozen=True)
class Service(Generic[S]):
    """A Trellis service: its ``main`` is the process's entry point."""

    settings: type[S]
    kind: str
    build: Build[S]
    #: Join certmanager for the component's certificate before ``build``; certmanager,
    #: which signs its own, does not (its ``build`` sets ``runtime.identity``).
    joins: bool = True

    @property
    def name(self) -> str:
        return self.settings.service_name

    @property
    def prog(self) -> str:
        return f"trellis-{self.name}"

    def load(self, argv: Sequence[str] | None = None) -> S:
        """Settings from ``argv`` (``None``: ``sys.argv``) over the environment."""
        return from_command_line(self.settings, argv, self.prog)

    def main(self, argv: Sequence[str] | None = None) -> int:
        """Run the service until SIGTERM; returns the process's exit code."""
        try:
            settings = self.load(argv)
        except ValidationError as error:
            print(f"{self.prog}: {describe_error(self.settings, error)}", file=sys.stderr)
            return 2
        except SystemExit as done:  # --help (0) or a flag argparse refused (2)
            return done.code if isinstance(done.code, int) else 2
        tlstap.TAP.install()  # before gRPC starts: its TLS refusals are written to stderr
        logs.configure(settings.log_format, settings.log_level, self.name)
        return lifecycle.main(lambda stop: self.serve(settings, stop))

    async def serve(self, settings: S, stop: asyncio.Event) -> None:
        """Connect, build and serve until ``stop``."""
        runtime = await ServiceRuntime.connect(settings, self.kind, stop)
        if runtime is None:
            return
        runtime.metrics.register(tlstap.TAP)
        try:
            if self.joins and not await runtime.join():
                await runtime.close()
                return
            parts = await self.build(runtime, settings)
            if parts is not None and runtime.identity is None:
                raise RuntimeError(f"{self.name} has no identity: its build must set one")
            if parts is not None:
                runtime.count_identity()
                grpc = parts.grpc_server or runtime.grpc_server(parts.grpc, parts.grpc_services)
                app = runtime.admin_app(parts.readiness)
                parts.routes(app)
        except BaseException:
            await runtime.close()
            raise
        if parts is None:
            await runtime.close()
            return
        await runtime.serve(stop, grpc, app, parts.components, parts.attributes)
