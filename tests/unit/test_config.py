"""Config: one-line errors with file and key path (exit 2), defaults, the compiled cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhook.config import cache as config_cache
from gpuhook.config import loading as config_loading
from gpuhook.config import locate
from gpuhook.config.types import ENV_CACHE_DIR, ENV_DEBUG, Config
from gpuhook.errors import EXIT_CONFIG, ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("driver_root: [unclosed\n", "YAML syntax error: line 2, column 1"),
        ("bogus: 1\n", "bogus: unknown key"),
        ("policy:\n  kubernetes:\n    nope: x\n", "policy.kubernetes.nope: unknown key"),
        ("log:\n  level: loud\n", "log.level: 'loud' is not one of"),
        (
            "inventory:\n  auto_refresh: maybe\n",
            "inventory.auto_refresh: must be boolean, not a string",
        ),
        ("driver_root: relative/path\n", "driver_root: 'relative/path' does not match"),
        ("- a\n- b\n", "the top level must be a mapping, not a list"),
        ("runtime:\n  path: 1\n  path: 2\n", "duplicate key 'path'"),
        (
            "inject:\n  default_capabilities: [compute, warp]\n",
            "inject.default_capabilities[1]: 'warp' is not one of",
        ),
    ],
)
def test_bad_config_one_line_with_key_path(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config_loading.load(path, use_cache=False)
    line = str(info.value)
    assert message in line, line
    assert line.startswith(f"invalid config {path}: ")
    assert "\n" not in line and info.value.exit_code == EXIT_CONFIG


def test_defaults_fill_in(tmp_path: Path) -> None:
    cfg = config_loading.load(write(tmp_path, "state_dir: /tmp/x\n"), use_cache=False)
    assert cfg.state_dir == "/tmp/x" and cfg.inventory_path == "/tmp/x/inventory.json"
    assert cfg.policy.kubernetes_env_requests == "verify"
    assert cfg.default_capabilities == ("compute", "utility")


def test_example_file_matches_the_defaults() -> None:
    """config/config.yaml.example documents every key with its default value."""
    example = yaml.safe_load((REPO / "config" / "config.yaml.example").read_text())
    assert example == config_loading.DEFAULTS
    config_loading.validate_data("example", example)


def test_missing_named_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        config_loading.load(str(tmp_path / "nope.yaml"))


def test_compiled_cache_is_used_and_invalidated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path / "cache"))
    path = write(tmp_path, "state_dir: /one\n")
    assert config_loading.load(path).state_dir == "/one"
    cache = Path(config_cache.cache_dir_for(path))
    assert (cache / "compiled.json").exists()
    # the dispatcher's pointer: runtime, state folder, log level, runtime service's socket
    assert (cache / "runtime").read_text().splitlines() == [
        locate.resolve_runtime(""),
        "/one",
        "info",
        "/run/gpuhook/runtime.sock",
    ]
    calls: list[str] = []

    def compile_file(path: str) -> dict[str, Any]:
        calls.append(path)
        return {}

    monkeypatch.setattr(config_loading, "compile_file", compile_file)
    assert config_loading.load(path).state_dir == "/one" and not calls  # served from the cache
    monkeypatch.undo()
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path / "cache"))
    write(tmp_path, "state_dir: /two\n")
    os.utime(path, ns=(1, 1))  # a different mtime: the cache no longer matches
    assert config_loading.load(path).state_dir == "/two"


def test_the_cache_folder_is_gpuhook_cache_dir_and_the_hooks_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPUHOOK_CACHE_DIR names the cache folder for every executable (the runtime, its hook, the
    CLI); unset, it is /run/gpuhook/config."""
    path = write(tmp_path, "state_dir: /one\n")
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path / "run"))
    cfg = config_loading.load(path)
    assert (tmp_path / "run" / path.lstrip("/") / "compiled.json").is_file()
    assert (tmp_path / "run" / path.lstrip("/") / config_cache.POINTER_NAME).is_file()
    assert f"{ENV_CACHE_DIR}={tmp_path / 'run'}" in cfg.propagated_env
    monkeypatch.delenv(ENV_CACHE_DIR)  # (nothing is loaded now: it would write the host's /run)
    assert config_cache.cache_dir_for(path) == "/run/gpuhook/config" + path
    unset = Config(path, cfg.data, cfg.runtime)
    assert not any(e.startswith(ENV_CACHE_DIR) for e in unset.propagated_env)


