"""Hypothesis strategies for the fuzz suite: names, YAML values, documents, protobuf requests.

Fuzzing Trellis' edges needs three kinds of input, and every package's ``test_fuzz_*.py``
draws them from here:

* **Names** that are valid (:func:`dns_labels`, :func:`proxy_ids`, ...), and
  :func:`names`, which mixes valid ones with near misses (upper case, ``_``, a dash at an
  end, one character too long) and junk, because the interesting bugs sit at the edges of
  a rule, not in random bytes.
* **Documents**: :func:`yaml_values` (anything ``yaml.safe_load`` can return),
  :func:`seeds` (the valid documents of :mod:`trellis_testing.seeds`, one per kind
  and apiVersion Trellis reads) and :func:`mutations`, which drops, replaces or retypes one
  or more fields of a seed and says where; ServiceEntry and WorkloadEntry specs assembled
  field by field (:func:`service_entry_specs`, :func:`workload_entry_specs`).
* **Requests**: :func:`messages` fills any protobuf message from its descriptor, with
  :func:`names` for strings, any int32 for open enums, and nested messages or not.
"""

from __future__ import annotations

import copy
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from trellis_common import ids
from trellis_testing.seeds import SEEDS

M = TypeVar("M", bound=Message)
Path = tuple[str | int, ...]

# --- names ----------------------------------------------------------------------------------

_LABEL: Final = r"[a-z0-9]([-a-z0-9]{0,12}[a-z0-9])?"
# Text that reaches YAML files and protobuf strings: any character but lone surrogates.
_TEXT: Final = st.characters(exclude_categories=["Cs"])


def dns_labels() -> st.SearchStrategy[str]:
    return st.from_regex(_LABEL, fullmatch=True)


def dns_subdomains() -> st.SearchStrategy[str]:
    return st.lists(dns_labels(), min_size=1, max_size=4).map(".".join)


def trust_domains() -> st.SearchStrategy[str]:
    return st.from_regex(r"[a-z0-9._-]{1,30}", fullmatch=True)


def proxy_ids() -> st.SearchStrategy[ids.ProxyId]:
    return st.uuids().map(lambda u: ids.ProxyId(str(u)))


def proxy_common_names() -> st.SearchStrategy[str]:
    """``<proxy-uuid>.<service>.<namespace>``, within the 64 characters of a CN."""
    short = st.from_regex(r"[a-z]([-a-z0-9]{0,6}[a-z0-9])?", fullmatch=True)
    return st.builds("{}.{}.{}".format, proxy_ids(), short, short)


def _near_misses(valid: str) -> list[str]:
    """Spellings one step away from ``valid``: what a careless caller writes."""
    return [
        valid.upper(),
        valid.replace("-", "_"),
        f"-{valid}",
        f"{valid}-",
        f"{valid}.",
        f" {valid}",
        f"{valid}\n",
        valid + "a" * (64 - len(valid)),
        valid + "ä",
        "Bad Name!",
        "",
    ]


