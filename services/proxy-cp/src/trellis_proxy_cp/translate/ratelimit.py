"""OSM's local rate limits (UpstreamTrafficSetting ``rateLimit.local``, ``httpRoutes``) on the
destination's inbound side, as OSM v1.2 builds them.

- **HTTP**: the inbound connection manager always carries an ``envoy.filters.http.local_ratelimit``
  filter with no bucket of its own (so the listener never changes with a policy); the limit
  rides on the inbound virtual host as ``typed_per_filter_config``, and a route whose path
  regex is an ``httpRoutes[].path`` carries its own, which replaces the virtual host's for
  that route. A token bucket of ``requests`` per unit holding at most ``requests + burst``;
  a limited request gets the configured status (429 by default) and headers.
- **TCP**: an ``envoy.filters.network.local_ratelimit`` filter before ``tcp_proxy`` in the
  inbound filter chain, ``connections`` per unit (plus burst): a connection over the limit
  is closed at once.
"""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.extensions.filters.http.local_ratelimit.v3 import local_rate_limit_pb2 as http_rl
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.extensions.filters.network.local_ratelimit.v3 import local_rate_limit_pb2 as tcp_rl
from envoy.type.v3 import http_status_pb2, percent_pb2, token_bucket_pb2
from google.protobuf import any_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate.common import pack, seconds

HTTP_FILTER = "envoy.filters.http.local_ratelimit"
TCP_FILTER = "envoy.filters.network.local_ratelimit"
_ALL = base_pb2.RuntimeFractionalPercent(
    default_value=percent_pb2.FractionalPercent(
        numerator=100, denominator=percent_pb2.FractionalPercent.HUNDRED
    ),
    runtime_key="trellis.local_rate_limit",
)


def _bucket(limit: catalog_pb2.LocalRateLimit) -> token_bucket_pb2.TokenBucket:
    bucket = token_bucket_pb2.TokenBucket(
        max_tokens=limit.max_tokens, fill_interval=seconds(limit.fill_interval)
    )
    bucket.tokens_per_fill.value = limit.tokens_per_fill
    return bucket


def http_filter() -> hcm.HttpFilter:
    """The inbound manager's filter: no bucket, so nothing is limited but where a virtual
    host or route says so."""
    config = http_rl.LocalRateLimit(stat_prefix="inbound_http_local_rate_limit")
    return hcm.HttpFilter(name=HTTP_FILTER, typed_config=pack(config))


def http_limit(limit: catalog_pb2.LocalRateLimit) -> dict[str, any_pb2.Any]:
    """A virtual host's or route's ``typed_per_filter_config`` for ``limit``."""
    config = http_rl.LocalRateLimit(
        stat_prefix="inbound_http_local_rate_limit",
        token_bucket=_bucket(limit),
        filter_enabled=_ALL,
        filter_enforced=_ALL,
        response_headers_to_add=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=h.name.lower(), value=h.value),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
            for h in limit.response_headers
        ],
    )
    if limit.status:
        config.status.CopyFrom(http_status_pb2.HttpStatus(code=limit.status))
    return {HTTP_FILTER: pack(config)}


def route_limit(
    port: catalog_pb2.InboundPort, match: catalog_pb2.HttpMatch
) -> dict[str, any_pb2.Any]:
    """The per-route limit of an inbound route, if an ``httpRoutes[].path`` is its path."""
    for found in port.route_limits:
        if found.path == match.path_regex:
            return http_limit(found.limit)
    return {}


def tcp_filter(limit: catalog_pb2.LocalRateLimit) -> listener_components_pb2.Filter:
    config = tcp_rl.LocalRateLimit(
        stat_prefix="inbound_tcp_local_rate_limit", token_bucket=_bucket(limit)
    )
    return listener_components_pb2.Filter(name=TCP_FILTER, typed_config=pack(config))
