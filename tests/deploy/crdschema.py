"""What an API server does with a custom resource, for the chart's CRD tests, offline.

No API server runs here (kmock stores whatever it is sent), so these helpers do what
kube-apiserver does on ``kubectl apply`` of a custom resource, on the CRD's own schema:

* :func:`structural_problems`: the rules a CRD's schema must follow to be accepted at all
  (a *structural* schema: every node typed, no ``$ref``, ``additionalProperties`` never
  beside ``properties``, no ``nullable`` under a union, patterns that compile);
* :func:`prune_nulls`: ``null`` for a field that is not ``nullable`` is dropped before
  validation, as the server drops it;
* :func:`problems`: the schema's verdict on an object, where a field the schema does not
  know is an error, as ``kubectl apply`` (strict field validation, its default) makes it,
  unless the schema keeps unknown fields (``x-kubernetes-preserve-unknown-fields``). Each
  problem names the field as a dotted path (``spec.backends[0].weight``).

CEL rules (``x-kubernetes-validations``) are not evaluated: the CRDs of Trellis' own groups
have none (a test checks it), and the upstream Gateway API ones are upstream's to test.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema_rs

#: keywords a structural schema may hold (apiextensions v1 JSONSchemaProps), and the vendor
#: extensions the API server knows
KNOWN = {
    "type", "format", "description", "properties", "items", "required", "enum", "pattern",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties", "multipleOf",
    "additionalProperties", "nullable", "default", "oneOf", "anyOf", "allOf", "not", "example",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string",
    "x-kubernetes-embedded-resource", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type", "x-kubernetes-validations",
}  # fmt: skip
_UNIONS = ("oneOf", "anyOf", "allOf", "not")
#: keywords that shape a value, which a union's branches must not set (they only validate)
_SHAPING = {"type", "properties", "items", "additionalProperties", "nullable", "default"}


def structural_problems(schema: dict[str, Any], path: str = "") -> list[str]:
    """Why the API server would refuse this CRD schema (empty: it would take it)."""
    found = [f"{path or '<root>'}: unknown keyword {k}" for k in schema if k not in KNOWN]
    if "$ref" in schema:
        found.append(f"{path}: $ref is not allowed")
    kept = schema.get("x-kubernetes-preserve-unknown-fields") or schema.get(
        "x-kubernetes-int-or-string"
    )
    if "type" not in schema and not kept:
        found.append(f"{path or '<root>'}: no type")
    if "properties" in schema and "additionalProperties" in schema:
        found.append(f"{path}: additionalProperties beside properties")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except re.error as exc:
            found.append(f"{path}: pattern does not compile: {exc}")
    for union in _UNIONS:
        branches = schema.get(union)
        for branch in branches if isinstance(branches, list) else [branches] if branches else []:
            shaped = _SHAPING & set(branch)
            if shaped:
                found.append(f"{path}: {union} sets {sorted(shaped)}")
    for name, child in (schema.get("properties") or {}).items():
        found += structural_problems(child, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        found += structural_problems(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += structural_problems(schema["additionalProperties"], f"{path}.*")
    return found


#: what JSON Schema has no use for (``format``: the server's formats are its own)
_DROPPED = ("nullable", "format", "description", "default", "example")


def _json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI schema as JSON Schema, strict about unknown fields."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {k: _json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _json_schema(value)
        elif key in _UNIONS:
            out[key] = (
                [_json_schema(v) for v in value] if isinstance(value, list) else _json_schema(value)
            )
        elif key in _DROPPED or key.startswith("x-"):
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    strict = "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields")
    if strict and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


def prune_nulls(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` without the ``null`` fields the server would drop (not ``nullable``)."""
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        out = {}
        for key, child in value.items():
            sub = properties.get(key, schema.get("additionalProperties") or {})
            sub = sub if isinstance(sub, dict) else {}
            if child is None and properties and not sub.get("nullable"):
                continue
            out[key] = prune_nulls(child, sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_nulls(item, schema["items"]) for item in value]
    return value


def _dotted(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def problems(document: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """``field: why`` for each way ``document`` breaks ``schema`` (a CRD version's
    ``openAPIV3Schema``); ``apiVersion``, ``kind`` and ``metadata`` are the server's."""
    body = {k: v for k, v in document.items() if k not in ("apiVersion", "kind", "metadata")}
    schema = {**schema, "properties": {
        k: v for k, v in (schema.get("properties") or {}).items()
        if k not in ("apiVersion", "kind", "metadata")
    }}  # fmt: skip
    validator = jsonschema_rs.validator_for(_json_schema(schema))
    found = []
    for error in validator.iter_errors(prune_nulls(body, schema)):
        where = _dotted(list(error.instance_path))
        found.append(f"{where or '<root>'}: {error.message}")
    return found
