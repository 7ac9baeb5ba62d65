"""Valid documents of every kind and apiVersion Trellis reads: the fuzz suite's seeds.

Mutating a valid document (:func:`trellis_testing.strategies.mutations`) reaches
rules that random structures never do, because every other field stays valid. Each seed
uses most of its schema (optional fields included) so that a mutation can land anywhere;
``test_fuzz_documents.py`` checks that the seeds cover every registered kind and apiVersion
and that each parses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

SEEDS: Final[tuple[Mapping[str, Any], ...]] = (
    {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "bookstore", "namespace": "shop", "labels": {"app": "b"}},
        "spec": {
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "appProtocol": "http"},
                {"name": "grpc-api", "port": 9090, "targetPort": 9091, "protocol": "TCP"},
            ],
            "selector": {"app": "bookstore"},
            "clusterIP": "10.96.0.10",
            "type": "ClusterIP",
            "sessionAffinity": "None",
        },
    },
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bookstore"}},
    *(
        {
            "apiVersion": version,
            "kind": "TrafficSplit",
            "metadata": {"name": "split", "namespace": "shop"},
            "spec": {
                "service": "bookstore.shop",
                "backends": [
                    {"service": "bookstore-v1", "weight": 80},
                    {"service": "bookstore-v2", "weight": 20},
                ],
                **({"matches": [{"kind": "HTTPRouteGroup", "name": "routes"}]} if matches else {}),
            },
        }
        for version, matches in (
            ("split.smi-spec.io/v1alpha2", False),
            ("split.smi-spec.io/v1alpha3", True),
            ("split.smi-spec.io/v1alpha4", True),
        )
    ),
    *(
        {
            "apiVersion": version,
            "kind": "TrafficTarget",
            "metadata": {"name": "access", "namespace": "shop"},
            "spec": {
                "destination": {
                    "kind": "ServiceAccount",
                    "name": "bookstore",
                    "namespace": "shop",
                    **({"port": 8080} if port else {}),
                },
                "sources": [{"kind": "ServiceAccount", "name": "buyer", "namespace": "buyers"}],
                "rules": [
                    {"kind": "HTTPRouteGroup", "name": "routes", "matches": ["buy"]},
                    {"kind": "TCPRoute", "name": "tcp"},
                ],
            },
        }
        for version, port in (
            ("access.smi-spec.io/v1alpha2", True),
            ("access.smi-spec.io/v1alpha3", False),
        )
    ),
    *(
        {
            "apiVersion": version,
            "kind": "HTTPRouteGroup",
            "metadata": {"name": "routes", "namespace": "shop"},
            "spec": {
                "matches": [
                    {
                        "name": "buy",
                        "pathRegex": "/buy/[0-9]+",
                        "methods": ["GET", "POST"],
                        "headers": {"user-agent": ".*Firefox.*"},
                    },
                    {"name": "all", "methods": ["*"]},
                ]
            },
        }
        for version in ("specs.smi-spec.io/v1alpha3", "specs.smi-spec.io/v1alpha4")
    ),
    {
        "apiVersion": "specs.smi-spec.io/v1alpha3",
        "kind": "TCPRoute",
        "metadata": {"name": "tcp", "namespace": "shop"},
        "spec": {},
    },
    {
        "apiVersion": "specs.smi-spec.io/v1alpha4",
        "kind": "TCPRoute",
        "metadata": {"name": "tcp", "namespace": "shop"},
        "spec": {"matches": {"name": "db", "ports": [5432, 5433]}},
    },
    *(
        {
            "apiVersion": f"networking.istio.io/{version}",
            "kind": "ServiceEntry",
            "metadata": {"name": "payments", "namespace": "shop"},
            "spec": {
                "hosts": ["payments.example.com"],
                "addresses": ["192.0.2.0/24"],
                "ports": [
                    {"number": 443, "name": "https", "protocol": "HTTPS"},
                    {"number": 8080, "name": "http", "protocol": "http", "targetPort": 9080},
                ],
                "location": "MESH_INTERNAL",
                "resolution": "STATIC",
                "endpoints": [
                    {"address": "192.0.2.10", "ports": {"https": 8443}, "labels": {"v": "1"}},
                    {"address": "192.0.2.11", "locality": "eu/west/a", "weight": 3},
                ],
                "exportTo": ["."],
                "subjectAltNames": ["spiffe://cluster.local/ns/shop/sa/payments"],
            },
        }
        for version in ("v1alpha3", "v1beta1", "v1")
    ),
    {
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "ServiceEntry",
        "metadata": {"name": "local-db", "namespace": "shop"},
        "spec": {
            "hosts": ["db.local"],
            "ports": [{"number": 5432, "name": "tcp-db", "protocol": "TCP"}],
            "location": "MESH_EXTERNAL",
            "resolution": "STATIC",
            "endpoints": [{"address": "unix:///var/run/db.sock"}],
            "exportTo": ["*"],
        },
    },
    {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "vms", "namespace": "shop"},
        "spec": {
            "hosts": ["cart.shop.svc.cluster.local"],
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "resolution": "DNS",
            "workloadSelector": {"labels": {"app": "cart"}},
        },
    },
    *(
        {
            "apiVersion": f"networking.istio.io/{version}",
            "kind": "WorkloadEntry",
            "metadata": {"name": "cart-vm-1", "namespace": "shop", "labels": {"app": "cart"}},
            "spec": {
                "address": "10.0.0.7",
                "ports": {"http": 8080},
                "labels": {"app": "cart"},
                "network": "vpc-1",
                "locality": "eu/west",
                "weight": 2,
                "serviceAccount": "cart",
            },
        }
        for version in ("v1alpha3", "v1beta1", "v1")
    ),
    {
        "apiVersion": "config.openservicemesh.io/v1alpha2",
        "kind": "MeshConfig",
        "metadata": {"name": "osm-mesh-config", "namespace": "trellis-system"},
        "spec": {
            "sidecar": {"logLevel": "warn", "enablePrivilegedInitContainer": False},
            "traffic": {"enablePermissiveTrafficPolicyMode": True, "enableEgress": False},
            "certificate": {"serviceCertValidityDuration": "24h"},
            "observability": {"tracing": {"enable": True, "address": "jaeger", "port": 9411}},
        },
    },
    {
        "apiVersion": "config.trellis.io/v1alpha1",
        "kind": "MeshConfig",
        "metadata": {"name": "mesh", "namespace": "trellis-system"},
        "spec": {
            "trustDomain": "mesh.example.org",
            "traffic": {"enablePermissiveTrafficPolicyMode": False, "enableEgress": True},
            "certificate": {"serviceCertValidityDuration": "1h30m"},
            "sidecar": {"logLevel": "debug"},
            "observability": {"tracing": {"enable": False, "endpoint": "/api/v2/spans"}},
            "featureFlags": {"enableRetryPolicy": True},
        },
    },
    {
        "apiVersion": "policy.openservicemesh.io/v1alpha1",
        "kind": "Retry",
        "metadata": {"name": "retry", "namespace": "buyers"},
        "spec": {
            "source": {"kind": "ServiceAccount", "name": "buyer", "namespace": "buyers"},
            "destinations": [{"kind": "Service", "name": "bookstore", "namespace": "bookstore"}],
            "retryPolicy": {
                "retryOn": "5xx,reset",
                "perTryTimeout": "1s",
                "numRetries": 3,
                "retryBackoffBaseInterval": "10ms",
            },
        },
    },
    {
        "apiVersion": "policy.openservicemesh.io/v1alpha1",
        "kind": "UpstreamTrafficSetting",
        "metadata": {"name": "bookstore", "namespace": "bookstore"},
        "spec": {
            "host": "bookstore.bookstore.svc.cluster.local",
            "connectionSettings": {
                "tcp": {"maxConnections": 100, "connectTimeout": "5s"},
                "http": {
                    "maxRequests": 200,
                    "maxRequestsPerConnection": 10,
                    "maxPendingRequests": 50,
                    "maxRetries": 3,
                },
            },
            "rateLimit": {
                "local": {
                    "tcp": {"connections": 10, "unit": "second", "burst": 5},
                    "http": {
                        "requests": 100,
                        "unit": "minute",
                        "responseStatusCode": 429,
                        "responseHeadersToAdd": [{"name": "x-limited", "value": "yes"}],
                    },
                }
            },
            "httpRoutes": [
                {"path": "/books", "rateLimit": {"local": {"requests": 10, "unit": "second"}}}
            ],
            "outlierDetection": {
                "consecutive5xxErrors": 5,
                "consecutiveGatewayErrors": 3,
                "interval": "10s",
                "baseEjectionTime": "30s",
                "maxEjectionPercent": 50,
            },
        },
    },
    {
        "apiVersion": "policy.openservicemesh.io/v1alpha1",
        "kind": "Egress",
        "metadata": {"name": "httpbin", "namespace": "curl"},
        "spec": {
            "sources": [{"kind": "ServiceAccount", "name": "curl", "namespace": "curl"}],
            "hosts": ["httpbin.org"],
            "ipAddresses": ["10.0.0.0/24"],
            "ports": [{"number": 80, "protocol": "http"}, {"number": 5432, "protocol": "tcp"}],
            "matches": [
                {"apiGroup": "specs.smi-spec.io/v1alpha4", "kind": "HTTPRouteGroup", "name": "get"}
            ],
        },
    },
    {
        "apiVersion": "policy.openservicemesh.io/v1alpha1",
        "kind": "IngressBackend",
        "metadata": {"name": "httpbin", "namespace": "httpbin"},
        "spec": {
            "backends": [
                {
                    "name": "httpbin",
                    "port": {"number": 14001, "protocol": "https"},
                    "tls": {"skipClientCertValidation": False, "sniHosts": ["httpbin.local"]},
                }
            ],
            "sources": [
                {"kind": "Service", "name": "nginx", "namespace": "ingress-nginx"},
                {"kind": "AuthenticatedPrincipal", "name": "nginx.ingress-nginx.cluster.local"},
                {"kind": "IPRange", "name": "10.0.0.0/8"},
            ],
        },
    },
    *(
        {
            "apiVersion": version,
            "kind": "GRPCRoute",
            "metadata": {
                "name": "hello",
                "namespace": "shop",
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {
                "parentRefs": [{"group": "", "kind": "Service", "name": "hello", "port": 9000}],
                "hostnames": ["hello.shop.svc.cluster.local", "*.shop"],
                "rules": [
                    {
                        "matches": [
                            {
                                "method": {"service": "helloworld.Greeter", "method": "SayHello"},
                                "headers": [{"name": "x-version", "value": "2"}],
                            },
                            {
                                "method": {"type": "RegularExpression", "method": "Say.*"},
                                "headers": [
                                    {"type": "RegularExpression", "name": "env", "value": "a|b"}
                                ],
                            },
                        ],
                        "filters": [
                            {
                                "type": "RequestHeaderModifier",
                                "requestHeaderModifier": {
                                    "set": [{"name": "x-a", "value": "1"}],
                                    "add": [{"name": "x-b", "value": "2"}],
                                    "remove": ["x-c"],
                                },
                            },
                            {
                                "type": "RequestMirror",
                                "requestMirror": {
                                    "backendRef": {"name": "hello-shadow", "port": 9000},
                                    "percent": 10,
                                },
                            },
                        ],
                        "backendRefs": [
                            {"name": "hello-v1", "port": 9000, "weight": 80},
                            {"name": "hello-v2", "port": 9000, "weight": 20},
                        ],
                    }
                ],
            },
        }
        for version in ("gateway.networking.k8s.io/v1alpha2", "gateway.networking.k8s.io/v1")
    ),
    *(
        {
            "apiVersion": version,
            "kind": "HTTPRoute",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {
                "parentRefs": [{"group": "", "kind": "Service", "name": "web", "port": 80}],
                "hostnames": ["web.shop"],
                "rules": [
                    {
                        "matches": [
                            {
                                "path": {"type": "PathPrefix", "value": "/api"},
                                "headers": [{"name": "x-env", "value": "canary"}],
                                "queryParams": [{"name": "debug", "value": "1"}],
                                "method": "GET",
                            }
                        ],
                        "filters": [
                            {
                                "type": "URLRewrite",
                                "urlRewrite": {
                                    "hostname": "web.internal",
                                    "path": {
                                        "type": "ReplacePrefixMatch",
                                        "replacePrefixMatch": "/v2",
                                    },
                                },
                            },
                            {
                                "type": "ResponseHeaderModifier",
                                "responseHeaderModifier": {"set": [{"name": "x-r", "value": "1"}]},
                            },
                        ],
                        "backendRefs": [
                            {"name": "web-v1", "port": 80, "weight": 90},
                            {"name": "web-v2", "port": 80, "weight": 10},
                        ],
                        "timeouts": {"request": "10s", "backendRequest": "2s"},
                    }
                ],
            },
        }
        for version in ("gateway.networking.k8s.io/v1beta1", "gateway.networking.k8s.io/v1")
    ),
    {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "shop", "labels": {"shared-gateway": "true"}},
    },
    *(
        {
            "apiVersion": version,
            "kind": "GatewayClass",
            "metadata": {"name": "trellis"},
            "spec": {"controllerName": "trellis.dev/gateway", "description": "Trellis"},
        }
        for version in ("gateway.networking.k8s.io/v1beta1", "gateway.networking.k8s.io/v1")
    ),
    *(
        {
            "apiVersion": version,
            "kind": "Gateway",
            "metadata": {"name": "edge", "namespace": "shop"},
            "spec": {
                "gatewayClassName": "trellis",
                "listeners": [
                    {
                        "name": "http",
                        "port": 8080,
                        "protocol": "HTTP",
                        "allowedRoutes": {
                            "namespaces": {
                                "from": "Selector",
                                "selector": {"matchLabels": {"shared-gateway": "true"}},
                            },
                            "kinds": [{"kind": "HTTPRoute"}, {"kind": "GRPCRoute"}],
                        },
                    },
                    {
                        "name": "https",
                        "port": 8443,
                        "protocol": "HTTPS",
                        "hostname": "*.example.com",
                        "tls": {
                            "mode": "Terminate",
                            "certificateRefs": [{"name": "edge-cert", "namespace": "certs"}],
                        },
                    },
                ],
            },
        }
        for version in ("gateway.networking.k8s.io/v1beta1", "gateway.networking.k8s.io/v1")
    ),
    *(
        {
            "apiVersion": version,
            "kind": "TLSRoute",
            "metadata": {"name": "vault", "namespace": "shop"},
            "spec": {
                "parentRefs": [{"name": "edge", "sectionName": "tls"}],
                "hostnames": ["vault.example.com", "*.vault.example.com"],
                "rules": [
                    {
                        "name": "vault",
                        "backendRefs": [
                            {"name": "vault", "port": 8200, "weight": 9},
                            {"name": "vault-next", "port": 8200, "weight": 1},
                        ],
                    }
                ],
            },
        }
        for version in ("gateway.networking.k8s.io/v1alpha2", "gateway.networking.k8s.io/v1")
    ),
    *(
        {
            "apiVersion": version,
            "kind": "ReferenceGrant",
            "metadata": {"name": "edge-certs", "namespace": "certs"},
            "spec": {
                "from": [
                    {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "shop"}
                ],
                "to": [{"group": "", "kind": "Secret", "name": "edge-cert"}],
            },
        }
        for version in ("gateway.networking.k8s.io/v1beta1", "gateway.networking.k8s.io/v1")
    ),
)
"""One valid document per kind and apiVersion Trellis reads, using most of each schema."""
