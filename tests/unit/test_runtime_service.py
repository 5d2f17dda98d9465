"""The runtime service's pure side and its edges: the wire format (every malformed request is a
decline with its reason), the shim's exec seam, what the service imports before it forks, the
CLI's refusal when the service is disabled, doctor's line, and the systemd unit."""

from __future__ import annotations

import ast
import configparser
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhook.cli import doctor, doctor_engines
from gpuhook.cli.commands import run
from gpuhook.runtime import service, shim, wire
from gpuhook.runtime.wire import DECLINE, EXEC, EXIT, MAX_REPLY, MAX_REQUEST, PROTOCOL
from tests import factories as f
from tests.conftest import systemd_verify
from tests.logcapture import paper_node

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
UNIT = REPO / "packaging" / "systemd" / "gpuhook-runtime.service"


def message(*fields: bytes) -> bytes:
    return b"".join(field + b"\0" for field in fields)


# --- the wire format ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["gpuhook-runtime"], []),
        (["/usr/bin/gpuhook-runtime", "--root", "/r", "create", "--bundle", "/b", "c1"], ["A=1"]),
        (["gpuhook-runtime", "", "--log", ""], ["EMPTY=", "EQ=a=b=c", "PATH=/usr/bin:/bin"]),
        (["gpuhook-runtime", "caf\u00e9", "\udcff"], ["K=\u00e9\udcfe"]),  # non-UTF-8 bytes too
    ],
)
def test_request_round_trip(argv: list[str], env: list[str]) -> None:
    data = wire.encode_request(argv, env)
    assert data.startswith(PROTOCOL + b"\0") and data.endswith(b"\0")
    request = wire.decode_request(data)
    assert request.argv == argv
    assert request.env == dict(e.split("=", 1) for e in env)
    assert wire.encode_request([os.fsencode(a) for a in argv], env) == data  # bytes in, too


def test_the_first_of_a_repeated_name_wins_as_for_a_process() -> None:
    request = wire.decode_request(wire.encode_request(["x"], ["A=1", "B=2", "A=3"]))
    assert request.env == {"A": "1", "B": "2"}


def test_encode_refuses_a_nul_byte() -> None:
    with pytest.raises(ValueError, match="NUL"):
        wire.encode_request(["gpuhook-runtime", "a\0b"], [])


MALFORMED = [
    (b"", "not a gpuhook-runtime/1 request"),
    (message(b"gpuhook-runtime/2", b"1", b"x", b"0"), "not a gpuhook-runtime/1 request"),
    (b"gpuhook-runtime/1", "not a gpuhook-runtime/1 request"),  # the magic without its NUL
    (message(PROTOCOL, b"1", b"x", b"0")[:-1], "does not end with a NUL"),
    (message(PROTOCOL), "the argv count is missing"),
    (message(PROTOCOL, b"one", b"x", b"0"), "argv count b'one' is not a decimal number"),
    (message(PROTOCOL, b"-1", b"0"), "argv count b'-1' is not a decimal number"),
    (message(PROTOCOL, b"01", b"x", b"0"), "argv count b'01' is not a decimal number"),
    (message(PROTOCOL, b"+1", b"x", b"0"), "argv count b'+1' is not a decimal number"),
    (message(PROTOCOL, b"\xd9\xa1", b"x", b"0"), "is not a decimal number"),  # Arabic-Indic 1
    (message(PROTOCOL, b"99999999", b"0"), "is not a decimal number"),  # over 7 digits
    (message(PROTOCOL, b"0", b"0"), "argc is 0"),
    (message(PROTOCOL, b"3", b"a", b"b"), "the argv count is 3 but 2 fields follow"),
    (message(PROTOCOL, b"1", b"x"), "the environment count is missing"),
    (message(PROTOCOL, b"1", b"x", b""), "environment count b'' is not a decimal number"),
    (message(PROTOCOL, b"1", b"x", b"2", b"A=1"), "the environment count is 2 but 1 fields"),
    (message(PROTOCOL, b"1", b"x", b"0", b"extra"), "1 fields after the environment"),
    (message(PROTOCOL, b"1", b"x", b"1", b"NOVALUE"), "entry 'NOVALUE' is not KEY=VALUE"),
    (message(PROTOCOL, b"1", b"x", b"1", b"=v"), "entry '=v' is not KEY=VALUE"),
    (message(PROTOCOL, b"1", b"x" * MAX_REQUEST, b"0"), f"(at most {MAX_REQUEST})"),
]


