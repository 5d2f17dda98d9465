"""What a ``gpuhook doctor`` check is: its statuses, the :class:`Result` it reports, the
:class:`Node` it looks at, and the registry the checks join with :func:`register`.

The check modules (:mod:`gpuhook.cli.doctor_node`, :mod:`gpuhook.cli.doctor_engines`,
:mod:`gpuhook.cli.doctor_host`) import this module, and :mod:`gpuhook.cli.doctor` imports them
and runs what they registered: the imports read one way (no cycle).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from gpuhook.config import loading as config_loading
from gpuhook.engines import readers
from gpuhook.errors import ConfigError
from gpuhook.inventory import store
from gpuhook.model import check

if TYPE_CHECKING:
    from gpuhook.config.types import Config
    from gpuhook.inventory.store import Status
    from gpuhook.model.inventory import Inventory

CheckFunction = Callable[["Node"], "Result | list[Result]"]
F = TypeVar("F", bound=CheckFunction)

# The checks' vocabulary: one line of doctor's report (every status) and the statuses.
Result = check.CheckResult
PASS, WARN, FAIL, SKIP, STATUSES = check.PASS, check.WARN, check.FAIL, check.SKIP, check.STATUSES


class Node:
    """What the checks look at: the config (loaded and validated afresh, not from the cache),
    the inventory and the engines' configs, each read once."""

    def __init__(
        self,
        config_file: str | None = None,
        *,
        docker_config: str = readers.DEFAULT_PATHS[readers.DOCKER],
        containerd_config: str = readers.DEFAULT_PATHS[readers.CONTAINERD],
        podman_config: str = readers.DEFAULT_PATHS[readers.PODMAN],
        now: float | None = None,
    ) -> None:
        self.config_file = config_file
        self.engine_paths = {
            readers.DOCKER: docker_config,
            readers.CONTAINERD: containerd_config,
            readers.PODMAN: podman_config,
        }
        self.now = time.time() if now is None else now
        self.config: Config | None = None
        self.config_error: ConfigError | None = None
        try:
            self.config = config_loading.load(config_file, use_cache=False)
        except ConfigError as exc:
            self.config_error = exc
        self._status: Status | None = None
        self._engines: dict[str, readers.Registration] = {}

    def need_config(self) -> Config:
        if self.config is None:
            raise RuntimeError("check registered with needs_config=False used the config")
        return self.config

    def inventory_status(self) -> Status:
        if self._status is None:
            self._status = store.status(self.need_config())
        return self._status

    def inventory(self) -> Inventory | None:
        return self.inventory_status().inventory

    def engine(self, engine: str) -> readers.Registration:
        if engine not in self._engines:
            self._engines[engine] = readers.read(engine, self.engine_paths[engine])
        return self._engines[engine]


class Check:
    def __init__(self, name: str, function: CheckFunction, needs_config: bool) -> None:
        self.name = name
        self.function = function
        self.needs_config = needs_config


CHECKS: list[Check] = []


def register(
    name: str, *, needs_config: bool = True, before: str | tuple[str, ...] | None = None
) -> Callable[[F], F]:
    """Decorator: add a check (or replace the one of that name, in place). ``before`` puts a
    new check ahead of the named one (of the first registered of several names); otherwise it
    goes last. ``needs_config``: skipped, with a pointer to the config check, when the config is
    invalid."""
    names = (before,) if isinstance(before, str) else before or ()

    def decorate(function: F) -> F:
        check = Check(name, function, needs_config)
        for i, existing in enumerate(CHECKS):
            if existing.name == name:
                CHECKS[i] = check
                return function
        index = next((i for i, c in enumerate(CHECKS) if c.name in names), len(CHECKS))
        CHECKS.insert(index, check)
        return function

    return decorate


def section(*later: str) -> Callable[..., Callable[[F], F]]:
    """:func:`register` for one module of checks: each goes ahead of the first check of the
    later modules (``later``: their first checks' names) already registered, else last."""

    def register_in_section(name: str, *, needs_config: bool = True) -> Callable[[F], F]:
        return register(name, needs_config=needs_config, before=later)

    return register_in_section
