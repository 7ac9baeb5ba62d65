"""The mesh specification from the API server, next to (or instead of) the spec directory.

Every kind the catalog reads (SMI, MeshConfig, Istio ServiceEntry/WorkloadEntry, core
Services and ServiceAccounts: the kind registry's table, one row per ``apiVersion``) is
watched by an informer across all namespaces (``trellis_common.kube.informer``: list, then
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

Status is written back to the objects whose kind has one (every CRD here; not core
Services). Gateway API routes get ``status.parents`` (:mod:`.routestatus`); the others an
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
from datetime import UTC, datetime
from typing import Any, Protocol

import yaml
from kubernetes import client

from trellis_catalog import routestatus
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.spec import Status
from trellis_common.documents import all_kinds, yamlfile
from trellis_common.documents.base import Document, DocumentError, Origin
from trellis_common.kube import documents
from trellis_common.kube.documents import Resource
from trellis_common.kube.informer import Informer, Object
from trellis_common.lifecycle import run_components

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
        self.reader = documents.KubeDocuments(
            api,
            mesh_name,
            all_kinds(),
            also_from=lambda kind, namespace: (
                kind == "MeshConfig" and namespace == control_plane_namespace
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
        """The documents of the objects in scope, and the MeshConfig ConfigMap's; an edit
        that does not parse keeps the object's last good version in force."""
        configmaps = self.configmap.objects if self.configmap else {}
        extra = [
            (origin, functools.partial(meshconfig_of_configmap, obj, origin))
            for (namespace, name), obj in sorted(configmaps.items())
            for origin in [Origin(f"k8s:v1/ConfigMap/{namespace}/{name}")]
        ]
        return self.reader.documents(extra)

    async def write_statuses(self, statuses: dict[str, Status]) -> None:
        """Write each CRD object's Accepted condition where it differs (module docstring)."""
        by_source = {s.source: s for s in statuses.values()}
        for key, informer in self.informers.items():
            resource = self.active[key]
            if resource.core:
                continue
            for (namespace, name), obj in list(informer.objects.items()):
                source = f"k8s:{resource.api_version}/{resource.kind}/{namespace}/{name}"
                found = by_source.get(source)
                if found is None:
                    continue
                written = (resource, namespace, name)
                if resource.kind in routestatus.ROUTE_KINDS:  # Gateway API: per parent
                    entries = routestatus.parents(found, obj)
                    body = {"status": {"parents": entries}}
                    summary = f"parents={len(found.parents)} state={found.state}"
                    if entries is None or body == self._written.get(written):
                        continue
                    remembered: dict[str, Any] = body
                else:
                    wanted = condition(found, obj)
                    if wanted is None or _timeless(wanted) == self._written.get(written):
                        continue
                    body = {"status": {"conditions": [wanted]}}
                    summary = (
                        f"accepted={wanted['status']} generation={wanted['observedGeneration']}"
                    )
                    remembered = _timeless(wanted)
                try:
                    await asyncio.to_thread(
                        self._custom.patch_namespaced_custom_object_status,
                        resource.group, resource.version, namespace, resource.plural, name, body,
                    )  # fmt: skip
                    self.status_writes += 1
                    self._written[written] = remembered
                    log.info(
                        "kube_source.status_written resource=%s object=%s/%s %s",
                        resource, namespace, name, summary,
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


def _timeless(found: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in found.items() if k != "lastTransitionTime"}


def condition(status: Status, obj: Object) -> dict[str, Any] | None:
    """The Accepted condition ``obj`` should have; None if it has it already."""
    accepted = status.state in ("valid", "warning")
    reason = "Accepted" if accepted else ("Ignored" if status.state == "ignored" else "Invalid")
    generation = (obj.get("metadata") or {}).get("generation") or 0
    wanted = {
        "type": "Accepted",
        "status": "True" if accepted else "False",
        "reason": reason,
        "message": (f"{status.field}: " if status.field else "")
        + (status.reason or "accepted by the catalog"),
        "observedGeneration": generation,
    }
    current = [
        c
        for c in ((obj.get("status") or {}).get("conditions") or [])
        if isinstance(c, dict) and c.get("type") == "Accepted"
    ]
    if current and {k: current[0].get(k) for k in wanted} == wanted:
        return None
    same = current and current[0].get("status") == wanted["status"]
    now = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    wanted["lastTransitionTime"] = current[0].get("lastTransitionTime", now) if same else now
    return wanted
