"""RDS: the outbound routes (one virtual host per destination) and the inbound route,
which carries the inbound RBAC rules.

Outbound, each HTTP destination is a virtual host whose domains are every name a client
may use (with and without the port), and whose routes carry the catalog's matches (path
regex in RE2, methods, headers) and weighted clusters (TrafficSplit). Envoy refuses a
route configuration in which two virtual hosts share a domain, so a name already taken
(two HTTP ports of one service both claim the bare name) is kept only for the first.
"""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from google.protobuf import wrappers_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import authz, egress, gateway, ingress, names, ratelimit

HTTP_PROTOCOLS = ("http", "http2", "grpc")


def _regex(pattern: str) -> regex_pb2.RegexMatcher:
    return regex_pb2.RegexMatcher(regex=pattern)


def route_match(match: catalog_pb2.HttpMatch) -> rc.RouteMatch:
    route = rc.RouteMatch()
    if gateway.apply_match(match, route):
        pass  # an exact path or a segment prefix (Gateway API)
    elif match.path_regex in ("", ".*"):
        route.prefix = "/"
    else:
        route.safe_regex.CopyFrom(_regex(match.path_regex))
    methods = [m for m in match.methods if m != "*"]
    if methods:
        method = rc.HeaderMatcher(name=":method")
        if len(methods) == 1:
            method.string_match.CopyFrom(string_pb2.StringMatcher(exact=methods[0]))
        else:
            method.string_match.CopyFrom(
                string_pb2.StringMatcher(safe_regex=_regex("|".join(sorted(methods))))
            )
        route.headers.append(method)
    for name, pattern in sorted(match.headers.items()):
        route.headers.append(
            rc.HeaderMatcher(
                name=name.lower(), string_match=string_pb2.StringMatcher(safe_regex=_regex(pattern))
            )
        )
    return route


def retry_policy(retry: catalog_pb2.RetryPolicy) -> rc.RetryPolicy:
    """An OSM Retry policy as Envoy's (OSM's ``buildRetryPolicy``): what is unset keeps
    Envoy's default (1 retry, the route's timeout per try, 25 ms backoff base)."""
    policy = rc.RetryPolicy(retry_on=retry.retry_on)
    if retry.HasField("num_retries"):
        policy.num_retries.value = retry.num_retries
    if retry.HasField("per_try_timeout"):
        policy.per_try_timeout.FromNanoseconds(round(retry.per_try_timeout * 1e9))
    if retry.HasField("backoff_base_interval") and retry.backoff_base_interval > 0:
        policy.retry_back_off.base_interval.FromNanoseconds(
            round(retry.backoff_base_interval * 1e9)
        )
    return policy


def _action(
    route: catalog_pb2.Route, retry: catalog_pb2.RetryPolicy | None = None
) -> rc.RouteAction:
    action = _destination(route)
    if retry is not None:
        action.retry_policy.CopyFrom(retry_policy(retry))
    return action


def _destination(route: catalog_pb2.Route) -> rc.RouteAction:
    clusters = [c for c in route.clusters if c.weight > 0]
    if len(clusters) == 1:
        return rc.RouteAction(cluster=clusters[0].cluster)
    return rc.RouteAction(
        weighted_clusters=rc.WeightedCluster(
            clusters=[
                rc.WeightedCluster.ClusterWeight(
                    name=c.cluster, weight=wrappers_pb2.UInt32Value(value=c.weight)
                )
                for c in clusters
            ]
        )
    )


def service_hosts(service: catalog_pb2.OutboundService, domains: list[str]) -> list[rc.VirtualHost]:
    """One destination's virtual hosts (one unless Gateway API rules hold for only some of
    its names), with its routes in order."""
    retry = service.retry if service.HasField("retry") else None
    routes = []
    for route in service.routes:
        if route.source or route.direct_status:  # a Gateway API rule, or its last route
            envoy_retry = retry_policy(retry) if retry is not None else None
            routes.append((route, gateway.route(route, route_match(route.match), envoy_retry)))
        elif any(c.weight > 0 for c in route.clusters):
            action = _action(route, retry)
            routes.append(
                (route, rc.Route(name=route.name, match=route_match(route.match), route=action))
            )
    name = f"{service.namespace}/{service.name}|{service.port}"
    return gateway.virtual_hosts(name, domains, routes)


