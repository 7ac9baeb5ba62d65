"""The mesh's fixed names and default ports, without the settings machinery.

:mod:`trellis_runtime.settings` builds on pydantic-settings, which a ``trellis`` command that
makes one admin request has no use for: the CLI and :mod:`trellis_runtime.adminhttp` read
these constants here, and the settings module re-exports them for the services.
"""

from __future__ import annotations

DEFAULT_REDIS_URL = "redis://127.0.0.1:16379/0"
#: Where certmanager writes the mesh's trust bundle in the state directory.
TRUST_BUNDLE_FILE = "trust-bundle.pem"
#: The mesh a component belongs to when none is named: namespaces labelled
#: ``trellis.dev/monitored-by=trellis`` (:mod:`trellis_kube.client`).
DEFAULT_MESH_NAME = "trellis"


class Ports:
    """Default ports, one pair (gRPC, admin REST) per service, from ARCHITECTURE.md."""

    CATALOG = (15010, 15011)
    CERTMANAGER = (15020, 15021)
    ENDPOINTS_K8S = (15030, 15031)
    ENDPOINTS_VM = (15040, 15041)
    PROXY_CP = (15128, 15051)
    PROXY_CP_DESTINATION = 8086  # the Linkerd Destination API (mTLS)
    PROXY_CP_ENROLL = 15012  # pod agents enroll (server TLS, a ServiceAccount token)
    INJECTOR_ADMIN = 15061
    INJECTOR_WEBHOOK = 9443


#: The gRPC options of every server (:class:`trellis_runtime.grpcserver.GrpcServer`) and of
#: the channels components open to each other
#: (:meth:`trellis_identity.identity.ComponentIdentity.channel`): plain constants here, so that
#: the identity library needs no gRPC server.
GRPC_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Calls the application has not picked up yet wait in the C core's backlog; past 1,000
    # it refuses new ones at random (RESOURCE_EXHAUSTED "Too many pending requests"), and
    # past 3,000 always. When every proxy of a replica reconnects at once (a restart, a
    # replica's death), that turned a third of them away into a backoff: allow a whole
    # replica's streams to wait (bounded: each is a few kB until it is served).
    ("grpc.server.max_pending_requests", 10_000),
    ("grpc.server.max_pending_requests_hard_limit", 20_000),
)
