"""The init container's rules, as text: the order matters (exclusions before redirects)."""

from __future__ import annotations

from trellis_injector.domain import iptables
from trellis_injector.domain.iptables import Redirection
from trellis_kube.injection import Exclusions


def test_without_exclusions_all_tcp_goes_to_envoy_but_envoys_own() -> None:
    rules = iptables.rules(Redirection(inbound_port=15003, outbound_port=15001)).splitlines()
    assert rules[0] == "*nat"
    assert rules[-1] == "COMMIT"
    assert "-A TRELLIS_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in rules
    assert "-A TRELLIS_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15003" in rules
    assert "-A PREROUTING -p tcp -j TRELLIS_INBOUND" in rules
    assert "-A OUTPUT -p tcp -j TRELLIS_OUTPUT" in rules
    own = rules.index("-A TRELLIS_OUTPUT -m owner --uid-owner 1337 -j RETURN")
    loopback = rules.index("-A TRELLIS_OUTPUT -d 127.0.0.1/32 -j RETURN")
    redirect = rules.index("-A TRELLIS_OUTPUT -j TRELLIS_REDIRECT")
    assert own < redirect
    assert loopback < redirect
    assert not [r for r in rules if "--dport" in r]


def test_exclusions_come_before_the_redirects() -> None:
    excluded = Exclusions(
        inbound_ports=(9090,), outbound_ports=(5432, 6379), outbound_ranges=("10.0.0.0/8",)
    )
    rules = iptables.rules(Redirection(15003, 15001, 1337, excluded)).splitlines()
    inbound = rules.index("-A TRELLIS_INBOUND -p tcp --dport 9090 -j RETURN")
    assert inbound < rules.index("-A TRELLIS_INBOUND -p tcp -j TRELLIS_IN_REDIRECT")
    redirect = rules.index("-A TRELLIS_OUTPUT -j TRELLIS_REDIRECT")
    for rule in (
        "-A TRELLIS_OUTPUT -p tcp --dport 5432 -j RETURN",
        "-A TRELLIS_OUTPUT -p tcp --dport 6379 -j RETURN",
        "-A TRELLIS_OUTPUT -d 10.0.0.0/8 -j RETURN",
    ):
        assert rules.index(rule) < redirect


def test_the_command_loads_the_rules_with_iptables_restore() -> None:
    redirection = Redirection(15003, 15001, 1337, Exclusions(outbound_ports=(5432,)))
    shell, flag, script = iptables.command(redirection)
    assert (shell, flag) == ("/bin/sh", "-c")
    assert script.startswith("set -eu\niptables-restore --noflush <<'TRELLIS_RULES_END'\n")
    assert iptables.rules(redirection) in script
    assert script.endswith("TRELLIS_RULES_END\niptables-save -t nat\n")
    assert "exclude_out=5432" in iptables.describe(redirection)
