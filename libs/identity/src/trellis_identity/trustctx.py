"""Client TLS contexts: the one that trusts the mesh's CA and nothing else, and the system's.

:func:`system_context` is for plain-HTTP clients (Envoy's admin API, traffic through a
sidecar, the dashboard's scrapes): an ``httpx.Client`` made without ``verify`` builds a new
default context and loads the system's whole CA bundle, 25-50 ms of CPU, even for an
``http://`` URL that never uses it, and the tests make such requests by the thousand.

Kept apart from :mod:`trellis_identity.identity` (a component's own certificate, which needs
gRPC and the cryptography package): the CLI's admin requests need only this, and a
``trellis`` command pays for every import on each run.
"""

from __future__ import annotations

import functools
import ssl


def client_context(trust_bundle_pem: bytes) -> ssl.SSLContext:
    """Verifies servers against ``trust_bundle_pem`` only, TLS 1.2 at least."""
    context = ssl.create_default_context(cadata=trust_bundle_pem.decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


@functools.cache
def system_context() -> ssl.SSLContext:
    """The system's default trust, loaded once per process and shared (an ``SSLContext`` is
    safe to share between threads and connections)."""
    return ssl.create_default_context()
