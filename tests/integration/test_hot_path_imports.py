"""What the container-create path imports, as the installed runtime runs it (not a timing test).

The dispatcher starts ``python3 -I -S _shim_entry.py``; these tests start exactly that with
``-X importtime`` added, which reports every module the process imports before it execs the
runtime (a recorder script standing in for runc). A create without GPU markers must import
nothing but gpuhook's fast path (gpuhook.runtime.fastpath and the argv parser); the full paths
(a spec with markers: the leak case, GPU containers, a MIG node) must import none of the heavy
modules, except pynvml when the inventory is refreshed lazily.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpuhook.records import writer
from gpuhook.runtime import fastpath
from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.integration.test_shim import RECORDER

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
FAST_PATH = {
    "gpuhook",
    "gpuhook.model",
    "gpuhook.model.frozen",
    "gpuhook.runtime",
    "gpuhook.runtime.runc_argv",
    "gpuhook.runtime.fastpath",
}


def recorder_env(node: FakeNode, tmp_path: Path, **sections: object) -> tuple[dict[str, str], Path]:
    """A config of ``node`` whose runtime is a recorder (exit 42) and whose log level is an
    operator's default (the fake node's own config logs at debug level)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "argv.txt"
    fake = tmp_path / "fake-runc"
    fake.write_text(RECORDER.format(out=out))
    fake.chmod(0o755)
    env = node.variant(tmp_path, runtime={"path": str(fake)}, log={"level": "info"}, **sections)
    return env, out


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


def test_non_gpu_create_takes_the_fast_path(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env, argv_out = recorder_env(node, tmp_path)
    bundle = containers.bundle()
    cold, _ = create(env, bundle, "first")  # compiles the config, writes the fast-path cache
    assert "gpuhook.runtime.shim" in cold
    full_record = json.loads((bundle / writer.RECORD_NAME).read_text())

    modules, stderr = create(env, bundle, "second")
    assert modules == FAST_PATH, modules
    assert stderr == ""
    assert argv_out.read_text().splitlines() == [
        "--root",
        "/r",
        "create",
        "--bundle",
        str(bundle),
        "second",
    ]
    # The same record as the full path writes, and the same link.
    fast_record = json.loads((bundle / writer.RECORD_NAME).read_text())
    for rec in (full_record, fast_record):
        assert isinstance(rec.pop("timestamp"), float)
        rec.pop("container_id")
    assert fast_record == full_record
    assert fast_record["decision"]["reasons"][0]["why"] == fastpath.NOTE
    links = Path(node.truth["state_dir"]) / "containers"
    for cid in ("first", "second"):
        assert (links / f"{cid}.json").readlink() == bundle / writer.RECORD_NAME


def test_fast_path_steps_aside(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    env, _ = recorder_env(node, tmp_path)
    plain = containers.bundle()
    create(env, plain, "warm")
    assert create(env, plain, "fast")[0] == FAST_PATH

    # GPUHOOK_DEBUG: the debug decision line must be logged, by the full path.
    assert "gpuhook.runtime.shim" in create({**env, "GPUHOOK_DEBUG": "1"}, plain, "dbg")[0]
    # A container id that runc would reject anyway: the full path decides what to do.
    assert "gpuhook.runtime.shim" in create(env, plain, "bad:id")[0]
    # The config file changed: the cache no longer matches; the full path renews it.
    config = Path(env["GPUHOOK_CONFIG"])
    config.write_text(config.read_text() + "\n# edited\n")
    assert "gpuhook.runtime.shim" in create(env, plain, "edited")[0]
    assert create(env, plain, "fast-again")[0] == FAST_PATH
    # A spec with a GPU marker never takes the fast path.
    gpu = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"])
    assert "gpuhook.pipeline.flow" in create(env, gpu, "gpu")[0]


def _assert_light(modules: set[str], allow: frozenset[str] = frozenset()) -> None:
    assert not (modules & (HEAVY - allow)), modules & HEAVY
    assert not (modules & SLOW_STDLIB), modules & SLOW_STDLIB


def test_full_paths_import_nothing_heavy(
    node: FakeNode, containers: Containers, tmp_path: Path, fake_node_factory: object
) -> None:
    env, _ = recorder_env(node, tmp_path)
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
        node, tmp_path / "k8s", policy={"kubernetes": {"checkpoint": str(checkpoint)}}
    )
    create(k8s_env, containers.bundle(), "warm-k8s")
    cases = {
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
    # The non-GPU full path (fast-path cache gone, config cache kept) is light too.
    plain = containers.bundle()
    for cache in Path("/run/gpuhook/config").glob(f"**{env['GPUHOOK_CONFIG']}/fastpath"):
        cache.unlink()
    modules, _ = create(env, plain, "plain-full")
    assert "gpuhook.runtime.shim" in modules
    _assert_light(modules)


def test_pynvml_only_on_a_lazy_inventory_refresh(
    fake_node_factory: object, containers: Containers, tmp_path: Path
) -> None:
    own: FakeNode = fake_node_factory("--gpus", "2")  # type: ignore[operator]
    env, _ = recorder_env(own, tmp_path)
    create(env, containers.bundle(), "warm")
    modules, _ = create(env, containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"]), "refresh")
    assert "gpuhook.inventory.nvml" in modules  # no inventory yet: refreshed under the lock
    assert not (modules & (HEAVY - {"pynvml"}))
    modules, _ = create(env, containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"]), "cached")
    assert "gpuhook.pipeline.flow" in modules
    _assert_light(modules)
