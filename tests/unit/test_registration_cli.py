"""`gpuhook runtime configure|unconfigure` as an operator runs it: what it prints, what it
writes (backups, modes, idempotence), what it refuses and leaves untouched."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from gpuhook.cli.commands import run

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "registration"
RT = "/usr/bin/gpuhook-runtime"


@pytest.fixture(autouse=True)
def _no_containerd_on_path(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's containerd (1.6 here, maybe none in CI) must not check these files:
    tests/unit/test_registration_dump.py gives the check a containerd of its own."""
    monkeypatch.setenv("PATH", str(tmp_path_factory.mktemp("empty-path")))


def gpuhook(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".gpuhook-backup-*"))


def test_docker_configure_writes_backs_up_and_says_what_to_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = tmp_path / "daemon.json"
    original = (SAMPLES / "daemon.json").read_text()
    daemon.write_text(original)
    daemon.chmod(0o600)
    code, out, _ = gpuhook(
        capsys, "runtime", "configure", "--runtime", "docker", "--config", str(daemon),
        "--set-as-default",
    )  # fmt: skip
    assert code == 0
    [backup] = backups(daemon)
    assert out.splitlines() == [
        f"docker: added runtime gpuhook -> {RT}",
        "docker: default runtime: runc -> gpuhook",
        f"wrote {daemon} (previous file saved as {backup})",
        "restart docker to apply: systemctl restart docker",
    ]
    assert backup.read_text() == original
    assert backup.stat().st_mode & 0o777 == 0o600
    assert daemon.stat().st_mode & 0o777 == 0o600  # the old file's mode
    data = json.loads(daemon.read_text())
    assert data["default-runtime"] == "gpuhook" and data["runtimes"]["gpuhook"] == {"path": RT}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.json", backup.name]


def test_second_run_changes_nothing_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = tmp_path / "daemon.json"
    args = ("runtime", "configure", "--runtime", "docker", "--config", str(daemon))
    assert gpuhook(capsys, *args)[0] == 0
    written = daemon.read_bytes()
    stat = daemon.stat()
    code, out, _ = gpuhook(capsys, *args)
    assert code == 0
    assert out.splitlines()[-1] == (
        f"{daemon}: gpuhook is already registered; nothing changed, nothing written"
    )
    assert daemon.read_bytes() == written and daemon.stat().st_mtime_ns == stat.st_mtime_ns
    assert backups(daemon) == []  # the first run created the file: nothing to back up


def test_dry_run_prints_the_diff_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    original = (SAMPLES / "containerd-1.6-default.toml").read_text()
    config.write_text(original)
    code, out, _ = gpuhook(
        capsys, "runtime", "configure", "--runtime", "containerd", "--config", str(config),
        "--set-as-default", "--dry-run",
    )  # fmt: skip
    assert code == 0
    assert f"--- {config} (now)\n+++ {config} (gpuhook)\n" in out
    assert '-      default_runtime_name = "runc"\n+      default_runtime_name = "gpuhook"\n' in out
    assert '+        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook]\n' in out
    assert out.splitlines()[-1] == (
        "dry run: nothing written (applying it needs: systemctl restart containerd)"
    )
    assert config.read_text() == original and backups(config) == []


