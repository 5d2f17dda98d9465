"""What the container-create path imports, as the installed runtime runs it (not a timing test).

The dispatcher starts ``python3 -I -S _shim_entry.py``; these tests start exactly that with
``-X importtime`` added, which reports every module the process imports before it execs the
runtime (a recorder script standing in for runc). A create without GPU markers normally never
reaches Python (the dispatcher execs the runtime: tests/integration/test_dispatcher.py); when
it does (the debug switch, no trusted cache) it imports only the shim and writes no record. The
full paths (a spec with markers: the leak case, GPU containers, a MIG node) must import none of
the heavy modules, except pynvml when the inventory is refreshed lazily.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuhook.records import writer
from tests import factories as f
from tests.conftest import Containers, FakeNode, recorder_env

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "src" / "gpuhook" / "_shim_entry.py"
PYTHON = REPO / ".venv" / "bin" / "python"

HEAVY = {"click", "yaml", "jsonschema", "structlog", "pynvml"}
SLOW_STDLIB = {
    "json",
    "re",
    "typing",
    "dataclasses",
    "pathlib",
    "tempfile",
    "contextlib",
    "copy",
    "subprocess",
    "importlib.metadata",
}
# gpuhook's modules on the Python path of a create without GPU markers (the config and logging
# for its log line; the exec-env marker an earlier container of that id may have left); not
# the pipeline, not the record writer.
NO_MARKER_PATH = {
    "gpuhook",
    "gpuhook._fastjson",
    "gpuhook.config",
    "gpuhook.config.cache",
    "gpuhook.config.locate",
    "gpuhook.config.loading",
    "gpuhook.config.types",
    "gpuhook.errors",
    "gpuhook.fsutil",
    "gpuhook.log",
    "gpuhook.markers",
    "gpuhook.model",
    "gpuhook.model.frozen",
    "gpuhook.records",
    "gpuhook.records.execenv",
    "gpuhook.records.ids",
    "gpuhook.runtime",
    "gpuhook.runtime.ocispec",
    "gpuhook.runtime.runc_argv",
    "gpuhook.runtime.shim",
}


# an operator's default log level (the fake node's own config logs at debug level)
OPERATOR_LOG = {"level": "info"}


def _imported(stderr: str) -> set[str]:
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.add(name)
    return names


def _startup() -> set[str]:
    run = subprocess.run(
        [str(PYTHON), "-X", "importtime", "-I", "-S", "-c", "pass"],
        capture_output=True,
        text=True,
        check=True,
    )
    return _imported(run.stderr)


def create(env: dict[str, str], bundle: Path, cid: str = "c1") -> tuple[set[str], str]:
    """Run one create as the dispatcher does (plus -X importtime); return the modules it
    imported beyond the interpreter's own start, and its stderr without the import lines."""
    argv = ["--root", "/r", "create", "--bundle", str(bundle), cid]
    run = subprocess.run(
        [str(PYTHON), "-X", "importtime", "-I", "-S", str(ENTRY), *argv],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 42, run.stderr  # the recorder standing in for runc
    rest = "\n".join(x for x in run.stderr.splitlines() if not x.startswith("import time:"))
    return _imported(run.stderr) - _startup(), rest


def test_non_gpu_create_in_python_is_light_and_writes_no_record(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env, argv_out = recorder_env(node, tmp_path, log=OPERATOR_LOG)
    bundle = containers.bundle()
    create(env, bundle, "first")  # compiles the config
    modules, stderr = create(env, bundle, "second")
    assert {m for m in modules if m.startswith("gpuhook")} == NO_MARKER_PATH, modules
    _assert_light(modules)
    assert "gpuhook.pipeline.flow" not in modules and "gpuhook.records.writer" not in modules
    assert stderr == ""
    assert argv_out.read_text().splitlines() == [
        "--root",
        "/r",
        "create",
        "--bundle",
        str(bundle),
        "second",
    ]
    assert not (bundle / writer.RECORD_NAME).exists()  # records are for GPU-marked specs
    assert not (Path(node.truth["state_dir"]) / "containers" / "second.json").exists()
    # A spec with a GPU marker takes the full path.
    gpu = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"])
    assert "gpuhook.pipeline.flow" in create(env, gpu, "gpu")[0]


def _assert_light(modules: set[str], allow: frozenset[str] = frozenset()) -> None:
    assert not (modules & (HEAVY - allow)), modules & HEAVY
    assert not (modules & SLOW_STDLIB), modules & SLOW_STDLIB


def test_full_paths_import_nothing_heavy(
    node: FakeNode, containers: Containers, tmp_path: Path, fake_node_factory: object
) -> None:
    env, _ = recorder_env(node, tmp_path, log=OPERATOR_LOG)
    create(env, containers.bundle(), "warm")  # config compiled once (yaml, jsonschema)
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    checkpoint.write_text(
        json.dumps(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {
                            "PodUID": "other-pod",
                            "ContainerName": "main",
                            "ResourceName": "nvidia.com/gpu",
                            "DeviceIDs": {"0": [f.gpu_uuid(0)]},
                        }
                    ]
                },
                "Checksum": 1,
            }
        )
    )
    k8s_env, _ = recorder_env(
        node,
        tmp_path / "k8s",
        log=OPERATOR_LOG,
        policy={"kubernetes": {"checkpoint": str(checkpoint)}},
    )
    create(k8s_env, containers.bundle(), "warm-k8s")
    cases: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
        "leak": (k8s_env, {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": f.k8s()}),
        "gpu1": (env, {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}),
        "gpu-all": (env, {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}),
        "mig": (env, {"env": ["NVIDIA_VISIBLE_DEVICES=7:1"]}),
    }
    for name, (case_env, kw) in cases.items():
        bundle = containers.bundle(**kw)
        modules, _ = create(case_env, bundle, name)
        assert "gpuhook.pipeline.flow" in modules
        _assert_light(modules)
        spec = json.loads((bundle / "config.json").read_text())
        visible = [e for e in spec["process"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
        assert visible != ["NVIDIA_VISIBLE_DEVICES=all"], name  # the shim decided


def test_pynvml_only_on_a_lazy_inventory_refresh(
    fake_node_factory: object, containers: Containers, tmp_path: Path
) -> None:
    own: FakeNode = fake_node_factory("--gpus", "2")  # type: ignore[operator]
    env, _ = recorder_env(own, tmp_path, log=OPERATOR_LOG)
    create(env, containers.bundle(), "warm")
    modules, _ = create(env, containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"]), "refresh")
    assert "gpuhook.inventory.nvml" in modules  # no inventory yet: refreshed under the lock
    assert not (modules & (HEAVY - {"pynvml"}))
    modules, _ = create(env, containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"]), "cached")
    assert "gpuhook.pipeline.flow" in modules
    _assert_light(modules)
