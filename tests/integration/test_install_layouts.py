"""hook.path unset: the createContainer hook runs the gpuhook installed beside the running
gpuhook-runtime, for each install layout (real runc): ``make build``'s dispatchers
(build/bin, as the .deb's in /usr/bin) and a pip install's console scripts (a virtualenv's bin).
Before, the default was /usr/bin/gpuhook, and a pip install's GPU containers failed to start.
The form gpuhook-runtime writes runs in the gpuhook-runtime beside that gpuhook (the static
dispatcher runs it itself; a pip install's console script hands it to Python)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import testbed

from tests.conftest import Containers, FakeNode

pytestmark = [pytest.mark.slow, pytest.mark.root]

SRC = Path(__file__).resolve().parents[2] / "src"

CONSOLE_SCRIPT = """#!{python}
# what pip writes for [project.scripts] (plus this tree on sys.path: no install needed)
import sys
sys.path.insert(0, {src!r})
from {module} import {function}
if __name__ == "__main__":
    sys.exit({function}())
"""


def venv_bin(folder: Path) -> Path:
    """A virtualenv-style bin folder with pip's console scripts gpuhook and gpuhook-runtime."""
    folder.mkdir(parents=True)
    for name, module, function in (
        ("gpuhook", "gpuhook.__main__", "main"),
        ("gpuhook-runtime", "gpuhook.runtime.shim", "console_main"),
    ):
        script = folder / name
        script.write_text(
            CONSOLE_SCRIPT.format(
                python=sys.executable, src=str(SRC), module=module, function=function
            )
        )
        script.chmod(0o755)
    return folder


def build_bin_copy(folder: Path) -> Path:
    """The dispatchers of build/bin in a folder of their own, gpuhook-runtime reached through
    a link from elsewhere (the hook is found beside the link's target)."""
    folder.mkdir(parents=True)
    for name in ("gpuhook", "gpuhook-runtime"):
        shutil.copy2(Path(testbed.RUNTIME).parent / name, folder / name)
    return folder


@pytest.mark.parametrize("level", ["info", "debug"])
@pytest.mark.parametrize("layout", ["venv-bin", "sh-dispatchers"])
def test_gpu_container_runs_the_hook_beside_its_runtime(
    node: FakeNode, containers: Containers, tmp_path: Path, layout: str, level: str
) -> None:
    """At an operator's log level the hook's program is gpuhook-runtime; at debug level (Python
    logs every refresh) the gpuhook beside it."""
    if layout == "venv-bin":
        bindir = venv_bin(tmp_path / "venv" / "bin")
        runtime = str(bindir / "gpuhook-runtime")
    else:
        bindir = build_bin_copy(tmp_path / "opt" / "gpuhook" / "bin")
        (tmp_path / "links").mkdir()
        runtime = str(tmp_path / "links" / "gpuhook-runtime")
        os.symlink(bindir / "gpuhook-runtime", runtime)
    env = node.variant(tmp_path, hook={"path": None}, log={"level": level})
    bundle = containers.bundle(
        args=("/bin/sh", "-c", testbed.PROBE), env=["NVIDIA_VISIBLE_DEVICES=1"]
    )
    out = containers.run(bundle, env, runtime=runtime)
    assert out.returncode == 0, out.stderr
    seen = testbed.parse_probe(out.stdout)
    assert "/dev/nvidia1" in seen["dev"]
    # the hook refreshed the container's ld.so.cache: the injected libraries are listed
    assert any("libcuda.so.1 => /usr/local/gpuhook/lib/" in line for line in seen["ldconfig"])
    spec = json.loads((bundle / "config.json").read_text())
    paths = {hook["path"] for hook in spec["hooks"]["createContainer"]}
    assert paths == {str(bindir / ("gpuhook-runtime" if level == "info" else "gpuhook"))}


def test_doctor_says_which_gpuhook_the_hook_runs(node: FakeNode, tmp_path: Path) -> None:
    env = node.variant(tmp_path, hook={"path": None})
    bindir = venv_bin(tmp_path / "venv" / "bin")
    for gpuhook, source in (
        (str(bindir / "gpuhook"), f"hook.path unset: beside {bindir / 'gpuhook'}"),
        (testbed.GPUHOOK, f"hook.path unset: beside {testbed.GPUHOOK}"),
    ):
        out = run_cli([gpuhook, "doctor", "-o", "json"], env)
        hook = next(r for r in json.loads(out)["checks"] if r["check"] == "hook")
        assert hook["status"] == "pass"
        folder = Path(gpuhook).parent
        assert hook["message"].startswith(
            f"{folder / 'gpuhook-runtime'} hook update-ldcache (the containers gpuhook-runtime "
            f"creates); {folder / 'gpuhook'} hook update-ldcache ({source}) for CDI specs"
        )
    explicit = node.gpuhook("doctor", "-o", "json")  # the node's config sets hook.path
    hook = next(r for r in json.loads(explicit.stdout)["checks"] if r["check"] == "hook")
    assert f"(hook.path in {node.config})" in hook["message"]


def run_cli(argv: list[str], env: dict[str, str]) -> str:
    import subprocess

    out = subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, text=True, check=False, timeout=120
    )
    assert out.returncode in (0, 1), out.stderr  # doctor: 1 when some other check fails
    return out.stdout