@pytest.mark.parametrize(("data", "reason"), MALFORMED)
def test_a_malformed_request_is_declined_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(wire.Declined) as info:
        wire.decode_request(data)
    assert reason in str(info.value)
    assert "\n" not in str(info.value)


def test_replies_round_trip_and_are_checked() -> None:
    assert wire.decode_reply(wire.encode_reply(EXEC, b"/usr/sbin/runc")) == (
        EXEC,
        b"/usr/sbin/runc",
    )
    assert wire.decode_reply(wire.encode_reply(EXIT, b"70")) == (EXIT, b"70")
    assert wire.decode_reply(wire.encode_reply(DECLINE, b"why")) == (DECLINE, b"why")
    long_reason = wire.encode_reply(DECLINE, b"r" * 10_000)
    assert len(long_reason) == MAX_REPLY and wire.decode_reply(long_reason)[0] == DECLINE
    with pytest.raises(ValueError, match="too long"):
        wire.encode_reply(EXEC, b"/" + b"x" * MAX_REPLY)
    with pytest.raises(ValueError, match="unknown reply kind"):
        wire.encode_reply(b"Z", b"")
    for bad in (b"", b"Xrunc", b"X/a\0b", b"R", b"R256", b"R-1", b"R1.0", b"Q/x"):
        with pytest.raises(ValueError, match="malformed reply"):
            wire.decode_reply(bad)


# --- the shim's exec seam -------------------------------------------------------------------------


class Executed(Exception):
    pass


def test_the_shim_hands_the_runtime_to_its_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = paper_node(tmp_path)
    monkeypatch.setenv("GPUHOOK_CONFIG", str(config))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"])))
    calls: list[tuple[str, list[str]]] = []

    def execute(path: str, argv: list[str]) -> None:
        calls.append((path, argv))
        raise Executed

    argv = ["gpuhook-runtime", "--root", "/r", "create", "--bundle", str(bundle), "c1"]
    with pytest.raises(Executed):
        shim.main(argv, execute)  # type: ignore[arg-type]
    runtime = str(tmp_path / "runc")
    assert calls == [(runtime, [runtime, *argv[1:]])]
    assert "NVIDIA_VISIBLE_DEVICES=GPU-" in (bundle / "config.json").read_text()


def test_an_executor_that_cannot_exec_gets_the_shims_failure_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    config = paper_node(tmp_path)
    monkeypatch.setenv("GPUHOOK_CONFIG", str(config))
    log = tmp_path / "runc.log"

    def execute(path: str, argv: list[str]) -> None:
        raise PermissionError(13, "Permission denied", path)

    code = shim.main(["gpuhook-runtime", "--log", str(log), "list"], execute)  # type: ignore[arg-type]
    line = f"gpuhook: cannot execute {tmp_path / 'runc'}: Permission denied"
    assert (code, capfd.readouterr().err) == (1, line + "\n")
    assert line in log.read_text()


# --- what the service imports before it forks -----------------------------------------------------


def _gpuhook_imports(module: str) -> set[str]:
    """The gpuhook modules ``module`` imports, lazily or not."""
    path = SRC / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = SRC / module.replace(".", "/") / "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuhook"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                dotted = SRC / full.replace(".", "/")
                is_module = dotted.with_suffix(".py").exists() or (dotted / "__init__.py").exists()
                found.add(full if is_module else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("gpuhook")}
    return found


def test_preload_holds_every_module_the_shim_can_reach() -> None:
    """Every gpuhook module reachable from the shim by any import (lazy ones too) is among those
    the service imports before it forks (its rule: the packages gpuhook.runtime may import), and
    no CLI module is."""
    reached: set[str] = set()
    todo = ["gpuhook.runtime.shim"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += sorted(_gpuhook_imports(module))
    packages = {m for m in reached if (SRC / m.replace(".", "/") / "__init__.py").exists()}
    preloaded = service.preload()
    assert reached - packages - set(preloaded) == set()
    assert not [m for m in preloaded if m.startswith(("gpuhook.cli", "gpuhook.node"))]


def test_preload_imports_nothing_heavy_that_changes_the_shim() -> None:
    """structlog would become the shim's log writer in the children; click is the CLI's."""
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(SRC)!r}); from gpuhook.runtime import service;"
            "service.preload(); print(sorted(m for m in ('structlog', 'click', 'pynvml')"
            " if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "[]\n"


