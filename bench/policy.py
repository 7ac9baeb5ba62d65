"""What a policy change and a certificate rotation cost proxy-cp, against a whole build.

A route change (an HTTPRouteGroup's new match, a TrafficSplit's new weights) moves the
``outbound`` of a client's policy. proxy-cp translates again only the kinds of resource
whose translators read what moved (:mod:`trellis_proxy_cp.translate.scope`): the group's
routes; its listeners, clusters, load assignments and secrets stay the resources they
were. A rotated certificate moves the material, which only the secrets read.

The baseline, measured in the same run, is what each change cost before: the whole
snapshot translated and serialized again (the group's record of what its snapshot was
built from is dropped first, which is what makes ``ProxyControlPlane`` build whole).

Each operation is one ``ProxyControlPlane.apply`` (or ``set_material``) of one identity
with one group, through the real control plane, cache and translators, in turn over
:data:`GROUPS` identities of the ``xds`` benchmark's shape (20 HTTP upstreams, two inbound
rules): ``routes_change`` and ``rotation`` against ``whole_routes_change`` and
``whole_rotation``. The rates are per core.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

from bench import report, xds_mesh
from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.cache.inputs import Inputs, split
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.translate.secrets import SecretMaterial

GROUPS = 20


def _policy(group: int, variant: int) -> pb.View:
    """Group ``group``'s policy with the routes of variant ``variant`` (0 or 1)."""
    view = xds_mesh.view(group)
    for service in view.outbound:
        service.routes[0].match.path_regex = ".*" if variant == 0 else "/v2/.*"
    return split(view).policy


def _material(serial: int) -> SecretMaterial:
    return dataclasses.replace(xds_mesh.material(), serial=f"s{serial}")


async def _control_plane() -> ProxyControlPlane:
    async def fetch_inputs(identity: str, service_account: str) -> Inputs:
        return xds_mesh.inputs(int(identity.rpartition("-")[2]))

    async def fetch_material(identity: str, service_account: str) -> SecretMaterial:
        return _material(0)

    control_plane = ProxyControlPlane(SnapshotCache(), fetch_inputs, fetch_material)
    for group in range(GROUPS):
        node = xds_mesh.node_id(group, GROUPS)
        await control_plane.attach(
            node, xds_mesh.identity(group), xds_mesh.account(group), xds_mesh.SETTINGS
        )
    return control_plane


async def _measure(seconds: float, warmup: float) -> tuple[dict[str, float], dict[str, int]]:
    control_plane = await _control_plane()
    policies = {
        (group, variant): _policy(group, variant) for group in range(GROUPS) for variant in (0, 1)
    }
    changes = itertools.count(1)
    rotations = itertools.count(1)

    def whole(identity: str) -> None:
        for group in control_plane.groups.values():
            if group.identity == identity:
                group.built_from = None

    def routes(forget: bool) -> report.AsyncOp:
        async def op() -> None:
            change = next(changes)
            group = change % GROUPS
            identity = xds_mesh.identity(group)
            if forget:
                whole(identity)
            await control_plane.apply({identity: policies[group, change // GROUPS % 2]}, {})

        return op

    def rotation(forget: bool) -> report.AsyncOp:
        async def op() -> None:
            serial = next(rotations)
            identity = xds_mesh.identity(serial % GROUPS)
            if forget:
                whole(identity)
            await control_plane.set_material(identity, _material(serial))

        return op

    rates = await report.measure_rates_async(
        {
            "routes_change": report.async_runner(routes(forget=False)),
            "whole_routes_change": report.async_runner(routes(forget=True)),
            "rotation": report.async_runner(rotation(forget=False)),
            "whole_rotation": report.async_runner(rotation(forget=True)),
        },
        seconds,
        warmup,
    )
    return rates, dict(control_plane.kinds_built)


def run(*, seconds: float = 2.0, warmup: float = 0.2) -> dict[str, float]:
    rates, kinds = asyncio.run(_measure(seconds, warmup))
    notes = {
        "routes_change": "a client's HTTP routes moved: its routes translated",
        "whole_routes_change": "baseline: the same change, the whole snapshot translated",
        "rotation": "a new certificate: the group's secrets translated",
        "whole_rotation": "baseline: the same rotation, the whole snapshot translated",
    }
    figures = [report.Figure(name, rates[name], "/s", note) for name, note in notes.items()]
    translated = ", ".join(f"{kind} {count:,}" for kind, count in sorted(kinds.items()))
    report.print_table(
        f"policy: one identity's change, {GROUPS} identities of 20 upstreams in turn "
        f"(kinds translated over the run: {translated})",
        figures,
    )
    by_name = {f.name: f for f in figures}
    ratios = {
        f"{name}/whole_{name}": report.ratio_line(
            by_name[name], by_name[f"whole_{name}"], "baseline"
        )
        for name in ("routes_change", "rotation")
    }
    return report.results(figures, ratios)
