"""A flush in steps: the event loop is given back during a recompute, a reader waits for
the whole result, and an input that arrives meanwhile goes into the next flush."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from trellis_catalog import catalog as catalog_module
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.sources import kinds
from trellis_common.specdir import load_paths

ROOT = Path(__file__).resolve().parents[3]
V1, V2 = "bookstore/bookstore-v1|14001", "bookstore/bookstore-v2|14001"


def provided(name: str, address: str) -> ProvidedService:
    return ProvidedService(
        provider="vm",
        namespace="bookstore",
        name=name,
        ports=(("http", 8080, "", 0),),
        endpoints=(ProvidedEndpoint(address, (("http", 8081),), service_account="bookstore"),),
    )


def move(catalog: Catalog, service: str, address: str) -> None:
    """A provider's new report: ``service``'s one endpoint is at ``address`` now."""
    catalog.update_provider_service("vm", "bookstore", service, provided(service, address))


@pytest.fixture
def every_step_yields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog_module, "STEP_SECONDS", 0.0)


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


def _catalog(freeze_heap: bool = False) -> Catalog:
    documents, errors = load_paths([ROOT / "examples" / "bookstore"], kinds())
    catalog = Catalog(freeze_heap=freeze_heap)
    catalog.set_documents(documents, errors)
    catalog.set_provider_services(
        "vm", [provided("bookstore-v1", "10.0.0.1"), provided("bookstore-v2", "10.0.0.2")]
    )
    catalog.flush()
    return catalog


@pytest.mark.usefixtures("every_step_yields")
async def test_a_flush_gives_the_loop_back_and_readers_wait_for_the_whole_result() -> None:
    catalog = _catalog()
    move(catalog, "bookstore-v2", "10.0.2.2")
    flush = asyncio.create_task(catalog.flush_in_steps())
    reader = asyncio.create_task(catalog.settled())
    turns = 0
    while not flush.done():
        turns += 1
        await asyncio.sleep(0)
        if not flush.done():
            assert not reader.done(), "a reader went ahead of the flush in progress"
        if turns == 1:  # an input in the middle of the flush
            move(catalog, "bookstore-v1", "10.0.1.1")
    await reader
    assert turns > 3, "the flush held the loop from start to end"
    assert catalog.clusters[V2].endpoints[0].address == "10.0.2.2"
    # the input that came meanwhile was marked for the next flush, not lost
    assert catalog.clusters[V1].endpoints[0].address == "10.0.0.1"
    await catalog.flush_in_steps()
    assert catalog.clusters[V1].endpoints[0].address == "10.0.1.1"


@pytest.mark.usefixtures("every_step_yields")
async def test_flushes_in_steps_take_turns() -> None:
    catalog = _catalog()
    move(catalog, "bookstore-v2", "10.0.2.3")
    first = asyncio.create_task(catalog.flush_in_steps())
    await asyncio.sleep(0)
    move(catalog, "bookstore-v1", "10.0.1.3")
    second = asyncio.create_task(catalog.flush_in_steps())
    await asyncio.gather(first, second)
    assert catalog.clusters[V2].endpoints[0].address == "10.0.2.3"
    assert catalog.clusters[V1].endpoints[0].address == "10.0.1.3"


@pytest.mark.usefixtures("unfrozen")
async def test_the_service_catalog_freezes_what_a_big_flush_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc.unfreeze()
    v2 = "bookstore-v2"
    plain = _catalog()
    move(plain, v2, "10.0.2.4")
    monkeypatch.setattr(catalog_module, "FREEZE_AFTER", 0.0)  # every flush counts as big
    await plain.flush_in_steps()
    assert gc.get_freeze_count() == 0  # only the service's catalog freezes
    service = _catalog(freeze_heap=True)
    move(service, v2, "10.0.2.5")
    monkeypatch.setattr(catalog_module, "FREEZE_AFTER", 3600.0)  # a small flush: churn
    await service.flush_in_steps()
    assert gc.get_freeze_count() == 0  # its garbage stays the collector's
    move(service, v2, "10.0.2.6")
    monkeypatch.setattr(catalog_module, "FREEZE_AFTER", 0.0)
    await service.flush_in_steps()
    assert gc.get_freeze_count() > 0


@pytest.mark.usefixtures("every_step_yields")
async def test_documents_set_during_a_flush_are_the_next_flushs() -> None:
    catalog = _catalog()
    documents, errors = load_paths([ROOT / "examples" / "bookstore"], kinds())
    kept = [d for d in documents if d.key.kind != "TrafficTarget"]
    catalog.set_documents(documents, errors)  # the same again: compared in the flush's steps
    flush = asyncio.create_task(catalog.flush_in_steps())
    await asyncio.sleep(0)
    catalog.set_documents(kept, errors)  # while the flush compares the first list
    await flush
    assert any(key.startswith("TrafficTarget ") for key in catalog.spec.statuses)
    await catalog.flush_in_steps()
    assert not any(key.startswith("TrafficTarget ") for key in catalog.spec.statuses)


@pytest.mark.usefixtures("every_step_yields", "unfrozen")
async def test_the_service_catalog_pauses_full_collections_while_it_flushes() -> None:
    service = _catalog(freeze_heap=True)
    before = gc.get_threshold()
    move(service, "bookstore-v2", "10.0.2.7")
    flush = asyncio.create_task(service.flush_in_steps())
    seen = []
    while not flush.done():
        seen.append(gc.get_threshold()[2])
        await asyncio.sleep(0)
    assert max(seen) > before[2] * 1000  # the oldest generation's threshold, out of reach
    assert gc.get_threshold() == before
