"""`gpuhook runtime configure --runtime containerd` with `containerd config dump`: runc's options
come from the merged config (root file and drop-ins), and an edit that containerd would not
read as meant is undone, every file restored. The containerd here is a stand-in that merges
imports key by key as containerd 2.x does; tests/integration/test_containerd2.py runs the real
containerd 2.3.4."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest

from gpuhook.cli.commands import run

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "registration"
RT = "/usr/bin/gpuhook-runtime"
CRI3 = "io.containerd.cri.v1.runtime"

# `containerd --config FILE config dump`: FILE with its imports merged key by key, printed as
# TOML. FAKE_DUMP_FAIL: fail as containerd does on a bad drop-in once gpuhook is the default;
# FAKE_DUMP_NO_TYPE: drop gpuhook's runtime_type (the merged view of toolkit#1956's drop-in).
FAKE = f"""#!{sys.executable}
import glob, os, sys, tomllib, tomlkit
path = sys.argv[sys.argv.index("--config") + 1]
def merge(a, b):
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            merge(a[k], v)
        else:
            a[k] = v
doc = tomllib.load(open(path, "rb"))
for pattern in doc.get("imports", []):
    for name in sorted(glob.glob(pattern)):
        merge(doc, tomllib.load(open(name, "rb")))
cri = doc.get("plugins", {{}}).get("{CRI3}", {{}}).get("containerd", {{}})
if os.environ.get("FAKE_DUMP_FAIL") and cri.get("default_runtime_name") == "gpuhook":
    sys.exit("containerd: drop-in config version 4 higher than root config version 3")
if os.environ.get("FAKE_DUMP_NO_TYPE"):
    cri.get("runtimes", {{}}).get("gpuhook", {{}}).pop("runtime_type", None)
print(tomlkit.dumps(doc))
"""


@pytest.fixture
def containerd(tmp_path: Path) -> str:
    exe = tmp_path / "bin" / "containerd"
    exe.parent.mkdir()
    exe.write_text(FAKE)
    exe.chmod(0o755)
    return str(exe)


def gpuhook(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run(list(args))
    out, err = capsys.readouterr()
    # gpuhook-runtime is not installed here: drop the warning that says so.
    err = "".join(line for line in err.splitlines(True) if not line.startswith("warning: "))
    return code, out, err


def node(tmp_path: Path) -> tuple[Path, Path, str]:
    """A containerd 2.x config whose runc options a drop-in sets (the root file's runc has
    SystemdCgroup = true and no Root; the drop-in says false and a Root)."""
    config = tmp_path / "config.toml"
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    original = (SAMPLES / "containerd-2.0-v3.toml").read_text()
    original = original.replace("imports = []", f"imports = ['{conf_d}/*.toml']")
    config.write_text(original)
    (conf_d / "10-runc.toml").write_text(
        f"version = 3\n[plugins.'{CRI3}'.containerd.runtimes.runc.options]\n"
        "  SystemdCgroup = false\n  Root = '/srv/runc'\n"
    )
    return config, conf_d, original


def test_the_drop_in_runtime_carries_runc_options_of_the_merged_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], containerd: str
) -> None:
    config, conf_d, original = node(tmp_path)
    dropin = conf_d / "99-gpuhook.toml"
    args = ("--runtime", "containerd", "--config", str(config), "--drop-in", str(dropin))
    code, out, err = gpuhook(
        capsys, "runtime", "configure", *args, "--set-as-default", "--containerd", containerd
    )
    assert code == 0, err
    assert config.read_text() == original  # its glob already imports the drop-in
    runtime = tomllib.loads(dropin.read_text())["plugins"][CRI3]["containerd"]["runtimes"]
    assert runtime["gpuhook"]["options"] == {
        "BinaryName": RT,
        "Root": "/srv/runc",
        "SystemdCgroup": False,
    }
    assert runtime["gpuhook"]["options"]["Root"] == "/srv/runc"
    assert runtime["gpuhook"]["options"]["SystemdCgroup"] is False  # the drop-in's, not the root's
    assert runtime["gpuhook"]["runtime_type"] == "io.containerd.runc.v2"
    assert (
        f"checked: {containerd} config dump reads runtime gpuhook -> {RT} as the default runtime"
        in out.splitlines()
    )
    code, out, err = gpuhook(capsys, "runtime", "unconfigure", *args, "--containerd", containerd)
    assert code == 0, err
    assert not dropin.exists() and config.read_text() == original
    assert f"checked: {containerd} config dump loads {config}" in out.splitlines()


def test_the_root_file_runtime_carries_runc_options_of_the_merged_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], containerd: str
) -> None:
    config, _, original = node(tmp_path)
    args = ("--runtime", "containerd", "--config", str(config), "--containerd", containerd)
    code, _, err = gpuhook(capsys, "runtime", "configure", *args, "--set-as-default")
    assert code == 0, err
    runtimes = tomllib.loads(config.read_text())["plugins"][CRI3]["containerd"]["runtimes"]
    assert runtimes["gpuhook"]["options"]["SystemdCgroup"] is False
    assert runtimes["gpuhook"]["options"]["Root"] == "/srv/runc"
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True  # the root file's runc: as it was
    assert gpuhook(capsys, "runtime", "unconfigure", *args)[0] == 0
    assert config.read_text() == original


@pytest.mark.parametrize(
    ("env", "why"),
    [
        (
            "FAKE_DUMP_FAIL",
            "containerd: drop-in config version 4 higher than root config version 3",
        ),
        ("FAKE_DUMP_NO_TYPE", "runtime gpuhook has runtime_type None, not io.containerd.runc.v2"),
    ],
)
@pytest.mark.parametrize("drop_in", [True, False])
def test_an_edit_containerd_would_not_read_is_undone(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    containerd: str,
    env: str,
    why: str,
    drop_in: bool,
) -> None:
    config, conf_d, original = node(tmp_path)
    config.chmod(0o640)
    config.write_text(original.replace(f"imports = ['{conf_d}/*.toml']", "imports = []"))
    before = config.read_bytes()
    dropin = conf_d / "new" / "99-gpuhook.toml"  # its folder too is made, then removed
    monkeypatch.setenv(env, "1")
    args = ["--runtime", "containerd", "--config", str(config), "--containerd", containerd]
    args += ["--drop-in", str(dropin)] if drop_in else []
    code, _, err = gpuhook(capsys, "runtime", "configure", *args, "--set-as-default")
    assert code == 1
    [line] = err.splitlines()
    assert line.startswith(f"gpuhook: {config}: after the edit, ") and why in line, line
    assert line.endswith("; every file restored as it was, nothing changed")
    assert config.read_bytes() == before and oct(config.stat().st_mode & 0o777) == "0o640"
    assert not dropin.exists()
    assert sorted(os.listdir(tmp_path)) == ["bin", "conf.d", "config.toml"]  # no backups left
    assert sorted(os.listdir(conf_d)) == ["10-runc.toml"]


def test_a_config_containerd_cannot_load_is_not_edited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], containerd: str
) -> None:
    config, conf_d, original = node(tmp_path)
    (conf_d / "50-broken.toml").write_text("version = 3\n[plugins\n")
    args = ("--runtime", "containerd", "--config", str(config), "--containerd", containerd)
    code, _, err = gpuhook(capsys, "runtime", "configure", *args, "--set-as-default")
    assert code == 1
    [line] = err.splitlines()
    assert line.startswith(f"gpuhook: {config}: containerd config dump: ")
    assert line.endswith("containerd cannot load the config as it is; nothing written")
    assert config.read_text() == original
