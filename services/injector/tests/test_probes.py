"""Kubelet HTTP probes rewritten to the sidecar's probe listeners, and those listeners in
the bootstrap (checked by Envoy itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch

from trellis_common.bootstrap import BootstrapSpec, ProbeRoute, ProxyFiles, envoy_bootstrap
from trellis_injector.domain import probes
from trellis_testing import envoy


def pod() -> dict[str, Any]:
    app = {
        "name": "app",
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 3},
        "livenessProbe": {"httpGet": {"path": "/live?deep=1", "port": "http"}},
        "startupProbe": {"tcpSocket": {"port": 8080}},
    }
    admin = {
        "name": "admin",
        "readinessProbe": {"httpGet": {"port": 9443, "scheme": "HTTPS"}},
        "livenessProbe": {"httpGet": {"port": "missing"}},
    }
    return {"metadata": {"name": "web"}, "spec": {"containers": [app, admin]}}


def test_http_probes_go_to_envoys_listeners_and_the_rest_is_left_as_written() -> None:
    routes, ops = probes.rewrites(pod())
    assert routes == [
        ProbeRoute(15901, "/trellis-liveness-probe/app", 8080, "/live?deep=1"),
        ProbeRoute(15902, "/trellis-readiness-probe/app", 8080, "/healthz"),
    ]
    patched = jsonpatch.apply_patch(pod(), ops)
    app, admin = patched["spec"]["containers"]
    assert app["readinessProbe"] == {
        "httpGet": {"path": "/trellis-readiness-probe/app", "port": 15902, "scheme": "HTTP"},
        "periodSeconds": 3,  # timing kept
    }
    assert app["livenessProbe"]["httpGet"]["port"] == 15901
    assert app["startupProbe"] == {"tcpSocket": {"port": 8080}}  # Envoy accepts it: passes
    assert admin == pod()["spec"]["containers"][1]  # HTTPS and a bad port name: untouched


def test_the_bootstrap_serves_each_probe_path_and_envoy_accepts_it(tmp_path: Path) -> None:
    routes, _ = probes.rewrites(pod())
    files = ProxyFiles(tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem")
    spec = BootstrapSpec("u.web.shop", "shop", "web", files, probes=tuple(routes))
    bootstrap = envoy_bootstrap(spec)
    listeners = {x["name"]: x for x in bootstrap["static_resources"]["listeners"]}
    assert set(listeners) == {"trellis-probe-15901", "trellis-probe-15902"}
    manager = listeners["trellis-probe-15902"]["filter_chains"][0]["filters"][0]["typed_config"]
    first, fallback = manager["route_config"]["virtual_hosts"][0]["routes"]
    assert first["match"] == {"path": "/trellis-readiness-probe/app"}
    assert first["route"] == {"cluster": "trellis-probe|8080", "prefix_rewrite": "/healthz"}
    assert fallback["direct_response"]["status"] == 404
    for name in ("cert.pem", "key.pem", "ca.pem"):  # validate mode reads the files
        (tmp_path / name).write_text("")
    static = {"static_resources": {
        "listeners": bootstrap["static_resources"]["listeners"],
        "clusters": [c for c in bootstrap["static_resources"]["clusters"]
                     if c["name"].startswith("trellis-probe")],
    }}  # fmt: skip
    result = envoy.validate(static)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_probe_listeners_are_left_out_of_the_inbound_redirection() -> None:
    from trellis_injector.domain.injection import Sidecar, init_container
    from trellis_kube.injection import Exclusions

    script = init_container(Sidecar("envoy", "init", "agent"), Exclusions())["command"][2]
    for port in (15901, 15902, 15903, 15010):
        assert f"-A TRELLIS_INBOUND -p tcp --dport {port} -j RETURN" in script