def mostly(valid: st.SearchStrategy[Any], wrong: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` nine times in ten, else ``wrong``: enough valid fields to reach deep rules."""
    return st.sampled_from(range(10)).flatmap(lambda i: wrong if i == 9 else valid)


def plausible_names() -> st.SearchStrategy[str]:
    """What a well-behaved caller sends: a name, an account, a CN, an identity, or nothing."""
    return st.one_of(
        st.just(""),
        dns_labels(),
        dns_subdomains(),
        proxy_ids(),
        proxy_common_names(),
        st.builds("{}.{}.svc.{}".format, dns_labels(), dns_labels(), trust_domains()),
        st.builds("{}/{}".format, dns_labels(), dns_labels()),
        st.sampled_from(["10.0.0.1", "::1"]),
    )


def names() -> st.SearchStrategy[str]:
    """Valid names, near misses of valid names, and junk, in about equal parts."""
    valid = st.one_of(dns_labels(), dns_subdomains(), proxy_ids())
    near = valid.flatmap(lambda v: st.sampled_from(_near_misses(v)))
    junk = st.one_of(
        st.text(_TEXT, max_size=80),
        st.text(string.printable, min_size=200, max_size=400),
        st.sampled_from(["*", "*.", "*.example.com", "a/b", "/", "..", "0", "null", "\x00"]),
    )
    return st.one_of(valid, near, junk)


# --- YAML values and documents --------------------------------------------------------------


def regexes() -> st.SearchStrategy[str]:
    """Regex-like text: what path and header matches hold, including what ``re`` chokes on
    (groups nested deeper than it recurses, repeat counts larger than it counts)."""
    return st.one_of(
        st.text(alphabet="()[]{}*+?.|\\^$-:=!<>Pa0123456789,", max_size=30),
        st.integers(1, 3000).map(lambda n: "(" * n + ")" * n),
        st.integers(0, 2**70).map(lambda n: f"a{{{n}}}"),
        st.integers(0, 2**70).map(lambda n: f"a{{1,{n}}}"),
    )


_SCALARS: Final = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(_TEXT, max_size=20),
    names(),
    st.sampled_from(["24h", "1h30m", "-1s", "0", "HTTP", "STATIC", "DNS", "unix:///x", "::1"]),
    st.sampled_from(["10.0.0.1", "10.0.0.0/8", "ServiceAccount", "v1", "*", "~", "."]),
    regexes(),
)


def yaml_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """What ``yaml.safe_load`` may hand the parser: scalars, lists and string-keyed maps."""
    return st.recursive(
        _SCALARS,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(st.one_of(names(), st.text(_TEXT, max_size=12)), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def _wrong_types(value: Any) -> st.SearchStrategy[Any]:
    """Values of another type than ``value``'s, the mistake a YAML author makes most."""
    options: list[st.SearchStrategy[Any]] = [
        st.none(),
        st.just([value]),
        st.just({"value": value}),
        st.just(str(value)),
        st.integers(min_value=-5, max_value=70_000),
        st.booleans(),
    ]
    return st.one_of(*options).filter(lambda v: type(v) is not type(value))


def seeds(kind: str | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """A deep copy of one of :data:`~trellis_testing.seeds.SEEDS` (of ``kind``)."""
    chosen = [s for s in SEEDS if kind is None or s["kind"] == kind]
    return st.sampled_from(chosen).map(copy.deepcopy)


def _paths(node: Any, prefix: Path = ()) -> list[Path]:
    found: list[Path] = []
    children: list[tuple[str | int, Any]] = []
    if isinstance(node, dict):
        children = list(node.items())
    elif isinstance(node, list):
        children = list(enumerate(node))
    for key, child in children:
        found.append((*prefix, key))
        found.extend(_paths(child, (*prefix, key)))
    return found


def _at(node: Any, path: Path) -> Any:
    for key in path:
        node = node[key]
    return node


def dotted(path: Path) -> str:
    """``("spec", "ports", 0, "number")`` as the parser reports it: ``spec.ports[0].number``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


@dataclass(frozen=True, slots=True)
class Mutation:
    """What was done to a seed: ``op`` (drop, replace, retype) at ``path``."""

    op: str
    path: Path

    def __str__(self) -> str:
        return f"{self.op} {dotted(self.path)}"


@st.composite
def mutations(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    documents: st.SearchStrategy[dict[str, Any]],
    max_mutations: int = 3,
) -> tuple[dict[str, Any], tuple[Mutation, ...]]:
    """A document from ``documents`` with 1 to ``max_mutations`` fields dropped or replaced."""
    document = draw(documents)
    done: list[Mutation] = []
    for _ in range(draw(st.integers(1, max_mutations))):
        paths = _paths(document)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _at(document, path[:-1]), path[-1]
        op = draw(st.sampled_from(["drop", "replace", "retype"]))
        if op == "drop":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(yaml_values(max_leaves=6))
        else:
            parent[key] = draw(_wrong_types(parent[key]))
        done.append(Mutation(op, path))
    return document, tuple(done)


# --- protobuf messages ----------------------------------------------------------------------

_INT_RANGES: Final = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _scalar(field: FieldDescriptor, strings: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_STRING:
        return strings
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.floats(width=32 if field.type == FieldDescriptor.TYPE_FLOAT else 64)
    low, high = _INT_RANGES[field.type]
    if field.type == FieldDescriptor.TYPE_ENUM:  # mostly named values, sometimes any number
        enum_type: Any = field.enum_type
        named = [v.number for v in enum_type.values]
        return mostly(st.sampled_from(named), st.integers(low, high))
    return st.one_of(st.integers(max(low, -5), 100_000), st.integers(low, high))


def _fill(
    descriptor: Any, depth: int, strings: st.SearchStrategy[str]
) -> st.SearchStrategy[dict[str, Any]]:
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        inner_type: Any = field.message_type
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if inner_type.GetOptions().map_entry:
                key = inner_type.fields_by_name["key"]
                value = inner_type.fields_by_name["value"]
                if value.type == FieldDescriptor.TYPE_MESSAGE:
                    continue
                fields[field.name] = st.dictionaries(
                    _scalar(key, strings), _scalar(value, strings), max_size=3
                )
                continue
            if depth <= 0:
                continue
            inner = _fill(inner_type, depth - 1, strings)
            fields[field.name] = st.lists(inner, max_size=2) if field.is_repeated else inner
        elif field.is_repeated:
            fields[field.name] = st.lists(_scalar(field, strings), max_size=3)
        else:
            fields[field.name] = _scalar(field, strings)
    return st.fixed_dictionaries({}, optional=fields)


def messages(
    cls: type[M],
    *,
    depth: int = 3,
    strings: st.SearchStrategy[str] | None = None,
    fields: Mapping[str, st.SearchStrategy[Any]] | None = None,
) -> st.SearchStrategy[M]:
    """Instances of ``cls`` with any subset of its fields set, sub-messages included.

    Strings are ``strings``, by default :func:`plausible_names` nine times in ten and
    :func:`names` (near misses and junk) otherwise. ``fields`` gives some top-level fields
    a strategy of their own (always set): mostly valid values for each field make whole
    valid requests common, so the code behind the checks is reached.
    """
    text = strings if strings is not None else mostly(plausible_names(), names())
    rest = _fill(cls.DESCRIPTOR, depth, text)
    if fields:
        rest = st.tuples(rest, st.fixed_dictionaries(fields)).map(lambda p: {**p[0], **p[1]})
    return rest.map(lambda values: cls(**values))


# --- Istio ServiceEntry and WorkloadEntry, field by field ----------------------------------

_IPS: Final = ["10.0.0.1", "192.0.2.7", "::1", "2001:db8::7", "fe80::1%eth0", "010.0.0.1"]
_CIDRS: Final = ["10.0.0.0/8", "2001:db8::/32", "10.0.0.1/33", "10.0.0.0/255.0.0.0"]
_SOCKETS: Final = ["unix:///var/run/a.sock", "unix://relative", "unix:///", "unix://"]


def _hosts() -> st.SearchStrategy[str]:
    valid = st.one_of(dns_subdomains(), dns_subdomains().map(lambda h: f"*.{h}"))
    wrong = st.one_of(
        dns_subdomains().map(str.upper), st.sampled_from(["*", "*.", "a.*.b", *_IPS]), names()
    )
    return mostly(valid, wrong)


def _endpoint_addresses() -> st.SearchStrategy[str]:
    valid = st.one_of(st.sampled_from(_IPS + _SOCKETS[:1]), dns_subdomains())
    return mostly(valid, st.one_of(st.sampled_from(_SOCKETS), _hosts(), names()))


def _istio_ports() -> st.SearchStrategy[int | Any]:
    wrong = st.sampled_from([0, -1, 65536, 2**63, "80", 80.0, True, None])
    return mostly(st.integers(1, 65535), wrong)


def _port_names() -> st.SearchStrategy[str]:
    return mostly(st.sampled_from(["http", "https", "grpc", "tcp-db", "web"]), names())


def _endpoint(optional: bool) -> st.SearchStrategy[dict[str, Any]]:
    fields: dict[str, st.SearchStrategy[Any]] = {
        "ports": st.dictionaries(_port_names(), _istio_ports(), max_size=3),
        "labels": st.dictionaries(dns_labels(), mostly(dns_labels(), names()), max_size=2),
        "network": names(),
        "locality": mostly(
            st.sampled_from(["eu", "eu/west", "eu/west/a"]),
            st.one_of(st.sampled_from(["eu//a", "/", "eu/"]), names()),
        ),
        "weight": mostly(st.integers(0, 10), st.sampled_from([-1, 2**32, 2**32 - 1, "1"])),
        "serviceAccount": mostly(dns_subdomains(), names()),
    }
    if optional:
        return st.fixed_dictionaries({"address": _endpoint_addresses()}, optional=fields)
    return st.fixed_dictionaries({"address": _endpoint_addresses(), **fields})


def workload_entry_specs() -> st.SearchStrategy[dict[str, Any]]:
    """WorkloadEntry specs built from valid, near-valid and wrong values for each field."""
    return _endpoint(optional=True)


def service_entry_specs() -> st.SearchStrategy[dict[str, Any]]:
    """ServiceEntry specs built from valid, near-valid and wrong values for each field."""
    protocols = ["HTTP", "HTTPS", "GRPC", "HTTP2", "MONGO", "TCP", "TLS", "http", ""]
    port = st.fixed_dictionaries(
        {"number": _istio_ports(), "name": _port_names()},
        optional={
            "protocol": mostly(st.sampled_from(protocols), st.sampled_from(["UDP", 7, None])),
            "targetPort": _istio_ports(),
        },
    )
    export = mostly(st.one_of(st.sampled_from([".", "*", "~"]), dns_labels()), names())
    return st.fixed_dictionaries(
        {
            "hosts": mostly(st.lists(_hosts(), min_size=1, max_size=3), st.just([])),
            "ports": mostly(st.lists(port, min_size=1, max_size=3), st.just([])),
        },
        optional={
            "addresses": st.lists(
                mostly(st.sampled_from(_IPS + _CIDRS[:2]), st.sampled_from(_CIDRS + _SOCKETS)),
                max_size=2,
            ),
            "location": mostly(
                st.sampled_from(["MESH_EXTERNAL", "MESH_INTERNAL"]),
                st.sampled_from(["mesh_internal", "", None]),
            ),
            "resolution": mostly(
                st.sampled_from(["NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN"]),
                st.sampled_from(["dns", "", 3]),
            ),
            "endpoints": st.lists(_endpoint(optional=True), max_size=3),
            "workloadSelector": st.fixed_dictionaries(
                {"labels": st.dictionaries(dns_labels(), mostly(dns_labels(), names()), max_size=2)}
            ),
            "exportTo": st.lists(export, max_size=3),
            "subjectAltNames": st.lists(names(), max_size=2),
        },
    )
