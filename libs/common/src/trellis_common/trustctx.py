"""The client TLS context that trusts the mesh's CA and nothing else.

Kept apart from :mod:`trellis_common.identity` (a component's own certificate, which needs
gRPC and the cryptography package): the CLI's admin requests need only this, and a
``trellis`` command pays for every import on each run.
"""

from __future__ import annotations

import ssl


def client_context(trust_bundle_pem: bytes) -> ssl.SSLContext:
    """Verifies servers against ``trust_bundle_pem`` only, TLS 1.2 at least."""
    context = ssl.create_default_context(cadata=trust_bundle_pem.decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