def outbound(view: catalog_pb2.View) -> route_pb2.RouteConfiguration:
    taken: set[str] = set()
    hosts = []
    for service in view.outbound:
        if service.protocol not in HTTP_PROTOCOLS:
            continue
        domains = [d for d in service.hostnames if d not in taken]
        if not domains:
            continue
        taken.update(domains)
        hosts += service_hosts(service, domains)
    for external in view.external:
        if external.protocol not in HTTP_PROTOCOLS:
            continue
        domains = [d for d in (external.host, f"{external.host}:{external.port}") if d not in taken]
        if domains:
            taken.update(domains)
            hosts.append(
                rc.VirtualHost(
                    name=f"external/{external.host}|{external.port}",
                    domains=domains,
                    routes=[
                        rc.Route(
                            match=rc.RouteMatch(prefix="/"),
                            route=rc.RouteAction(cluster=external.cluster),
                        )
                    ],
                )
            )
    hosts += _egress_hosts(view, taken)
    if view.mesh.egress:
        hosts.append(egress.virtual_host())  # last: mesh destinations match first
    return route_pb2.RouteConfiguration(
        name=names.OUTBOUND_ROUTES,
        virtual_hosts=hosts,
        validate_clusters=wrappers_pb2.BoolValue(value=False),
    )


def _egress_hosts(view: catalog_pb2.View, taken: set[str]) -> list[rc.VirtualHost]:
    """The hosts OSM Egress policies allow: a name a mesh destination or ServiceEntry
    already has stays theirs (they come first); routes sharing a name share its host."""
    grouped: dict[str, rc.VirtualHost] = {}
    claimed: dict[str, str] = {}  # domain -> its host's key
    for route in view.egress:
        domains = [d for d in egress.domains(route) if d not in taken]
        if not domains:
            continue
        key = claimed.get(domains[0], domains[0])
        host = grouped.get(key)
        if host is None:
            host = grouped[key] = rc.VirtualHost(name=f"egress/{key}")
        for domain in domains:
            if domain not in claimed:
                claimed[domain] = key
                host.domains.append(domain)
        cluster = egress.cluster_name(route)
        if route.protocol == "http":
            for index, match in enumerate(route.matches or [catalog_pb2.HttpMatch()]):
                host.routes.append(
                    rc.Route(
                        name=f"{cluster}|{index}",
                        match=route_match(match),
                        route=rc.RouteAction(cluster=cluster),
                    )
                )
        else:
            host.routes.append(egress.connect_route(cluster, cluster, egress.authority(route)))
        for added in host.routes:
            if not added.HasField("metadata"):  # which Egress policies allow it, for operators
                added.metadata.filter_metadata["trellis"].update({"policies": list(route.policies)})
    taken.update(claimed)
    return list(grouped.values())


def inbound(
    view: catalog_pb2.View,
    ports: list[catalog_pb2.InboundPort],
    name: str = names.INBOUND_ROUTES,
) -> route_pb2.RouteConfiguration:
    """The routes to the local application: one per distinct HTTP match the port's rules
    allow (a catch-all in permissive mode or for a rule of whole routes), each carrying all
    of the port's RBAC rules.

    OSM's status codes follow (docs/osm-compatibility.md): a request that matches no
    allowed route finds no route, 404; one that matches a route its source is not allowed
    on is refused by RBAC, 403. Every route carries the whole rule set, so which route a
    request lands on never changes who is allowed. The rules ride on the routes
    (``authz.per_route``), so a policy change is an RDS update that the next request already
    sees; the listener's own RBAC filter denies everything and never changes.
    """
    hosts = []
    for port in ports[:1]:
        if port.protocol not in HTTP_PROTOCOLS:
            continue
        rbac = authz.per_route(port)
        action = rc.RouteAction(cluster=names.inbound_cluster(port.port))
        routes = [
            rc.Route(
                name=f"inbound|{port.port}|{index}",
                match=route_match(match),
                route=action,
                typed_per_filter_config={**rbac, **ratelimit.route_limit(port, match)},
            )
            for index, match in enumerate(_allowed_matches(port))
        ]
        routes.append(
            rc.Route(
                name=f"inbound|{port.port}|no-route",
                match=rc.RouteMatch(prefix="/"),
                direct_response=rc.DirectResponseAction(status=404),
                typed_per_filter_config=authz.unrouted(),
            )
        )
        host = rc.VirtualHost(name=f"inbound|{port.port}", domains=["*"], routes=routes)
        if port.HasField("rate_limit"):  # OSM: the service's limit, on its virtual host
            for key, value in ratelimit.http_limit(port.rate_limit).items():
                host.typed_per_filter_config[key].CopyFrom(value)
        hosts.append(host)
    return route_pb2.RouteConfiguration(name=name, virtual_hosts=hosts)


def _allowed_matches(port: catalog_pb2.InboundPort) -> list[catalog_pb2.HttpMatch]:
    """The distinct matches of the port's rules, in order; one catch-all when any rule (or
    permissive mode) allows every request."""
    admitted = ingress.rbac_policy(port) is not None  # an https IngressBackend: every route
    if port.allow_any or admitted or any(not rule.http for rule in port.rules):
        return [catalog_pb2.HttpMatch()]
    found: dict[bytes, catalog_pb2.HttpMatch] = {}
    for rule in port.rules:
        for match in rule.http:
            found.setdefault(match.SerializeToString(deterministic=True), match)
    return list(found.values())
