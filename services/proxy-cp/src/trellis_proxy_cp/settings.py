"""proxy-cp settings: flags, ``TRELLIS_PROXY_CP_*`` (plus the shared ``TRELLIS_*`` ones).

``grpc_port`` is the xDS port (mTLS only), served on ``xds_host``: all interfaces by
default, since proxies are remote.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from trellis_runtime.settings import Ports, ServiceSettings, admin_port, grpc_port


class ProxyCpSettings(ServiceSettings):
    """Trellis proxy-cp: the xDS server proxies talk to (--grpc-port is the mTLS xDS port)."""

    service_name: ClassVar[str] = "proxy-cp"

    grpc_port: int = grpc_port(Ports.PROXY_CP[0])
    admin_port: int = admin_port(Ports.PROXY_CP[1])
    xds_host: str = Field("0.0.0.0", description="address of the xDS port")
    catalog_address: str = Field(
        "", description="catalog's host:port; empty: from the service registry"
    )
    certmanager_address: str = Field(
        "", description="certmanager's host:port; empty: from the service registry"
    )
    # Expected proxies (clients/expected.py): listings of the catalog start at least this
    # far apart (s); a listing says yes for this long; a proxy a listing did not name is
    # refused without asking again for this long.
    expected_min_interval: float = Field(0.25, ge=0, description="least seconds between listings")
    expected_max_age: float = Field(10.0, gt=0, description="seconds a listing is trusted")
    expected_refused_for: float = Field(5.0, ge=0, description="seconds a refusal holds")
    # Caps on what one proxy may ask (transport/limits.py).
    max_node_metadata_bytes: int = Field(16384, ge=0, description="largest node metadata (bytes)")
    max_resource_names: int = Field(1024, ge=1, description="most resource names in one request")
    max_resource_name_bytes: int = Field(512, ge=1, description="longest resource name")
    max_streams_per_proxy: int = Field(4, ge=1, description="most open xDS streams per proxy")
    # The Linkerd Destination API (discovery.py), on its own mTLS port beside xDS.
    destination_port: int = Field(
        Ports.PROXY_CP_DESTINATION,
        ge=-1,
        le=65535,
        description="Linkerd Destination API port (mTLS; 0: any free port; -1: not served)",
    )
    enroll_port: int = Field(
        Ports.PROXY_CP_ENROLL,
        ge=-1,
        le=65535,
        description="pod agents' enrollment port (server TLS; 0: any free port; -1: not served)",
    )
    destination_queue_capacity: int = Field(
        100, ge=1, description="updates one Destination stream may have waiting before it ends"
    )
    destination_update_interval: float = Field(
        10.0, gt=0, description="conduit API's ADDRESS_UPDATE_INTERVAL: an empty add this often"
    )
    cluster_domain: str = Field("cluster.local", description="DNS suffix of service names")
    retry_budget_ratio: float = Field(0.2, ge=0, description="profiles' retry budget: ratio")
    retry_budget_min_per_second: int = Field(
        10, ge=0, description="profiles' retry budget: retries per second always allowed"
    )
    retry_budget_ttl: float = Field(10.0, gt=0, description="profiles' retry budget: window (s)")
