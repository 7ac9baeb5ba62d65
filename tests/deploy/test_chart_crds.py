"""The chart's CRDs: which it installs, and that their schemas agree with the catalog.

* By default the chart renders the CRDs of Trellis' own group and of OSM's and SMI's, and
  no other project's: Gateway API and Istio CRDs are prerequisites, rendered only with
  ``crds.gatewayApi.install`` / ``crds.istio.install``, and then exactly as upstream has
  them. All are templates kept on uninstall, so ``helm upgrade`` updates them.
* Each CRD serves every version the catalog parses, stores the one it prefers, and has a
  structural schema the API server takes.
* The schemas never refuse what the catalog accepts: every seed document
  (``trellis_testing.seeds``), every example (``examples/``), every document the
  catalog's and the document models' tests parse (``crd_corpus.json``, see
  :data:`CORPUS`), and every mutation of a seed the catalog still accepts validates; and
  they refuse what the catalog refuses where a schema can say it, naming the field.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from tests.deploy import crdschema
from tests.deploy.helmchart import CHART, NAMESPACE, ROOT, Rendered, helm, render
from trellis_catalog import gatewaystatus
from trellis_catalog.kubesource import resources
from trellis_common.documents import all_kinds
from trellis_common.documents.base import DocumentError, Origin
from trellis_testing import strategies as fuzz
from trellis_testing.seeds import SEEDS

OWN_GROUPS = {
    "config.trellis.io", "config.openservicemesh.io", "policy.openservicemesh.io",
    "specs.smi-spec.io", "access.smi-spec.io", "split.smi-spec.io",
}  # fmt: skip
PREREQUISITES = {"gateway.networking.k8s.io": "gateway-api", "networking.istio.io": "istio"}
#: The documents the catalog's and the models' tests parse successfully, recorded once by
#: patching ``KindRegistry.parse`` during those tests (the kinds whose CRD Trellis ships);
#: regenerate it the same way when those tests gain documents.
CORPUS = Path(__file__).with_name("crd_corpus.json")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-crds")


@pytest.fixture(scope="module")
def default(scratch: Path) -> Rendered:
    return render(scratch)


@pytest.fixture(scope="module")
def everything(scratch: Path) -> Rendered:
    return render(scratch / "all", "crds.gatewayApi.install=true", "crds.istio.install=true")


def _by_name(rendered: Rendered) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in rendered.all("CustomResourceDefinition")}


def _schemas(rendered: Rendered) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the openAPIV3Schema the CRD serves it with."""
    found = {}
    for crd in rendered.all("CustomResourceDefinition"):
        spec = crd["spec"]
        for version in spec["versions"]:
            if version["served"]:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                found[key] = version["schema"]["openAPIV3Schema"]
    return found


def test_default_installs_only_trellis_osm_and_smi_groups(default: Rendered) -> None:
    crds = _by_name(default)
    assert {c["spec"]["group"] for c in crds.values()} == OWN_GROUPS
    wanted = {
        f"{versions[0].plural}.{group}"
        for (group, _), versions in resources().items()
        if group in OWN_GROUPS
    }
    assert set(crds) == wanted
    assert not (CHART / "crds").exists()  # Helm would never upgrade those


def test_every_crd_is_kept_on_uninstall(everything: Rendered) -> None:
    for name, crd in _by_name(everything).items():
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", name


def test_own_crds_serve_every_version_the_catalog_reads(default: Rendered) -> None:
    crds = _by_name(default)
    for (group, kind), versions in resources().items():
        if group not in OWN_GROUPS:
            continue
        crd = crds[f"{versions[0].plural}.{group}"]
        served = [(v["name"], v["storage"]) for v in crd["spec"]["versions"] if v["served"]]
        assert served == [(r.version, i == 0) for i, r in enumerate(versions)], kind
        for version in crd["spec"]["versions"]:
            assert version["subresources"] == {"status": {}}  # the catalog writes status


