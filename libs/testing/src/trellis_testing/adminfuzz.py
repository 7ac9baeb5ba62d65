"""Schemathesis against a service's admin app: the checks every admin API must pass.

Each service's ``test_fuzz_admin_api.py`` builds its real admin app (``admin.create_app``
plus the service's routes, fakes behind them where a live backend would be needed), loads
its OpenAPI in-process with :func:`schema_of` (services serve ``/openapi.json`` only with
``debug_endpoints``, so the document is not fetched over HTTP) and runs every operation through
:func:`exercise`: the request is sent with the admin token (so the routes that change state
run, not only their 401), and the response must pass :data:`CHECKS`:

- ``not_a_server_error``: no 5xx, whatever the path, query, headers or body;
- ``response_schema_conformance`` and ``content_type_conformance``: a response that the
  OpenAPI document declares has the declared shape and media type;
- :func:`explains_itself`: every 4xx is JSON with a non-empty ``detail`` (a sentence, or
  pydantic's list of errors, each with where (``loc``) and what (``msg``)).

Schemathesis draws its examples with hypothesis, so the budget is the hypothesis profile
(``ci`` or ``fuzz``, see the root ``conftest.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import hypothesis
import schemathesis
from fastapi import FastAPI
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)
from schemathesis.specs.openapi.schemas import OpenApiSchema

TOKEN: Final = "fuzz-admin-token"
AUTH: Final = {"Authorization": f"Bearer {TOKEN}"}


def explains_itself(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 4xx answer says what is wrong: JSON with a non-empty ``detail``."""
    if not 400 <= response.status_code < 500:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(
            f"{response.status_code} answer is not JSON: {response.content[:200]!r}"
        ) from None
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str) and detail.strip():
        return True
    if isinstance(detail, list) and detail:
        for item in detail:
            if not (isinstance(item, dict) and item.get("msg") and "loc" in item):
                raise AssertionError(f"{response.status_code} error without loc and msg: {item}")
        return True
    raise AssertionError(f"{response.status_code} answer does not explain itself: {body!r}")


CHECKS: Final = [
    not_a_server_error,
    response_schema_conformance,
    content_type_conformance,
    explains_itself,
]


def schema_of(app: FastAPI) -> OpenApiSchema:
    """Schemathesis' schema of ``app``'s OpenAPI document, with calls going to ``app``.

    The document is built by ``app.openapi()`` and copied through JSON, as a fetched one
    would be, so nothing schemathesis does to it reaches the app's cached copy.
    """
    loaded = schemathesis.openapi.from_dict(json.loads(json.dumps(app.openapi())))
    loaded.app = app
    return loaded


def steer(
    schema: schemathesis.BaseSchema,
    *,
    paths: Mapping[str, Sequence[Mapping[str, str]]] | None = None,
    queries: Mapping[str, st.SearchStrategy[dict[str, Any]]] | None = None,
    bodies: Mapping[str, st.SearchStrategy[Any]] | None = None,
) -> None:
    """Point about half of ``schema``'s examples at things that exist.

    Generated from the OpenAPI document alone, path parameters never name a workload or a
    certificate that exists, and bodies rarely pass the domain's checks, so the code behind
    them would go untested. ``paths`` maps an operation's path template to parameters that
    hit (``{"/v1/workloads/{namespace}/{name}": [{"namespace": "shop", "name": "vm-1"}]}``);
    ``queries`` (by path) and ``bodies`` (by label, ``POST /v1/workloads``) give strategies of
    query parameters and bodies the domain accepts, nearly always.
    """
    known_paths, known_queries, known_bodies = paths or {}, queries or {}, bodies or {}

    def either(generated: Any, valid: st.SearchStrategy[Any] | None) -> Any:
        return st.just(generated) if valid is None else st.one_of(st.just(generated), valid)

    def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> Any:
        known = known_paths.get(context.operation.path)
        return either(path_parameters, st.sampled_from(known).map(dict) if known else None)

    def flatmap_query(context: Any, query: dict[str, Any]) -> Any:
        return either(query, known_queries.get(context.operation.path))

    def flatmap_body(context: Any, body: Any) -> Any:
        return either(body, known_bodies.get(context.operation.label))

    schema.hook(flatmap_path_parameters)
    schema.hook(flatmap_query)
    schema.hook(flatmap_body)


def exercise(case: schemathesis.Case[Any]) -> None:
    """Send ``case`` with the admin token and check the answer.

    Each status is a hypothesis event: ``--hypothesis-show-statistics`` shows how far the
    examples got (422s only means the routes behind the checks were never reached).
    """
    response = case.call(headers=AUTH)
    hypothesis.event(f"{case.operation.label} -> {response.status_code}")
    case.validate_response(response, checks=CHECKS, headers=AUTH)
