"""A Kubernetes API server for tests: kmock's emulator, made to keep the API's promises.

Our code talks to the API server through the official ``kubernetes`` client, and tests run
that real client against kmock's ``KubernetesEmulator`` (there is no cluster here). As
shipped, the emulator leaves out what a watcher depends on (see
``shared/notes/kubernetes-testing-facts.md``): no resourceVersion, uid or creation time, no
generateName, every watch replays everything, no 410 Gone, selectors ignored, namespaces
unreadable. :class:`ApiServer` keeps kmock's HTTP server, request parsing, discovery and
error bodies, and its own store takes over the objects:

* create fills ``uid``, ``creationTimestamp``, ``generation``, ``resourceVersion`` (one
  counter for all objects), the namespace from the URL and a name from ``generateName``,
  and answers 201; a duplicate is 409 ``AlreadyExists``;
* patches: a JSON list is RFC 6902, a dict is a JSON merge patch (RFC 7386; strategic
  merge's per-list keys are not emulated); ``/status`` changes only the status, the main
  resource bumps ``generation`` when anything but metadata and status changes, and a patch
  that changes nothing changes no resourceVersion and sends no event; PUT replaces, with
  the resourceVersion precondition (409 ``Conflict``);
* delete honours finalizers (``deletionTimestamp`` first, gone once they are cleared);
* list and watch honour ``labelSelector`` (equality, ``!=``, ``in``, ``notin``, exists)
  and ``fieldSelector`` on ``metadata.name``/``metadata.namespace``; a list carries the
  current resourceVersion; a watch from a resourceVersion sends only what changed after it
  (an object that stops matching a selector arrives as DELETED, one that starts as ADDED),
  a watch with none starts with every object as ADDED, ``timeoutSeconds`` ends it, and a
  resourceVersion from before :meth:`KubeApi.expire` gets the ERROR event with 410
  ``Expired``, as after etcd compaction;
* Namespaces are served as the cluster-scoped resource they are; TokenReview answers about
  the ServiceAccount tokens it issued (:mod:`trellis_testing.kubeauth`), a pod-bound
  one only while its pod is in the store with the uid it was bound to;
* the TokenRequest API the kubelet uses for projected tokens
  (``POST .../serviceaccounts/<sa>/token``) issues a token for a stored ServiceAccount,
  bound to a stored pod of that account when ``boundObjectRef`` names one, with the API
  server's refusals (no such account or pod: 404, another account's pod: 400, another uid:
  409, under ten minutes: 422);
* Leases (``coordination.k8s.io/v1``) as any object, their spec validated (:mod:`.kubevalidation`).

Faults for tests: :meth:`ApiServer.drop_watches` ends every open watch (a dropped
connection: the client resumes from its last resourceVersion), :meth:`ApiServer.expire`
compacts the history and drops the watches (the client must list again), and
:meth:`ApiServer.partition` cuts off the client of one bearer token: its requests hang
until :meth:`ApiServer.heal`, then fail (503) without touching the store.
:mod:`trellis_testing.kube` runs it on its own thread.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import jsonpatch
import kmock
from kmock._internal import k8s, parsing, rendering

from trellis_testing import kubeportforward, kubevalidation
from trellis_testing.kubeauth import API_SERVER, TokenAuthority
from trellis_testing.kubeselect import Selector

Key = tuple[str, str, str, str]  # group, plural, namespace ("" for cluster scope), name

_CLUSTER_SCOPED = {("", "namespaces"), ("", "nodes")}
_TOKEN_REQUEST = re.compile(r"/api/v1/namespaces/[^/]+/serviceaccounts/[^/]+/token")
#: The API server's default and floor for a TokenRequest's ``expirationSeconds``.
_DEFAULT_TOKEN_SECONDS = 3600
_MIN_TOKEN_SECONDS = 600


def _parse_path(path: str) -> parsing.ParsedPath:
    """kmock reads ``/api/v1/namespaces/NAME`` as a namespace prefix with no resource."""
    parts = path.strip("/").split("/")
    own = len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize"))
    if parts[:3] == ["api", "v1", "namespaces"] and own:
        name = parts[3] if len(parts) > 3 else None
        sub = parts[4] if len(parts) > 4 else None
        return parsing.ParsedPath("", "v1", "namespaces", None, name, sub)
    return _original_parse_path(path)


_original_parse_path = parsing.parse_path
parsing.parse_path = _parse_path  # kmock is pinned (==0.8): this is its private parser


def _error(status: int, reason: str, message: str) -> k8s.KubernetesError:
    return k8s.KubernetesError(status=status, reason=reason, message=message, details={})


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


@dataclass(frozen=True)
class _Event:
    rv: int
    group: str
    plural: str
    type: str
    obj: dict[str, Any]
    old: dict[str, Any] | None


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return cast(dict[str, Any], obj.setdefault("metadata", {}))


class ApiServer(k8s.KubernetesEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.store: dict[Key, dict[str, Any]] = {}
        self.history: list[_Event] = []
        self.revision = 0
        self.compacted = 0
        self.epoch = 0
        self.watch_count = 0
        self.changed = asyncio.Condition()
        self.tokens = TokenAuthority(pod_uid=self._pod_uid)
        #: bearer tokens of the clients cut off from the server (:meth:`partition`)
        self.partitioned: set[str] = set()
        self.healed = asyncio.Condition()
        self.fallback[kmock.method.PUT] << self._serve_replace
        self.fallback["post", _TOKEN_REQUEST] << self._serve_token_request

    async def _handle(self, request: rendering.Request) -> Any:
        token = _bearer(request)
        if token in self.partitioned:
            async with self.healed:
                await self.healed.wait_for(lambda: token not in self.partitioned)
            raise _error(503, "ServiceUnavailable", "the request was lost in a partition")
        # kmock matches a request by scanning its log of every request (quadratic in a long run
        # of elections); nothing reads that log: keep only this request (matching is sync)
        self._requests[:] = [request]
        # the store replaces the emulator's own bookkeeping; .kubeportforward, port-forwards
        return await kubeportforward.serve(self, request, k8s.KubernetesScaffold._handle)

    async def partition(self, token: str) -> None:
        """Cut off the client that sends ``token``: its requests hang until :meth:`heal`."""
        self.partitioned.add(token)

    async def heal(self, token: str | None = None) -> None:
        """Reconnect the client of ``token`` (every one, with None): what it sent fails."""
        self.partitioned -= set(self.partitioned) if token is None else {token}
        async with self.healed:
            self.healed.notify_all()

    # -- the store -------------------------------------------------------------------------

    def _key(self, request: rendering.Request, name: str | None = None) -> Key:
        resource = request.resource
        assert resource is not None  # only Kubernetes requests reach the fallbacks
        group, plural = resource.group or "", resource.plural or ""
        namespace = "" if (group, plural) in _CLUSTER_SCOPED else (request.namespace or "")
        return group, plural, namespace, name if name is not None else (request.name or "")

    def _known(self, request: rendering.Request) -> None:
        """A resource is served once declared (as installing its CRD does) or written."""
        group, plural = self._key(request)[:2]
        assert request.resource is not None
        version = request.resource.version
        # a declared resource is served in its declared versions only, as a CRD's are
        versions = {r.version for r in self.resources if (r.group, r.plural) == (group, plural)}
        if versions and version not in versions:
            raise _error(404, "NotFound", f"the server could not find {plural} in {version}")
        if not versions and not any(k[:2] == (group, plural) for k in self.store):
            raise _error(404, "NotFound", f"the server could not find the resource {plural}")

    def _existing(self, request: rendering.Request) -> tuple[Key, dict[str, Any]]:
        self._known(request)
        key = self._key(request)
        if key not in self.store:
            raise _error(404, "NotFound", f'{key[1]} "{key[3]}" not found')
        return key, self.store[key]

    async def _record(self, key: Key, kind: str, obj: dict[str, Any], old: Any) -> None:
        self.revision += 1
        _meta(obj)["resourceVersion"] = str(self.revision)
        if kind == "DELETED":
            self.store.pop(key, None)
        else:
            self.store[key] = obj
        event = _Event(self.revision, key[0], key[1], kind, copy.deepcopy(obj), old)
        self.history.append(event)
        async with self.changed:
            self.changed.notify_all()

    async def _serve_create(self, request: rendering.Request) -> Any:
        body = request.data
        if not isinstance(body, dict):
            raise _error(400, "BadRequest", "the body must be a JSON object")
        if self._key(request)[:2] == ("authentication.k8s.io", "tokenreviews"):
            return rendering.Response(status=201, payload=self.tokens.review(body))
        self._known(request)
        obj = copy.deepcopy(body)
        meta = _meta(obj)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        if not meta.get("name"):
            raise _error(422, "Invalid", "metadata.name: Required value: name or generateName")
        key = self._key(request, meta["name"])
        if key[2]:
            meta["namespace"] = key[2]
        kubevalidation.check(key[0], key[1], key[3], obj)
        if key in self.store:
            raise _error(409, "AlreadyExists", f'{key[1]} "{key[3]}" already exists')
        meta.update(
            uid=str(uuid.uuid4()),
            creationTimestamp=_rfc3339(datetime.datetime.now(datetime.UTC)),
            generation=1,
        )
        await self._record(key, "ADDED", obj, None)
        return rendering.Response(status=201, payload=copy.deepcopy(obj))

    def _pod_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the stored pod ``namespace/name``, or None if there is none."""
        pod = self.store.get(("", "pods", namespace, name))
        return None if pod is None else cast(str, _meta(pod).get("uid"))

    async def _serve_token_request(self, request: rendering.Request) -> Any:
        """``POST .../serviceaccounts/<sa>/token``: a TokenRequest, answered as the API
        server does (``status.token`` and ``status.expirationTimestamp``, RFC 3339)."""
        namespace, account = request.namespace or "", request.name or ""
        stored = self.store.get(("", "serviceaccounts", namespace, account))
        if stored is None:
            raise _error(404, "NotFound", f'serviceaccounts "{account}" not found')
        body = request.data if isinstance(request.data, dict) else {}
        spec = copy.deepcopy(body.get("spec") or {})
        spec["audiences"] = spec.get("audiences") or [API_SERVER]
        seconds = spec.setdefault("expirationSeconds", _DEFAULT_TOKEN_SECONDS)
        if seconds < _MIN_TOKEN_SECONDS:
            raise _error(
                422,
                "Invalid",
                f'TokenRequest.authentication.k8s.io "{account}" is invalid: '
                f"spec.expirationSeconds: Invalid value: {seconds}: may not specify a duration "
                "less than 10 minutes",
            )
        pod = self._bound_pod(namespace, account, spec.get("boundObjectRef"))
        token = self.tokens.issue(
            namespace,
            account,
            audiences=tuple(spec["audiences"]),
            lifetime=seconds,
            pod=pod,
            account_uid=_meta(stored).get("uid"),
        )
        expires = datetime.datetime.fromtimestamp(
            self.tokens.tokens[token].expires_at, datetime.UTC
        )
        answer = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "metadata": {"name": account, "namespace": namespace, "creationTimestamp": None},
            "spec": spec,
            "status": {"token": token, "expirationTimestamp": _rfc3339(expires)},
        }
        return rendering.Response(status=201, payload=answer)

    def _bound_pod(
        self, namespace: str, account: str, ref: dict[str, Any] | None
    ) -> tuple[str, str] | None:
        """The (name, uid) of the pod a TokenRequest binds to, checked as the API server
        checks it: the pod exists, runs as ``account``, and has the uid given (if any)."""
        if not ref:
            return None
        if (ref.get("apiVersion"), ref.get("kind")) != ("v1", "Pod"):
            kind = f"{ref.get('apiVersion')}, Kind={ref.get('kind')}"
            raise _error(400, "BadRequest", f"cannot bind token to object of type {kind}")
        name = ref.get("name") or ""
        pod = self.store.get(("", "pods", namespace, name))
        if pod is None:
            raise _error(404, "NotFound", f'pods "{name}" not found')
        if ((pod.get("spec") or {}).get("serviceAccountName") or "default") != account:
            raise _error(
                400,
                "BadRequest",
                f'cannot bind token for serviceaccount "{account}" to pod running with '
                "different serviceaccount name.",
            )
        uid = cast(str, _meta(pod).get("uid"))
        if ref.get("uid") and ref["uid"] != uid:
            raise _error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on Pod "{name}": the UID in the bound object '
                f"reference ({ref['uid']}) does not match the UID in record. The object might "
                "have been deleted and then recreated",
            )
        return name, uid

    async def _serve_fetch(self, request: rendering.Request) -> Any:
        return copy.deepcopy(self._existing(request)[1])

    async def _serve_update(self, request: rendering.Request) -> Any:
        key, current = self._existing(request)
        patch = request.data
        if isinstance(patch, list):
            try:
                patched = jsonpatch.apply_patch(current, patch)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise _error(422, "Invalid", f"the JSON patch does not apply: {exc}") from exc
        elif isinstance(patch, dict):
            patched = _merge(current, patch)
        else:
            raise _error(400, "BadRequest", "a patch is a JSON object or a JSON list")
        return await self._write(request, key, current, patched)

    async def _serve_replace(self, request: rendering.Request) -> Any:
        if request.resource is None or not request.name or not isinstance(request.data, dict):
            raise _error(404, "NotFound", "PUT names one object and sends it whole")
        key, current = self._existing(request)
        wanted = _meta(request.data).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise _error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {key[1]} "{key[3]}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        kubevalidation.check(key[0], key[1], key[3], request.data)
        return await self._write(request, key, current, copy.deepcopy(request.data))

    async def _write(
        self, request: rendering.Request, key: Key, current: dict[str, Any], new: dict[str, Any]
    ) -> Any:
        if request.subresource == "status":
            new = {**copy.deepcopy(current), "status": new.get("status")}
        else:
            # identity and bookkeeping stay the server's, whatever the writer sent
            meta, old_meta = _meta(new), current["metadata"]
            for field in ("uid", "creationTimestamp", "generation", "name", "namespace"):
                if field in old_meta:
                    meta[field] = old_meta[field]
            body = {k: v for k, v in new.items() if k not in ("metadata", "status")}
            before = {k: v for k, v in current.items() if k not in ("metadata", "status")}
            if body != before:
                meta["generation"] = old_meta.get("generation", 1) + 1
        _meta(new)["resourceVersion"] = current["metadata"]["resourceVersion"]
        if new == current:
            return copy.deepcopy(current)  # no change: no new resourceVersion, no event
        meta = _meta(new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            await self._record(key, "DELETED", new, current)
        else:
            await self._record(key, "MODIFIED", new, current)
        return copy.deepcopy(new)

    async def _serve_delete(self, request: rendering.Request) -> Any:
        key, current = self._existing(request)
        obj = copy.deepcopy(current)
        meta = _meta(obj)
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = datetime.datetime.now(datetime.UTC).isoformat()
                await self._record(key, "MODIFIED", obj, current)
        else:
            await self._record(key, "DELETED", obj, current)
        return copy.deepcopy(obj)

    # -- reading ---------------------------------------------------------------------------

    def _wanted(self, request: rendering.Request) -> Callable[[dict[str, Any]], bool]:
        labels = Selector.parse(request.params.get("labelSelector"))
        fields = dict(
            term.replace("==", "=").split("=", 1)
            for term in (request.params.get("fieldSelector") or "").split(",")
            if "=" in term
        )
        namespace = self._key(request)[2]

        def wanted(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            if namespace and meta.get("namespace") != namespace:
                return False
            if request.name and meta.get("name") != request.name:
                return False
            for field, value in fields.items():
                if meta.get(field.removeprefix("metadata.")) != value:
                    return False
            return labels.matches(meta.get("labels") or {})

        return wanted

    def _matching(self, request: rendering.Request) -> list[dict[str, Any]]:
        self._known(request)
        group, plural = self._key(request)[:2]
        wanted = self._wanted(request)
        return [
            copy.deepcopy(obj)
            for (g, p, _, _), obj in sorted(self.store.items())
            if (g, p) == (group, plural) and wanted(obj)
        ]

    async def _serve_list(self, request: rendering.Request) -> Any:
        if request.resource is not None and not request.resource.plural:
            return await self._serve_version(request)  # ``/apis/<group>/<version>``: discovery
        return {
            "kind": "List",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self.revision)},
            "items": self._matching(request),
        }

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        yield b""  # headers first, so the client's watch starts even when nothing happens
        self.watch_count += 1
        group, plural = self._key(request)[:2]
        wanted = self._wanted(request)
        since = request.params.get("resourceVersion") or "0"
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        epoch = self.epoch
        if since == "0":
            for obj in self._matching(request):
                yield {"type": "ADDED", "object": obj}
            position = len(self.history)
        else:
            if int(since) < self.compacted:
                yield {"type": "ERROR", "object": _expired(since, self.compacted)}
                return
            position = next(
                (i for i, e in enumerate(self.history) if e.rv > int(since)), len(self.history)
            )
        while self.epoch == epoch:
            while position < len(self.history):
                event = self.history[position]
                position += 1
                if (event.group, event.plural) == (group, plural):
                    kind = _as_seen(event, wanted)
                    if kind is not None:
                        yield {"type": kind, "object": copy.deepcopy(event.obj)}
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                return
            async with self.changed:
                try:
                    await asyncio.wait_for(self.changed.wait(), remaining)
                except TimeoutError:
                    return

    async def drop_watches(self) -> None:
        self.epoch += 1
        async with self.changed:
            self.changed.notify_all()

    async def expire(self) -> None:
        # as if other writes moved the revision on and etcd compacted everything before it
        self.revision += 1
        self.compacted = self.revision
        await self.drop_watches()


def _bearer(request: rendering.Request) -> str:
    """The bearer token a request carries ("" without one)."""
    header = next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _rfc3339(moment: datetime.datetime) -> str:
    """A UTC time as the API server writes one: whole seconds, ``Z``."""
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _as_seen(event: _Event, wanted: Callable[[dict[str, Any]], bool]) -> str | None:
    """The event as a watch with a selector sees it (the watch cache's translation)."""
    now = event.type != "DELETED" and wanted(event.obj)
    before = event.old is not None and wanted(event.old)
    if event.type == "DELETED":
        return "DELETED" if wanted(event.obj) else None
    if now and before:
        return "MODIFIED"
    if now:
        return "ADDED"
    if before:
        return "DELETED"
    return None


def _expired(since: str, oldest: int) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {since} ({oldest})",
        "reason": "Expired",
        "code": 410,
    }
