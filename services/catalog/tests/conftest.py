"""Fixtures shared by the catalog's tests: documents from YAML, provider reports, a policy builder.

The tests directory is not a package (tests run with ``--import-mode=importlib``), so test
modules cannot import from here: what they share are fixtures, typed with the package's types.

- ``docs(text)``: the documents of a multi-document YAML text (every kind the catalog reads);
  an invalid document fails the test, so a typo in a test's YAML is never silently dropped.
- ``docs_and_errors(text)``: the same, returning the :class:`DocumentError`\\ s instead.
- ``endpoint("10.0.0.1", {"http": 8080}, service_account="api")``: a provider's endpoint.
- ``report("shop/api", endpoint(...), ports=[("http", 80)])``: a provider's report of a service;
  a port is ``(name, number)``, ``(name, number, protocol)`` or ``(name, number, protocol,
  target)``.
- ``mesh(text, *reports, accounts={"shop/api": "api-sa"})``: a :class:`PolicyBuilder` over the
  spec built from ``text`` and the services indexed from ``reports``; a service's account is
  its name unless ``accounts`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest
import yaml

from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.index import services
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.sources import kinds
from trellis_common.documents.base import Document, DocumentError, KindRegistry, Origin
from trellis_common.model import MeshService
from trellis_spec import mesh as meshspec

SOURCE = "test.yaml"

PortArg = tuple[str, int] | tuple[str, int, str] | tuple[str, int, str, int]


def _parse(registry: KindRegistry, text: str) -> tuple[list[Document], list[DocumentError]]:
    documents: list[Document] = []
    errors: list[DocumentError] = []
    for index, raw in enumerate(yaml.safe_load_all(text)):
        if raw is None:
            continue
        try:
            documents.append(registry.parse(raw, Origin(SOURCE, index)))
        except DocumentError as exc:
            errors.append(exc)
    return documents, errors


@pytest.fixture(scope="session")
def registry() -> KindRegistry:
    return kinds()


@pytest.fixture
def docs_and_errors(
    registry: KindRegistry,
) -> Callable[[str], tuple[list[Document], list[DocumentError]]]:
    """The valid documents and the errors of a multi-document YAML text."""
    return lambda text: _parse(registry, text)


@pytest.fixture
def docs(registry: KindRegistry) -> Callable[[str], list[Document]]:
    """The documents of a multi-document YAML text; any invalid document fails the test."""

    def parse(text: str) -> list[Document]:
        documents, errors = _parse(registry, text)
        if errors:
            raise AssertionError(f"the test's YAML is invalid: {[str(e) for e in errors]}")
        return documents

    return parse


def _endpoint(
    address: str = "10.0.0.1", ports: Mapping[str, int] | None = None, **fields: Any
) -> ProvidedEndpoint:
    return ProvidedEndpoint(address, tuple((ports or {}).items()), **fields)


def _port(port: PortArg) -> tuple[str, int, str, int]:
    name, number = port[0], port[1]
    protocol = port[2] if len(port) > 2 else ""
    target = port[3] if len(port) > 3 else 0
    assert isinstance(protocol, str)
    assert isinstance(target, int)
    return name, number, protocol, target


def _report(
    service: str,
    *endpoints: ProvidedEndpoint,
    ports: Iterable[PortArg] = (("http", 80),),
    provider: str = "vm",
    **fields: Any,
) -> ProvidedService:
    namespace, name = service.split("/")
    return ProvidedService(
        provider=provider,
        namespace=namespace,
        name=name,
        ports=tuple(_port(p) for p in ports),
        endpoints=endpoints,
        **fields,
    )


@pytest.fixture
def endpoint() -> Callable[..., ProvidedEndpoint]:
    """``endpoint(address, {"http": 8080}, service_account=..., ...)``."""
    return _endpoint


@pytest.fixture
def report() -> Callable[..., ProvidedService]:
    """``report("ns/name", *endpoints, ports=[("http", 80, "HTTP", 0)], location=..., ...)``."""
    return _report


@pytest.fixture
def mesh(docs: Callable[[str], list[Document]]) -> Callable[..., PolicyBuilder]:
    """``mesh(yaml_text, *reports, accounts={"ns/svc": "account"}, trust_domain=...)``."""

    def build(
        text: str,
        *reports: ProvidedService,
        accounts: Mapping[str, str] | None = None,
        trust_domain: str = "cluster.local",
    ) -> PolicyBuilder:
        spec = meshspec.build(docs(text))
        known = services.index(spec.services, reports, spec.route_ports())
        table = dict(accounts or {})

        def account_of(service: MeshService) -> str:
            return table.get(str(service), service.name)

        return PolicyBuilder(spec, known, account_of, trust_domain)

    return build
