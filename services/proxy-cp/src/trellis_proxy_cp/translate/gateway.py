"""Gateway API routes (HTTPRoute, GRPCRoute) as Envoy routes.

The catalog has already turned gRPC methods into paths (``/service/method``), resolved the
backends and ordered the rules by precedence; here each rule becomes an Envoy route:

- matches: an exact path, a segment prefix (``path_separated_prefix``: ``/api`` takes
  ``/api`` and ``/api/x``, not ``/apix``), an RE2 regex; exact or regex header and query
  parameter matches; the method.
- a direct response where the rule cannot forward (404, gRPC UNIMPLEMENTED, for no match;
  500 for an ``ExtensionRef`` filter; the rule's error for no valid backend); Envoy answers
  a gRPC request's 503 with UNAVAILABLE and 404 with UNIMPLEMENTED.
- weighted clusters where an invalid backend's share names :data:`INVALID_BACKEND`, a
  cluster that never exists, answered with the rule's ``cluster_not_found_response_code``
  (503: gRPC UNAVAILABLE; 500 for HTTP), so the weights hold.
- filters: header modifiers (the rule's and each backend's), mirrors with their share,
  ``RequestRedirect``, ``URLRewrite``; ``timeouts`` (no deadline unless set, so gRPC streams
  live) with ``backendRequest`` as the per-try timeout.

A rule restricted to some of the service's names (route hostnames) goes only into the
virtual hosts of those names (:func:`virtual_hosts`), which is also how a proxyless gRPC
client, which matches no ``:authority`` header, sees them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import wrappers_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate.common import seconds

INVALID_BACKEND = "trellis|invalid-backend"
_REDIRECT_CODES = {
    301: rc.RedirectAction.MOVED_PERMANENTLY,
    302: rc.RedirectAction.FOUND,
    303: rc.RedirectAction.SEE_OTHER,
    307: rc.RedirectAction.TEMPORARY_REDIRECT,
    308: rc.RedirectAction.PERMANENT_REDIRECT,
}
_NOT_FOUND_CODES = {
    500: rc.RouteAction.INTERNAL_SERVER_ERROR,
    503: rc.RouteAction.SERVICE_UNAVAILABLE,
    404: rc.RouteAction.NOT_FOUND,
}


def _string(match: catalog_pb2.ValueMatch) -> string_pb2.StringMatcher:
    if match.regex:
        return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=match.value))
    return string_pb2.StringMatcher(exact=match.value)


def apply_match(match: catalog_pb2.HttpMatch, route: rc.RouteMatch) -> bool:
    """Set the Gateway API parts of ``match`` on ``route``; False if it has none of them
    (an SMI match: the caller sets the path)."""
    path = bool(match.path_exact or match.path_prefix)
    if match.path_exact:
        route.path = match.path_exact
    elif match.path_prefix:
        route.path_separated_prefix = match.path_prefix
    for header in match.header_matches:
        route.headers.append(rc.HeaderMatcher(name=header.name, string_match=_string(header)))
    for param in match.query_params:
        route.query_parameters.append(
            rc.QueryParameterMatcher(name=param.name, string_match=_string(param))
        )
    return path


def _header_options(edits: catalog_pb2.HeaderEdits) -> list[base_pb2.HeaderValueOption]:
    found = [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=h.name.lower(), value=h.value),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for h in edits.set
    ]
    found += [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=h.name.lower(), value=h.value),
            append_action=base_pb2.HeaderValueOption.APPEND_IF_EXISTS_OR_ADD,
        )
        for h in edits.add
    ]
    return found


def _removed(edits: catalog_pb2.HeaderEdits) -> list[str]:
    return [name.lower() for name in edits.remove]


def _per_million(numerator: int, denominator: int) -> percent_pb2.FractionalPercent:
    return percent_pb2.FractionalPercent(
        numerator=round(numerator * 1_000_000 / max(denominator, 1)),
        denominator=percent_pb2.FractionalPercent.MILLION,
    )


def _redirect(redirect: catalog_pb2.Redirect) -> rc.RedirectAction:
    action = rc.RedirectAction(response_code=_REDIRECT_CODES.get(redirect.status_code, 1))
    if redirect.scheme:
        action.scheme_redirect = redirect.scheme
    if redirect.hostname:
        action.host_redirect = redirect.hostname
    if redirect.port:
        action.port_redirect = redirect.port
    if redirect.full_path:
        action.path_redirect = redirect.full_path
    elif redirect.prefix_path:
        if redirect.prefix_path == "/":
            action.regex_rewrite.CopyFrom(_drop_prefix(redirect.matched_prefix))
        else:
            action.prefix_rewrite = redirect.prefix_path
    return action


def _drop_prefix(prefix: str) -> regex_pb2.RegexMatchAndSubstitute:
    """``ReplacePrefixMatch: /`` on ``/api/x`` is ``/x``, not ``//x``."""
    return regex_pb2.RegexMatchAndSubstitute(
        pattern=regex_pb2.RegexMatcher(regex=f"^{re.escape(prefix.rstrip('/'))}/*"),
        substitution="/",
    )