# --- the CLI and doctor ---------------------------------------------------------------------------


def test_serve_with_the_service_disabled_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f'runtime:\n  service: ""\nstate_dir: {tmp_path}\nlog:\n  file: ""\n')
    code = run(["--config", str(config), "runtime", "serve"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == (
        f"gpuhook: runtime serve: runtime.service is empty in {config} (the runtime service is "
        "disabled); set it there or give --socket PATH\n"
    )


def test_serve_refuses_a_path_that_is_not_a_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path}\nlog:\n  file: ''\n")
    taken = tmp_path / "file"
    taken.write_text("mine")
    code = run(["--config", str(config), "runtime", "serve", "--socket", str(taken)])
    assert code == 1
    assert capsys.readouterr().err == (
        f"gpuhook: {taken} exists and is not a socket; remove it or choose another path\n"
    )
    assert taken.read_text() == "mine"


def _doctor_line(tmp_path: Path, socket_path: str) -> doctor.Result:
    config = tmp_path / "config.yaml"
    config.write_text(f"runtime:\n  service: '{socket_path}'\nstate_dir: {tmp_path}\n")
    node = doctor.Node(str(config))
    result = doctor_engines.check_runtime_service(node)
    assert isinstance(result, doctor.Result)
    return result


def test_doctor_says_whether_the_service_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runtime.sock"
    missing = _doctor_line(tmp_path, str(path))
    assert (missing.status, missing.message) == (
        doctor.WARN,
        f"not running (no socket at {path}): creates with a GPU marker start Python: slower, "
        "still correct",
    )
    assert missing.fix.startswith("systemctl enable --now gpuhook-runtime.service")
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listening:
        listening.bind(str(path))
        stale = _doctor_line(tmp_path, str(path))  # bound, not listening: a dead service's
        assert stale.status == doctor.WARN and "refuses connections" in stale.message
        listening.listen(1)
        ok = _doctor_line(tmp_path, str(path))
        assert (ok.status, ok.message) == (doctor.PASS, f"listening at {path}")
    disabled = _doctor_line(tmp_path, "")
    assert disabled.status == doctor.SKIP
    assert disabled.message.startswith("disabled in config (runtime.service is empty in ")


def test_doctor_runs_the_check_after_the_runtime_check() -> None:
    names = [c.name for c in doctor.CHECKS]
    assert names.index("runtime service") == names.index("runtime") + 1


# --- the systemd unit -----------------------------------------------------------------------------


def test_unit_runs_the_service_and_lets_a_restart_finish_creates() -> None:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    svc = parser["Service"]
    assert svc["ExecStart"] == "/usr/bin/gpuhook runtime serve"
    assert (svc["Type"], svc["KillMode"], svc["Restart"]) == ("simple", "process", "on-failure")
    before = set(parser["Unit"]["Before"].split())
    assert {"containerd.service", "docker.service", "crio.service", "kubelet.service"} <= before
    assert parser["Unit"]["After"] == "local-fs.target"
    assert parser["Install"]["WantedBy"] == "multi-user.target"
    # a mount namespace or fewer capabilities of its own would make it decline every create
    for option in ("ProtectSystem", "PrivateTmp", "PrivateDevices", "CapabilityBoundingSet"):
        assert option not in svc
    rules = (REPO / "packaging" / "deb" / "debian" / "rules").read_text()
    started = "$(filter %.path gpuhook-runtime.service gpuhook-metrics.service,$(UNITS))"
    assert f"STARTED_UNITS := {started}" in rules


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text())
    assert systemd_verify(unit, "gpuhook(1)") == []


def test_the_service_process_is_started_as_the_cli_was(tmp_path: Path) -> None:
    """gpuhook runtime serve execs the command that started its own Python, up to the script:
    a dynamic loader with its options too (gpuhook node install's /opt/gpuhook layout)."""
    loader = "/lib64/ld-linux-x86-64.so.2"
    if not os.path.exists(loader):
        pytest.skip(f"no {loader} here")
    script = tmp_path / "interpreter.py"
    script.write_text(
        f"import sys; sys.path.insert(0, {str(SRC)!r})\n"
        "from gpuhook.runtime import service; print(service.interpreter())\n"
    )
    for command in ([sys.executable, "-I", "-S"], [loader, sys.executable, "-I"]):
        out = subprocess.run([*command, str(script)], capture_output=True, text=True, check=True)
        assert out.stdout == f"{command}\n"
