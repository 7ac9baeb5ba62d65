"""Joining in Kubernetes: a component's projected ServiceAccount token, reviewed by the API
server (TokenReview), is its first certificate, once.

certmanager runs as a process with a kubeconfig for the test API server, which issues the
tokens and answers the reviews. Each refusal is checked for its reason, its log line and
its count; the tokens never appear in certmanager's log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from trellis_identity.identity import csr_for, new_key
from trellis_testing import RedisServer
from trellis_testing.kube import KubeApi
from trellis_testing.services import ServiceProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def kube() -> Iterator[KubeApi]:
    with KubeApi() as api:
        yield api


@pytest.fixture
def certmanager(
    state_dir: Path, redis_server: RedisServer, kube: KubeApi, tmp_path: Path
) -> Iterator[ServiceProcess]:
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    process = ServiceProcess(
        "certmanager",
        "trellis_certmanager.main",
        state_dir,
        redis_server,
        env={"TRELLIS_CERTMANAGER_KUBECONFIG": str(kubeconfig)},
    )
    process.start()
    yield process
    process.stop()


def join(certmanager: ServiceProcess, token: str, component: str = "catalog") -> tuple[int, str]:
    _, key = new_key()
    answer = certmanager.post(
        "/v1/join", json={"token": token, "csr_pem": csr_for(key, component).decode()}
    )
    body = answer.json()
    return answer.status_code, body.get("cert_chain_pem") or body.get("detail")


def test_a_service_account_token_of_the_control_plane_joins_once(
    certmanager: ServiceProcess, kube: KubeApi
) -> None:
    token = kube.service_account_token("trellis-system", "catalog")
    status, chain = join(certmanager, token)
    assert status == 200, chain
    issued = x509.load_pem_x509_certificate(chain.encode())
    san = issued.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://cluster.local/ns/trellis-system/sa/catalog"
    ]
    # the identity is the token's, whatever name the CSR asked for
    again = join(certmanager, token, component="proxy-cp")
    assert again == (401, "join token already used: a token works once")


@pytest.mark.parametrize(
    ("namespace", "account", "audiences", "reason", "says"),
    [
        ("shop", "catalog", ("trellis",), "not_control_plane", "is not a service account of"),
        ("trellis-system", "default", ("trellis",), "not_a_component", "no control plane"),
        ("trellis-system", "catalog", ("vault",), "wrong_audience", "invalid for the target"),
    ],
)
def test_a_token_that_is_not_a_components_is_refused_logged_and_counted(
    certmanager: ServiceProcess,
    kube: KubeApi,
    namespace: str,
    account: str,
    audiences: tuple[str, ...],
    reason: str,
    says: str,
) -> None:
    token = kube.service_account_token(namespace, account, audiences=audiences)
    status, detail = join(certmanager, token)
    assert status == 401
    assert says in detail
    metrics = certmanager.get("/metrics").text
    assert f'trellis_certmanager_join_refused_total{{reason="{reason}"}} 1.0' in metrics
    assert f"join.refused reason={reason}" in certmanager.logs()
    assert token not in certmanager.logs()


def test_a_token_the_api_server_did_not_issue_or_that_expired_is_refused(
    certmanager: ServiceProcess, kube: KubeApi
) -> None:
    forged = kube.service_account_token("trellis-system", "catalog")[:-8] + "AAAAAAAA"
    expired = kube.service_account_token("trellis-system", "catalog", lifetime=-1)
    assert join(certmanager, forged) == (401, "service account token refused: invalid bearer token")
    assert join(certmanager, expired) == (401, "service account token refused: Token has expired.")
    metrics = certmanager.get("/metrics").text
    assert 'trellis_certmanager_join_refused_total{reason="not_authenticated"} 2.0' in metrics


def test_a_component_joins_with_its_projected_token_file(
    certmanager: ServiceProcess,
    kube: KubeApi,
    state_dir: Path,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "serviceaccount" / "token"
    token_file.parent.mkdir()
    token_file.write_text(kube.service_account_token("trellis-system", "endpoints-vm"))
    provider = ServiceProcess(
        "endpoints-vm",
        "trellis_endpoints_vm.main",
        state_dir,
        redis_server,
        env={"TRELLIS_SERVICE_ACCOUNT_TOKEN_FILE": str(token_file)},
        join_token=False,
    )
    provider.start()
    try:
        assert "join.done component=endpoints-vm" in provider.logs()
        issued = "trellis_certmanager_component_certificates_issued_total"
        metrics = certmanager.get("/metrics").text
        assert f'{issued}{{component="endpoints-vm",via="join"}} 1.0' in metrics
    finally:
        provider.stop()