def test_prerequisites_only_on_opt_in_and_as_upstream_has_them(
    default: Rendered, scratch: Path
) -> None:
    for group, folder in PREREQUISITES.items():
        value = {"gateway-api": "gatewayApi", "istio": "istio"}[folder]
        rendered = render(scratch / folder, f"crds.{value}.install=true")
        crds = _by_name(rendered)
        theirs = {n: c for n, c in crds.items() if c["spec"]["group"] == group}
        assert set(crds) - set(theirs) == set(_by_name(default))  # only those are added
        wanted = {f"{r[0].plural}.{g}" for (g, _), r in resources().items() if g == group}
        assert set(theirs) == wanted
        upstream = {}
        for path in (ROOT / "deploy" / "upstream" / folder).glob("*.yaml"):
            doc = yaml.safe_load(path.read_text())
            upstream[doc["metadata"]["name"]] = doc
        for name, crd in theirs.items():
            annotations = dict(crd["metadata"]["annotations"])
            annotations.pop("helm.sh/resource-policy")
            original = copy.deepcopy(upstream[name])
            original["metadata"]["annotations"] = {
                k: v
                for k, v in (original["metadata"].get("annotations") or {}).items()
                if k != "helm.sh/resource-policy"
            }
            assert {**crd, "metadata": {**crd["metadata"], "annotations": annotations}} == (
                original
            ), name


def test_schemas_are_structural_without_cel(default: Rendered) -> None:
    for name, crd in _by_name(default).items():
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            assert crdschema.structural_problems(schema) == [], f"{name} {version['name']}"
            assert "x-kubernetes-validations" not in json.dumps(schema), name


def _shipped(document: dict[str, Any]) -> bool:
    group = str(document.get("apiVersion", "")).rpartition("/")[0]
    return group in OWN_GROUPS


def _catalog_accepts(document: dict[str, Any]) -> bool:
    try:
        all_kinds().parse(copy.deepcopy(document), Origin("test"))
    except DocumentError:
        return False
    return True


def _accepted() -> list[tuple[str, dict[str, Any]]]:
    """Every document of the shipped groups the repository holds as valid."""
    found = [(f"seed {i}", dict(s)) for i, s in enumerate(SEEDS)]
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            found.append((f"{path.relative_to(ROOT)} #{i}", doc))
    corpus = json.loads(CORPUS.read_text())
    found += [(f"{CORPUS.name} #{i} ({c['from']})", c["document"]) for i, c in enumerate(corpus)]
    return [(where, doc) for where, doc in found if isinstance(doc, dict) and _shipped(doc)]


def test_the_corpus_is_of_documents_the_catalog_accepts() -> None:
    documents = _accepted()
    assert len(documents) > 50
    kinds = {(d["apiVersion"], d["kind"]) for _, d in documents}
    shipped = {
        (r.api_version, r.kind)
        for (group, _), versions in resources().items()
        if group in OWN_GROUPS
        for r in versions
    }
    assert kinds == shipped  # every version of every kind has a document
    refused = [where for where, doc in documents if not _catalog_accepts(doc)]
    assert refused == []


def test_every_document_the_catalog_accepts_validates(default: Rendered) -> None:
    schemas = _schemas(default)
    failures = {}
    for where, doc in _accepted():
        found = crdschema.problems(doc, schemas[(doc["apiVersion"], doc["kind"])])
        if found:
            failures[where] = found
    assert failures == {}


@pytest.fixture(scope="module")
def schemas(default: Rendered) -> dict[tuple[str, str], dict[str, Any]]:
    return _schemas(default)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mutated=fuzz.mutations(fuzz.seeds().filter(_shipped)))
def test_a_mutated_seed_the_catalog_accepts_validates(
    schemas: dict[tuple[str, str], dict[str, Any]],
    mutated: tuple[dict[str, Any], tuple[fuzz.Mutation, ...]],
) -> None:
    document, done = mutated
    if not isinstance(document.get("metadata"), dict) or not _catalog_accepts(document):
        return
    schema = schemas.get((document["apiVersion"], document["kind"]))
    if schema is None:  # a mutated apiVersion the catalog still reads: not a shipped one
        return
    assert crdschema.problems(document, schema) == [], [str(m) for m in done]


