"""The init container's traffic redirection, as the text of its iptables rules.

An injected pod's ``trellis-init`` container runs before any other container of the pod
starts serving, in the pod's network namespace, with ``NET_ADMIN``: it loads these rules
with ``iptables-restore --noflush`` and exits. As in OSM's init container:

* inbound TCP (``PREROUTING``) goes to Envoy's inbound listener (15003), except the ports
  the pod excludes;
* outbound TCP (``OUTPUT``) goes to Envoy's outbound listener (15001), except what Envoy
  itself sends (it runs as uid 1337: without this it would loop into itself), traffic to
  the loopback address, and the ports and IPv4 ranges the pod excludes.

Everything here is pure: the rules are text, checked by tests (there is no network
namespace to load them into there), and the command that loads them is a shell heredoc,
so the container image needs ``sh`` and ``iptables-restore`` and nothing of Trellis.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Final

from trellis_kube.injection import Exclusions

PROXY_UID: Final = 1337

_INBOUND = "TRELLIS_INBOUND"
_INBOUND_REDIRECT = "TRELLIS_IN_REDIRECT"
_OUTPUT = "TRELLIS_OUTPUT"
_REDIRECT = "TRELLIS_REDIRECT"
_END = "TRELLIS_RULES_END"


@dataclass(frozen=True, slots=True)
class Redirection:
    """Where Envoy listens in the pod, and what to leave alone."""

    inbound_port: int
    outbound_port: int
    proxy_uid: int = PROXY_UID
    exclusions: Exclusions = field(default_factory=Exclusions)


def rules(redirection: Redirection) -> str:
    """The ``nat`` table rules, in ``iptables-restore`` format."""
    r = redirection
    x = r.exclusions
    lines = [
        "*nat",
        f":{_INBOUND} - [0:0]",
        f":{_INBOUND_REDIRECT} - [0:0]",
        f":{_OUTPUT} - [0:0]",
        f":{_REDIRECT} - [0:0]",
        f"-A {_REDIRECT} -p tcp -j REDIRECT --to-ports {r.outbound_port}",
        f"-A {_INBOUND_REDIRECT} -p tcp -j REDIRECT --to-ports {r.inbound_port}",
        # inbound
        f"-A PREROUTING -p tcp -j {_INBOUND}",
        *(f"-A {_INBOUND} -p tcp --dport {port} -j RETURN" for port in x.inbound_ports),
        f"-A {_INBOUND} -p tcp -j {_INBOUND_REDIRECT}",
        # outbound
        f"-A OUTPUT -p tcp -j {_OUTPUT}",
        f"-A {_OUTPUT} -m owner --uid-owner {r.proxy_uid} -j RETURN",
        f"-A {_OUTPUT} -d 127.0.0.1/32 -j RETURN",
        *(f"-A {_OUTPUT} -p tcp --dport {port} -j RETURN" for port in x.outbound_ports),
        *(f"-A {_OUTPUT} -d {cidr} -j RETURN" for cidr in x.outbound_ranges),
        f"-A {_OUTPUT} -j {_REDIRECT}",
        "COMMIT",
    ]
    return "\n".join(lines) + "\n"


def script(redirection: Redirection) -> str:
    """The init container's shell script: load :func:`rules`, then show what is loaded."""
    text = rules(redirection)
    return f"set -eu\niptables-restore --noflush <<'{_END}'\n{text}{_END}\niptables-save -t nat\n"


def command(redirection: Redirection) -> list[str]:
    """The init container's ``command``."""
    return ["/bin/sh", "-c", script(redirection)]


def describe(redirection: Redirection) -> str:
    """One line for logs: what is redirected where, and what is excluded."""
    x = redirection.exclusions
    return " ".join(
        (
            f"inbound={redirection.inbound_port}",
            f"outbound={redirection.outbound_port}",
            f"uid={redirection.proxy_uid}",
            f"exclude_in={shlex.quote(','.join(map(str, x.inbound_ports)) or '-')}",
            f"exclude_out={shlex.quote(','.join(map(str, x.outbound_ports)) or '-')}",
            f"exclude_ranges={shlex.quote(','.join(x.outbound_ranges) or '-')}",
        )
    )
