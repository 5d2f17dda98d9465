"""gpuhook-runtime as a runtime: passthrough, --version, error reporting, atomic spec writes,
bad bundles, the lazy inventory refresh, and `gpuhook inspect spec`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import testbed

from gpuhook.runtime import ocispec
from tests import factories as f
from tests.conftest import Containers, FakeNode, make_fake_node, recorder_env

pytestmark = pytest.mark.root


def runtime(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [testbed.RUNTIME, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=cwd,
        check=False,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--root", "/r", "kill", "ctr", "9"],
        ["--log", "/tmp/x.log", "--log-format=json", "delete", "--force", "ctr"],
        ["state", "create"],  # "create" as an id: a false positive of the sh scan
        ["list"],
    ],
)
def test_passthrough_keeps_argv_and_exit_code(
    node: FakeNode, tmp_path: Path, argv: list[str]
) -> None:
    env, out = recorder_env(node, tmp_path)
    runtime("list", env=env)  # first call through Python compiles the config cache
    result = runtime(*argv, env=env)
    assert result.returncode == 42
    assert out.read_text().splitlines() == argv
    assert result.stdout == "" and result.stderr == ""


def test_create_passes_argv_unchanged(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env, out = recorder_env(node, tmp_path)
    bundle = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"])
    argv = [
        "--root",
        "/r",
        "--log",
        str(tmp_path / "log.json"),
        "create",
        "--bundle",
        str(bundle),
        "ctr",
    ]
    result = runtime(*argv, env=env)
    assert result.returncode == 42, result.stderr
    assert out.read_text().splitlines() == argv


def test_version_names_itself_and_the_runtime(node: FakeNode) -> None:
    result = runtime("--version", env=node.env)
    assert result.returncode == 0
    first, *rest = result.stdout.splitlines()
    assert first.startswith("gpuhook-runtime 0.1.0 (gpuhook), wrapping /")
    assert any(line.startswith("runc version") for line in rest)


def test_error_goes_to_stderr_and_runc_log(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    bundle = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=GPU-nope"])
    log = tmp_path / "log.json"
    result = runtime(
        "--log",
        str(log),
        "--log-format",
        "json",
        "create",
        "--bundle",
        str(bundle),
        "c1",
        env=node.env,
    )
    assert result.returncode == 1
    assert (
        result.stderr == "gpuhook: env NVIDIA_VISIBLE_DEVICES: unknown GPU UUID GPU-nope "
        "(this node has GPUs 0-7)\n"
    )
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error" and entry["msg"] == result.stderr.strip()
    text_log = tmp_path / "log.txt"
    runtime("--log", str(text_log), "create", "-b", str(bundle), "c2", env=node.env)
    assert (
        'level=error msg="gpuhook: env NVIDIA_VISIBLE_DEVICES: unknown GPU UUID'
        in text_log.read_text()
    )


def test_missing_bundle_one_line(node: FakeNode, tmp_path: Path) -> None:
    result = runtime("create", "--bundle", str(tmp_path / "nope"), "c1", env=node.env)
    assert result.returncode == 1
    assert result.stderr == f"gpuhook: bundle {tmp_path / 'nope'} does not exist\n"


def test_malformed_config_json_one_line(node: FakeNode, tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"')
    result = runtime("create", "--bundle", str(bundle), "c1", env=node.env)
    assert result.returncode == 1
    assert result.stderr.startswith(f"gpuhook: malformed {bundle}/config.json: ")
    assert result.stderr.count("\n") == 1


def test_read_only_bundle(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    """A GPU container whose bundle cannot be written fails with one line; a non-GPU container
    in the same read-only bundle starts."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    gpu = containers.bundle("gpu", env=["NVIDIA_VISIBLE_DEVICES=0"])
    subprocess.run(["mount", "--bind", str(gpu), str(mnt)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)], check=True)
        result = containers.run(mnt, node.env)
        assert result.returncode == 1
        assert result.stderr == f"gpuhook: cannot write {mnt}/config.json: Read-only file system\n"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    plain = containers.bundle("plain", args=("/bin/true",))
    subprocess.run(["mount", "--bind", str(plain), str(mnt)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)], check=True)
        result = containers.run(mnt, node.env)
        assert result.returncode == 0, result.stderr
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_failure_between_write_and_rename_leaves_old_spec(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    original = json.dumps(f.spec(env=["A=1"])).encode()
    (bundle / "config.json").write_bytes(original)
    (bundle / "config.json").chmod(0o600)

    def crash() -> None:
        raise KeyboardInterrupt  # the shim killed between fsync and rename

    with pytest.raises(KeyboardInterrupt):
        ocispec.write(str(bundle), {"new": True}, before_replace=crash)
    assert (bundle / "config.json").read_bytes() == original
    assert sorted(p.name for p in bundle.iterdir()) == ["config.json"]
    ocispec.write(str(bundle), {"new": True})
    assert json.loads((bundle / "config.json").read_text()) == {"new": True}
    assert (bundle / "config.json").stat().st_mode & 0o777 == 0o600  # same mode


def test_leftover_temp_of_a_killed_writer_is_removed(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "config.json").write_text("{}")
    leftover = bundle / ".config.json.gpuhook-tmp-999999-abcd"
    leftover.write_text("{partial")
    ocispec.write(str(bundle), {"a": 1})
    assert sorted(p.name for p in bundle.iterdir()) == ["config.json"]


def test_missing_inventory_is_refreshed_once_by_the_shim(
    tmp_path: Path, containers: Containers
) -> None:
    node = make_fake_node(tmp_path / "n", "--gpus", "2")
    assert not (node.root / "state" / "inventory.json").exists()
    seen = containers.probe(node.env, env=["NVIDIA_VISIBLE_DEVICES=1"])
    assert seen["returncode"] == 0, seen["stderr"]
    assert "/dev/nvidia1" in seen["dev"]
    assert (node.root / "state" / "inventory.json").exists()


def test_no_nvml_on_the_create_path(node: FakeNode, containers: Containers) -> None:
    """With a fresh inventory the create path never loads NVML: prove it by hiding the
    library (LD_LIBRARY_PATH unset): the GPU container still starts."""
    env = {k: v for k, v in node.env.items() if k != "LD_LIBRARY_PATH"}
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=2"])
    assert seen["returncode"] == 0, seen["stderr"]
    assert "/dev/nvidia2" in seen["dev"]


def test_inspect_spec_outputs(node: FakeNode, containers: Containers) -> None:
    bundle = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    before = (bundle / "config.json").read_bytes()
    out = node.gpuhook("inspect", "spec", "--bundle", str(bundle), "--output", "json")
    assert out.returncode == 0, out.stderr
    view: dict[str, Any] = json.loads(out.stdout)
    assert view["decision"]["refused"] is True
    assert view["kubernetes"]["pod_name"] == "trainer"
    assert view["edits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert (bundle / "config.json").read_bytes() == before  # a dry run
    diff = node.gpuhook("inspect", "spec", str(bundle / "config.json"), "--diff")
    assert diff.returncode == 0
    assert '-      "NVIDIA_VISIBLE_DEVICES=all"' in diff.stdout
    assert '+      "NVIDIA_VISIBLE_DEVICES=void"' in diff.stdout
    table = node.gpuhook("inspect", "spec", "-b", str(bundle), "-o", "table")
    assert "refused" in table.stdout and "kubelet_internal_checkpoint not found" in table.stdout
    missing = node.gpuhook("inspect", "spec")
    assert missing.returncode == 2 and missing.stderr.startswith("gpuhook: inspect spec: give")


def test_non_gpu_container_starts_with_broken_config(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("log: [\n")
    env = {**node.env, "GPUHOOK_CONFIG": str(broken)}
    plain = containers.bundle(args=("/bin/true",))
    assert containers.run(plain, env).returncode == 0
    gpu = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"])
    result = containers.run(gpu, env)
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpuhook: invalid config {broken}: YAML syntax error")
