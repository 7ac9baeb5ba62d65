"""certmanager settings: flags, ``TRELLIS_CERTMANAGER_*`` (plus the shared ``TRELLIS_*`` ones).

Lifetimes take ISO 8601 durations (``PT48H``, ``P365D``) or seconds, in flags and variables.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_identity import jointoken
from trellis_runtime.settings import Ports, ServiceSettings, admin_port, grpc_port


class CertManagerSettings(ServiceSettings):
    """Trellis certmanager: the mesh CA."""

    service_name: ClassVar[str] = "certmanager"

    grpc_port: int = grpc_port(Ports.CERTMANAGER[0])
    admin_port: int = admin_port(Ports.CERTMANAGER[1])

    key_algorithm: KeyAlgorithm = Field(
        KeyAlgorithm.ECDSA_P256,
        description="ecdsa-p256 or rsa-2048: the key of the root and the leaves",
    )
    trust_domain: str = Field(
        "cluster.local", description="SPIFFE trust domain: spiffe://<td>/ns/<ns>/sa/<sa>"
    )
    cluster_domain: str = Field("cluster.local", description="DNS suffix of service names")
    proxy_cp_extra_sans: tuple[str, ...] = Field(
        ("localhost", "127.0.0.1", "::1"),
        description="names and IP addresses proxy-cp's component certificate (what it serves "
        "xDS with) carries besides its own names (proxyless gRPC clients check their "
        "server_uri's host against it); a JSON list",
    )
    control_plane_namespace: str = Field(
        "trellis-system",
        description="the control plane's namespace: no proxy or service certificate is "
        "issued in it (nor in trellis-system, the namespace component certificates name)",
    )
    service_cert_validity: dt.timedelta = Field(
        dt.timedelta(hours=48), description="service certificate lifetime (ISO 8601 or seconds)"
    )
    proxy_cert_validity: dt.timedelta = Field(
        dt.timedelta(hours=24),
        le=dt.timedelta(days=7),
        description="proxy (xDS client) certificate lifetime (ISO 8601 or seconds), 7 days at "
        "most; a revoked "
        "serial is remembered until it expires. Proxies' hosts renew theirs through proxy-cp "
        "once 2/3 of it has passed (`trellis proxy renew --watch`)",
    )
    root_validity: dt.timedelta = Field(
        dt.timedelta(days=3650),
        description="lifetime of a root the service makes itself (ISO 8601 or seconds)",
    )
    validity_jitter: float = Field(
        0.1, ge=0, lt=0.5, description="a service lifetime is changed by up to this fraction"
    )
    renew_fraction: float = Field(
        0.75, gt=0, lt=1, description="rotate once this share of a lifetime has passed"
    )
    rotation_interval: float = Field(5.0, gt=0, description="seconds between rotation sweeps")
    claim_seconds: float = Field(
        5.0,
        gt=0,
        description="how long a replica holds a common name against the others while it "
        "issues (a replica killed meanwhile holds the name up no longer)",
    )
    prune_after: dt.timedelta = Field(
        dt.timedelta(days=1), description="records this long past expiry are deleted (not the CA)"
    )

    component_cert_validity: dt.timedelta = Field(
        dt.timedelta(hours=24),
        description="lifetime of a control plane component's certificate (ISO 8601 or "
        "seconds); each component renews its own at two thirds of it",
    )
    join_key_file: Path | None = Field(
        None,
        description="the key join tokens are checked with (32 bytes, 0600; unset: "
        "<state-dir>/join-key, made on first start)",
    )

    previous_kek_files: list[Path] = Field(
        default_factory=list,
        description="KEKs replaced by kek_file: values still sealed under one are read, then "
        "sealed again under kek_file at start (a KEK rotation); drop them once the log says "
        "cert.keys_sealed under_old_kek=0",
    )
    kek_file: Path | None = Field(
        None,
        description="the key-encryption key (32 bytes, mode 0600) that seals the keys in "
        "Redis; made on first start (unset: <state-dir>/certmanager/kek)",
    )

    kubeconfig: Path | None = Field(
        None,
        description="a kubeconfig for the API server that reviews ServiceAccount tokens at "
        "join (in a pod: in-cluster; neither: only join tokens)",
    )
    join_audience: str = Field(
        "trellis",
        min_length=1,
        description="the audience of the ServiceAccount tokens to join with",
    )
    # The operator's own CA (root or intermediate): certificate, key, and chain to a root.
    ca_cert_file: Path | None = Field(None, description="your CA's certificate (PEM)")
    ca_key_file: Path | None = Field(None, description="your CA's private key (PEM)")
    ca_bundle_file: Path | None = Field(None, description="chain from your CA up to its root")

    @property
    def join_key_path(self) -> Path:
        return self.join_key_file or jointoken.key_path(self.state_dir)

    @property
    def kek_path(self) -> Path:
        return self.kek_file or self.state_dir / "certmanager" / "kek"
