"""Pod-bound ServiceAccount tokens from the test API server, as a real one makes them: the
kubelet's TokenRequest, the claims, and TokenReview answers (Kubernetes 1.30+), through the
real ``kubernetes`` client."""

from __future__ import annotations

import base64
import datetime
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from trellis_testing.kubeauth import API_SERVER, TokenAuthority

EXTRA = "authentication.kubernetes.io/"


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return decoded


def make_pod(core: Any, name: str, account: str = "web") -> Any:
    body = {
        "metadata": {"name": name},
        "spec": {"serviceAccountName": account, "containers": [{"name": "app", "image": "app"}]},
    }
    return core.create_namespaced_pod("shop", body)


def token_request(
    core: Any, account: str, pod: dict[str, str] | None = None, **spec: Any
) -> Any:  # fmt: skip
    ref = {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", **pod}} if pod else {}
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {**spec, **ref},
    }
    return core.create_namespaced_service_account_token(account, "shop", body)


def review(api_client: Any, token: str, audiences: list[str]) -> Any:
    authentication: Any = client.AuthenticationV1Api(api_client)
    body = {"spec": {"token": token, "audiences": audiences}}
    return authentication.create_token_review(body).status


@pytest.fixture
def core(kube: tuple[Any, Any]) -> Any:
    core: Any = client.CoreV1Api(kube[1])
    core.create_namespaced_service_account("shop", {"metadata": {"name": "web"}})
    return core


def test_a_token_request_binds_the_token_to_the_pod(kube: tuple[Any, Any], core: Any) -> None:
    pod = make_pod(core, "web-1")
    assert pod.metadata.uid
    assert pod.metadata.creation_timestamp
    account = core.read_namespaced_service_account("web", "shop")
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)

    answer = token_request(
        core,
        "web",
        {"name": "web-1", "uid": pod.metadata.uid},
        audiences=["trellis"],
        expirationSeconds=900,
    )

    expires = answer.status.expiration_timestamp
    assert before + datetime.timedelta(seconds=900) <= expires
    assert expires <= before + datetime.timedelta(seconds=902)
    token = answer.status.token
    said = claims(token)
    assert said["aud"] == ["trellis"]
    assert said["sub"] == "system:serviceaccount:shop:web"
    assert said["exp"] - said["iat"] == 900
    assert said["kubernetes.io"] == {
        "namespace": "shop",
        "serviceaccount": {"name": "web", "uid": account.metadata.uid},
        "pod": {"name": "web-1", "uid": pod.metadata.uid},
    }
    status = review(kube[1], token, ["trellis"])
    assert status.authenticated
    assert status.user.username == "system:serviceaccount:shop:web"
    assert status.user.uid == account.metadata.uid
    assert status.user.extra == {
        f"{EXTRA}credential-id": [f"JTI={said['jti']}"],
        f"{EXTRA}pod-name": ["web-1"],
        f"{EXTRA}pod-uid": [pod.metadata.uid],
    }


def test_a_token_request_defaults_to_the_api_servers_audience_and_an_hour(
    kube: tuple[Any, Any], core: Any
) -> None:
    make_pod(core, "web-1")
    answer = token_request(core, "web", {"name": "web-1"}, audiences=[])
    assert answer.spec.audiences == [API_SERVER]
    assert answer.spec.expiration_seconds == 3600
    assert claims(answer.status.token)["aud"] == [API_SERVER]
    refused = review(kube[1], answer.status.token, ["trellis"])
    assert not refused.authenticated
    assert "is invalid for the target audiences" in refused.error


def test_a_bound_token_dies_with_its_pod_and_is_not_revived_by_a_namesake(
    kube: tuple[Any, Any], core: Any
) -> None:
    first = make_pod(core, "web-1")
    token = token_request(core, "web", {"name": "web-1"}, audiences=["trellis"]).status.token
    assert review(kube[1], token, ["trellis"]).authenticated

    core.delete_namespaced_pod("web-1", "shop")
    gone = review(kube[1], token, ["trellis"])
    assert not gone.authenticated
    assert gone.error == "[invalid bearer token, service account token has been invalidated]"

    second = make_pod(core, "web-1")
    recreated = review(kube[1], token, ["trellis"])
    assert not recreated.authenticated
    assert recreated.error == (
        f"[invalid bearer token, pod UID ({second.metadata.uid}) does not match service "
        f"account pod ref claim ({first.metadata.uid})]"
    )


@pytest.mark.parametrize(
    ("account", "ref", "spec", "status", "message"),
    [
        ("ghost", None, {}, 404, 'serviceaccounts "ghost" not found'),
        ("web", {"name": "web-9"}, {}, 404, 'pods "web-9" not found'),
        (
            "web",
            {"name": "other-1"},
            {},
            400,
            'cannot bind token for serviceaccount "web" to pod running with different '
            "serviceaccount name.",
        ),
        (
            "web",
            {"name": "web-1", "uid": "0000"},
            {},
            409,
            "the UID in the bound object reference (0000) does not match the UID in record",
        ),
        ("web", None, {"expirationSeconds": 60}, 422, "may not specify a duration less than 10"),
        (
            "web",
            {"kind": "Secret", "name": "web-token"},
            {},
            400,
            "cannot bind token to object of type v1, Kind=Secret",
        ),
    ],
)
def test_a_token_request_is_refused_as_the_api_server_refuses_it(
    core: Any,
    account: str,
    ref: dict[str, str] | None,
    spec: dict[str, Any],
    status: int,
    message: str,
) -> None:
    make_pod(core, "web-1")
    make_pod(core, "other-1", account="other")
    with pytest.raises(ApiException) as refused:
        token_request(core, account, ref, **spec)
    assert refused.value.status == status
    assert message in json.loads(str(refused.value.body))["message"]


def test_kube_api_binds_a_token_it_issues_directly(kube: tuple[Any, Any], core: Any) -> None:
    api, api_client = kube
    pod = make_pod(core, "web-1")
    bound = api.service_account_token("shop", "web", pod=("web-1", pod.metadata.uid))
    plain = api.service_account_token("shop", "web")

    assert claims(bound)["kubernetes.io"]["pod"] == {"name": "web-1", "uid": pod.metadata.uid}
    assert "pod" not in claims(plain)["kubernetes.io"]
    assert review(api_client, bound, ["trellis"]).user.extra[f"{EXTRA}pod-name"] == ["web-1"]
    assert set(review(api_client, plain, ["trellis"]).user.extra) == {f"{EXTRA}credential-id"}
    core.delete_namespaced_pod("web-1", "shop")
    assert not review(api_client, bound, ["trellis"]).authenticated
    assert review(api_client, plain, ["trellis"]).authenticated


def test_an_authority_without_a_store_knows_no_pods() -> None:
    alone = TokenAuthority()
    token = alone.issue("shop", "web", pod=("web-1", "uid-1"))
    assert alone.review({"spec": {"token": token}})["status"]["authenticated"] is False
    pods = {("shop", "web-1"): "uid-1"}
    wired = TokenAuthority(pod_uid=lambda namespace, name: pods.get((namespace, name)))
    token = wired.issue("shop", "web", pod=("web-1", "uid-1"))
    assert wired.review({"spec": {"token": token}})["status"]["authenticated"] is True
