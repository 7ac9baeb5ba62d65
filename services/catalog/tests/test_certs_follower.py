"""The catalog refuses to expect a proxy whose service account cannot be a SPIFFE id.

The follower's side (skip the record with a rejection, keep the rest, against a real gRPC
peer) is in test_followers.py.

Before certmanager checked service accounts, it stored a proxy certificate for the account
``Bad Name!``; the catalog expected that proxy, and every recompute then failed building
its SPIFFE id, so the catalog crash-looped. Records stored before the check still exist.
"""

from __future__ import annotations

import pytest

from trellis_catalog.catalog import Catalog, UnknownProxy

BAD = "00000000-0000-4000-8000-000000000002.cart.shop"


def test_the_catalog_refuses_to_expect_a_proxy_with_an_invalid_account() -> None:
    catalog = Catalog()
    with pytest.raises(UnknownProxy, match="service account 'Bad Name!' is not a valid"):
        catalog.expect_proxy(BAD, "Bad Name!")
    assert catalog.proxies == {}
    catalog.flush()
