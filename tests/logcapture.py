"""Helpers for tests that assert gpuhook's log events as data, and a paper GPU node: a config
and an inventory (tests.factories) in a temporary folder, no device nodes, no root needed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog.testing
import yaml

from gpuhook import log
from gpuhook.inventory import driverroot
from tests import factories as f


@contextmanager
def captured() -> Iterator[list[MutableMapping[str, Any]]]:
    """structlog's capture of every event gpuhook logs in this process while inside. gpuhook's
    own configure() calls inside keep their level (a debug event is filtered at level info)
    but no longer reset the capture."""
    log.configure("debug", "", prefer_structlog=True)
    with structlog.testing.capture_logs() as events:
        yield events


class Exec(Exception):
    """os.execv replaced: the shim handed the container to the runtime."""

    def __init__(self, path: str, argv: list[str]) -> None:
        super().__init__(path)
        self.path = path
        self.argv = argv


def fake_execv(path: str, argv: list[str]) -> None:
    raise Exec(path, list(argv))


def paper_node(folder: Path, **sections: Any) -> Path:
    """A config file for a paper node with 8 GPUs (GPU 6 with 2 MIG devices) whose inventory
    is current; ``sections`` are merged into the config (one level deep)."""
    driver, dev = folder / "driver", folder / "dev"
    driver.mkdir(parents=True, exist_ok=True)
    dev.mkdir(exist_ok=True)
    inventory = f.inventory(mig={6: 2}).replace(
        driver_root=str(driver),
        dev_root=str(dev),
        staleness_key=driverroot.staleness_key(str(driver), str(dev)),
    )
    inv_path = folder / "inventory.json"
    inv_path.write_text(json.dumps(inventory.to_dict()))
    runtime = folder / "runc"
    runtime.write_text("#!/bin/sh\nexit 0\n")
    runtime.chmod(0o755)
    data: dict[str, Any] = {
        "driver_root": str(driver),
        "dev_root": str(dev),
        "state_dir": str(folder / "state"),
        "runtime": {"path": str(runtime)},
        "log": {"level": "info", "file": str(folder / "log" / "gpuhook.log")},
        "inventory": {"path": str(inv_path), "auto_refresh": False},
        "hook": {"path": "/bin/true", "ldconfig": "/bin/true"},
        "cdi": {"spec_dirs": [str(folder / "cdi")]},  # never the host's CDI folders
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = folder / f"config-{len(os.listdir(folder))}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def log_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a log file, as data."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
