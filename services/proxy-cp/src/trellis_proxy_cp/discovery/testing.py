"""Fakes for the Destination server's callers, for tests and benchmarks: one caller, the
catalog's views as :class:`~.access.CallerViews` asks for them, and the table's listings.

A benchmark or test whose client may reach ``shop/web`` builds its server with
``access(CatalogViews({CALLER.identity: view("shop/web")}))``.
"""

from __future__ import annotations

from collections.abc import Callable

from trellis_api import catalog_pb2 as cpb
from trellis_proxy_cp.discovery.access import Access, Caller, CallerViews, Context

CALLER = Caller("6f1f0c2e-3b6d-4c55-9d1e-2a0b7c8d9e10.buyer.shop", "shop/buyer", "buyer")


def view(*names: str, identity: str = CALLER.identity, permissive: bool = False) -> cpb.View:
    """A view of ``identity`` whose outbound services are ``names`` (``<namespace>/<name>``)."""
    outbound = []
    for name in names:
        namespace, _, service = name.partition("/")
        outbound.append(cpb.OutboundService(namespace=namespace, name=service, port=80))
    namespace, _, service = identity.partition("/")
    return cpb.View(
        identity=identity,
        namespace=namespace,
        service=service,
        mesh=cpb.MeshSettings(permissive=permissive),
        outbound=outbound,
    )


class CatalogViews:
    """The catalog's ``want`` and ``forget``, over ``views`` (identity -> view): an identity
    it has no view for gets an empty one, as the catalog's deny-by-default answer."""

    def __init__(self, views: dict[str, cpb.View] | None = None) -> None:
        self.views = views if views is not None else {}
        self.asked: list[str] = []
        self.forgotten: list[str] = []

    async def want(self, identity: str, service_account: str) -> cpb.View:
        self.asked.append(identity)
        return self.views.get(identity, cpb.View(identity=identity))

    def forget(self, identity: str) -> None:
        self.forgotten.append(identity)


class Listings:
    """:attr:`~.access.Access.fresh`: counts the listings asked for, and applies what a test
    left in ``news`` (changes the catalog made that the table has not listed yet)."""

    def __init__(self) -> None:
        self.asked = 0
        self.news: list[Callable[[], object]] = []

    async def __call__(self) -> None:
        self.asked += 1
        news, self.news = self.news, []
        for change in news:
            change()


def access(
    catalog: CatalogViews | None = None,
    caller: Caller = CALLER,
    listings: Listings | None = None,
) -> Access:
    """Every call comes from ``caller``; views come from ``catalog``."""
    catalog = catalog if catalog is not None else CatalogViews()

    async def identify(context: Context) -> Caller:
        return caller

    views = CallerViews(catalog.want, catalog.forget)
    return Access(identify, views, listings if listings is not None else Listings())
