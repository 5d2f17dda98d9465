# gpuhook developer targets. On a fresh Debian 12 machine use ./dev TARGET (installs what is needed first).
SHELL := /bin/sh
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
PKGDIR := $(CURDIR)/src
PYTEST_ARGS ?=

.PHONY: all build lint typecheck unit test demo clean deb bench

all: build

# The same POSIX sh dispatchers the .deb installs, pointing at this checkout.
build: build/bin/gpuhook-runtime build/bin/gpuhook build/bin/nvidia-container-runtime-hook

build/bin/gpuhook-runtime: packaging/gpuhook-runtime.in
	@mkdir -p build/bin
	sed -e 's|@PYTHON@|$(PY)|g' -e 's|@PKGDIR@|$(PKGDIR)|g' $< > $@.tmp && chmod 755 $@.tmp && mv $@.tmp $@

build/bin/gpuhook: packaging/gpuhook.in
	@mkdir -p build/bin
	sed -e 's|@PYTHON@|$(PY)|g' -e 's|@PKGDIR@|$(PKGDIR)|g' $< > $@.tmp && chmod 755 $@.tmp && mv $@.tmp $@

build/bin/nvidia-container-runtime-hook: packaging/nvidia-container-runtime-hook
	@mkdir -p build/bin
	cp $< $@ && chmod 755 $@

lint:
	$(VENV)/bin/ruff check src tests tools tools/fake-node $(wildcard bench)

typecheck:
	$(VENV)/bin/mypy

unit: build
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test: build lint typecheck
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: build
	$(PY) tools/demo.py

clean:
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache
