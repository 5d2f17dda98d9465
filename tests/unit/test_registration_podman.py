"""podman registration: containers.conf gets an [engine.runtimes] entry and, as the default,
[engine] runtime; the same guarantees as docker and containerd (backup, atomic, idempotent,
comments kept, malformed refused untouched)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpuhook.cli.commands import run
from gpuhook.engines import podman
from gpuhook.errors import RegistrationError

SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "registration" / "containers.conf"
RT = "/usr/bin/gpuhook-runtime"


def gpuhook(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_configure_keeps_every_comment_and_key_and_is_idempotent() -> None:
    text = SAMPLE.read_text()
    edit = podman.podman_configure(text, set_default=True)
    assert edit.changed
    data = tomllib.loads(edit.text)
    before = tomllib.loads(text)
    assert data["engine"]["runtimes"]["gpuhook"] == [RT]
    assert data["engine"]["runtime"] == "gpuhook"
    before["engine"]["runtimes"]["gpuhook"] = [RT]
    before["engine"]["runtime"] = "gpuhook"
    assert data == before
    comments = [line for line in text.splitlines() if line.strip().startswith("#")]
    assert all(c in edit.text.splitlines() for c in comments)
    again = podman.podman_configure(edit.text, set_default=True)
    assert not again.changed and again.text == edit.text


def test_unconfigure_gives_the_file_back() -> None:
    text = SAMPLE.read_text()
    configured = podman.podman_configure(text, set_default=True).text
    edit = podman.podman_unconfigure(configured)
    after = tomllib.loads(edit.text)
    expected = tomllib.loads(text)
    del expected["engine"]["runtime"]  # podman's own default applies again
    assert after == expected
    assert not podman.podman_unconfigure(edit.text).changed


def test_configure_without_default_leaves_the_runtime_key() -> None:
    edit = podman.podman_configure(SAMPLE.read_text(), runtime_path="/opt/gpuhook/bin/rt")
    data = tomllib.loads(edit.text)
    assert data["engine"]["runtime"] == "crun"
    assert data["engine"]["runtimes"]["gpuhook"] == ["/opt/gpuhook/bin/rt"]


def test_new_file_holds_only_gpuhooks_keys() -> None:
    edit = podman.podman_configure(None, set_default=True)
    assert tomllib.loads(edit.text) == {
        "engine": {"runtime": "gpuhook", "runtimes": {"gpuhook": [RT]}}
    }
    assert not podman.podman_unconfigure(None).changed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[engine\nruntime = 1\n", "malformed TOML"),
        ("engine = 3\n", "'engine' is not a table"),
        ("[engine]\nruntimes = [1]\n", "'engine.runtimes' is not a table"),
        ("[engine]\nruntime = 1\n", "'engine.runtime' is not a string"),
    ],
)
def test_malformed_is_refused(text: str, message: str) -> None:
    with pytest.raises(RegistrationError, match=message):
        podman.podman_configure(text, set_default=True)


def test_cli_backs_up_writes_and_needs_no_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "containers.conf"
    conf.write_text(SAMPLE.read_text())
    conf.chmod(0o640)
    args = ("runtime", "configure", "--runtime", "podman", "--config", str(conf))
    code, out, _ = gpuhook(capsys, *args, "--set-as-default")
    assert code == 0, out
    [backup] = sorted(tmp_path.glob("containers.conf.gpuhook-backup-*"))
    assert backup.read_text() == SAMPLE.read_text()
    assert conf.stat().st_mode & 0o777 == 0o640
    assert out.splitlines()[-1] == f"podman reads {conf} on every command: nothing to restart"
    code, out, _ = gpuhook(capsys, *args, "--set-as-default")
    assert code == 0 and "nothing changed, nothing written" in out
    code, out, _ = gpuhook(
        capsys, "runtime", "unconfigure", "--runtime", "podman", "--config", str(conf)
    )
    assert code == 0
    assert "runtime" not in tomllib.loads(conf.read_text())["engine"]


def test_cli_refuses_a_malformed_file_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "containers.conf"
    conf.write_text("[engine\n")
    code, _, err = gpuhook(
        capsys, "runtime", "configure", "--runtime", "podman", "--config", str(conf)
    )
    assert code == 1 and "malformed TOML" in err and "nothing written" in err
    assert conf.read_text() == "[engine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["containers.conf"]
