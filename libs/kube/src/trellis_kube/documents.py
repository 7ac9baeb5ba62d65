"""Documents from the API server: one informer per kind, parsed by the kinds registry.

Each kind a service reads (a row of a :class:`~trellis_common.documents.base.KindRegistry`,
one per ``apiVersion``) is watched by an informer across all namespaces
(``trellis_kube.informer``: list, then watch from its resourceVersion, 410 relists
and diffs), on the newest version the server serves: a CRD serves every object under each
of its versions, so reading two would read each object twice. Documents come from the
monitored namespaces (``trellis.dev/monitored-by=<mesh name>``, live), and from others a
caller names per kind (the catalog: MeshConfig from the control plane's namespace); a
caller may also refuse a kind in a namespace (the catalog: MeshConfig anywhere else), which
reports the object as ignored, saying why.

A resource the server does not serve (its CRD is not installed: 404) is not an error: it
is listed again every ``absent_retry`` seconds and reported absent; the reader is synced
without it. An object whose edit does not parse keeps its last good version in force
beside the error, as a file of a spec directory does; a deleted object is gone.

The catalog reads every kind (``trellis_catalog.kubesource``, which also writes statuses
back); endpoints-vm reads ServiceEntry and WorkloadEntry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from trellis_common.documents.base import (
    Document,
    DocumentError,
    DocumentKey,
    Ignored,
    KindRegistry,
    Origin,
)
from trellis_kube.informer import Informer
from trellis_kube.namespaces import MonitoredNamespaces

log = logging.getLogger(__name__)

NOT_FOUND = 404


@dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def plural(self) -> str:
        lower = self.kind.lower()
        if lower.endswith("y") and lower[-2:-1] not in ("a", "e", "i", "o", "u"):
            return lower[:-1] + "ies"  # policies; but gateways
        return lower + "es" if lower.endswith("s") else lower + "s"  # egresses

    @property
    def core(self) -> bool:
        return self.group == ""

    def __str__(self) -> str:
        return f"{self.plural}.{self.group or 'core'}/{self.version}"


def _priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' version order: GA over beta over alpha, then the higher number."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if match is None:
        return (-1, 0, 0)
    major, stage, minor = match.groups()
    return ({"alpha": 0, "beta": 1, None: 2}[stage], int(major), int(minor or 0))


def resources(
    registry: KindRegistry, kinds: Iterable[str] | None = None
) -> dict[tuple[str, str], list[Resource]]:
    """(group, kind) -> the versions ``registry`` reads (of ``kinds``; all when None), the
    preferred first."""
    wanted = set(kinds) if kinds is not None else None
    table: dict[tuple[str, str], list[Resource]] = {}
    for kind in sorted(registry.kinds()):
        if wanted is not None and kind not in wanted:
            continue
        for api_version in registry.versions(kind):
            found = Resource(api_version, kind)
            table.setdefault((found.group, kind), []).append(found)
    for versions in table.values():
        versions.sort(key=lambda r: _priority(r.version), reverse=True)
    return table


Parser = tuple[Origin, Callable[[], Document]]


class KubeDocuments:
    """The informers, the monitored namespaces and the documents they make."""

    def __init__(
        self,
        api: Any,
        mesh_name: str,
        registry: KindRegistry,
        *,
        kinds: Iterable[str] | None = None,
        also_from: Callable[[str, str], bool] = lambda kind, namespace: False,
        ignored: Callable[[str, str], str] = lambda kind, namespace: "",
        watch_timeout: int = 60,
        absent_retry: float = 30.0,
    ) -> None:
        from kubernetes import client  # imported where a reader is made (client.py)

        self._core: Any = client.CoreV1Api(api)
        self._custom: Any = client.CustomObjectsApi(api)
        self._registry = registry
        self._also_from = also_from
        self._ignored = ignored
        self._absent_retry = absent_retry
        #: set on every change of an object or of the monitored namespaces
        self.changed = asyncio.Event()
        self.namespaces = MonitoredNamespaces(self._core, mesh_name, watch_timeout=watch_timeout)
        self.namespaces.on_change(lambda *_: self.changed.set())
        self.candidates = resources(registry, kinds)
        #: (group, kind) -> the version in use (the newest the server serves)
        self.active = {key: versions[0] for key, versions in self.candidates.items()}
        self.informers: dict[tuple[str, str], Informer] = {}
        self.absent: set[tuple[str, str]] = set()
        #: the last document each object parsed to (its source: the origin's)
        self._good: dict[str, Document] = {}
        for key in self.candidates:
            informer = Informer(
                f"{key[1]}.{key[0] or 'core'}",
                functools.partial(self._list, key),
                watch_timeout=watch_timeout,
            )
            informer.subscribe(lambda *_: self.changed.set())
            self.informers[key] = informer

    def _list(self, key: tuple[str, str], **kwargs: Any) -> Any:
        resource = self.active[key]
        if resource.core:
            snake = re.sub(r"(?<!^)(?=[A-Z])", "_", resource.kind).lower()  # service_account
            return getattr(self._core, f"list_{snake}_for_all_namespaces")(**kwargs)
        return self._custom.list_cluster_custom_object(
            resource.group, resource.version, resource.plural, **kwargs
        )

    def parts(self) -> list[Callable[[asyncio.Event], Awaitable[None]]]:
        """The loops to run: the namespaces' informer and one per kind."""
        found: list[Callable[[asyncio.Event], Awaitable[None]]] = [self.namespaces.run]
        found += [functools.partial(self._follow, k, i) for k, i in self.informers.items()]
        return found

    async def _follow(self, key: tuple[str, str], informer: Informer, stop: asyncio.Event) -> None:
        """The informer on the newest served version; while none is served (no CRD), the
        versions are tried again now and then."""
        from kubernetes.client.exceptions import ApiException

        while not stop.is_set():
            for resource in self.candidates[key]:
                self.active[key] = resource
                try:
                    await informer.run(stop)
                    return
                except ApiException as exc:
                    if exc.status != NOT_FOUND:
                        raise
            if key not in self.absent:
                log.info("kube_source.absent kind=%s retry_s=%s", key[1], self._absent_retry)
            self.absent.add(key)
            informer.synced.set()  # nothing to wait for: the reader is ready without it
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._absent_retry)
        self.absent.discard(key)

    @property
    def synced(self) -> bool:
        return self.namespaces.synced.is_set() and all(
            i.synced.is_set() for i in self.informers.values()
        )

    def documents(self, extra: Iterable[Parser] = ()) -> tuple[list[Document], list[DocumentError]]:
        """The documents of the objects in scope, and ``extra`` parsers' (the catalog's
        MeshConfig ConfigMap), each keeping its last good version when an edit fails."""
        parsers: list[Parser] = []
        ignored: list[DocumentError] = []
        for key, informer in self.informers.items():
            resource = self.active[key]
            for (namespace, name), obj in sorted(informer.objects.items()):
                wanted = self.namespaces.monitors(namespace) or self._also_from(
                    resource.kind, namespace
                )
                if not wanted:
                    continue
                raw = {**obj, "apiVersion": resource.api_version, "kind": resource.kind}
                origin = Origin(f"k8s:{resource.api_version}/{resource.kind}/{namespace}/{name}")
                why = self._ignored(resource.kind, namespace)
                if why:
                    named = DocumentKey(resource.kind, namespace, name)
                    ignored.append(Ignored(origin, "metadata.namespace", why, named))
                    continue
                parsers.append((origin, functools.partial(self._registry.parse, raw, origin)))
        parsers += extra
        documents: list[Document] = []
        errors: list[DocumentError] = list(ignored)
        good: dict[str, Document] = {}
        for origin, parse in parsers:
            try:
                good[origin.source] = parse()
            except DocumentError as exc:
                errors.append(exc)
                if origin.source in self._good:
                    good[origin.source] = self._good[origin.source]
            if origin.source in good:
                documents.append(good[origin.source])
        self._good = good
        return documents, errors

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "kubernetes",
            "mesh": self.namespaces.mesh_name,
            "monitored_namespaces": sorted(self.namespaces.names()),
            "reading": sorted(str(self.active[k]) for k in self.informers if k not in self.absent),
            "absent": sorted(f"{kind}.{group or 'core'}" for group, kind in self.absent),
        }
