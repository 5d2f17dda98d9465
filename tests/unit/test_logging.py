"""Structured logging, asserted as data: one ``decision`` event per create with the container id
bound, the same line shape from the shim's stdlib writer as from structlog, a record that
cannot be written logged and never blocking, the shim never writing to stdout, and the one
debug switch (GPUHOOK_DEBUG=1 or log.level: debug) for the shim, the hook and the CLI."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import testbed

from gpuhook import log
from gpuhook.config import loading as config_loading
from gpuhook.runtime import decide, hooks, shim
from tests import factories as f
from tests.hostguard import session_env
from tests.logcapture import Exec, captured, fake_execv, log_lines, paper_node

TIMESTAMP = re.compile(r'"timestamp":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)"')


@pytest.fixture(autouse=True)
def _quiet_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("GPUHOOK_DEBUG", raising=False)
    yield
    log.configure("info", "")


def bundle_of(folder: Path, spec: dict[str, Any]) -> Path:
    (folder / "rootfs").mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(spec))
    return folder


def create(
    monkeypatch: pytest.MonkeyPatch, config: Path, bundle: Path, cid: str
) -> tuple[list[MutableMapping[str, Any]], Exec]:
    """Run the shim's create in this process; returns the events and the runtime exec."""
    monkeypatch.setenv("GPUHOOK_CONFIG", str(config))
    monkeypatch.setattr(os, "execv", fake_execv)
    with captured() as events, pytest.raises(Exec) as info:
        shim.main(["gpuhook-runtime", "--root", "/r", "create", "--bundle", str(bundle), cid])
    return events, info.value


