"""The request matches the mesh specification's documents resolve to: what a route or an
access rule takes (SMI's regexes; Gateway API's exact, prefix and regex matches)."""

from __future__ import annotations

from dataclasses import dataclass

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class ValueMatch:
    """A Gateway API header or query parameter match: exactly, or by an RE2 regex."""

    name: str
    value: str
    regex: bool = False


@dataclass(frozen=True, slots=True)
class HttpMatch:
    """Which requests a route or rule takes; the defaults take every request.

    SMI matches set ``path_regex``, ``methods`` and ``headers`` (regexes); Gateway API
    matches may instead set ``path_exact`` or ``path_prefix`` (whole segments), and exact or
    regex ``header_matches`` and ``query_params``."""

    path_regex: str = ".*"
    methods: tuple[str, ...] = ()
    headers: Headers = ()
    path_exact: str = ""
    path_prefix: str = ""
    header_matches: tuple[ValueMatch, ...] = ()
    query_params: tuple[ValueMatch, ...] = ()


MATCH_ALL = HttpMatch()
