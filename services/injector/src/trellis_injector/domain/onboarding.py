"""Onboarding a proxy, as pure functions: the request, its checks, the bootstrap.

Every onboarding path shares this module: ``POST /v1/bootstrap`` (``trellis vm bootstrap``)
now, the Kubernetes webhook later. The proxy's key is made where the proxy runs and only a
CSR travels (:func:`check_csr`): no private key is in any onboarding answer. A
:class:`ProxyRequest` is checked once, here, and a bad one raises
:class:`InvalidOnboarding` naming the field as the REST body spells it.
:func:`build_bootstrap` turns a request, the proxy certificate's common name and where
proxy-cp is into an Envoy bootstrap with :func:`trellis_common.bootstrap.envoy_bootstrap`.

The files' paths are where they will be on the proxy's host (``output_dir``), which is
not the injector's host: nothing here touches a file system, and the paths are only
checked to be absolute (in POSIX terms, whatever the injector runs on).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal, get_args

from cryptography import x509

from trellis_common import ids
from trellis_common.bootstrap import (
    CA_FILE,
    KEY_FILE,
    PROXY_CERT_FILE,
    SDS_FILE,
    WORKLOAD_CERT_FILE,
    BootstrapSpec,
    ProbeRoute,
    ProxyFiles,
    envoy_bootstrap,
    node_locality,
)
from trellis_common.grpc_bootstrap import GrpcFolder, grpc_bootstrap
from trellis_kube.injection import Exclusions

AdsProtocol = Literal["sotw", "delta"]
PROTOCOLS: Final[tuple[str, ...]] = get_args(AdsProtocol)

PORT_MIN: Final = 1
PORT_MAX: Final = 65535

# File names inside output_dir; the CLI writes the files where the answer's paths say.
BOOTSTRAP_FILE: Final = "envoy.yaml"
# The layout of a pod agent's folder (trellis_common.bootstrap), which `trellis vm
# bootstrap` and `trellis proxy renew` write the same way (a ..data link swapped).
CERT_CHAIN_FILE: Final = PROXY_CERT_FILE
TRUST_BUNDLE_FILE: Final = CA_FILE

_ANY_PROXY_ID: Final = ids.ProxyId(str(uuid.UUID(int=0)))
MAX_CSR_BYTES: Final = 16 * 1024


class InvalidOnboarding(ValueError):
    """A request field is not acceptable; ``field`` is its name in the REST body."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