@pytest.mark.parametrize(
    ("engine", "name", "text", "message"),
    [
        ("docker", "daemon.json", '{"debug": true,\n', "malformed JSON: Expecting property name"),
        ("containerd", "config.toml", "version = 2\n[plugins\n", "malformed TOML: "),
        ("containerd", "config.toml", "[grpc]\n", "no 'version = 2' (containerd 1.x)"),
    ],
)
@pytest.mark.parametrize("action", ["configure", "unconfigure"])
def test_malformed_file_is_refused_with_one_line_and_left_untouched(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    engine: str,
    name: str,
    text: str,
    message: str,
    action: str,
) -> None:
    path = tmp_path / name
    path.write_text(text)
    code, out, err = gpuhook(capsys, "runtime", action, "--runtime", engine, "--config", str(path))
    assert code == 1
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith(f"gpuhook: {path}: {message}"), err
    assert out == ""
    assert path.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_unconfigure_gives_back_the_original(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    original = (SAMPLES / "containerd-2.0-v3.toml").read_text()
    config.write_text(original)
    base = ("--runtime", "containerd", "--config", str(config))
    assert gpuhook(capsys, "runtime", "configure", *base, "--set-as-default")[0] == 0
    assert (
        tomllib.loads(config.read_text())["plugins"]["io.containerd.cri.v1.runtime"]["containerd"][
            "default_runtime_name"
        ]
        == "gpuhook"
    )
    code, out, _ = gpuhook(capsys, "runtime", "unconfigure", *base)
    assert code == 0
    assert out.splitlines()[:2] == [
        "containerd: removed CRI runtime gpuhook",
        "containerd: default runtime: gpuhook -> runc",
    ]
    assert out.splitlines()[-1] == "restart containerd to apply: systemctl restart containerd"
    assert config.read_text() == original
    assert len(backups(config)) == 2
    code, out, _ = gpuhook(capsys, "runtime", "unconfigure", *base)
    assert code == 0 and out.splitlines() == [
        f"{config}: gpuhook is not registered; nothing changed, nothing written"
    ]


def test_containerd_drop_in_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    dropin = tmp_path / "conf.d" / "gpuhook.toml"
    original = (SAMPLES / "containerd-1.6-default.toml").read_text()
    config.write_text(original)
    base = ("--runtime", "containerd", "--config", str(config), "--drop-in", str(dropin))
    code, out, _ = gpuhook(capsys, "runtime", "configure", *base, "--set-as-default")
    assert code == 0, out
    assert tomllib.loads(config.read_text())["imports"] == [str(dropin)]
    data = tomllib.loads(dropin.read_text())
    cri = data["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["default_runtime_name"] == "gpuhook"
    assert cri["containerd"]["runtimes"]["gpuhook"]["options"]["BinaryName"] == RT
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.6"  # the copied section
    assert f"wrote {dropin} (new file)" in out.splitlines()
    code, out, _ = gpuhook(capsys, "runtime", "unconfigure", *base)
    assert code == 0
    assert config.read_text() == original
    assert not dropin.exists()
    [saved] = backups(dropin)
    assert f"removed {dropin} (saved as {saved})" in out.splitlines()


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    daemon = tmp_path / "daemon.json"
    code, _, err = gpuhook(
        capsys, "runtime", "configure", "--runtime", "docker", "--config", str(daemon),
        "--drop-in", str(tmp_path / "x"),
    )  # fmt: skip
    assert (code, err) == (2, "gpuhook: --drop-in: only containerd imports drop-in files\n")
    code, _, err = gpuhook(
        capsys, "runtime", "configure", "--runtime", "docker", "--config", str(daemon),
        "--runtime-path", "gpuhook-runtime",
    )  # fmt: skip
    assert code == 2 and "give an absolute path" in err
    code, _, err = gpuhook(
        capsys, "runtime", "configure", "--runtime", "docker", "--config", str(daemon),
        "--runtime-name", "runc",
    )  # fmt: skip
    assert (code, err) == (1, "gpuhook: runtime name 'runc' is reserved for runc itself\n")
    code, _, err = gpuhook(capsys, "runtime", "configure", "--runtime", "crio")
    assert code == 2 and "'crio' is not one of 'docker', 'containerd', 'podman'" in err
    assert not daemon.exists()


def test_warns_when_the_runtime_is_not_installed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = tmp_path / "daemon.json"
    missing = str(tmp_path / "nope" / "gpuhook-runtime")
    code, _, err = gpuhook(
        capsys, "runtime", "configure", "--runtime", "docker", "--config", str(daemon),
        "--runtime-path", missing,
    )  # fmt: skip
    assert code == 0
    assert err == (
        f"warning: {missing} is not an executable file here; docker cannot start containers "
        "through runtime gpuhook until it is\n"
    )
    exe = tmp_path / "gpuhook-runtime"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert os.access(exe, os.X_OK)
    code, _, err = gpuhook(
        capsys, "runtime", "configure", "--runtime", "docker", "--config", str(daemon),
        "--runtime-path", str(exe),
    )  # fmt: skip
    assert code == 0 and err == ""


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ("containerd github.com/containerd/containerd v1.7.12 71909c1\n", 1),
        ("containerd github.com/containerd/containerd/v2 v2.0.2 c507a0257ea\n", 2),
        ("containerd containerd.io 1.6.33 d2d58213\n", 1),
        ("containerd github.com/containerd/containerd/v2 2.1.0 abc\n", 2),
        ("containerd: unknown flag\n", 1),
        ("", 1),
    ],
)
def test_containerd_major_of_its_version_line(output: str, major: int) -> None:
    from gpuhook.engines.configure import major_of

    assert major_of(output) == major
