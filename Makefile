# gpuhook developer targets. On a fresh Debian 12 machine use ./dev TARGET (installs what is needed first).
SHELL := /bin/sh
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
PKGDIR := $(CURDIR)/src
PYTEST_ARGS ?=

.PHONY: all build lint typecheck unit test demo clean deb bench image

all: build

# The same dispatchers the .deb installs (gpuhook-runtime: C, gpuhook: POSIX sh), pointing at this checkout.
build: build/bin/gpuhook-runtime build/bin/gpuhook build/bin/nvidia-container-runtime-hook

# Rendered from the .in templates with the tables they are made from (gpuhook.runtime.dispatch).
RENDER := PYTHONPATH=$(PKGDIR) $(PY) -m gpuhook.runtime.dispatch
# Every module of the package: the dispatchers are rendered from tables that several modules own
# (whatever runtime.dispatch imports), so a change to any of them rebuilds them (a second's work).
RENDER_DEPS := $(shell find src/gpuhook -name '*.py' -not -path '*/__pycache__/*')

build/bin/gpuhook-runtime: packaging/gpuhook-runtime.c.in packaging/gpuhook-ldcache.c.in $(RENDER_DEPS)
	@mkdir -p build/bin
	$(RENDER) $< $@ $(PY) $(PKGDIR)

build/bin/gpuhook: packaging/gpuhook.in $(RENDER_DEPS)
	@mkdir -p build/bin
	$(RENDER) $< $@ $(PY) $(PKGDIR)

build/bin/nvidia-container-runtime-hook: packaging/nvidia-container-runtime-hook
	@mkdir -p build/bin
	cp $< $@ && chmod 755 $@

lint:
	$(VENV)/bin/ruff check src tests tools tools/fake-node $(wildcard bench)

typecheck:
	$(VENV)/bin/mypy
	MYPYPATH=tools $(VENV)/bin/mypy --strict bench

# The pure tests: fast, and without root (root-marked ones are skipped then; CI runs them all).
unit: build
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

test: build lint typecheck
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: build
	$(PY) tools/demo.py

# Container-start overhead against plain runc (root; ~5 minutes; not a test). Table on stdout,
# JSON in build/bench/latest.json. BENCH_ARGS e.g. "--peer /path/to/nvidia-container-runtime".
BENCH_ARGS ?=
bench: build
	$(PY) bench/lifecycle.py $(BENCH_ARGS)

# Into dist/, with Debian's tools, each checked by lintian: python3-nvidia-ml-py_<v>_all.deb (the
# NVML bindings, from the PyPI sdist pinned in packaging/nvidia-ml-py/SHA256SUMS, downloaded once
# into build/nvidia-ml-py/) and gpuhook_<version>_<arch>.deb, which depends on it.
deb:
	packaging/nvidia-ml-py/build-deb
	packaging/deb/build-deb

# dist/gpuhook-node_<version>.tar: the DaemonSet's image (docker-archive, `docker load`), from
# debootstrap bookworm + the debs of `make deb`; no registry (root; docs/operations.md "The DaemonSet").
image: deb
	packaging/image/build-image

clean:
	rm -rf build dist packaging/deb/build .pytest_cache .mypy_cache .ruff_cache