@pytest.mark.parametrize("value", ["relative/cache", "/run//x", "/run/x/../y", "/run/x/."])
def test_a_cache_dir_that_is_not_a_plain_absolute_path_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """The dispatcher reads no pointer under such a folder (plain_path) and Python says why."""
    path = write(tmp_path, "state_dir: /one\n")
    monkeypatch.setenv(ENV_CACHE_DIR, value)
    with pytest.raises(ConfigError) as info:
        config_loading.load(path)
    assert str(info.value) == (
        f"invalid config {path}: {ENV_CACHE_DIR}={value!r} is not an absolute path without //, "
        ". or .. parts"
    )


def test_the_pointer_holds_the_files_log_level_not_the_writers_debug_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`GPUHOOK_DEBUG=1 gpuhook doctor` after a config edit must not turn debug on for every
    later create on the node: the dispatcher reads each call's own switch."""
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv(ENV_DEBUG, "1")
    path = write(tmp_path, "state_dir: /one\n")
    cfg = config_loading.load(path)
    assert cfg.log_level == "debug"  # this process logs at debug
    pointer = Path(config_cache.cache_dir_for(path)) / "runtime"
    assert pointer.read_text().splitlines()[2] == "info"


def test_a_cache_compiled_by_a_build_with_other_keys_is_compiled_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path / "cache"))
    path = write(tmp_path, "state_dir: /one\n")
    config_loading.load(path)
    compiled = Path(config_cache.cache_dir_for(path)) / "compiled.json"
    body = json.loads(compiled.read_text())
    del body["config"]["runtime"]["service"]  # as a build that did not know the key wrote it
    body["identity"][-1] = body["identity"][-1].replace(" runtime.service", "")
    compiled.write_text(json.dumps(body))
    assert config_loading.load(path).service_socket == "/run/gpuhook/runtime.sock"
    assert json.loads(compiled.read_text())["config"]["runtime"]["service"]


def test_cli_config_validate_exit_codes(tmp_path: Path) -> None:
    gpuhook = [sys.executable, "-m", "gpuhook"]
    bad = write(tmp_path, "log:\n  level: loud\n")
    out = subprocess.run(
        [*gpuhook, "config", "validate", bad], capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert out.stderr.startswith(f"gpuhook: invalid config {bad}: log.level:")
    good = tmp_path / "good.yaml"
    good.write_text("state_dir: /tmp/x\n")
    out = subprocess.run(
        [*gpuhook, "config", "validate", str(good)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and f"{good}: valid" in out.stdout


def test_hot_path_load_imports_no_yaml_or_jsonschema(tmp_path: Path) -> None:
    path = write(tmp_path, "state_dir: /tmp/x\n")
    code = (
        "import sys; sys.path.insert(0, 'src');"
        "import os; from gpuhook.config import loading;"
        f"os.environ['GPUHOOK_CACHE_DIR'] = {str(tmp_path / 'cache')!r};"
        f"loading.load({path!r});"  # compiles, writes the cache
        "[sys.modules.pop(m) for m in list(sys.modules) if m.startswith(('yaml', 'jsonschema'))];"
        f"loading.load({path!r});"
        "print(sorted(m for m in sys.modules if m.startswith(('yaml', 'jsonschema'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == "[]"


def test_checkpoint_defaults_to_the_kubelet_dir(tmp_path: Path) -> None:
    cfg = config_loading.load(write(tmp_path, "state_dir: /tmp/x\n"), use_cache=False)
    assert cfg.policy.kubelet_dir == "/var/lib/kubelet"
    assert cfg.policy.checkpoint == "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    text = "policy:\n  kubernetes:\n    kubelet_dir: /data/kubelet\n"
    cfg = config_loading.load(write(tmp_path, text), use_cache=False)
    assert cfg.policy.checkpoint == "/data/kubelet/device-plugins/kubelet_internal_checkpoint"
    text += "    checkpoint: /x/cp\n"  # an explicit key still wins
    assert config_loading.load(write(tmp_path, text), use_cache=False).policy.checkpoint == "/x/cp"
