"""The chart's ``values.schema.json``: Helm refuses bad values before rendering anything.

The default values lint and render; a wrong type, a value outside its enum or range, and a
misspelt key fail ``helm lint``, ``helm template`` and ``helm install --dry-run=client``
with a message naming the value. Every key of ``values.yaml`` is described by the schema,
and every key the schema adds beyond ``values.yaml`` is listed here, so neither file gains a
value the other does not know.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.helmchart import CHART, HELM, NAMESPACE, helm, render

SCHEMA = CHART / "values.schema.json"
VALUES = CHART / "values.yaml"
COMPONENT_KEYS = ("certmanager", "catalog", "endpointsK8s", "endpointsVm", "proxyCp", "injector")

#: keys the schema allows that values.yaml does not set (dotted paths)
OPTIONAL = {
    "global",
    *(f"{key}.replicas" for key in COMPONENT_KEYS if key != "proxyCp"),
    *(f"{key}.priorityClassName" for key in COMPONENT_KEYS),
    "meshConfig.featureFlags",
    "meshConfig.featureFlags.enableRetryPolicy",
    "meshConfig.traffic.inboundPortExclusionList",
    "meshConfig.traffic.outboundPortExclusionList",
    "meshConfig.traffic.outboundIPRangeExclusionList",
    "meshConfig.observability.tracing.address",
    "meshConfig.observability.tracing.port",
    "meshConfig.observability.tracing.endpoint",
    "networkPolicy.metricsNamespaceSelector.matchLabels",
    "networkPolicy.metricsNamespaceSelector.matchExpressions",
}

#: (--set item, what the error must name): each must be refused
BAD = [
    pytest.param("proxyCp.replicas=two", "/proxyCp/replicas", id="replicas-not-an-integer"),
    pytest.param("catalog.replicas=two", "/catalog/replicas", id="singleton-replicas-type"),
    pytest.param("proxyCp.replicas=0", "/proxyCp/replicas", id="replicas-zero"),
    pytest.param(
        "injector.failurePolicy=Sometimes", "/injector/failurePolicy", id="failure-policy"
    ),
    pytest.param("netwrokPolicy.enabled=false", "netwrokPolicy", id="misspelt-top-level-key"),
    pytest.param("proxyCp.replcas=3", "replcas", id="misspelt-component-key"),
    pytest.param(
        "meshConfig.observability.tracing.port=70000",
        "/meshConfig/observability/tracing/port",
        id="port-70000",
    ),
    pytest.param("image.pullPolicy=Sometimes", "/image/pullPolicy", id="pull-policy"),
    pytest.param("logLevel=LOUD", "/logLevel", id="log-level"),
    pytest.param("logFormat=xml", "/logFormat", id="log-format"),
    pytest.param(
        "meshConfig.sidecar.logLevel=verbose", "/meshConfig/sidecar/logLevel", id="envoy-level"
    ),
    pytest.param(
        "catalog.extraEnv[0].name=TRELLIS_CATALOG_X,catalog.extraEnv[0].value=5",
        "/catalog/extraEnv/0/value",
        id="env-value-not-a-string",
    ),
    pytest.param("injector.timeoutSeconds=31", "/injector/timeoutSeconds", id="webhook-timeout"),
    pytest.param("ha.enabled=maybe", "/ha/enabled", id="ha-not-a-boolean"),
    pytest.param("podAntiAffinity=sometimes", "/podAntiAffinity", id="anti-affinity"),
    pytest.param(
        "topologySpread.whenUnsatisfiable=Never",
        "/topologySpread/whenUnsatisfiable",
        id="spread-when-unsatisfiable",
    ),
    pytest.param(
        "podDisruptionBudget.maxUnavailable=0", "/podDisruptionBudget/maxUnavailable", id="pdb-0"
    ),
    pytest.param("redis.mode=cluster", "/redis/mode", id="redis-mode"),
    pytest.param("redis.sentinel.replicas=2", "/redis/sentinel/replicas", id="sentinels-2"),
    pytest.param(
        "redis.external.url=http://redis.example.org", "/redis/external/url", id="external-url"
    ),
    pytest.param("redis.externalUrl=redis://r:6379", "externalUrl", id="the-old-external-key"),
]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return dict(json.loads(SCHEMA.read_text(encoding="utf-8")))


def test_the_schema_is_draft_07(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False


def test_the_default_values_lint_and_render(scratch: Path) -> None:
    out = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, scratch=scratch)
    assert "0 chart(s) failed" in out
    assert render(scratch).all("Deployment")


def test_values_the_templates_accept_pass(scratch: Path) -> None:
    rendered = render(
        scratch,
        "logLevel=debug",
        "logFormat=kv",
        "image.pullPolicy=Always",
        "meshConfig.sidecar.logLevel=WARN",
        "meshConfig.certificate.serviceCertValidityDuration=1h30m",
        "meshConfig.observability.tracing.enable=true",
        "meshConfig.observability.tracing.address=jaeger.tracing.svc",
        "meshConfig.observability.tracing.port=65535",
        "meshConfig.traffic.outboundPortExclusionList={1,65535}",
        "injector.timeoutSeconds=30",
        "redis.persistence.enabled=true",
        "redis.persistence.size=10",
        "podAnnotations.example\\.com/team=mesh",
        "nodeSelector.kubernetes\\.io/os=linux",
        "tolerations[0].operator=Exists",
        "imagePullSecrets[0].name=registry",
        "networkPolicy.metricsNamespaceSelector.matchLabels.team=monitoring",
        "global.anything=1",
        "ha.enabled=true",
        "podAntiAffinity=required",
        "podDisruptionBudget.enabled=true",
        "topologySpread.whenUnsatisfiable=DoNotSchedule",
        "priorityClassName=system-cluster-critical",
        "catalog.priorityClassName=high",
        "redis.sentinel.downAfterMilliseconds=1000",
    )
    env = rendered.env("catalog")
    assert env["TRELLIS_LOG_LEVEL"] == "debug"


def _refused(scratch: Path, *args: str) -> str:
    """helm's stdout and stderr together (lint says why on stdout), after it failed."""
    env = {**os.environ, "HOME": str(scratch), "KUBECONFIG": str(scratch / "none")}
    done = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode != 0, (args[0], done.stdout[-2000:])
    return done.stdout + done.stderr


