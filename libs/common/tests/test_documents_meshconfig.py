"""Tests for trellis_common.documents.meshconfig: OSM's and Trellis' MeshConfig, Go durations.

OSM's MeshConfig is read as OSM users have it (the preset OSM's Helm chart installs, unknown
fields and all); Trellis' own refuses unknown fields. Both give the same settings.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml

from trellis_common.documents import meshconfig
from trellis_common.documents.base import DocumentError, KindRegistry, Origin
from trellis_common.documents.meshconfig import MeshConfigSettings, TracingSettings

ORIGIN = Origin("file.yaml", 0)

# OSM's preset MeshConfig (charts/osm/templates/preset-mesh-config.yaml), values filled in.
OSM_PRESET = """
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata:
  name: osm-mesh-config
  namespace: osm-system
spec:
  sidecar:
    enablePrivilegedInitContainer: false
    logLevel: error
    maxDataPlaneConnections: 0
    envoyImage: envoyproxy/envoy-distroless:v1.22.2
    initContainerImage: openservicemesh/init:v1.2.0
    configResyncInterval: "0s"
    localProxyMode: Localhost
    resources: {}
  traffic:
    enableEgress: true
    enablePermissiveTrafficPolicyMode: true
    outboundPortExclusionList: []
    inboundPortExclusionList: []
    outboundIPRangeExclusionList: []
    outboundIPRangeInclusionList: []
    networkInterfaceExclusionList: []
    inboundExternalAuthorization:
      enable: false
      address: ""
      port: 0
  observability:
    osmLogLevel: info
    enableDebugServer: false
    tracing:
      enable: true
      address: jaeger.osm-system.svc.cluster.local
      port: 9411
      endpoint: /api/v2/spans
  certificate:
    serviceCertValidityDuration: 24h
    certKeyBitSize: 2048
  featureFlags:
    enableWASMStats: false
    enableEgressPolicy: true
    enableSnapshotCacheMode: false
"""

TRELLIS = """
apiVersion: config.trellis.io/v1alpha1
kind: MeshConfig
metadata:
  name: mesh
spec:
  trustDomain: cluster.local
  traffic:
    enablePermissiveTrafficPolicyMode: false
    enableEgress: true
  certificate:
    serviceCertValidityDuration: 1h30m
  sidecar:
    logLevel: WARN
  observability:
    tracing:
      enable: true
      address: zipkin.tracing
