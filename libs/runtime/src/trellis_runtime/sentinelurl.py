"""Redis under Sentinel: the ``redis+sentinel://`` URL, parsed and checked in one place.

A highly available Redis is a master, its replicas and (at least) three sentinels that
watch them and promote a replica when the master is lost. A client is not given the
master's address, which changes at a failover, but the sentinels' and the master's name;
it asks a sentinel where the master is whenever it (re)connects. The URL says all that::

    redis+sentinel://[user[:password]@]host1[:port1][,host2[:port2]...]/<master-name>[/<db>][?options]

* ``host:port``: the sentinels (at least one, the port defaults to 26379; an IPv6
  address in brackets, ``[::1]:26379``);
* ``master-name``: the name the sentinels monitor (``sentinel monitor <name> ...``);
* ``db``: the database number, 0 if left out;
* ``user:password``: the Redis user, as in a ``redis://`` URL (``redis_username`` and
  ``redis_password_file`` win over it, :class:`trellis_runtime.redisconn.RedisTarget`).

Logging in to the sentinels: the sentinels of ``trellis up --redis-sentinel`` and of the
Helm chart have the components' users too (:func:`trellis_runtime.redisacl.sentinel_acl_lines`:
the same name and password, allowed only to ask where the master is), so by default a
client logs in to a sentinel exactly as to Redis, and no second secret is handed out. An
operator's own sentinels may be set up otherwise; the options say how:

* ``sentinel_auth=none``: the sentinels take no password (their default user is on);
* ``sentinel_password_file=PATH`` (and ``sentinel_username=NAME``, default ``default``):
  log in to the sentinels as that user, with the password read from that file.

Anything else in the URL is refused with an error naming what is wrong (and never the
password): a typo in a setting is found at start-up, not as a Redis that cannot be found.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
OPTIONS = ("sentinel_auth", "sentinel_username", "sentinel_password_file")

#: Makes the error for one problem with the URL (the URL, redacted, is in it).
Complaint = Callable[[str], ValueError]


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names Redis through its sentinels."""
    return url.partition("://")[0].lower() == SCHEME


def redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: what an error may quote."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hosts = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.partition(':')[0]}:***@{hosts}"


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed ``redis+sentinel://`` URL (see the module docstring)."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    #: How to log in to the sentinels: as to Redis, without a password, or from a file.
    sentinel_auth: Literal["same", "none", "file"] = "same"
    sentinel_username: str = "default"
    sentinel_password_file: Path | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelUrl:
        """Raises ``ValueError`` naming what is wrong, and quoting the URL without its
        password."""

        def bad(problem: str) -> ValueError:
            return ValueError(f"bad Redis Sentinel URL {redacted(url)!r}: {problem}")

        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() != SCHEME:
            raise bad(f"it must start with {SCHEME}://")
        netloc, _, tail = rest.partition("/")
        path, _, query = tail.partition("?")
        userinfo, at, hosts = netloc.rpartition("@")
        username = password = None
        if at:
            user, colon, secret = userinfo.partition(":")
            username = unquote(user) or None
            password = unquote(secret) if colon else None
        sentinels = tuple(_address(host, bad) for host in hosts.split(","))
        segments = path.split("/") if path else []
        if not segments or not segments[0]:
            raise bad("no master name: add /<master-name> after the sentinels")
        if len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
            raise bad("after the sentinels comes /<master-name>[/<db>], db a number")
        db = int(segments[1]) if len(segments) == 2 else 0
        return cls(sentinels, unquote(segments[0]), db, username, password, *_options(query, bad))

    def describe(self) -> str:
        """``sentinel[h1:26379,h2:26379]/mymaster/0``: no credentials."""
        where = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.sentinels)
        return f"sentinel[{where}]/{self.master}/{self.db}"

    def sentinel_login(
        self, username: str | None, password: str | None
    ) -> tuple[str | None, str | None]:
        """The user and password to log in to the sentinels with, given Redis's.

        Raises ``ValueError`` naming ``sentinel_password_file`` when it cannot be read."""
        if self.sentinel_auth == "none":
            return None, None
        if self.sentinel_auth == "same" or self.sentinel_password_file is None:
            return username, password
        path = self.sentinel_password_file
        try:
            secret = path.read_text().strip()
        except OSError as exc:
            raise ValueError(
                f"sentinel_password_file {str(path)!r} cannot be read: {exc.strerror}"
            ) from exc
        if not secret:
            raise ValueError(f"sentinel_password_file {str(path)!r} is empty")
        return self.sentinel_username, secret


def _address(text: str, bad: Complaint) -> tuple[str, int]:
    if not text:
        raise bad("a sentinel's address is empty: list them as host1:port1,host2:port2")
    try:
        parts = urlsplit(f"//{text}")
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise bad(f"sentinel address {text!r}: {exc}") from exc
    if not host or parts.username is not None or parts.path:
        raise bad(f"sentinel address {text!r} is not host[:port]")
    return host, port or DEFAULT_SENTINEL_PORT


def _options(
    query: str, bad: Complaint
) -> tuple[Literal["same", "none", "file"], str, Path | None]:
    try:
        values = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise bad(f"its options ({exc})") from exc
    unknown = sorted(set(values) - set(OPTIONS))
    if unknown:
        raise bad(f"unknown option(s) {unknown}: the options are {list(OPTIONS)}")
    repeated = sorted(k for k, v in values.items() if len(v) > 1)
    if repeated:
        raise bad(f"option(s) {repeated} given more than once")
    given = {k: v[0] for k, v in values.items()}
    auth = given.get("sentinel_auth", "")
    file = given.get("sentinel_password_file", "")
    if auth not in ("", "same", "none"):
        raise bad(f"sentinel_auth must be 'same' or 'none', not {auth!r}")
    if file and auth:
        raise bad("sentinel_password_file and sentinel_auth exclude each other")
    if "sentinel_username" in given and not file:
        raise bad("sentinel_username needs sentinel_password_file")
    if file:
        return "file", given.get("sentinel_username") or "default", Path(file)
    return ("none" if auth == "none" else "same"), "default", None
