"""Fuzzing the catalog's gRPC requests: the checks alone, then the servicer behind them.

Promises: a check returns or raises ``InvalidField`` naming a field of the request; the
servicer answers, or ends the call with INVALID_ARGUMENT naming a field (recorded as a
rejection) or NOT_FOUND; nothing else escapes. And what the servicer accepted never breaks
the catalog afterwards: a recompute after any sequence of accepted calls succeeds (a proxy
expected with the account ``Bad Name!`` once crash-looped it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf.message import Message
from hypothesis import event, example, given
from hypothesis import strategies as st

from trellis_api import catalog_pb2 as pb
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.sources import kinds
from trellis_catalog.transport import grpc_requests
from trellis_catalog.transport.grpc_api import CatalogServicer
from trellis_common.specdir import load_paths
from trellis_runtime.health import Health
from trellis_testing import strategies as fuzz
from trellis_testing.servicer import Checks, answers_or_refuses, check_names_a_field

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS, ERRORS = load_paths([ROOT / "examples" / "bookstore"], kinds())
PROXY = "00000000-0000-4000-8000-000000000001.bookstore-v1.bookstore"


class Fields(set[str]):
    """A request's fields, where a refusal may name an item of one: ``names[3]`` or
    ``service_accounts['a/b']`` is a field of the request that has ``names`` or
    ``service_accounts``."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.partition("[")[0])


CHECKS: Checks = {
    "GetView": (pb.GetViewRequest, grpc_requests.view, {"identity", "service_account"}),
    "ListServices": (pb.ListServicesRequest, grpc_requests.namespace_filter, {"namespace"}),
    "ListChanges": (pb.ListChangesRequest, grpc_requests.cursor, {"since"}),
    "GetResources": (
        pb.GetResourcesRequest,
        grpc_requests.resources,
        Fields({"names", "service_accounts"}),
    ),
    "CheckPolicy": (
        pb.CheckPolicyRequest,
        grpc_requests.policy_question,
        {
            "source_namespace",
            "source_service_account",
            "destination_namespace",
            "destination_service",
        },
    ),
    "ExpectProxy": (
        pb.ExpectProxyRequest,
        grpc_requests.expected_proxy,
        {"common_name", "service_account"},
    ),
    "RegisterProxy": (
        pb.RegisterProxyRequest,
        grpc_requests.registered_proxy,
        {"common_name", "proxy_cp", "address"},
    ),
    "UnregisterProxy": (
        pb.UnregisterProxyRequest,
        grpc_requests.unregistered_proxy,
        {"common_name"},
    ),
}
NAMES = ["bookstore", "bookbuyer", "bookstore-v1", "bookstore/bookstore-v1", PROXY]
STRINGS = fuzz.mostly(st.one_of(fuzz.plausible_names(), st.sampled_from(NAMES)), fuzz.names())


LABELS = fuzz.mostly(st.sampled_from(["bookstore", "bookbuyer", "bookstore-v1"]), fuzz.names())
ACCOUNTS = fuzz.mostly(st.one_of(st.just(""), fuzz.dns_subdomains()), fuzz.names())
PROXIES = fuzz.mostly(st.one_of(st.just(PROXY), fuzz.proxy_common_names()), fuzz.names())
IDENTITIES = fuzz.mostly(st.builds("{}/{}".format, LABELS, LABELS), fuzz.names())
# Resource names: those the catalog publishes, others of each kind, and near misses
# (an empty account list, a trailing comma, no cluster) the servicer must take apart.
RESOURCES = fuzz.mostly(
    st.one_of(
        st.sampled_from(
            [
                "policy/bookbuyer/bookbuyer",
                "slice/bookstore/bookstore-v1|14001",
                "slice/bookstore/bookstore-v1|14001@,bookstore",
                "slice/bookstore/bookstore-v1|14001@",
                "slice/bookstore/bookstore-v1|14001@bookstore,,",
                "slice/@bookstore",
                "slice/",
                "destination/bookstore/bookstore-v1",
                "destination/bookstore",
                "destination/",
            ]
        ),
        st.builds("policy/{}".format, IDENTITIES),
        st.builds("slice/{}/{}|{}@{}".format, LABELS, LABELS, st.integers(0, 70_000), LABELS),
        st.builds("destination/{}".format, STRINGS),
    ),
    fuzz.names(),
)
CURSORS = fuzz.mostly(
    st.builds("{:x}-{}".format, st.integers(0, 2**48), st.integers(0, 10)), fuzz.names()
)
# Each RPC's fields, mostly valid: whole valid requests, to reach what is behind the checks.
FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "GetView": {
        "identity": IDENTITIES,
        "service_account": ACCOUNTS,
    },
    "ListServices": {"namespace": fuzz.mostly(st.one_of(st.just(""), LABELS), fuzz.names())},
    "ListChanges": {"since": CURSORS},
    "GetResources": {
        "names": st.lists(RESOURCES, max_size=4),
        "service_accounts": st.dictionaries(IDENTITIES, ACCOUNTS, max_size=2),
    },
    "CheckPolicy": {
        "source_namespace": LABELS,
        "source_service_account": ACCOUNTS,
        "destination_namespace": LABELS,
        "destination_service": LABELS,
    },
    "ExpectProxy": {"common_name": PROXIES, "service_account": ACCOUNTS},
    "RegisterProxy": {
        "common_name": PROXIES,
        "proxy_cp": fuzz.mostly(st.one_of(st.just(""), fuzz.dns_labels()), fuzz.names()),
        "address": fuzz.mostly(st.sampled_from(["", "10.0.0.1", "::1"]), fuzz.names()),
    },
    "UnregisterProxy": {"common_name": PROXIES},
}


