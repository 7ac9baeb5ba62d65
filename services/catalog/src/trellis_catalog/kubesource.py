"""The mesh specification from the API server, next to (or instead of) the spec directory.

Every kind the catalog reads (SMI, MeshConfig, Istio ServiceEntry/WorkloadEntry, Gateway
API routes, Gateways, GatewayClasses and ReferenceGrants, core Services, ServiceAccounts and
Namespaces: the kind registry's table, one row per ``apiVersion``) is
watched by an informer across all namespaces (``trellis_kube.informer``: list, then
watch from its resourceVersion, 410 relists and diffs). Documents come from the monitored
namespaces (``trellis.dev/monitored-by=<mesh name>``, live) and, for MeshConfig, from the
control plane's namespace too, and also from a ConfigMap there (``meshconfig_configmap``,
its ``data["meshconfig.yaml"]``), for clusters where the operator would rather not install
the MeshConfig CRD; it is one more source of the same document, and two MeshConfigs get the
catalog's usual "a second MeshConfig" error. A resource the server does not serve (its CRD is not
installed: 404) is not an error: it is listed again every ``absent_retry`` seconds and
shown as absent in ``describe()``; the source is ready without it.

Each object is parsed by the same models as a file (an object's source is
``k8s:<apiVersion>/<kind>/<namespace>/<name>``, which is what status shows), and the catalog
gets the union of this source's documents and the directory's (:class:`Sources`).

GatewayClasses are cluster-scoped: they belong to no namespace and are always read. The
Namespace documents (whose labels a Gateway listener's ``allowedRoutes`` selects by) are
the monitored namespaces, from the informer that already follows them: routes are read
from those only, so no other namespace's labels matter, and no second informer is needed.

Status is written back to the objects whose kind has one (every CRD here but
ReferenceGrant; not core kinds). Gateway API routes get ``status.parents``
(:mod:`.routestatus`); GatewayClasses and Gateways of Trellis' class their conditions and
listeners, other controllers' nothing (:mod:`.gatewaystatus`); the others an
``Accepted`` condition, ``True`` (reason ``Accepted``) for a valid or warned document,
``False`` (``Invalid``, or ``Ignored`` for a kind no service reads) with the catalog's
reason as the message, and ``observedGeneration``. It is written only when it differs from
what the object has (the transition time kept when the status did not change), so an
unchanged document costs no write; a failed write is logged and retried on the next change.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from typing import Any, Protocol

import yaml
from kubernetes import client

from trellis_catalog import gatewaystatus, routestatus
from trellis_catalog.catalog import Catalog
from trellis_common.documents import all_kinds, yamlfile
from trellis_common.documents.base import Document, DocumentError, Origin
from trellis_kube import documents
from trellis_kube.documents import Resource
from trellis_kube.informer import Informer, Object
from trellis_runtime.lifecycle import run_components
from trellis_spec.statuses import Condition, Status

log = logging.getLogger(__name__)

NOT_FOUND = 404
#: The key of the MeshConfig ConfigMap's data that holds the document (YAML).
MESHCONFIG_KEY = "meshconfig.yaml"


def resources() -> dict[tuple[str, str], list[Resource]]:
    """(group, kind) -> the versions the catalog reads, the preferred first."""
    return documents.resources(all_kinds())


class Sink(Protocol):
    """Where the documents read go: :class:`trellis_catalog.sources.Sources`, which joins them
    with the spec directory's."""

    def set(
        self, name: str, documents: Iterable[Document], errors: Iterable[DocumentError]
    ) -> None: ...


