"""The compiled config cache names the runtime that gpuhook-runtime execs as root, both from
Python (compiled.json) and from the dispatcher (the ``runtime`` pointer). Only a cache written
by root (or the running user) and writable by no one else is acted on (SECURITY.md, class E)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import testbed

from gpuhook.config import cache as config_cache
from tests.conftest import FakeNode

pytestmark = pytest.mark.root

NOBODY = 65534
RECORDER = "#!/bin/sh\necho {name} > {out}\nexit 42\n"


def recorders(tmp_path: Path) -> tuple[str, str, Path]:
    out = tmp_path / "who-ran.txt"
    paths = []
    for name in ("configured", "planted"):
        path = tmp_path / name
        path.write_text(RECORDER.format(name=name, out=out))
        path.chmod(0o755)
        paths.append(str(path))
    return paths[0], paths[1], out


def passthrough(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A non-create call: the dispatcher execs the cached runtime without Python."""
    return subprocess.run(
        [testbed.RUNTIME, "--root", "/r", "kill", "ctr", "9"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def cached(node: FakeNode, tmp_path: Path) -> tuple[dict[str, str], Path, str, Path]:
    """A config whose runtime is the 'configured' recorder, its cache compiled; returns the env,
    the cache folder, the 'planted' recorder and the file both recorders write their name to."""
    configured, planted, out = recorders(tmp_path)
    env = node.variant(tmp_path, runtime={"path": configured})
    assert passthrough(env).returncode == 42  # the first call compiles the cache
    cache = Path(config_cache.cache_dir_for(env["GPUHOOK_CONFIG"]))
    assert (cache / "runtime").read_text().splitlines()[0] == configured
    return env, cache, planted, out


def plant_pointer(pointer: Path, planted: str) -> None:
    lines = pointer.read_text().splitlines()
    pointer.write_text("\n".join([planted, *lines[1:]]) + "\n")


def test_the_runtime_pointer_is_used(cached: tuple[dict[str, str], Path, str, Path]) -> None:
    """The control: a root-owned pointer is what the dispatcher execs."""
    env, cache, planted, out = cached
    plant_pointer(cache / "runtime", planted)
    assert passthrough(env).returncode == 42
    assert out.read_text() == "planted\n"


@pytest.mark.parametrize(
    "how", ["owner", "relative", "group-writable", "world-writable", "symlink"]
)
def test_an_untrusted_runtime_pointer_is_ignored(
    cached: tuple[dict[str, str], Path, str, Path], how: str
) -> None:
    """Issue 16.6: the dispatcher refuses what gpuhook.config.cache.trusted_file refuses."""
    env, cache, planted, out = cached
    pointer = cache / "runtime"
    plant_pointer(pointer, planted)
    if how == "owner":
        os.chown(pointer, NOBODY, NOBODY)
    elif how == "group-writable":
        pointer.chmod(0o664)
    elif how == "world-writable":
        pointer.chmod(0o646)
    elif how == "symlink":
        real = cache.parent / "elsewhere"
        pointer.rename(real)
        pointer.symlink_to(real)
    else:
        plant_pointer(pointer, "planted")  # a bare name would be looked up in PATH
        env = {**env, "PATH": f"{Path(planted).parent}:{os.environ['PATH']}"}
    assert passthrough(env).returncode == 42
    assert out.read_text() == "configured\n"


def test_python_writes_an_untrusted_pointer_anew(
    cached: tuple[dict[str, str], Path, str, Path],
) -> None:
    """A pointer others could write sends the call to Python, which runs the configured runtime
    and writes the pointer anew (a new file: the planted text and the loose mode are gone)."""
    env, cache, planted, out = cached
    pointer = cache / "runtime"
    assert pointer.stat().st_mode & 0o7777 == config_cache.POINTER_MODE
    plant_pointer(pointer, planted)
    pointer.chmod(0o664)
    assert passthrough(env).returncode == 42
    assert out.read_text() == "configured\n"
    assert pointer.stat().st_mode & 0o7777 == config_cache.POINTER_MODE
    assert pointer.read_text().splitlines()[0] != planted
    assert passthrough(env).returncode == 42  # and the dispatcher uses it again
    assert out.read_text() == "configured\n"


def plant_compiled(cache: Path, planted: str) -> Path:
    """Point compiled.json's runtime at ``planted`` and drop the pointer, so that the
    dispatcher goes through Python, which reads compiled.json."""
    compiled = cache / "compiled.json"
    configured = str(Path(planted).parent / "configured")
    text = compiled.read_text()
    assert f'"runtime":"{configured}"' in text
    compiled.write_text(text.replace(f'"runtime":"{configured}"', f'"runtime":"{planted}"'))
    (cache / "runtime").unlink()
    return compiled


def test_the_compiled_config_is_used(cached: tuple[dict[str, str], Path, str, Path]) -> None:
    env, cache, planted, out = cached
    plant_compiled(cache, planted)
    assert passthrough(env).returncode == 42
    assert out.read_text() == "planted\n"


@pytest.mark.parametrize("how", ["owner", "group-writable", "world-writable"])
def test_an_untrusted_compiled_config_is_ignored(
    cached: tuple[dict[str, str], Path, str, Path], how: str
) -> None:
    env, cache, planted, out = cached
    compiled = plant_compiled(cache, planted)
    if how == "owner":
        os.chown(compiled, NOBODY, NOBODY)
    else:
        compiled.chmod(0o664 if how == "group-writable" else 0o646)
    assert passthrough(env).returncode == 42
    assert out.read_text() == "configured\n"  # recompiled from the config file itself
