"""From a raw YAML mapping to a validated document, or an error that says where and why.

A document is identified by ``(kind, namespace, name)``; several ``apiVersion``s of one kind
map to one model (for example ``networking.istio.io/v1alpha3``, ``v1beta1`` and ``v1`` of
``ServiceEntry``). Models register themselves in a :class:`KindRegistry`; parsing never
raises anything but :class:`DocumentError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trellis_common.ids import InvalidIdentifier, validate_dns_label, validate_dns_subdomain


class StrictModel(BaseModel):
    """Base of every spec model: unknown fields are errors (they are usually typos)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ObjectMeta(StrictModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    name: str
    namespace: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    # when the API server created the object; Gateway API routes use it for precedence
    creation_timestamp: datetime | None = Field(default=None, alias="creationTimestamp")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        try:
            return validate_dns_subdomain(value, "metadata.name")
        except InvalidIdentifier as exc:
            raise ValueError(exc.reason) from None

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        try:
            return validate_dns_label(value, "metadata.namespace")
        except InvalidIdentifier as exc:
            raise ValueError(exc.reason) from None


SpecT = TypeVar("SpecT", bound=BaseModel)


class Resource(BaseModel, Generic[SpecT]):
    """The envelope every kind shares; subclasses fix ``spec``'s model."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    api_version: str = Field(alias="apiVersion")
    kind: str
    metadata: ObjectMeta
    spec: SpecT


@dataclass(frozen=True, slots=True, order=True)
class DocumentKey:
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a document came from: a file and its position in it (0-based)."""

    source: str
    index: int = 0

    def __str__(self) -> str:
        return f"{self.source} (document {self.index + 1})"


@dataclass(frozen=True, slots=True)
class Document:
    key: DocumentKey
    api_version: str
    origin: Origin
    resource: Any = field(compare=False)  # the validated Resource subclass instance


class DocumentError(ValueError):
    """One problem with one document: where, which field, why."""

    def __init__(
        self, origin: Origin, field: str, reason: str, key: DocumentKey | None = None
    ) -> None:
        self.origin = origin
        self.field = field
        self.reason = reason
        self.key = key
        what = f" {key}" if key else ""
        where = f" {field}:" if field else ""
        super().__init__(f"{origin}{what}:{where} {reason}")


def location(loc: Iterable[int | str]) -> str:
    """pydantic's error location as a path: ``spec.ports[0].number``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class UnreadKind(DocumentError):
    """A document of a kind no Trellis service reads: it is ignored, and reported as such."""


class Ignored(DocumentError):
    """A document of a kind that is read, but not from where it is (a MeshConfig outside the
    control plane's namespace): it is ignored, and reported as such."""


_ALIASES = {"api_version": "apiVersion"}


class KindRegistry:
    """Which models parse which ``(apiVersion, kind)``."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, str], type[Resource[Any]]] = {}

    def register(self, kind: str, api_versions: Iterable[str], model: type[Resource[Any]]) -> None:
        for api_version in api_versions:
            self._models[(api_version, kind)] = model

    def kinds(self) -> set[str]:
        return {kind for _, kind in self._models}

    def versions(self, kind: str) -> list[str]:
        return sorted(v for v, k in self._models if k == kind)

    def parse(self, raw: object, origin: Origin) -> Document:
        if not isinstance(raw, Mapping):
            raise DocumentError(
                origin, "", f"a document must be a mapping, got {type(raw).__name__}"
            )
        api_version, kind = raw.get("apiVersion"), raw.get("kind")
        if not isinstance(kind, str) or not kind:
            raise DocumentError(origin, "kind", "is required")
        if not isinstance(api_version, str) or not api_version:
            raise DocumentError(origin, "apiVersion", "is required")
        metadata = raw.get("metadata")
        key = None
        if isinstance(metadata, Mapping) and isinstance(metadata.get("name"), str):
            namespace = metadata.get("namespace") or "default"
            key = DocumentKey(kind, str(namespace), metadata["name"])
        model = self._models.get((api_version, kind))
        if model is None:
            known = self.versions(kind)
            if not known:
                raise UnreadKind(
                    origin,
                    "kind",
                    f"{kind} ({api_version}) is not read by any Trellis service: ignored",
                    key,
                )
            reason = f"apiVersion {api_version!r} is not supported for {kind}; use one of " + (
                ", ".join(known)
            )
            raise DocumentError(origin, "apiVersion", reason, key)
        try:
            resource = model.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = location(_ALIASES.get(str(p), p) for p in first["loc"])
            more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            message = str(first["msg"]).removeprefix("Value error, ")
            raise DocumentError(origin, loc, message + more, key) from None
        except ValueError as exc:
            raise DocumentError(origin, "", str(exc), key) from None
        meta = resource.metadata
        return Document(DocumentKey(kind, meta.namespace, meta.name), api_version, origin, resource)
