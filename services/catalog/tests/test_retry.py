"""OSM's Retry policy in the catalog: the document's rules, its status, and which outbound
services of which source it applies to (OSM v1.2's ``getRetryPolicy``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.model.views import Identity, RetryPolicy
from trellis_common.documents.base import Document, DocumentError
from trellis_common.model import MeshService
from trellis_spec import mesh as meshspec

Mesh = Callable[..., PolicyBuilder]

SHOP = """apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec: {ports: [{name: tcp-db, port: 5432}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: osm-mesh-config, namespace: trellis-system}
spec: {traffic: {enablePermissiveTrafficPolicyMode: true}, featureFlags: {enableRetryPolicy: FLAG}}
"""


def retry(
    destinations: str = "[{kind: Service, name: api, namespace: shop}, "
    "{kind: Service, name: db, namespace: shop}]",
    policy: str = "{retryOn: '5xx,reset', numRetries: 3, perTryTimeout: 1.5s, "
    "retryBackoffBaseInterval: 10ms}",
    source: str = "{kind: ServiceAccount, name: web, namespace: shop}",
    name: str = "web-retry",
) -> str:
    return f"""---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: Retry
metadata: {{name: {name}, namespace: shop}}
spec:
  source: {source}
  destinations: {destinations}
  retryPolicy: {policy}
"""


def shop(flag: bool, *extra: str) -> str:
    return SHOP.replace("FLAG", str(flag).lower()) + "".join(extra)


def test_a_retry_applies_to_its_source_calls_to_its_http_destinations(mesh: Mesh) -> None:
    builder = mesh(shop(True, retry()))
    web = {o.name: o for o in builder.build(Identity("shop", "web"), "web").outbound}
    assert web["api"].retry == RetryPolicy(
        policy="shop/web-retry",
        retry_on="5xx,reset",
        num_retries=3,
        per_try_timeout=1.5,
        backoff_base_interval=0.01,
    )
    assert web["db"].retry is None  # TCP: nothing to retry
    api = {o.name: o for o in builder.build(Identity("shop", "api"), "api").outbound}
    assert api["web"].retry is None  # another source
    assert builder.spec.retried(MeshService("shop", "api"))


def test_without_the_feature_flag_a_retry_has_no_effect_and_says_so(mesh: Mesh) -> None:
    builder = mesh(shop(False, retry()))
    web = builder.build(Identity("shop", "web"), "web")
    assert [(o.name, o.retry) for o in web.outbound] == [("api", None), ("db", None), ("web", None)]
    status = builder.spec.statuses["Retry shop/web-retry"]
    assert (status.state, status.reason) == (
        "warning",
        "has no effect: MeshConfig spec.featureFlags.enableRetryPolicy is off",
    )
    assert not builder.spec.retried(MeshService("shop", "api"))


def test_the_first_retry_by_name_wins_and_non_service_destinations_are_skipped(
    mesh: Mesh,
) -> None:
    pods = (
        "[{kind: Pod, name: api-0, namespace: shop}, {kind: Service, name: api, namespace: shop}]"
    )
    builder = mesh(
        shop(
            True,
            retry(name="b-second", policy="{retryOn: 5xx, numRetries: 9}"),
            retry(name="a-first", destinations=pods, policy="{retryOn: reset}"),
        )
    )
    web = {o.name: o for o in builder.build(Identity("shop", "web"), "web").outbound}
    assert web["api"].retry == RetryPolicy(policy="shop/a-first", retry_on="reset")
    status = builder.spec.statuses["Retry shop/a-first"]
    assert status.state == "warning"
    assert "spec.destinations[0]: kind 'Pod' is not 'Service'" in status.reason


@pytest.mark.parametrize(
    ("document", "field", "reason"),
    [
        (retry(policy="{retryOn: 5xx-ish}"), "retryOn", "unknown retry condition(s) '5xx-ish'"),
        (retry(policy="{retryOn: ''}"), "retryOn", "must list Envoy retry conditions"),
        (retry(policy="{numRetries: 1}"), "retryOn", "Field required"),
        (retry(policy="{retryOn: 5xx, perTryTimeout: 5}"), "perTryTimeout", "Go duration"),
        (retry(policy="{retryOn: 5xx, numRetries: -1}"), "numRetries", "greater than or equal"),
        (retry(source="{kind: Service, name: web, namespace: shop}"), "kind", "'ServiceAccount'"),
        (retry(destinations="[]"), "destinations", "at least 1"),
    ],
)
def test_a_malformed_retry_is_refused_naming_the_field(
    docs_and_errors: Callable[[str], tuple[list[Document], list[DocumentError]]],
    document: str,
    field: str,
    reason: str,
) -> None:
    documents, errors = docs_and_errors(shop(True, document))
    assert [d.key.kind for d in documents if d.key.kind == "Retry"] == []
    [error] = errors
    assert field in error.field
    assert reason in error.reason
    spec = meshspec.build(documents, errors)
    assert spec.statuses["Retry shop/web-retry"].state == "error"
