"""The catalog's side of certmanager: a proxy certificate the catalog cannot use is refused.

Before certmanager checked service accounts, it stored a proxy certificate for the account
``Bad Name!``; the catalog expected that proxy, and every recompute then failed building
its SPIFFE id, so the catalog crash-looped. Records stored before the check still exist.
"""

from __future__ import annotations

import pytest

from trellis_api import certmanager_pb2 as pb
from trellis_catalog.catalog import Catalog, UnknownProxy
from trellis_catalog.clients.certs import CertificateFollower
from trellis_common.health import Health

GOOD = "00000000-0000-4000-8000-000000000001.cart.shop"
BAD = "00000000-0000-4000-8000-000000000002.cart.shop"


async def _bell(kind: str, key: str) -> int:
    return 1


def test_the_catalog_refuses_to_expect_a_proxy_with_an_invalid_account() -> None:
    catalog = Catalog(_bell)
    with pytest.raises(UnknownProxy, match="service account 'Bad Name!' is not a valid"):
        catalog.expect_proxy(BAD, "Bad Name!")
    assert catalog.proxies == {}
    catalog.flush()


def test_the_follower_skips_a_bad_record_with_a_rejection_and_keeps_the_rest() -> None:
    catalog = Catalog(_bell)
    health = Health()
    follower = CertificateFollower(catalog, "127.0.0.1:1", health.rejections)

    follower._expect(pb.CertificateInfo(common_name=BAD, service_account="Bad Name!"))
    follower._expect(pb.CertificateInfo(common_name=GOOD, service_account="cart"))

    assert list(catalog.proxies) == [GOOD]
    [rejection] = health.rejections.items()
    assert (rejection.source, rejection.key) == ("certificates", BAD)
    assert "service account 'Bad Name!'" in rejection.reason
    catalog.flush()
    assert catalog.account_of_identity(catalog.proxies[GOOD].identity) == "cart"