class KubeSource:
    """One informer per kind, on the newest version the server serves: a CRD serves every
    object under each of its versions, so reading two would read each object twice."""

    def __init__(
        self,
        api: client.ApiClient,
        mesh_name: str,
        control_plane_namespace: str,
        catalog: Catalog,
        sources: Sink,
        *,
        watch_timeout: int = 60,
        absent_retry: float = 30.0,
        meshconfig_configmap: str = "",
    ) -> None:
        self._core: Any = client.CoreV1Api(api)
        self._custom: Any = client.CustomObjectsApi(api)
        self._control_plane = control_plane_namespace
        self._catalog = catalog
        self._sources = sources
        self._registry = all_kinds()
        self.reader = documents.KubeDocuments(
            api,
            mesh_name,
            self._registry,
            kinds=[kind for kind in self._registry.kinds() if kind != "Namespace"],
            also_from=lambda kind, namespace: (
                namespace == ""  # cluster-scoped: GatewayClass
                or (kind == "MeshConfig" and namespace == control_plane_namespace)
            ),
            ignored=functools.partial(_meshconfig_elsewhere, control_plane_namespace),
            watch_timeout=watch_timeout,
            absent_retry=absent_retry,
        )
        self._wake = self.reader.changed
        self.namespaces = self.reader.namespaces
        self.candidates = self.reader.candidates
        self.active = self.reader.active
        self.informers = self.reader.informers
        self.absent = self.reader.absent
        self.status_writes = 0
        #: the last condition written per object (without its time): a write's own watch
        #: event can come after the next evaluation, which must not write it again
        self._written: dict[tuple[Resource, str, str], dict[str, Any]] = {}
        #: the MeshConfig ConfigMap's informer (one object: its name is the field selector)
        self.configmap: Informer | None = None
        if meshconfig_configmap:
            self.configmap = Informer(
                f"ConfigMap.core/{control_plane_namespace}/{meshconfig_configmap}",
                functools.partial(
                    self._core.list_namespaced_config_map,
                    control_plane_namespace,
                    field_selector=f"metadata.name={meshconfig_configmap}",
                ),
                watch_timeout=watch_timeout,
            )
            self.configmap.subscribe(lambda *_: self._wake.set())

    async def load(self) -> None:
        """Nothing to read before the service starts: the informers list in ``run``."""

    async def run(self, stop: asyncio.Event) -> None:
        parts = [self._applying, *self.reader.parts()]
        if self.configmap is not None:
            parts.append(self.configmap.run)
        await run_components(parts, stop)

    async def _applying(self, stop: asyncio.Event) -> None:
        """Hand the catalog the documents on every change, then write the statuses back."""
        while not stop.is_set():
            waits = {asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
            if stop.is_set() or not self.synced:
                continue
            self._wake.clear()
            documents, errors = self.documents()
            self._sources.set("kubernetes", documents, errors)
            await self._catalog.flush_and_announce()
            await self.write_statuses(self._catalog.spec.statuses)

    @property
    def synced(self) -> bool:
        return self.reader.synced and (self.configmap is None or self.configmap.synced.is_set())

    def documents(self) -> tuple[list[Document], list[DocumentError]]:
        """The documents of the objects in scope, the monitored Namespaces' and the
        MeshConfig ConfigMap's; an edit that does not parse keeps the object's last good
        version in force."""
        configmaps = self.configmap.objects if self.configmap else {}
        extra: list[documents.Parser] = [
            (origin, functools.partial(self._registry.parse, raw, origin))
            for (_, name), obj in sorted(self.namespaces.informer.objects.items())
            for raw in [{**obj, "apiVersion": "v1", "kind": "Namespace"}]
            for origin in [Origin(f"k8s:v1/Namespace//{name}")]
        ]
        extra += [
            (origin, functools.partial(meshconfig_of_configmap, obj, origin))
            for (namespace, name), obj in sorted(configmaps.items())
            for origin in [Origin(f"k8s:v1/ConfigMap/{namespace}/{name}")]
        ]
        return self.reader.documents(extra)

    async def write_statuses(self, statuses: dict[str, Status]) -> None:
        """Write each CRD object's status where it differs (module docstring)."""
        by_source = {s.source: s for s in statuses.values()}
        for key, informer in self.informers.items():
            resource = self.active[key]
            if resource.core or resource.kind in gatewaystatus.STATUSLESS_KINDS:
                continue
            for (namespace, name), obj in list(informer.objects.items()):
                source = f"k8s:{resource.api_version}/{resource.kind}/{namespace}/{name}"
                found = by_source.get(source)
                wanted = None if found is None else status_body(resource.kind, found, obj)
                written = (resource, namespace, name)
                if wanted is None or routestatus.timeless(wanted) == self._written.get(written):
                    continue
                await self._patch_status(resource, namespace, name, wanted)

    async def _patch_status(
        self, resource: Resource, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        """Merge-patch ``status`` into the object's status subresource (a cluster-scoped
        object, a GatewayClass, has no namespace); a failure is retried on the next change."""
        body = {"status": status}
        group, version, plural = resource.group, resource.version, resource.plural
        try:
            if namespace:
                await asyncio.to_thread(
                    self._custom.patch_namespaced_custom_object_status,
                    group, version, namespace, plural, name, body,
                )  # fmt: skip
            else:
                await asyncio.to_thread(
                    self._custom.patch_cluster_custom_object_status,
                    group, version, plural, name, body,
                )  # fmt: skip
            self.status_writes += 1
            self._written[(resource, namespace, name)] = routestatus.timeless(status)
            log.info(
                "kube_source.status_written resource=%s object=%s/%s %s",
                resource, namespace, name, _summary(status),
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001  # retried on the next change
            log.warning(
                "kube_source.status_failed resource=%s object=%s/%s error=%r",
                resource, namespace, name, str(exc),
            )  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {
            **self.reader.describe(),
            "status_writes": self.status_writes,
            "meshconfig_configmap": self.configmap.name if self.configmap else None,
        }


def _meshconfig_elsewhere(control_plane: str, kind: str, namespace: str) -> str:
    """Why a MeshConfig outside the control plane's namespace is not read: mesh-wide
    settings (permissive mode, egress, certificate lifetimes, exclusions) are the operator's,
    and a namespace's editor must not set them for everyone (OSM reads its one MeshConfig
    in osm-system)."""
    if kind != "MeshConfig" or namespace == control_plane:
        return ""
    return (
        f"a MeshConfig is read only from the control plane's namespace {control_plane!r}; "
        f"this one in {namespace!r} is ignored"
    )


def meshconfig_of_configmap(obj: Object, origin: Origin) -> Document:
    """The MeshConfig a ConfigMap holds under :data:`MESHCONFIG_KEY`, parsed as a file's
    would be (bounded YAML, the same models); its namespace is the ConfigMap's."""
    field = f"data.{MESHCONFIG_KEY}"
    text = (obj.get("data") or {}).get(MESHCONFIG_KEY)
    if not isinstance(text, str):
        raise DocumentError(origin, field, "is missing: put the MeshConfig document (YAML) there")
    try:
        loaded = yamlfile.load_bytes(text.encode(), yamlfile.DEFAULT_LIMITS.max_alias_nodes)
    except (yaml.YAMLError, yamlfile.TooCostly, RecursionError) as exc:
        raise DocumentError(origin, field, f"is not YAML: {exc}") from None
    if len(loaded) != 1 or not isinstance(loaded[0], dict):
        raise DocumentError(origin, field, "must hold exactly one document, a MeshConfig")
    raw = dict(loaded[0])
    if raw.get("kind") != "MeshConfig":
        raise DocumentError(
            origin, f"{field}: kind", f"must be MeshConfig, got {raw.get('kind')!r}"
        )
    found = raw.get("metadata")
    metadata: dict[str, Any] = found if isinstance(found, dict) else {}
    namespace = (obj.get("metadata") or {}).get("namespace")
    raw["metadata"] = {
        "name": (obj.get("metadata") or {}).get("name"),
        **metadata,
        "namespace": namespace,
    }
    return all_kinds().parse(raw, origin)


def _summary(status: dict[str, Any]) -> str:
    """What a status write says in its log line."""
    if "parents" in status:
        return f"parents={len(status['parents'])}"
    found = " ".join(f"{c['type']}={c['status']}" for c in status.get("conditions") or [])
    listeners = f" listeners={len(status['listeners'])}" if "listeners" in status else ""
    generation = (status.get("conditions") or [{}])[0].get("observedGeneration")
    return f"{found}{listeners} generation={generation}"


def status_body(kind: str, status: Status, obj: Object) -> dict[str, Any] | None:
    """The ``status`` fields ``obj`` (of ``kind``) should have; None if it has them, or
    if they are not the catalog's to write (another controller's Gateway or class)."""
    if kind in routestatus.ROUTE_KINDS:  # Gateway API routes: per parent
        entries = routestatus.parents(status, obj)
        return None if entries is None else {"parents": entries}
    if kind in gatewaystatus.GATEWAY_KINDS:
        return gatewaystatus.status_of(status, obj)
    wanted = condition(status, obj)
    return None if wanted is None else {"conditions": [wanted]}


def condition(status: Status, obj: Object) -> dict[str, Any] | None:
    """The Accepted condition ``obj`` should have; None if it has it already."""
    accepted = status.state in ("valid", "warning")
    reason = "Accepted" if accepted else ("Ignored" if status.state == "ignored" else "Invalid")
    wanted = Condition(
        "Accepted",
        "True" if accepted else "False",
        reason,
        (f"{status.field}: " if status.field else "")
        + (status.reason or "accepted by the catalog"),
    )
    current = [
        c
        for c in ((obj.get("status") or {}).get("conditions") or [])
        if isinstance(c, dict) and c.get("type") == "Accepted"
    ]
    generation = routestatus.generation_of(obj)
    found = routestatus.conditions([wanted], current, generation, routestatus.now())[0]
    if current and {k: current[0].get(k) for k in found} == found:
        return None
    return found
