"""The chart's Gateways (``gateways:``): each entry's Envoy, run as the CLI runs it.

A ServiceAccount (the identity), a Deployment of ``trellis gateway run --enroll`` whose
arguments the real command accepts, configured as the pod agent reads its configuration,
the listener certificates mounted where ``--certs-dir`` says, a Service for the listeners,
and the mesh root in the Gateway's namespace. Bad entries fail the rendering, named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from tests.deploy.helmchart import CHART, HelmFailed, Rendered, helm, render
from trellis_cli import gateway
from trellis_cli.agent import AgentConfig

pytestmark = pytest.mark.timeout(120)

WEB = {
    "name": "web",
    "namespace": "shop",
    "replicas": 2,
    "service": {
        "type": "ClusterIP",
        "ports": [{"name": "http", "port": 8080}, {"name": "https", "port": 8443}],
    },
    "certificateSecrets": ["web-tls"],
}


def render_gateways(scratch: Path, *gateways: dict[str, Any]) -> Rendered:
    values = scratch / "gateways.yaml"
    values.write_text(yaml.safe_dump({"gateways": list(gateways)}))
    text = helm(
        *("template", "trellis", str(CHART), "--namespace", "trellis-system"),
        *("-f", str(values)),
        scratch=scratch,
    )
    return Rendered([o for o in yaml.safe_load_all(text) if o])


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return render_gateways(tmp_path_factory.mktemp("helm"), WEB)


def of(rendered: Rendered, kind: str, name: str, namespace: str = "shop") -> dict[str, Any]:
    found = [
        o
        for o in rendered.all(kind)
        if o["metadata"]["name"] == name and o["metadata"].get("namespace") == namespace
    ]
    assert len(found) == 1, (kind, name, namespace)
    return found[0]


def test_no_gateway_by_default(tmp_path: Path) -> None:
    plain = render(tmp_path)
    assert not [o for o in plain.objects if o["metadata"].get("namespace") == "shop"]
    assert "trellis-mesh-root" not in plain.names("ConfigMap")


def test_a_gateway_runs_trellis_gateway_run_with_arguments_the_command_accepts(
    rendered: Rendered,
) -> None:
    pod = of(rendered, "Deployment", "web")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"][:3] == ["trellis", "gateway", "run"]
    context = gateway.run.make_context("run", list(container["command"][3:]))
    assert context.params["enroll"] is True
    assert context.params["namespace"] == "shop"
    assert context.params["name"] == "web"
    assert context.params["xds_address"] == "proxy-cp.trellis-system.svc:15128"
    assert context.params["proxy_cp_id"] == "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"
    assert pod["serviceAccountName"] == "web"
    assert pod["automountServiceAccountToken"] is False
    assert of(rendered, "Deployment", "web")["spec"]["replicas"] == 2
    assert of(rendered, "ServiceAccount", "web")["automountServiceAccountToken"] is False


def test_the_pod_enrolls_as_the_agent_is_configured_with_its_own_token(
    rendered: Rendered,
) -> None:
    pod = of(rendered, "Deployment", "web")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["TRELLIS_AGENT_CA"]["valueFrom"]["configMapKeyRef"] == {
        "name": "trellis-mesh-root",
        "key": "ca.crt",
    }
    given = {name: e.get("value", "PEM") for name, e in env.items()}
    config = AgentConfig.from_env(
        {
            **given,
            "TRELLIS_AGENT_SERVICE": "web",
            "TRELLIS_AGENT_DIR": "/x",
            **{"TRELLIS_AGENT_BOOTSTRAP": "{}"},
        }
    )
    assert config.address == "proxy-cp.trellis-system.svc:15012"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert str(config.token_path.parent) in mounts
    token = next(v for v in pod["volumes"] if v["name"] == mounts[str(config.token_path.parent)])
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "trellis"
    # Envoy comes from the injector's Envoy image, where TRELLIS_ENVOY_BIN says
    init = pod["initContainers"][0]
    assert init["command"][-1] == given["TRELLIS_ENVOY_BIN"]


def test_listener_certificates_are_mounted_where_certs_dir_says(rendered: Rendered) -> None:
    pod = of(rendered, "Deployment", "web")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    context = gateway.run.make_context("run", list(container["command"][3:]))
    folder = Path(context.params["certs_dir"]) / "shop" / "web-tls"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(folder))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "web-tls"
    assert {i["path"] for i in volume["secret"]["items"]} == {"tls.crt", "tls.key"}


def test_the_service_exposes_the_listeners_and_the_mesh_root_is_in_the_namespace(
    rendered: Rendered,
) -> None:
    service = of(rendered, "Service", "web")
    assert service["spec"]["type"] == "ClusterIP"
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        (8080, 8080),
        (8443, 8443),
    ]
    pod = of(rendered, "Deployment", "web")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod.items()
    root = of(rendered, "ConfigMap", "trellis-mesh-root")["data"]["ca.crt"]
    ca = rendered.secret("trellis-ca")["tls.crt"].decode()
    assert root.strip() == ca.strip()


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({**WEB, "namespace": "trellis-system"}, "gateways[0].namespace"),
        ({**WEB, "service": {"ports": []}}, "gateways"),
        ({**WEB, "name": "Not_A_Name"}, "gateways"),
    ],
)
def test_a_bad_entry_fails_the_rendering_naming_it(
    tmp_path: Path, entry: dict[str, Any], named: str
) -> None:
    with pytest.raises(HelmFailed, match=named.replace("[", r"\[").replace("]", r"\]")):
        render_gateways(tmp_path, entry)


def test_the_run_command_refuses_enroll_without_an_xds_address() -> None:
    with pytest.raises(click.UsageError, match="--xds-address"):
        gateway.run.main(
            ["--enroll", "-n", "shop", "--name", "web", "--out", "/tmp/x"],
            standalone_mode=False,
            obj=None,
        )
