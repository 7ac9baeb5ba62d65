"""A Kubernetes Service, its EndpointSlices and their Pods, as the provider reports them.

The rules, as kube-proxy and the EndpointSlice API define them:

* An endpoint is served when ``conditions.ready`` is true or unset (unset means ready).
  One that is not ready but ``serving`` and ``terminating`` (a pod draining on shutdown) is
  served only while the Service has no ready endpoint at all, as kube-proxy does: it still
  answers, and is better than nothing. Any other endpoint is left out.
* Each address of an endpoint is one endpoint of the service, on the slice's ports, which
  map to the Service's ports by name (a slice port named ``http`` carries the Service port
  named ``http``; unnamed ports match the unnamed Service port).
* The endpoint carries its zone (``zone``, as its locality), and from the pod its
  ``targetRef`` names: the pod's service account, labels and name (``workload``).
* A Service port's protocol follows OSM (``appProtocol``, then the port name's prefix,
  then HTTP: :meth:`trellis_common.documents.core.ServicePort.resolved_protocol`).

A malformed object is a warning with its reason, never a failure: the service (or port,
or endpoint) is left out and the rest is reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from trellis_common.documents import core

Object = Mapping[str, Any]
PROVIDER = "k8s"


@dataclass(frozen=True, slots=True)
class Port:
    name: str
    number: int
    protocol: str
    target_port: int = 0


@dataclass(frozen=True, slots=True, order=True)
class Endpoint:
    address: str
    ports: tuple[tuple[str, int], ...]
    labels: tuple[tuple[str, str], ...] = ()
    locality: str = ""
    service_account: str = ""
    workload: str = ""
    draining: bool = False


@dataclass(frozen=True, slots=True)
class ServiceView:
    namespace: str
    name: str
    ports: tuple[Port, ...]
    addresses: tuple[str, ...]
    endpoints: tuple[Endpoint, ...]
    warnings: tuple[str, ...] = field(default=(), compare=False)


def _meta(obj: Object) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Object) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def service_ports(service: Object) -> tuple[tuple[Port, ...], list[str]]:
    ports, warnings = [], []
    spec = _spec(service)
    for index, raw in enumerate(spec.get("ports") or ()):
        try:
            parsed = core.ServicePort.model_validate(raw)
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"] if exc.errors() else str(exc)
            warnings.append(f"spec.ports[{index}]: {reason}")
            continue
        target = parsed.target_port if isinstance(parsed.target_port, int) else 0
        ports.append(Port(parsed.name or "", parsed.port, parsed.resolved_protocol(), target))
    return tuple(ports), warnings


def _addresses(service: Object) -> tuple[str, ...]:
    spec = _spec(service)
    ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    return tuple(ip for ip in ips if isinstance(ip, str) and ip and ip != "None")


def _condition(endpoint: Mapping[str, Any], name: str, default: bool) -> bool:
    conditions = endpoint.get("conditions") or {}
    value = conditions.get(name) if isinstance(conditions, Mapping) else None
    return default if value is None else bool(value)


def _slice_ports(
    slice_: Object, service_ports_by_name: Mapping[str, Port]
) -> tuple[tuple[str, int], ...]:
    found = []
    for raw in slice_.get("ports") or ():
        if not isinstance(raw, Mapping) or not isinstance(raw.get("port"), int):
            continue
        name = raw.get("name") or ""
        if name in service_ports_by_name:
            found.append((name, int(raw["port"])))
    return tuple(sorted(found))


def view(
    service: Object,
    slices: Iterable[Object],
    pods: Mapping[tuple[str, str], Object],
) -> ServiceView:
    """The service as the provider reports it (see the module docstring)."""
    meta = _meta(service)
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    ports, warnings = service_ports(service)
    by_name = {p.name: p for p in ports}
    ready: list[Endpoint] = []
    draining: list[Endpoint] = []
    for slice_ in slices:
        slice_ports = _slice_ports(slice_, by_name)
        if not slice_ports:
            continue
        for endpoint in slice_.get("endpoints") or ():
            if not isinstance(endpoint, Mapping):
                continue
            is_ready = _condition(endpoint, "ready", True)
            serving = _condition(endpoint, "serving", is_ready)
            terminating = _condition(endpoint, "terminating", False)
            if not is_ready and not (serving and terminating):
                continue
            target = endpoint.get("targetRef") or {}
            pod = (
                pods.get((namespace, target.get("name", "")))
                if target.get("kind") == "Pod"
                else None
            )
            pod_meta = _meta(pod) if pod is not None else {}
            pod_spec = pod.get("spec") if pod is not None else {}
            labels = pod_meta.get("labels") or {}
            account = (pod_spec or {}).get("serviceAccountName") or ("default" if pod else "")
            for address in endpoint.get("addresses") or ():
                found = Endpoint(
                    address=str(address),
                    ports=slice_ports,
                    labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                    locality=str(endpoint.get("zone") or ""),
                    service_account=str(account),
                    workload=str(pod_meta.get("name") or target.get("name") or ""),
                    draining=not is_ready,
                )
                (ready if is_ready else draining).append(found)
    endpoints = ready or draining
    return ServiceView(
        namespace,
        name,
        ports,
        _addresses(service),
        tuple(sorted(set(endpoints))),
        tuple(warnings),
    )


def service_of_slice(slice_: Object) -> tuple[str, str] | None:
    """(namespace, service) a slice belongs to (label ``kubernetes.io/service-name``)."""
    meta = _meta(slice_)
    labels = meta.get("labels") or {}
    service = labels.get("kubernetes.io/service-name") if isinstance(labels, Mapping) else None
    if not service:
        return None
    return str(meta.get("namespace") or ""), str(service)