def test_the_shim_line_is_the_structlog_line(tmp_path: Path) -> None:
    """The shim logs through a stdlib writer (structlog costs ~80 ms to import); its line is
    byte for byte the line structlog renders for the same event, but for the time."""
    config = paper_node(tmp_path, log={"level": "debug"})
    bundle = bundle_of(tmp_path / "b", f.spec())
    out = subprocess.run(
        [testbed.RUNTIME, "--root", str(tmp_path / "r"), "create", "--bundle", str(bundle), "c7"],
        env={**session_env(), "GPUHOOK_CONFIG": str(config)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    shim_file = tmp_path / "log" / "gpuhook.log"
    [shim_line] = [line for line in shim_file.read_text().splitlines() if '"decision"' in line]
    event = json.loads(shim_line)
    assert list(event)[:5] == ["timestamp", "level", "event", "container_id", "bundle"]
    assert (event["container_id"], event["bundle"], event["level"]) == ("c7", str(bundle), "debug")

    other = tmp_path / "structlog.log"
    log.configure("debug", str(other), prefer_structlog=True)
    fields = {k: v for k, v in event.items() if k not in ("timestamp", "level", "event")}
    context = {k: fields.pop(k) for k in ("container_id", "bundle")}
    log.get_logger(**context).debug("decision", **fields)
    [structlog_line] = other.read_text().splitlines()
    assert TIMESTAMP.search(shim_line) and TIMESTAMP.search(structlog_line)
    assert TIMESTAMP.sub("T", shim_line) == TIMESTAMP.sub("T", structlog_line)


def test_gpu_create_logs_one_decision_and_nothing_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = paper_node(tmp_path)
    bundle = bundle_of(tmp_path / "b", f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"]))
    events, execd = create(monkeypatch, config, bundle, "c-gpu")
    assert execd.argv == [
        str(tmp_path / "runc"),
        "--root",
        "/r",
        "create",
        "--bundle",
        str(bundle),
        "c-gpu",
    ]
    assert [e["event"] for e in events] == ["decision"]
    [d] = events
    assert (d["log_level"], d["container_id"], d["bundle"]) == ("info", "c-gpu", str(bundle))
    assert (d["channel"], d["devices"], d["refused"]) == ("env", ["1"], False)
    assert d["reasons"][0]["verdict"] == "granted"
    assert capsys.readouterr().out == ""


# The last: a GPU marker but no request (a spec without any marker gets no record at all).
@pytest.mark.parametrize(
    "env",
    [["NVIDIA_VISIBLE_DEVICES=1"], ["NVIDIA_VISIBLE_DEVICES=void"], ["X_NVIDIA_VISIBLE_DEVICES=1"]],
)
def test_a_record_that_cannot_be_written_is_logged_and_never_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: list[str]
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")  # a file where the state folder should be
    config = paper_node(tmp_path, state_dir=str(blocker / "state"))
    bundle = bundle_of(tmp_path / "b", f.spec(env=env))
    events, execd = create(monkeypatch, config, bundle, "c1")
    assert execd.path == str(tmp_path / "runc")  # the container goes on to the runtime
    [warning] = [e for e in events if e["event"] == "record not written"]
    assert warning["log_level"] == "warning" and warning["container_id"] == "c1"
    assert warning["error"].startswith(
        f"cannot link decision record {blocker}/state/containers/c1.json: "
    )


@pytest.mark.parametrize(
    ("env_debug", "level", "logged"),
    [("", "info", False), ("0", "info", False), ("1", "info", True), ("", "debug", True)],
)
def test_the_debug_switch_in_the_shim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env_debug: str, level: str, logged: bool
) -> None:
    monkeypatch.setenv("GPUHOOK_DEBUG", env_debug)
    config = paper_node(tmp_path, log={"level": level})
    for spec, name in ((f.spec(), "plain"), (f.spec(env=["NVIDIA_VISIBLE_DEVICES="]), "empty")):
        events, _ = create(monkeypatch, config, bundle_of(tmp_path / name, spec), name)
        debug = [e for e in events if e["log_level"] == "debug"]
        if not logged:
            assert debug == []
            continue
        [d] = debug
        assert (d["event"], d["container_id"], d["gpu_container"]) == ("decision", name, False)


def test_the_debug_switch_in_the_cli(tmp_path: Path) -> None:
    config = paper_node(tmp_path)
    log_file = tmp_path / "log" / "gpuhook.log"
    env = {**session_env(), "GPUHOOK_CONFIG": str(config)}
    for extra_env, flags, debug in (
        ({}, [], False),
        ({"GPUHOOK_DEBUG": "1"}, [], True),
        ({}, ["--debug"], True),
    ):
        if log_file.exists():
            log_file.unlink()
        out = subprocess.run(
            [testbed.GPUHOOK, *flags, "inspect", "container", "--all", "-o", "json"],
            env={**env, **extra_env},
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        events = [e for e in log_lines(log_file) if e["level"] == "debug"]
        if debug:
            assert events[0]["event"] == "cli"
            assert events[0]["command"] == "gpuhook inspect container"
        else:
            assert events == []


def test_the_debug_switch_in_the_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = paper_node(tmp_path)
    bundle = bundle_of(tmp_path / "b", {"root": {"path": "rootfs"}})
    (bundle / "rootfs" / "lib").mkdir(parents=True)
    state = json.dumps({"ociVersion": "1.0.2", "id": "c-hook", "bundle": str(bundle)})
    monkeypatch.setenv("GPUHOOK_CONFIG", str(config))
    monkeypatch.chdir(tmp_path)  # the hook changes to /; this puts the test's cwd back after

    def hook(ldconfig: str) -> list[MutableMapping[str, Any]]:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(state.encode())))
        with captured() as events:
            assert hooks.main(["update-ldcache", "--ldconfig", ldconfig, "--folder", "/lib"]) == 0
        return events

    assert hook("/bin/true") == []
    [failed] = hook("/bin/false")  # a warning is logged at info level too
    assert (failed["event"], failed["log_level"], failed["exit_code"]) == (
        "ldcache not refreshed",
        "warning",
        1,
    )
    monkeypatch.setenv("GPUHOOK_DEBUG", "1")
    [full, done] = hook("/bin/true")  # /bin/true writes no cache for the merge: the full run
    assert (full["event"], done["event"], done["container_id"], done["hook"]) == (
        "ldcache: the full ldconfig run",
        "ldcache refreshed",
        "c-hook",
        "update-ldcache",
    )
    assert done["command"] == ["/bin/true", "-X", "-r", str(bundle / "rootfs"), "/lib"]
    assert done["how"] == "full"


def test_hooks_get_the_config_and_debug_switch_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook's env is explicit (never the container's); gpuhook passes its own variables so
    that the hook reads the shim's config and cache and logs where the shim does, at its level."""
    path = paper_node(tmp_path)
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=1", "LD_PRELOAD=/evil.so", "GPUHOOK_DEBUG=1"])

    def hook_env() -> tuple[str, ...]:
        cfg = config_loading.load(str(path), use_cache=False)
        out = decide.run(spec, cfg, inventory_source=lambda _c: f.inventory())
        return out.edits.hooks[0].env

    cache = f"GPUHOOK_CACHE_DIR={os.environ['GPUHOOK_CACHE_DIR']}"  # the session's (hostguard)
    base = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"GPUHOOK_CONFIG={path}", cache)
    assert hook_env() == base
    monkeypatch.setenv("GPUHOOK_DEBUG", "1")
    assert hook_env() == (*base, "GPUHOOK_DEBUG=1")