def _rewrite(rewrite: catalog_pb2.Rewrite, action: rc.RouteAction) -> None:
    if rewrite.hostname:
        action.host_rewrite_literal = rewrite.hostname
    if rewrite.full_path:
        action.regex_rewrite.CopyFrom(
            regex_pb2.RegexMatchAndSubstitute(
                pattern=regex_pb2.RegexMatcher(regex="^/.*$"), substitution=rewrite.full_path
            )
        )
    elif rewrite.prefix_path == "/":
        action.regex_rewrite.CopyFrom(_drop_prefix(rewrite.matched_prefix))
    elif rewrite.prefix_path:
        action.prefix_rewrite = rewrite.prefix_path


def _edit_headers(
    source: catalog_pb2.Route | catalog_pb2.WeightedCluster,
    target: rc.Route | rc.WeightedCluster.ClusterWeight,
) -> None:
    """A header modifier's edits on an Envoy route or weighted cluster (same field names)."""
    if source.HasField("request_headers"):
        target.request_headers_to_add.extend(_header_options(source.request_headers))
        target.request_headers_to_remove.extend(_removed(source.request_headers))
    if source.HasField("response_headers"):
        target.response_headers_to_add.extend(_header_options(source.response_headers))
        target.response_headers_to_remove.extend(_removed(source.response_headers))


def _cluster_weight(cluster: catalog_pb2.WeightedCluster) -> rc.WeightedCluster.ClusterWeight:
    weight = rc.WeightedCluster.ClusterWeight(
        name=cluster.cluster or INVALID_BACKEND,
        weight=wrappers_pb2.UInt32Value(value=cluster.weight),
    )
    _edit_headers(cluster, weight)
    return weight


def _action(route: catalog_pb2.Route, retry: rc.RetryPolicy | None) -> rc.RouteAction:
    clusters = [c for c in route.clusters if c.weight > 0]
    plain = len(clusters) == 1 and not (
        clusters[0].HasField("request_headers") or clusters[0].HasField("response_headers")
    )
    if plain:
        action = rc.RouteAction(cluster=clusters[0].cluster or INVALID_BACKEND)
    else:
        action = rc.RouteAction(
            weighted_clusters=rc.WeightedCluster(clusters=[_cluster_weight(c) for c in clusters])
        )
    action.cluster_not_found_response_code = _NOT_FOUND_CODES.get(
        route.invalid_status, rc.RouteAction.SERVICE_UNAVAILABLE
    )
    action.timeout.CopyFrom(seconds(route.timeout if route.HasField("timeout") else 0.0))
    for mirror in route.mirrors:
        action.request_mirror_policies.append(
            rc.RouteAction.RequestMirrorPolicy(
                cluster=mirror.cluster,
                runtime_fraction=base_pb2.RuntimeFractionalPercent(
                    default_value=_per_million(mirror.numerator, mirror.denominator)
                ),
            )
        )
    if route.HasField("rewrite"):
        _rewrite(route.rewrite, action)
    if retry is not None or route.HasField("backend_timeout"):
        policy = rc.RetryPolicy() if retry is None else retry
        if retry is None:
            policy.num_retries.value = 0
        if route.HasField("backend_timeout"):
            policy.per_try_timeout.CopyFrom(seconds(route.backend_timeout))
        action.retry_policy.CopyFrom(policy)
    return action


def route(
    source: catalog_pb2.Route, match: rc.RouteMatch, retry: rc.RetryPolicy | None
) -> rc.Route:
    """One Gateway API rule as an Envoy route."""
    found = rc.Route(name=source.name, match=match)
    if source.direct_status:
        found.direct_response.CopyFrom(rc.DirectResponseAction(status=source.direct_status))
        return found
    if source.HasField("redirect"):
        found.redirect.CopyFrom(_redirect(source.redirect))
    else:
        found.route.CopyFrom(_action(source, retry))
    _edit_headers(source, found)
    return found


def virtual_hosts(
    name: str, domains: Iterable[str], routes: list[tuple[catalog_pb2.Route, rc.Route]]
) -> list[rc.VirtualHost]:
    """The service's virtual hosts: one per set of names that the same routes hold for (a
    route with hostnames holds only for those names, with or without the port)."""
    groups: dict[tuple[int, ...], list[str]] = {}
    names = [frozenset(source.hostnames) for source, _ in routes]
    if not any(names):  # every route holds for every name (SMI, GAMMA without hostnames)
        groups[tuple(range(len(routes)))] = list(domains)
    for domain in domains if any(names) else ():
        head, colon, port = domain.rpartition(":")
        base = head if colon and port.isdecimal() else domain
        held = tuple(i for i, only in enumerate(names) if not only or base in only)
        groups.setdefault(held, []).append(domain)
    found = []
    for index, (held, group) in enumerate(sorted(groups.items(), key=lambda g: g[1][0])):
        if held:
            found.append(
                rc.VirtualHost(
                    name=name if index == 0 else f"{name}|{index}",
                    domains=group,
                    routes=[routes[i][1] for i in held],
                )
            )
    return found
