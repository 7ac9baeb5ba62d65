"""The mesh's fixed names and default ports, without the settings machinery.

:mod:`trellis_common.settings` builds on pydantic-settings, which a ``trellis`` command that
makes one admin request has no use for: the CLI and :mod:`trellis_common.adminhttp` read
these constants here, and the settings module re-exports them for the services.
"""

from __future__ import annotations

DEFAULT_REDIS_URL = "redis://127.0.0.1:16379/0"
#: Where certmanager writes the mesh's trust bundle in the state directory.
TRUST_BUNDLE_FILE = "trust-bundle.pem"


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
