"""Schemathesis against the catalog's admin API: real routes over the bookstore example.

The app is built once, at import: schemathesis generates one test per operation from it
(its fixture-based loader does not work with pytest 9).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import schemathesis
from fastapi import FastAPI
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.sources import kinds
from trellis_catalog.transport import rest
from trellis_common.specdir import load_paths
from trellis_runtime import admin
from trellis_runtime.health import Health
from trellis_testing import adminfuzz

ROOT = Path(__file__).resolve().parents[3]


def admin_app() -> FastAPI:
    catalog = Catalog()
    catalog.set_documents(*load_paths([ROOT / "examples" / "bookstore"], kinds()))
    catalog.set_provider_services(
        "vm",
        [
            ProvidedService(
                provider="vm",
                namespace="bookstore",
                name="bookstore-v1",
                ports=(("http", 8080, "", 0),),
                endpoints=(
                    ProvidedEndpoint("10.0.0.1", (("http", 8081),), service_account="bookstore"),
                ),
            )
        ],
    )
    catalog.expect_proxy("00000000-0000-4000-8000-000000000001.bookbuyer.bookbuyer", "bookbuyer")
    catalog.flush()
    metrics = CollectorRegistry()
    app = admin.create_app("catalog", metrics, {"catalog": lambda: True}, Health(metrics))
    rest.add_routes(app, catalog, lambda: {"kind": "directory", "path": "examples/bookstore"})
    return app


schema = adminfuzz.schema_of(admin_app())
NAMESPACES = st.sampled_from(["bookstore", "bookbuyer", "bookthief"])
SERVICES = st.sampled_from(["bookstore", "bookstore-v1", "bookstore-v2", "bookbuyer"])
adminfuzz.steer(
    schema,
    paths={
        "/v1/views/{namespace}/{service}": [
            {"namespace": "bookstore", "service": "bookstore-v1"},
            {"namespace": "bookbuyer", "service": "bookbuyer"},
            {"namespace": "elsewhere", "service": "job"},
        ]
    },
    queries={
        "/v1/policy/check": st.fixed_dictionaries(
            {
                "from": st.builds("{}/{}".format, NAMESPACES, SERVICES),
                "to": st.builds("{}/{}".format, NAMESPACES, SERVICES),
            }
        ),
        "/v1/resources": st.fixed_dictionaries({"state": st.sampled_from(["valid", "error"])}),
    },
)


@schema.parametrize()
def test_admin_api(case: schemathesis.Case[Any]) -> None:
    adminfuzz.exercise(case)
