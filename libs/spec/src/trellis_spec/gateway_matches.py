"""Gateway API matches as the views carry them: a GRPCRoute's method and headers as an
HTTP/2 match on ``/service/method`` (GEP-1016's table), an HTTPRoute's path, headers, query
parameters and method. The routes (:mod:`.gateway`) and the TrafficTargets that name a
GRPCRoute (:mod:`.spec`) share them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from trellis_common.documents import gateway
from trellis_spec.matches import HttpMatch, ValueMatch


def _values(matches: Iterable[gateway.HeaderMatch], lower: bool) -> tuple[ValueMatch, ...]:
    return tuple(
        ValueMatch(m.name.lower() if lower else m.name, m.value, m.type == "RegularExpression")
        for m in matches
    )


def grpc_match(match: gateway.GRPCRouteMatch | None) -> HttpMatch:
    """A GRPCRoute match as an HTTP/2 match on ``/service/method`` (GEP-1016's table):

    ============  =======  ======  ===========================================
    type          service  method  path
    ============  =======  ======  ===========================================
    Exact         yes      yes     exactly ``/service/method``
    Exact         yes      no      the segment prefix ``/service``
    Exact         no       yes     regex ``/[^/]+/method``
    RegularExp.   either   either  regex ``/(service|[^/]+)/(method|[^/]+)``
    ============  =======  ======  ===========================================
    """
    if match is None:
        return HttpMatch()
    headers = _values(match.effective_headers(), lower=True)
    method = match.method
    if method is None:
        return HttpMatch(header_matches=headers)
    service, name = method.service or "", method.method or ""
    if method.type == "Exact":
        if service and name:
            return HttpMatch(path_exact=f"/{service}/{name}", header_matches=headers)
        if service:
            return HttpMatch(path_prefix=f"/{service}", header_matches=headers)
        return HttpMatch(path_regex=f"/[^/]+/{re.escape(name)}", header_matches=headers)
    pattern = f"/(?:{service or '[^/]+'})/(?:{name or '[^/]+'})"
    return HttpMatch(path_regex=pattern, header_matches=headers)


def http_match(match: gateway.HTTPRouteMatch) -> HttpMatch:
    """An HTTPRoute match: the path (``PathPrefix`` by whole segments, a trailing ``/``
    ignored), headers, query parameters and method."""
    path = match.path
    found = HttpMatch(
        methods=(match.method,) if match.method else (),
        header_matches=_values(match.effective_headers(), lower=True),
        query_params=_values(match.effective_query_params(), lower=False),
    )
    if path.type == "Exact":
        return replace(found, path_exact=path.value)
    if path.type == "RegularExpression":
        return replace(found, path_regex=path.value)
    prefix = path.value.rstrip("/")
    return replace(found, path_prefix=prefix) if prefix else found
