"""What a provider says about a service: its description and its endpoints.

These are the values the catalog consumes (over gRPC). They are frozen and sorted, so two
views of the same state compare equal and only real changes produce events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from trellis_common.model import ReportedEndpoint, ServiceReach

Pairs = tuple[tuple[str, str], ...]
PortMap = tuple[tuple[str, int], ...]


class ServiceKey(NamedTuple):
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PortInfo:
    name: str
    number: int
    protocol: str = ""
    target_port: int = 0


@dataclass(frozen=True, slots=True)
class ServiceInfo(ServiceReach):
    key: ServiceKey
    ports: tuple[PortInfo, ...] = ()
    source: str = "registration"


@dataclass(frozen=True, slots=True, order=True)
class EndpointInfo(ReportedEndpoint):
    """An endpoint of a service this provider resolves, and where it came from."""

    network: str = ""
    source: str = "registration"


@dataclass(frozen=True, slots=True)
class ServiceView:
    info: ServiceInfo
    endpoints: tuple[EndpointInfo, ...]

    @property
    def key(self) -> ServiceKey:
        return self.info.key
