"""Test helpers for the xDS core, one module per kind of helper:

* :mod:`.resources`: small valid Envoy resources and snapshots;
* :mod:`.ads`: a real ADS server and a real grpcio client, recording hooks, a fake authorizer;
* :mod:`.control`: a control plane with inputs and connected proxies, without gRPC;
* :mod:`.catalog`: the catalog's RPCs proxy-cp calls, over real gRPC (``WatchChanges``
  among them), a locator of a known address, and a fake clock.

Everything is re-exported here, so tests write ``from trellis_proxy_cp import testing as t``.
"""

from __future__ import annotations

from trellis_proxy_cp.testing.ads import (
    PROBE_PREFIX,
    TIMEOUT,
    AdsClient,
    AdsHarness,
    RecordingHooks,
    StaticAuthorizer,
    ads_server,
    names_of,
    node,
)
from trellis_proxy_cp.testing.catalog import (
    FakeCatalog,
    FakeClock,
    fake_catalog,
    locator,
)
from trellis_proxy_cp.testing.control import (
    KEY_PEM,
    SIDECAR,
    SPIFFE_PREFIX,
    FakeSources,
    acknowledge,
    broken_view,
    connect,
    material,
    peer_certificate_pem,
    proxy_common_name,
    reject,
    view,
)
from trellis_proxy_cp.testing.resources import (
    CA,
    CERT,
    api_listener,
    cluster,
    listener,
    load_assignment,
    mesh,
    resource,
    route_config,
    secret,
    snapshot,
)

__all__ = [
    "CA",
    "CERT",
    "KEY_PEM",
    "PROBE_PREFIX",
    "SIDECAR",
    "SPIFFE_PREFIX",
    "TIMEOUT",
    "AdsClient",
    "AdsHarness",
    "FakeCatalog",
    "FakeClock",
    "FakeSources",
    "RecordingHooks",
    "StaticAuthorizer",
    "acknowledge",
    "ads_server",
    "api_listener",
    "broken_view",
    "cluster",
    "connect",
    "fake_catalog",
    "listener",
    "load_assignment",
    "locator",
    "material",
    "mesh",
    "names_of",
    "node",
    "peer_certificate_pem",
    "proxy_common_name",
    "reject",
    "resource",
    "route_config",
    "secret",
    "snapshot",
    "view",
]
