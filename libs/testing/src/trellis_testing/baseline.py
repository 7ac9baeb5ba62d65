"""One mesh for a module's tests, each test starting from the same named state.

Starting a mesh (Redis and four or five service processes) costs about 10 s of CPU, and
most integration tests only need *a* mesh in a known state, not a new one. A module that
shares one marks its tests with one xdist group (so one worker starts it once) and uses
:func:`shared_mesh` in a module-scoped fixture and :meth:`Baseline.restore` after each test.

The baseline is what the mesh answers once started: the catalog's services and resources
(without revision numbers), the proxies connected, the workloads registered and the service
processes up. :meth:`Baseline.restore` undoes what tests do (sidecars and apps started,
workloads registered, spec files written) and then waits, without a fixed sleep, until the
mesh answers exactly that again; if it never does, the error names each part that differs.

The catalog keeps a proxy's account while its certificate is valid, and lists a service
with its first proxy's account: a module names the identities its tests onboard
(``onboarded``), and the baseline is taken once each has a certificate, so that the listing
after a test reads as before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from trellis_testing import redis_backend
from trellis_testing.kube import KubeApi
from trellis_testing.mesh import Mesh
from trellis_testing.redis_server import RedisServer
from trellis_testing.services import ServiceProcess
from trellis_testing.waiting import eventually

M = TypeVar("M", bound=Mesh)
#: (namespace, service, account) of a sidecar a module's tests onboard
Identity = tuple[str, str, str]


class Baseline:
    """The shared mesh as each test finds it, and the way back to it.

    Two things the catalog keeps by design are primed before the baseline is taken, so that
    its listing after a test reads as before it: a proxy's account while its certificate is
    valid (``onboarded``: each identity is issued a certificate), and a service's account
    once its workloads ran under it (``registered``: each (name, service) is registered
    once, as ``bookstore``, on a port nobody serves, and deregistered).
    """

    def __init__(
        self,
        mesh: Mesh,
        onboarded: tuple[Identity, ...] = (),
        registered: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.mesh = mesh
        self.files = {p.name: p.read_bytes() for p in mesh.spec_dir.iterdir() if p.is_file()}
        for namespace, service, account in onboarded:
            mesh.proxy_certificate(namespace, service, account)
        wanted = {(f"{ns}/{service}", account) for ns, service, account in onboarded}

        def known() -> bool:
            proxies = mesh.processes["catalog"].get("/v1/proxies").json()["proxies"]
            return wanted <= {(p["identity"], p["service_account"]) for p in proxies}

        asyncio.run(eventually(known, timeout=30, interval=0.1, message="accounts known"))
        for name, service in registered:
            mesh.register(name, service, 1)

        def endpoints() -> int:
            return sum(s["endpoints"] for s in self.answers()["services"])

        if registered:
            asyncio.run(eventually(lambda: endpoints() == len(registered), timeout=30))
            self.deregister()
        self.proxy_certificates = self.proxy_certificate_names()
        seen: list[dict[str, Any]] = [{}]

        def settled() -> bool:  # what was primed has applied: two reads in a row agree
            now = self.answers()
            same = now == seen[0] and not any(s["endpoints"] for s in now["services"])
            seen[0] = now
            return same

        asyncio.run(eventually(settled, timeout=30, interval=0.2, message="the mesh settled"))
        self.listing = seen[0]

    def answers(self) -> dict[str, Any]:
        """What the baseline compares (revisions left out: they only grow; lists in an
        order of their own: a document written again comes last in the catalog's); a module
        adds what its own tests read."""
        mesh = self.mesh
        catalog = mesh.processes["catalog"]
        services = catalog.get("/v1/services").json()["services"]
        resources = catalog.get("/v1/resources").json()["resources"]
        proxies = catalog.get("/v1/proxies").json()["proxies"]
        return {
            "services": sorted(services, key=lambda s: (s["namespace"], s["name"])),
            "resources": sorted(resources, key=lambda r: (r["key"], r["source"], r["document"])),
            "views": catalog.get("/v1/views").json()["views"],
            "connected": sorted(p["common_name"] for p in proxies if p["connected"]),
            "proxy-cp": mesh.proxies(),
            "workloads": self.workloads(),
            "up": [p.instance for p in (*mesh.processes.values(), *mesh.replicas) if alive(p)],
        }

    def proxy_certificate_names(self) -> list[str]:
        """The proxy certificates certmanager holds a record of."""
        listed = self.mesh.processes["certmanager"].get("/v1/certificates?kind=proxy").json()
        return sorted(c["common_name"] for c in listed["certificates"])

    def workloads(self) -> list[dict[str, Any]]:
        listed = self.mesh.processes["endpoints-vm"].get("/v1/workloads").json()
        workloads: list[dict[str, Any]] = listed["workloads"]
        return workloads

    def admin(self) -> dict[str, str]:
        token = (self.mesh.state_dir / "admin-token").read_text().strip()
        return {"Authorization": f"Bearer {token}"}

    def deregister(self) -> None:
        """Every workload out of the registry, its heartbeat token with it (as the CLI's
        ``vm deregister`` leaves the state directory)."""
        vm = self.mesh.processes["endpoints-vm"]
        for workload in self.workloads():
            namespace, name = workload["namespace"], workload["name"]
            gone = vm.delete(f"/v1/workloads/{namespace}/{name}", headers=self.admin())
            assert gone.status_code in (200, 204, 404), gone.text  # 404: it expired meanwhile
            # where ``trellis vm register`` keeps the token (trellis_cli.vm.heartbeat_token_path,
            # a layer above this one)
            token = self.mesh.state_dir / "heartbeat-tokens" / namespace / name
            token.unlink(missing_ok=True)

    def undo(self) -> None:
        """Undo what a test did: its sidecars and apps stopped (their files gone, so that the
        next test onboards under the same names), the proxy certificates it was issued
        revoked (as an operator retires a proxy: the record goes, and the catalog no longer
        expects it), its workloads deregistered, the spec's files as they were. A module
        extends it with what its own tests change."""
        mesh = self.mesh
        for sidecar in mesh.sidecars:
            sidecar.envoy.terminate()
        for sidecar in mesh.sidecars:
            sidecar.envoy.stop()
        mesh.sidecars.clear()
        for app in mesh.apps:
            app.stop()
        mesh.apps.clear()
        for folder in ("proxies", "envoy"):  # onboarding writes a sidecar's files anew
            shutil.rmtree(mesh.tmp / folder, ignore_errors=True)
        certmanager = mesh.processes["certmanager"]
        for common_name in self.proxy_certificate_names():
            if common_name not in self.proxy_certificates:
                url = f"/v1/certificates/{common_name}/revoke"
                revoked = certmanager.post(url, headers=self.admin())
                assert revoked.status_code in (200, 404), revoked.text
        self.deregister()
        for path in mesh.spec_dir.iterdir():
            if path.is_file() and path.name not in self.files:
                path.unlink()
        for name, content in self.files.items():
            path = mesh.spec_dir / name
            if not path.exists() or path.read_bytes() != content:
                path.write_bytes(content)

    def restore(self, timeout: float = 60.0) -> None:
        """:meth:`undo`, then wait until the mesh answers as it did before the first test
        (certmanager's proxy certificates too)."""
        self.undo()
        back_to(
            {**self.listing, "certificates": self.proxy_certificates},
            lambda: {**self.answers(), "certificates": self.proxy_certificate_names()},
            timeout,
        )


def back_to(
    baseline: dict[str, Any], read: Callable[[], dict[str, Any]], timeout: float = 60.0
) -> None:
    """Wait until ``read()`` is ``baseline`` again; a timeout names what still differs."""
    deadline = time.monotonic() + timeout
    while (now := read()) != baseline:
        if time.monotonic() > deadline:
            differs = {k: (v, now.get(k)) for k, v in baseline.items() if now.get(k) != v}
            raise AssertionError(f"never back to the baseline; (baseline, now): {differs}")
        time.sleep(0.1)


def stored_names(
    kube: KubeApi, kinds: Iterable[tuple[str, str]]
) -> dict[str, list[tuple[str, str]]]:
    """The (namespace, name) of each object of the ``(group, plural)`` kinds ``kube`` stores."""
    return {
        plural: sorted(
            (o["metadata"].get("namespace") or "", o["metadata"]["name"])
            for o in kube.objects(group, plural)
        )
        for group, plural in kinds
    }


def alive(process: ServiceProcess) -> bool:
    return process.process is not None and process.process.poll() is None


@contextlib.contextmanager
def shared_mesh(
    tmp: Path,
    spec: Path | dict[str, str],
    make: Callable[[Path, Path, RedisServer, Path], M],
    baseline: Callable[[M], Baseline] = Baseline,
) -> Iterator[tuple[M, Baseline]]:
    """A mesh made by ``make(tmp, state_dir, redis, spec_dir)`` on a copy of ``spec`` (a
    directory, or file names and their text), with its own Redis, started, and its
    :class:`Baseline` (``baseline(mesh)``); everything stopped after."""
    server = redis_backend.redis_server(tmp / "redis")
    server.start()
    try:
        state_dir = tmp / "state"
        state_dir.mkdir()
        spec_dir = tmp / "spec"
        if isinstance(spec, Path):
            shutil.copytree(spec, spec_dir)
        else:
            spec_dir.mkdir()
            for name, text in spec.items():
                (spec_dir / name).write_text(text)
        mesh = make(tmp, state_dir, server, spec_dir)
        mesh.start()
        try:
            yield mesh, baseline(mesh)
        finally:
            mesh.stop()
    finally:
        server.close()


def restored(shared: tuple[M, Baseline]) -> Iterator[M]:
    """The body of a module's function-scoped ``mesh`` fixture: the shared mesh at its
    baseline, and what the test changed undone after it (even when it failed)."""
    running, baseline = shared
    try:
        yield running
    finally:
        baseline.restore()


#: the bookstore's workloads, registered once before a baseline: the catalog then knows
#: bookstore-v1's and -v2's account, ``bookstore``, as it does once a test registers them
BOOKSTORE_WORKLOADS = (("v1-a", "bookstore-v1"), ("v2-a", "bookstore-v2"))


def module_mesh(
    folder: str,
    spec: Path | dict[str, str],
    make: Callable[[Path, Path, RedisServer, Path], Mesh] = Mesh,
    baseline: Callable[[Mesh], Baseline] = Baseline,
) -> tuple[Any, Any]:
    """A module's two fixtures, ``shared`` (the mesh, started once for the module by
    :func:`shared_mesh`, in a temporary folder named ``folder``) and ``mesh`` (that mesh at
    its baseline, what the test changed undone after it): ``shared, mesh = module_mesh(...)``
    at the module's top level, its tests in one xdist group."""

    @pytest.fixture(scope="module")
    def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mesh, Baseline]]:
        with shared_mesh(tmp_path_factory.mktemp(folder), spec, make, baseline) as started:
            yield started

    @pytest.fixture
    def mesh(shared: tuple[Mesh, Baseline]) -> Iterator[Mesh]:
        yield from restored(shared)

    return shared, mesh