def _check_port(name: str, value: int, *, zero_ok: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOnboarding(name, f"must be an integer, got {value!r}")
    low = 0 if zero_ok else PORT_MIN
    if not low <= value <= PORT_MAX:
        none = " (0: no application port)" if zero_ok else ""
        raise InvalidOnboarding(name, f"must be in {low}..{PORT_MAX}{none}, got {value}")


def _check_name(name: str, value: str, *, subdomain: bool = False) -> None:
    try:
        if subdomain:
            ids.validate_dns_subdomain(value, name)
        else:
            ids.validate_dns_label(value, name)
    except ids.InvalidIdentifier as exc:
        raise InvalidOnboarding(name, f"{exc.reason} (a {exc.kind}), got {value!r}") from None


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    """One proxy to onboard: its service, its ports on its host, where its files will be.

    ``service_account`` defaults to the service's name. ``app_port`` 0 means the workload
    serves nothing (a client only). The proxy's own ports (inbound, outbound, admin) and
    the application's port all live on one host, so no two may be the same.
    """

    namespace: str
    service: str
    inbound_port: int
    outbound_port: int
    admin_port: int
    output_dir: str
    app_port: int = 0
    service_account: str = ""
    protocol: AdsProtocol = "sotw"
    stats_port: int = 0  # Envoy's Prometheus statistics; 0: not served
    # a proxyless gRPC workload (`trellis grpc bootstrap`): no Envoy, so no ports of its own
    proxyless: bool = False
    # an injected pod: its init container redirects its traffic to Envoy, whose listeners
    # then go by original destination (proxy-cp's capture mode)
    capture: bool = False
    # kubelet probes rewritten to Envoy's probe listeners (an injected pod)
    probes: tuple[ProbeRoute, ...] = ()
    # where the proxy runs, region[/zone[/subzone]]: its bootstrap's node.locality
    locality: str = ""

    def __post_init__(self) -> None:
        _check_name("namespace", self.namespace)
        _check_name("service", self.service)
        try:
            ids.ProxyCommonName(_ANY_PROXY_ID, self.service, self.namespace)
        except ids.InvalidIdentifier as exc:  # the CN's 64 characters: names too long together
            raise InvalidOnboarding("service", exc.reason) from None
        if not self.service_account:
            object.__setattr__(self, "service_account", self.service)
        _check_name("service_account", self.service_account, subdomain=True)
        self._check_output_dir()
        if self.locality:
            try:
                node_locality(self.locality)
            except ValueError as exc:
                raise InvalidOnboarding("locality", str(exc)) from None
        if self.proxyless:
            return
        _check_port("app_port", self.app_port, zero_ok=True)
        _check_port("stats_port", self.stats_port, zero_ok=True)
        ports = [
            ("inbound_port", self.inbound_port),
            ("outbound_port", self.outbound_port),
            ("admin_port", self.admin_port),
        ]
        for name, value in ports:
            _check_port(name, value)
        if self.app_port:
            ports.insert(0, ("app_port", self.app_port))
        if self.stats_port:
            ports.append(("stats_port", self.stats_port))
        seen: dict[int, str] = {}
        for name, value in ports:
            if value in seen:
                raise InvalidOnboarding(
                    name, f"must differ from {seen[value]} (both are {value}): one host"
                )
            seen[value] = name
        if self.protocol not in PROTOCOLS:
            raise InvalidOnboarding(
                "protocol", f"must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}"
            )

    def _check_output_dir(self) -> None:
        if not self.output_dir or "\0" in self.output_dir:
            raise InvalidOnboarding("output_dir", "must be a path on the proxy's host")
        if not PurePosixPath(self.output_dir).is_absolute():
            raise InvalidOnboarding(
                "output_dir",
                f"must be an absolute path on the proxy's host, got {self.output_dir!r}",
            )

    @property
    def identity(self) -> str:
        return f"{self.namespace}/{self.service}"

    @property
    def files(self) -> ProxyFiles:
        folder = Path(self.output_dir)
        if self.proxyless:  # the proxy certificate is for the xDS channel only
            grpc = GrpcFolder(folder)
            return ProxyFiles(grpc.proxy_cert, grpc.proxy_key, grpc.ca)
        return ProxyFiles(
            cert_chain=folder / CERT_CHAIN_FILE,
            key=folder / KEY_FILE,
            trust_bundle=folder / TRUST_BUNDLE_FILE,
            sds=folder / SDS_FILE,  # `trellis proxy renew` swaps it: Envoy reloads, no restart
        )

    @property
    def workload_cert(self) -> Path:
        """Where the proxy's own workload certificate goes (its key is the proxy's)."""
        folder = Path(self.output_dir)
        return GrpcFolder(folder).cert if self.proxyless else folder / WORKLOAD_CERT_FILE


@dataclass(frozen=True, slots=True)
class XdsEndpoint:
    """Where proxies dial proxy-cp's xDS port."""

    host: str
    port: int

    @classmethod
    def parse(cls, address: str) -> XdsEndpoint:
        """``host:port`` or ``[v6]:port``, as the service registry records it."""
        host, sep, port = address.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not PORT_MIN <= int(port) <= PORT_MAX:
            raise ValueError(f"not a host:port address: {address!r}")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def proxy_cp_spiffe_id(trust_domain: str, namespace: str, service_account: str) -> str:
    """The SPIFFE id proxy-cp's serving certificate carries (raises if one part is bad)."""
    return ids.SpiffeId(trust_domain, namespace, service_account).uri


@dataclass(frozen=True, slots=True)
class ControlPlane:
    """What a bootstrap needs to know about proxy-cp: its address and its identity."""

    xds: XdsEndpoint
    spiffe_id: str


@dataclass(frozen=True, slots=True)
class ProxyCertificate:
    """A proxy certificate as issued for the proxy's CSR: no key (the proxy has it)."""

    common_name: str
    cert_chain_pem: str
    trust_bundle_pem: str
    #: the proxy's own workload certificate (mesh mTLS), for the same key
    workload_cert_chain_pem: str = ""


def check_csr(pem: str | bytes) -> bytes:
    """A PEM certificate signing request whose signature verifies, as bytes;
    :class:`InvalidOnboarding` naming ``csr_pem`` otherwise. certmanager checks the key's
    type and size itself; this check only names the field before anything is asked of it."""
    data = pem.encode() if isinstance(pem, str) else pem
    if not data.strip():
        raise InvalidOnboarding(
            "csr_pem",
            "a PEM certificate signing request is required: the proxy makes its key on its "
            "own host and sends only the request (`trellis vm bootstrap` does)",
        )
    if len(data) > MAX_CSR_BYTES:
        raise InvalidOnboarding("csr_pem", f"longer than {MAX_CSR_BYTES} bytes")
    try:
        csr = x509.load_pem_x509_csr(data)
    except ValueError:
        raise InvalidOnboarding("csr_pem", "not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise InvalidOnboarding("csr_pem", "the request's signature does not verify")
    return data


def build_bootstrap(
    request: ProxyRequest, common_name: str, control_plane: ControlPlane
) -> dict[str, Any]:
    """The Envoy bootstrap of one proxy (node id = its certificate's CN, ADS to proxy-cp), or
    a proxyless workload's ``GRPC_XDS_BOOTSTRAP`` document."""
    if request.proxyless:
        return grpc_bootstrap(
            common_name,
            request.namespace,
            request.service,
            control_plane.xds.host,
            control_plane.xds.port,
            GrpcFolder(Path(request.output_dir)),
        )
    return envoy_bootstrap(
        BootstrapSpec(
            node_id=common_name,
            namespace=request.namespace,
            service=request.service,
            files=request.files,
            xds_host=control_plane.xds.host,
            xds_port=control_plane.xds.port,
            proxy_cp_spiffe_id=control_plane.spiffe_id,
            outbound_port=request.outbound_port,
            inbound_port=request.inbound_port,
            app_port=request.app_port,
            admin_port=request.admin_port,
            protocol=request.protocol,
            stats_port=request.stats_port,
            capture=request.capture,
            probes=request.probes,
            # the proxy's own workload certificate and key are in its folder (a pod's
            # agent, or `trellis vm bootstrap`, keeps them): proxy-cp never sends a key
            workload_dir=request.output_dir,
            locality=request.locality,
        )
    )


@dataclass(frozen=True, slots=True)
class MeshSidecar:
    """What MeshConfig says of every sidecar, as the catalog answered ExpectProxy: Envoy's
    log level ("" for Envoy's default) and the traffic left out of the redirection."""

    log_level: str = ""
    exclusions: Exclusions = field(default_factory=Exclusions)


@dataclass(frozen=True, slots=True)
class Onboarding:
    """A proxy onboarded: its certificate and the bootstrap that uses it (and the key the
    proxy made, at the path the bootstrap names), and MeshConfig's sidecar settings."""

    request: ProxyRequest
    certificate: ProxyCertificate
    control_plane: ControlPlane
    bootstrap: dict[str, Any] = field(repr=False)
    sidecar: MeshSidecar = field(default_factory=MeshSidecar)

    @property
    def common_name(self) -> str:
        return self.certificate.common_name

    @property
    def files(self) -> ProxyFiles:
        return self.request.files


def onboarding(
    request: ProxyRequest,
    certificate: ProxyCertificate,
    control_plane: ControlPlane,
    sidecar: MeshSidecar | None = None,
) -> Onboarding:
    return Onboarding(
        request,
        certificate,
        control_plane,
        build_bootstrap(request, certificate.common_name, control_plane),
        sidecar or MeshSidecar(),
    )