"""


@pytest.fixture
def registry() -> KindRegistry:
    registry = KindRegistry()
    meshconfig.register(registry)
    return registry


def settings(registry: KindRegistry, raw: object) -> MeshConfigSettings:
    if isinstance(raw, str):
        raw = yaml.safe_load(raw)
    resource = registry.parse(raw, ORIGIN).resource
    assert isinstance(resource, meshconfig.MeshConfig | meshconfig.OsmMeshConfig)
    return resource.settings()


def with_spec(api_version: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    raw: dict[str, Any] = {"apiVersion": api_version, "kind": "MeshConfig"}
    raw["metadata"] = {"name": "mesh"}
    if spec is not None:
        raw["spec"] = spec
    return raw


def test_registers_both_versions(registry: KindRegistry) -> None:
    assert registry.versions("MeshConfig") == [
        "config.openservicemesh.io/v1alpha2",
        "config.trellis.io/v1alpha1",
    ]


def test_osm_preset_is_read_as_it_is(registry: KindRegistry) -> None:
    assert settings(registry, OSM_PRESET) == MeshConfigSettings(
        permissive=True,
        egress=True,
        service_cert_validity=timedelta(hours=24),
        trust_domain=None,
        sidecar_log_level="error",
        tracing=TracingSettings("jaeger.osm-system.svc.cluster.local", 9411, "/api/v2/spans"),
    )


def test_osm_fields_trellis_does_not_apply_are_listed(registry: KindRegistry) -> None:
    document = registry.parse(yaml.safe_load(OSM_PRESET), Origin("osm.yaml"))
    unapplied = document.resource.not_applied()
    assert "spec.sidecar.envoyImage" in unapplied
    assert "spec.traffic.networkInterfaceExclusionList" in unapplied
    assert "spec.traffic.inboundExternalAuthorization" in unapplied
    assert "spec.observability.osmLogLevel" in unapplied
    assert "spec.certificate.certKeyBitSize" in unapplied
    # what Trellis applies is not listed
    for applied in (
        "spec.traffic.enableEgress",
        "spec.traffic.enablePermissiveTrafficPolicyMode",
        "spec.observability.tracing",
        "spec.certificate.serviceCertValidityDuration",
        "spec.sidecar.logLevel",  # the injector passes it to Envoy
        "spec.traffic.inboundPortExclusionList",  # the injector's init container applies them
        "spec.traffic.outboundPortExclusionList",
        "spec.traffic.outboundIPRangeExclusionList",
    ):
        assert not any(u.startswith(applied) for u in unapplied), applied
    assert unapplied == tuple(sorted(unapplied))


def test_exclusion_lists_are_read_and_checked(registry: KindRegistry) -> None:
    traffic = {
        "inboundPortExclusionList": [8080, 9090],
        "outboundPortExclusionList": [5432],
        "outboundIPRangeExclusionList": ["10.0.0.1/8", "169.254.169.254/32", "10.0.0.0/8"],
    }
    for version in (meshconfig.OSM_API_VERSION, meshconfig.TRELLIS_API_VERSION):
        read = registry.parse(with_spec(version, {"traffic": traffic}), Origin("m.yaml"))
        settings = read.resource.settings()
        assert settings.inbound_port_exclusions == (8080, 9090)
        assert settings.outbound_port_exclusions == (5432,)
        assert settings.outbound_ip_range_exclusions == ("10.0.0.0/8", "169.254.169.254/32")
    for field, value, reason in (
        ("outboundIPRangeExclusionList", ["fd00::/8"], "is IPv6"),
        ("outboundIPRangeExclusionList", ["somewhere"], "must be an IPv4 CIDR"),
        ("inboundPortExclusionList", [0], "greater than or equal to 1"),
        ("outboundPortExclusionList", ["80"], "valid integer"),
    ):
        raw = with_spec(meshconfig.OSM_API_VERSION, {"traffic": {field: value}})
        with pytest.raises(DocumentError) as caught:
            registry.parse(raw, Origin("m.yaml"))
        assert caught.value.field == f"spec.traffic.{field}[0]", field
        assert reason in caught.value.reason, (field, caught.value.reason)


def test_trellis_meshconfig(registry: KindRegistry) -> None:
    assert settings(registry, TRELLIS) == MeshConfigSettings(
        permissive=False,
        egress=True,
        service_cert_validity=timedelta(hours=1, minutes=30),
        trust_domain="cluster.local",
        sidecar_log_level="warning",
        tracing=TracingSettings("zipkin.tracing", 9411, "/api/v2/spans"),
    )


@pytest.mark.parametrize("version", [meshconfig.OSM_API_VERSION, meshconfig.TRELLIS_API_VERSION])
@pytest.mark.parametrize("spec", [None, {}, {"traffic": {}, "observability": {"tracing": {}}}])
def test_defaults_permissive_off(
    registry: KindRegistry, version: str, spec: dict[str, Any] | None
) -> None:
    assert settings(registry, with_spec(version, spec)) == MeshConfigSettings()
    assert MeshConfigSettings().permissive is False


def test_osm_ignores_what_it_does_not_know_even_trust_domain(registry: KindRegistry) -> None:
    spec = {
        "trustDomain": "example.org",  # not an OSM field: Trellis' own version has it
        "traffic": {"enableEgress": True, "unknown": 1},
        "observability": {"tracing": {"enable": False, "sampling": 0.5}},
        "somethingNew": {"a": 1},
    }
    assert settings(registry, with_spec(meshconfig.OSM_API_VERSION, spec)) == MeshConfigSettings(
        egress=True
    )


def test_osm_zero_values_are_unset(registry: KindRegistry) -> None:
    tracing = {"enable": True, "address": "zipkin", "port": 0, "endpoint": ""}
    spec = {"observability": {"tracing": tracing}}
    got = settings(registry, with_spec(meshconfig.OSM_API_VERSION, spec))
    assert got.tracing == TracingSettings("zipkin", 9411, "/api/v2/spans")


def test_tracing_disabled_gives_no_tracing(registry: KindRegistry) -> None:
    spec = {"observability": {"tracing": {"enable": False, "address": "zipkin"}}}
    assert settings(registry, with_spec(meshconfig.TRELLIS_API_VERSION, spec)).tracing is None


OSM = meshconfig.OSM_API_VERSION
TRELLIS_V = meshconfig.TRELLIS_API_VERSION


@pytest.mark.parametrize(
    ("version", "spec", "field", "reason"),
    [
        (TRELLIS_V, {"traffic": {"enableEgres": True}}, "spec.traffic.enableEgres", "Extra inputs"),
        (TRELLIS_V, {"tracing": {}}, "spec.tracing", "Extra inputs"),
        (
            TRELLIS_V,
            {"observability": {"tracing": {"sampling": 1}}},
            "spec.observability.tracing.sampling",
            "Extra inputs",
        ),
        (TRELLIS_V, {"trustDomain": "Example.ORG"}, "spec.trustDomain", "lower case"),
        (
            OSM,
            {"traffic": {"enablePermissiveTrafficPolicyMode": "true"}},
            "spec.traffic.enablePermissiveTrafficPolicyMode",
            "valid boolean",
        ),
        (OSM, {"traffic": {"enableEgress": 1}}, "spec.traffic.enableEgress", "valid boolean"),
        (
            OSM,
            {"certificate": {"serviceCertValidityDuration": "24d"}},
            "spec.certificate.serviceCertValidityDuration",
            "unknown unit 'd'",
        ),
        (
            TRELLIS_V,
            {"certificate": {"serviceCertValidityDuration": "-1h"}},
            "spec.certificate.serviceCertValidityDuration",
            "must be positive",
        ),
        (
            TRELLIS_V,
            {"certificate": {"serviceCertValidityDuration": "0"}},
            "spec.certificate.serviceCertValidityDuration",
            "must be positive",
        ),
        (
            OSM,
            {"certificate": {"serviceCertValidityDuration": 86400}},
            "spec.certificate.serviceCertValidityDuration",
            "Go duration string",
        ),
        (OSM, {"sidecar": {"logLevel": "verbose"}}, "spec.sidecar.logLevel", "'trace'"),
        (
            OSM,
            {"observability": {"tracing": {"enable": True}}},
            "spec.observability.tracing.address",
            "required when tracing is enabled",
        ),
        (
            TRELLIS_V,
            {"observability": {"tracing": {"enable": True, "address": "z", "port": 70000}}},
            "spec.observability.tracing.port",
            "less than or equal to 65535",
        ),
        (
            TRELLIS_V,
            {"observability": {"tracing": {"address": "z", "endpoint": "api/v2/spans"}}},
            "spec.observability.tracing.endpoint",
            "starting with '/'",
        ),
    ],
)
def test_invalid_meshconfigs(
    registry: KindRegistry, version: str, spec: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(DocumentError) as caught:
        settings(registry, with_spec(version, spec))
    assert caught.value.field == field
    assert reason in caught.value.reason


# --- Go durations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", timedelta(0)),
        ("-0", timedelta(0)),
        ("0s", timedelta(0)),
        ("24h", timedelta(hours=24)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("90s", timedelta(seconds=90)),
        ("1.5h", timedelta(hours=1, minutes=30)),
        ("2h45m30.5s", timedelta(hours=2, minutes=45, seconds=30, milliseconds=500)),
        (".5s", timedelta(milliseconds=500)),
        ("1.s", timedelta(seconds=1)),
        ("300ms", timedelta(milliseconds=300)),
        ("10us", timedelta(microseconds=10)),
        ("10µs", timedelta(microseconds=10)),  # micro sign
        ("10μs", timedelta(microseconds=10)),  # Greek mu
        ("1500ns", timedelta(microseconds=1)),  # truncated to microseconds
        ("1ns", timedelta(0)),
        ("1m1m", timedelta(minutes=2)),  # Go adds repeated units
        ("+5m", timedelta(minutes=5)),
        ("-1h30m", -timedelta(hours=1, minutes=30)),
        ("2562047h", timedelta(hours=2562047)),  # just inside Go's int64 range
    ],
)
def test_parse_go_duration(text: str, expected: timedelta) -> None:
    assert meshconfig.parse_go_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("-", "empty"),
        ("24", "missing unit after '24'"),
        ("00", "missing unit"),
        ("1.5", "missing unit"),
        ("h", "expected a number at 'h'"),
        (".", "expected a number"),
        (".s", "expected a number"),
        ("1d", "unknown unit 'd'"),
        ("1hh", "unknown unit 'hh'"),
        ("1H", "unknown unit 'H'"),
        ("1h 30m", "unknown unit 'h '"),
        (" 1h", "expected a number"),
        ("1h-30m", "unknown unit 'h-'"),
        ("2562048h", "longer than Go allows"),
    ],
)
def test_parse_go_duration_rejects(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match="invalid duration") as caught:
        meshconfig.parse_go_duration(text)
    assert reason in str(caught.value)
    assert repr(text) in str(caught.value)
