"""Inbound authorization: the TrafficTargets (and permissive mode) as Envoy RBAC rules.

Each rule allows its sources' SPIFFE ids (the authenticated principal) on its routes (path
regex and methods) or, for TCP, on the port. With no rule and permissive mode off, the
rules are ALLOW with no policy, which denies everything: deny by default.

Where the rules live decides how fast a change bites (issue 11, "revoked access is revoked
now"):

- **HTTP**: the inbound listener's connection manager carries one ``envoy.filters.http.rbac``
  filter whose own rules deny everything, and never change. The real rules ride on the
  inbound *route* as ``typed_per_filter_config`` (``RBACPerRoute``), as OSM does, and the
  route configuration comes over RDS. A policy change therefore replaces the route
  configuration only: the listener stays byte-identical (its LDS version does not move), no
  connection is drained, and Envoy judges the next request on every pooled connection by
  the new rules, since each HTTP stream takes the route configuration current when it
  starts. A request that matches no allowed route lands on the last route, which answers
  404 itself (OSM's code for it) and switches RBAC off for itself only: there is nothing
  behind it to protect.
- **TCP**: RBAC is a network filter, judged once per connection, so the rules must be in
  the listener's filter chain and a change replaces that chain. Envoy updates the listener
  in place ("filter chain only update"): new connections meet the new chain at once, and the
  connections on the old chain are drained; ``tcp_proxy`` has no graceful drain, so they are
  closed when the Envoy server's drain time (``--drain-time-s``) ends.
"""

from __future__ import annotations

import re

from envoy.config.rbac.v3 import rbac_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.type.matcher.v3 import path_pb2, regex_pb2, string_pb2
from google.protobuf import any_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import ingress
from trellis_proxy_cp.translate.common import pack

HTTP_RBAC = "envoy.filters.http.rbac"
"""The HTTP RBAC filter's name: the key of its per-route configuration too."""


def _principals(rule: catalog_pb2.InboundRule) -> list[rbac_pb2.Principal]:
    return [
        rbac_pb2.Principal(
            authenticated=rbac_pb2.Principal.Authenticated(
                principal_name=string_pb2.StringMatcher(exact=spiffe)
            )
        )
        for spiffe in rule.source_spiffe_ids
    ]


def _regex(pattern: str) -> string_pb2.StringMatcher:
    return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=pattern))


def _permission(match: catalog_pb2.HttpMatch) -> rbac_pb2.Permission:
    rules = []
    if match.path_exact:
        exact = string_pb2.StringMatcher(exact=match.path_exact)
        rules.append(rbac_pb2.Permission(url_path=path_pb2.PathMatcher(path=exact)))
    elif match.path_prefix:  # whole segments, as the route matches them
        prefix = _regex(f"{re.escape(match.path_prefix)}(/.*)?")
        rules.append(rbac_pb2.Permission(url_path=path_pb2.PathMatcher(path=prefix)))
    elif match.path_regex not in ("", ".*"):
        rules.append(
            rbac_pb2.Permission(url_path=path_pb2.PathMatcher(path=_regex(match.path_regex)))
        )
    methods = [m for m in match.methods if m != "*"]
    if methods:
        rules.append(
            rbac_pb2.Permission(
                header=rc.HeaderMatcher(
                    name=":method", string_match=_regex("|".join(sorted(methods)))
                )
            )
        )
    for name, pattern in sorted(match.headers.items()):
        rules.append(
            rbac_pb2.Permission(
                header=rc.HeaderMatcher(name=name.lower(), string_match=_regex(pattern))
            )
        )
    for header in match.header_matches:  # Gateway API: exactly, or by regex
        value = (
            _regex(header.value) if header.regex else string_pb2.StringMatcher(exact=header.value)
        )
        rules.append(
            rbac_pb2.Permission(header=rc.HeaderMatcher(name=header.name, string_match=value))
        )
    if not rules:
        return rbac_pb2.Permission(any=True)
    return rbac_pb2.Permission(and_rules=rbac_pb2.Permission.Set(rules=rules))


def rules(port: catalog_pb2.InboundPort, http: bool) -> rbac_pb2.RBAC:
    """The port's rules: permissive mode allows anyone; each TrafficTarget rule its sources."""
    policies: dict[str, rbac_pb2.Policy] = {}
    if port.allow_any:
        policies["permissive"] = rbac_pb2.Policy(
            permissions=[rbac_pb2.Permission(any=True)],
            principals=[rbac_pb2.Principal(any=True)],
        )
    for index, rule in enumerate(port.rules):
        if http:
            permissions = [_permission(m) for m in rule.http] or [rbac_pb2.Permission(any=True)]
        else:
            permissions = [rbac_pb2.Permission(any=True)]
        policies[f"{rule.policy}#{index}"] = rbac_pb2.Policy(
            permissions=permissions, principals=_principals(rule)
        )
    admitted = ingress.rbac_policy(port)
    if admitted is not None:  # an https IngressBackend: every route, to its principals
        policies[f"ingress:{port.ingress.policy}"] = admitted
    return rbac_pb2.RBAC(action=rbac_pb2.RBAC.ALLOW, policies=policies)


def deny_all() -> rbac_pb2.RBAC:
    """ALLOW with no policy: nothing is allowed."""
    return rbac_pb2.RBAC(action=rbac_pb2.RBAC.ALLOW)


def http_filter() -> hcm.HttpFilter:
    """The inbound connection manager's RBAC filter: the same bytes for every policy.

    Its own rules deny everything; each route overrides them (:func:`per_route`). ``rules``
    must be present: an RBAC filter without rules enforces nothing.
    """
    return hcm.HttpFilter(name=HTTP_RBAC, typed_config=pack(http_rbac_pb2.RBAC(rules=deny_all())))


def per_route(port: catalog_pb2.InboundPort) -> dict[str, any_pb2.Any]:
    """The ``typed_per_filter_config`` of an inbound route: the port's HTTP rules.

    ``rbac.rules`` is always set, even with no policy (deny all): an ``RBACPerRoute`` whose
    ``rbac`` has no rules turns RBAC off for the route, which would allow everything.
    """
    override = http_rbac_pb2.RBACPerRoute(rbac=http_rbac_pb2.RBAC(rules=rules(port, http=True)))
    return {HTTP_RBAC: pack(override)}


def unrouted() -> dict[str, any_pb2.Any]:
    """The ``typed_per_filter_config`` of the inbound 404 route (a ``direct_response``, no
    upstream): an ``RBACPerRoute`` without ``rbac`` turns RBAC off for that route, so the
    answer is OSM's 404, not the listener's deny-all 403."""
    return {HTTP_RBAC: pack(http_rbac_pb2.RBACPerRoute())}