def requests() -> st.SearchStrategy[tuple[str, Message]]:
    def of(rpc: str) -> st.SearchStrategy[tuple[str, Message]]:
        cls = CHECKS[rpc][0]
        return st.tuples(
            st.just(rpc),
            fuzz.messages(cls, strings=STRINGS) | fuzz.messages(cls, fields=FIELDS[rpc]),
        )

    return st.sampled_from(sorted(CHECKS)).flatmap(of)


@given(asked=requests())
@example(asked=("CheckPolicy", pb.CheckPolicyRequest(source_namespace="Bad Name!")))
def test_checks_return_or_name_a_field_of_the_request(asked: tuple[str, Message]) -> None:
    check_names_a_field(CHECKS, *asked)


def catalog() -> Catalog:
    made = Catalog()
    made.set_documents(DOCUMENTS, ERRORS)
    made.set_provider_services(
        "vm",
        [
            ProvidedService(
                provider="vm",
                namespace="bookstore",
                name="bookstore-v1",
                ports=(("http", 8080, "", 0),),
                endpoints=(
                    ProvidedEndpoint("10.0.0.1", (("http", 8081),), service_account="bookstore"),
                ),
            )
        ],
    )
    made.flush()
    return made


@given(calls=st.lists(requests(), min_size=1, max_size=4))
@example(
    calls=[("ExpectProxy", pb.ExpectProxyRequest(common_name=PROXY, service_account="Bad Name!"))]
)
@example(calls=[("GetResources", pb.GetResourcesRequest(names=["destination/bookstore"]))])
@example(
    calls=[
        (
            "CheckPolicy",
            pb.CheckPolicyRequest(
                source_namespace="bookbuyer",
                source_service_account="bookbuyer",
                destination_namespace="bookstore",
                destination_service="Bad Name!",
            ),
        )
    ]
)
async def test_the_servicer_answers_or_refuses_naming_a_field_and_stays_consistent(
    calls: list[tuple[str, Message]],
) -> None:
    target = catalog()
    health = Health()
    servicer = CatalogServicer(target, health.rejections)
    for rpc, request in calls:
        aborted = await answers_or_refuses(servicer, rpc, request, health.rejections, CHECKS)
        event(f"{rpc} {aborted.code.name if aborted else 'OK'}")
    target.flush()  # what was accepted recomputes without an error
    for identity in target.view_versions():
        target.policy_for(identity)