@pytest.mark.parametrize(("item", "named"), BAD)
def test_a_bad_value_is_refused_naming_it(scratch: Path, item: str, named: str) -> None:
    chart = str(CHART)
    common = ("--namespace", NAMESPACE, "--set", item)
    for args in (
        ("lint", "--strict", chart, *common),
        ("template", "trellis", chart, *common),
        ("install", "trellis", chart, "--dry-run=client", *common),
    ):
        message = _refused(scratch, *args)
        assert "don't meet the specifications of the schema" in message, (args[0], message)
        assert named in message, (args[0], message)


def _walk_values(
    value: Any, node: dict[str, Any], path: tuple[str, ...], seen: set[str]
) -> list[str]:
    """Where ``value`` (a part of values.yaml) is not described by ``node`` (its schema)."""
    problems: list[str] = []
    if not isinstance(value, dict):
        return problems
    props = node.get("properties")
    if props is None:  # a free-form map: anything goes below it
        if node.get("additionalProperties") is False:
            problems.append(f"{'.'.join(path)}: closed object without properties")
        return problems
    for key, item in value.items():
        dotted = ".".join((*path, key))
        seen.add(dotted)
        if key not in props:
            problems.append(f"{dotted}: not in the schema")
            continue
        child = props[key]
        if not child.get("description"):
            problems.append(f"{dotted}: no description in the schema")
        if "type" not in child:
            problems.append(f"{dotted}: no type in the schema")
        problems += _walk_values(item, child, (*path, key), seen)
    return problems


def _schema_keys(node: dict[str, Any], path: tuple[str, ...]) -> set[str]:
    found: set[str] = set()
    for key, child in node.get("properties", {}).items():
        found.add(".".join((*path, key)))
        found |= _schema_keys(child, (*path, key))
    return found


def test_every_value_is_in_the_schema_and_the_other_way_round(schema: dict[str, Any]) -> None:
    values = yaml.safe_load(VALUES.read_text(encoding="utf-8"))
    seen: set[str] = set()
    assert _walk_values(values, schema, (), seen) == []
    assert _schema_keys(schema, ()) - seen == OPTIONAL


def test_objects_with_fixed_keys_refuse_others(schema: dict[str, Any]) -> None:
    """Every object the schema lists the keys of is closed, so a misspelt key fails."""

    def open_ones(node: dict[str, Any], path: str) -> list[str]:
        found = []
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(path or "<top>")
        for key, child in node.get("properties", {}).items():
            found += open_ones(child, f"{path}.{key}".lstrip("."))
        return found

    assert open_ones(schema, "") == []
