"""Upstream conformance cases the implementation fails today: each asserts what upstream
expects, and fails. The module's name does not start with ``test_``, so ``make test``
does not collect it; run it on purpose:

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/conformance/known_failures.py

Once the implementation is fixed, move the case into the ``test_status_*`` module it
belongs to (README.md lists each with the function at fault).
"""

from __future__ import annotations

from tests.conformance.upstream import (
    HTTP_ROUTE,
    INFRA,
    Want,
    WantListener,
    assert_listeners,
    assert_route_condition,
    build,
    gateway_status,
)


def test_gateway_invalid_tls_configuration_nonexistent_and_malformed_secret() -> None:
    """gateway-invalid-tls-configuration.go, its two cases about the Secret itself: a
    certificateRef to a Secret that does not exist, and to one whose data is not a
    certificate, are ResolvedRefs=False, InvalidCertificateRef. Trellis reads no Secret
    (``gateway_listeners._certificates`` checks only the kind and the ReferenceGrant), so
    both listeners are ResolvedRefs=True and Programmed=True."""
    builder = build("gateway-invalid-tls-configuration")
    invalid = WantListener(
        "https", (HTTP_ROUTE,), (Want("ResolvedRefs", "False", "InvalidCertificateRef"),), 0
    )
    for name in ("gateway-certificate-nonexistent-secret", "gateway-certificate-malformed-secret"):
        assert_listeners(gateway_status(builder, name), [invalid])


def test_gateway_with_attached_routes_when_the_gateway_has_unresolved_refs() -> None:
    """gateway-with-attached-routes.go, third case: an HTTPS listener whose certificateRef
    names a Secret that does not exist is Programmed=False and ResolvedRefs=False (and
    still counts its attached route); the same root cause as above."""
    builder = build("gateway-with-attached-routes")
    name = "unresolved-gateway-with-one-attached-unresolved-route"
    wanted = (Want("Programmed", "False"), Want("ResolvedRefs", "False"))
    assert_listeners(gateway_status(builder, name), [WantListener("tls", (HTTP_ROUTE,), wanted, 1)])
    assert_route_condition(
        builder,
        ("HTTPRoute", INFRA, "http-route-4"),
        f"{INFRA}/{name}",
        Want("ResolvedRefs", "False"),
    )
