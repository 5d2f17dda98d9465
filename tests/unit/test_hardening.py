"""Regression tests for what the security review (SECURITY.md, "Found and fixed") found: each
test fails on the code before its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuhook.config import loading as config_loading
from gpuhook.errors import ConfigError, InventoryError, RequestError
from gpuhook.inventory import store
from gpuhook.pipeline import apply, devices, request
from gpuhook.records import writer
from gpuhook.runtime import decide as decide_mod
from tests import factories as f

INVENTORY = f.inventory(8, {6: 3})


def decide(spec: dict[str, Any], **config: Any) -> Any:
    return decide_mod.run(spec, f.config(**config), inventory_source=lambda _c: INVENTORY).decision


# --- volume-mount markers: only a /dev/null mount is one --------------------------------------


def marker(device: str, source: str, root: str = "/var/run/nvidia-container-devices/") -> Any:
    return {"destination": root + device, "type": "bind", "source": source, "options": ["ro"]}


@pytest.mark.parametrize(
    "source",
    [
        "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/x",  # emptyDir
        "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~configmap/cm",  # configMap
        "tmpfs",
        "",
        "/dev/zero",
    ],
)
def test_a_pod_authors_volume_at_the_marker_path_is_no_request(source: str) -> None:
    """Before: any volume mounted at /var/run/nvidia-container-devices/all granted every GPU to a
    Kubernetes pod that was allocated none."""
    for device in ("all", f.gpu_uuid(1)):
        spec = f.spec(annotations=f.k8s(), mounts=[marker(device, source)])
        assert request.parse(spec).channels == ()
        d = decide(spec)
        assert not d.gpu_container and not d.devices


@pytest.mark.parametrize("source", ["/dev/null", "/dev//null", "/dev/./null"])
def test_a_dev_null_marker_is_a_request(source: str) -> None:
    d = decide(f.spec(mounts=[marker(f.gpu_uuid(1), source)]))
    assert [r.uuid for r in d.devices] == [f.gpu_uuid(1)]


def test_a_marker_of_another_source_does_not_hide_a_real_one() -> None:
    spec = f.spec(mounts=[marker("all", "/tmp/empty"), marker(f.gpu_uuid(2), "/dev/null")])
    assert [r.uuid for r in decide(spec).devices] == [f.gpu_uuid(2)]


def test_dotdot_in_a_marker_is_one_line() -> None:
    spec = f.spec(mounts=[marker("../../../etc", "/dev/null")])
    with pytest.raises(RequestError, match=r"^malformed GPU request: malformed volume-mount"):
        decide(spec)


# --- malformed spec shapes: one line or no request, never a traceback -------------------------


@pytest.mark.parametrize("mounts", [True, 5, 1.5])
def test_mounts_that_is_not_a_list_is_no_request(mounts: Any) -> None:
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"])
    spec["mounts"] = mounts
    assert [c.channel for c in request.parse(spec).channels] == ["env"]


@pytest.mark.parametrize(
    ("where", "odd"),
    [("mounts", {"destination": [], "source": "x"}), ("devices", {"path": {"a": 1}})],
)
def test_spec_entries_with_non_string_paths_are_kept(where: str, odd: dict[str, Any]) -> None:
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"])
    entries = spec["mounts"] if where == "mounts" else spec["linux"].setdefault("devices", [])
    entries.append(odd)
    outcome = decide_mod.run(spec, f.config(), inventory_source=lambda _c: INVENTORY)
    assert [d.uuid for d in outcome.decision.devices] == [f.gpu_uuid(1)]
    assert apply.apply(outcome.spec, outcome.edits) == outcome.spec
    kept = outcome.spec["mounts"] if where == "mounts" else outcome.spec["linux"]["devices"]
    assert odd in kept and len(kept) > 2


# --- device ids: ASCII digits only ---------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["\u00b2", "\u0661", "1\u00b2", "\uff10", "9" * 5000, "6:\u00b2", "\u0666:1"]
)
def test_non_ascii_or_huge_digits_are_unknown_ids(value: str) -> None:
    """Before: a superscript two crashed int() (str.isdigit accepts it), an Arabic-Indic one was
    read as GPU 1, and 5000 digits crashed int()'s digit limit."""
    refs, errors = devices.resolve((value,), INVENTORY)
    assert refs == () and len(errors) == 1 and "\n" not in errors[0]
    with pytest.raises(RequestError):
        decide(f.spec(env=[f"NVIDIA_VISIBLE_DEVICES={value}"]))


# --- the inventory file: any damage is "corrupt", one line ---------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [("missing_libraries", {"": None}), ("missing_libraries", {"x": 5}), ("gpus", [{"a": 1}])],
)
def test_damaged_inventory_is_one_line(tmp_path: Path, key: str, value: Any) -> None:
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({**INVENTORY.to_dict(), key: value}))
    config = f.config(inventory__path=str(path), inventory__auto_refresh=False)
    with pytest.raises(InventoryError, match=r"^inventory .* is corrupt \(.*\); run: gpuhook"):
        store.read(config)
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=0"])
    with pytest.raises(InventoryError):
        decide_mod.run(spec, config)


# --- the config loader: one line for every malformed file ---------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("? [a]\n: 1\n", "line 1, column 3: a key must be a string, not a list"),
        ("log: {1: 2}\n", "line 1, column 7: a key must be a string, not an integer"),
        ("{1: 2, 'a': 3}\n", "a key must be a string, not an integer"),
        ("2001-12-14: 1\n", "a key must be a string, not date"),
        ("driver_root: 2001-13-45\n", "invalid YAML value: month must be in 1..12"),
    ],
)
def test_config_with_odd_keys_or_values_is_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_loading.validate_data("/c.yaml", config_loading.parse_yaml("/c.yaml", text.encode()))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_deeply_nested_config_is_one_line_not_a_segfault(tmp_path: Path) -> None:
    """libyaml's C loader segfaulted (the whole process, here the CLI) at ~50 000 levels."""
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 60_000 + "]" * 60_000)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gpuhook.cli import commands; sys.exit(commands.run(sys.argv[1:]))",
            "config",
            "validate",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert out.stderr == f"gpuhook: invalid config {path}: YAML nested too deeply\n"


# --- records: what a killed create left behind is removed by the next one ----------------------


def test_next_record_write_removes_a_killed_writers_temps(tmp_path: Path) -> None:
    bundle, state = tmp_path / "bundle", tmp_path / "state"
    bundle.mkdir()
    config = f.config(state_dir=str(state))
    dead = 2**22 + 12345  # above pid_max's default: no such process
    stale = bundle / f".gpuhook-decision.json.gpuhook-tmp-{dead}-0badc0de"
    stale.write_text("{partial")
    record = writer.build("c1", str(bundle), request.parse(f.spec()))
    assert writer.write(config, "c1", str(bundle), record) == ""
    assert sorted(p.name for p in bundle.iterdir()) == ["gpuhook-decision.json"]
    # the link is re-pointed through a temp too: a killed re-point leaves one behind
    other = tmp_path / "other"
    other.mkdir()
    stale_link = state / "containers" / f".c1.json.gpuhook-tmp-{dead}-0badc0de"
    stale_link.symlink_to("nowhere")
    assert writer.write(config, "c1", str(other), record) == ""
    assert sorted(p.name for p in (state / "containers").iterdir()) == ["c1.json"]
    assert os.readlink(state / "containers" / "c1.json") == str(other / "gpuhook-decision.json")