def _seed(api_version: str, kind: str) -> dict[str, Any]:
    found = [s for s in SEEDS if s["apiVersion"] == api_version and s["kind"] == kind]
    return copy.deepcopy(dict(found[0]))


def _set(document: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    node: Any = document
    parts = [int(p) if p.isdigit() else p for p in path.split(".")]
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value
    return document


#: (apiVersion, kind, path set, value, the field the refusal names)
BAD = [
    pytest.param("split.smi-spec.io/v1alpha2", "TrafficSplit", "spec.backends.0.weight", "half",
                 "spec.backends[0].weight", id="split-weight-not-a-number"),
    pytest.param("split.smi-spec.io/v1alpha4", "TrafficSplit", "spec.servce", "x", "servce",
                 id="split-misspelt-field"),
    pytest.param("access.smi-spec.io/v1alpha3", "TrafficTarget", "spec.destination.kind",
                 "Pod", "spec.destination.kind", id="target-destination-not-an-account"),
    pytest.param("access.smi-spec.io/v1alpha3", "TrafficTarget", "spec.sources", "everyone",
                 "spec.sources", id="target-sources-not-a-list"),
    pytest.param("config.trellis.io/v1alpha1", "MeshConfig",
                 "spec.certificate.serviceCertValidityDuration", "a day",
                 "spec.certificate.serviceCertValidityDuration", id="meshconfig-duration"),
    pytest.param("config.trellis.io/v1alpha1", "MeshConfig", "spec.trustDomain",
                 "Mesh.Example", "spec.trustDomain", id="meshconfig-trust-domain"),
    pytest.param("config.trellis.io/v1alpha1", "MeshConfig",
                 "spec.traffic.enablePermisiveTrafficPolicyMode", True,
                 "enablePermisiveTrafficPolicyMode", id="meshconfig-misspelt-field"),
    pytest.param("config.trellis.io/v1alpha1", "MeshConfig", "spec.sidecar.logLevel", "loud",
                 "spec.sidecar.logLevel", id="meshconfig-log-level"),
    pytest.param("config.openservicemesh.io/v1alpha2", "MeshConfig",
                 "spec.traffic.enableEgress", "yes", "spec.traffic.enableEgress",
                 id="osm-meshconfig-egress-not-a-boolean"),
]  # fmt: skip


@pytest.mark.parametrize(("api_version", "kind", "path", "value", "field"), BAD)
def test_bad_documents_are_refused_naming_the_field(
    default: Rendered, api_version: str, kind: str, path: str, value: Any, field: str
) -> None:
    document = _set(_seed(api_version, kind), path, value)
    assert not _catalog_accepts(document)  # the catalog refuses it too
    found = crdschema.problems(document, _schemas(default)[(api_version, kind)])
    assert found, f"{path}={value!r} was accepted"
    assert any(field in problem for problem in found), found


def test_without_its_own_crds_the_catalog_keeps_its_rights(scratch: Path) -> None:
    rendered = render(scratch / "none", "crds.trellis.install=false")
    assert rendered.all("CustomResourceDefinition") == []
    rules = rendered.get("ClusterRole", "trellis-catalog")["rules"]
    granted = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    for (group, kind), versions in resources().items():
        if not versions[0].core:  # every kind it reads, whoever installs the CRD
            assert (group, versions[0].plural) in granted
            # and writes the status of, but of a kind that has none (ReferenceGrant)
            writes = versions[0].kind not in gatewaystatus.STATUSLESS_KINDS
            assert ((group, f"{versions[0].plural}/status") in granted) == writes, kind


def test_notes_name_the_prerequisites(scratch: Path) -> None:
    def notes(*sets: str) -> str:
        args = ["install", "trellis", str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
        for item in sets:
            args += ["--set", item]
        return helm(*args, scratch=scratch)

    out = notes()
    assert "crds.gatewayApi.install=true" in out
    assert "crds.istio.install=true" in out
    out = notes("crds.gatewayApi.install=true", "crds.istio.install=true")
    assert "crds.gatewayApi.install=true" not in out
    assert "upstream's CRDs, from this release" in out
