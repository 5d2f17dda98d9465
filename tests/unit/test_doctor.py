"""gpuhook doctor without a GPU node: the engine config readers (docker daemon.json,
containerd config.toml v2/v3 with imports), the check registry (a new check is one registered
function), one line per check with its fix, exit codes, JSON, and colour only on a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import testbed

from gpuhook.cli import commands, doctor, doctor_engines
from gpuhook.engines import readers
from tests.hostguard import session_env
from tests.logcapture import paper_node

RUNTIME = testbed.RUNTIME  # an executable named gpuhook-runtime


def read(engine: str, tmp_path: Path, text: str, name: str = "cfg") -> readers.Registration:
    path = tmp_path / name
    path.write_text(text)
    return readers.read(engine, str(path))


@pytest.mark.parametrize(
    ("text", "runtimes", "default", "ours"),
    [
        (
            json.dumps({"runtimes": {"gpuhook": {"path": RUNTIME}}, "default-runtime": "gpuhook"}),
            {"gpuhook": RUNTIME},
            "gpuhook",
            True,
        ),
        (
            json.dumps({"runtimes": {"gh": {"path": RUNTIME}, "nvidia": {"path": "/usr/bin/x"}}}),
            {"gh": RUNTIME, "nvidia": "/usr/bin/x"},
            "runc",
            False,
        ),
        (
            json.dumps(
                {
                    "runtimes": {
                        "gh": {
                            "runtimeType": "io.containerd.runc.v2",
                            "options": {"BinaryName": RUNTIME},
                        }
                    },
                    "default-runtime": "gh",
                }
            ),
            {"gh": RUNTIME},
            "gh",
            True,
        ),
        ('{"log-level": "info"}', {}, "runc", False),
    ],
)
def test_docker_reader(
    tmp_path: Path, text: str, runtimes: dict[str, str], default: str, ours: bool
) -> None:
    reg = read("docker", tmp_path, text)
    assert (reg.exists, reg.error, reg.runtimes, reg.default) == (True, "", runtimes, default)
    assert reg.default_is_gpuhook is ours


def test_docker_reader_errors(tmp_path: Path) -> None:
    assert read("docker", tmp_path, "{nope").error.startswith("not valid JSON: ")
    assert read("docker", tmp_path, "[]").error == "the top level is not a JSON object"
    missing = readers.read("docker", str(tmp_path / "absent.json"))
    assert (missing.exists, missing.error) == (False, "")


V2 = f"""version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "gpuhook"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook.options]
    BinaryName = "{RUNTIME}"
"""

V3 = f"""version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = 'runc'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpuhook.options]
    BinaryName = '{RUNTIME}'
"""


def test_containerd_reader_versions(tmp_path: Path) -> None:
    v2 = read("containerd", tmp_path, V2)
    assert (v2.version, v2.runtimes, v2.default) == (2, {"runc": "", "gpuhook": RUNTIME}, "gpuhook")
    assert v2.default_is_gpuhook
    v3 = read("containerd", tmp_path, V3)
    assert (v3.version, v3.runtimes, v3.default, v3.default_is_gpuhook) == (
        3,
        {"gpuhook": RUNTIME},
        "runc",
        False,
    )
    old = read("containerd", tmp_path, "[plugins.cri]\nx = 1\n")
    assert old.error.startswith("config version 1 is not supported")
    assert read("containerd", tmp_path, "version = [").error.startswith("not valid TOML: ")


def test_containerd_imports(tmp_path: Path) -> None:
    """version 3 merges an imported file key by key; version 2 replaces the plugin section."""
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "gpuhook.toml").write_text(
        V3.replace("'runc'", "'gpuhook'").replace("version = 3\n", "")
    )
    main = "version = 3\nimports = ['conf.d/*.toml']\n" + V3.split("\n", 1)[1].replace(
        "runtimes.gpuhook", "runtimes.crun"
    )
    reg = read("containerd", tmp_path, main, "config.toml")
    assert reg.runtimes == {"crun": RUNTIME, "gpuhook": RUNTIME}
    assert reg.default == "gpuhook"
    drop = V2.replace("version = 2\n", "").replace('"gpuhook"\n[', '"runc"\n[', 1)
    (tmp_path / "v2.toml").write_text(drop.replace("runtimes.gpuhook", "runtimes.other"))
    main2 = f'version = 2\nimports = ["{tmp_path}/v2.toml"]\n' + V2.split("\n", 1)[1]
    reg2 = read("containerd", tmp_path, main2, "config2.toml")
    assert reg2.runtimes == {"runc": "", "other": RUNTIME}  # the imported section replaced it
    assert reg2.default == "runc"


def test_containerd_reader_refuses_a_drop_in_of_a_higher_version(tmp_path: Path) -> None:
    """NVIDIA/aicr#1688: a version-4 drop-in under a version-2 root stops containerd 2.x."""
    (tmp_path / "99-nvidia.toml").write_text("version = 4\n")
    reg = read("containerd", tmp_path, f'version = 2\nimports = ["{tmp_path}/*.toml"]\n')
    assert reg.error == (
        f"import {tmp_path}/99-nvidia.toml: config version 4 is higher than this file's (2): "
        "containerd 2.x refuses to start"
    )


# --- the registry and the command --------------------------------------------------------------


@pytest.fixture
def registry() -> Iterator[None]:
    saved = list(doctor.CHECKS)
    yield
    doctor.CHECKS[:] = saved


@pytest.fixture
def engines(tmp_path: Path) -> list[str]:
    docker = tmp_path / "daemon.json"
    docker.write_text(
        json.dumps({"runtimes": {"gpuhook": {"path": RUNTIME}}, "default-runtime": "gpuhook"})
    )
    containerd = tmp_path / "config.toml"
    containerd.write_text(V2)
    return ["--docker-config", str(docker), "--containerd-config", str(containerd)]


def run_doctor(
    capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, dict[str, tuple[str, str]], str]:
    """The doctor in this process: exit code, {check: (STATUS, rest of the line)}, stderr."""
    code = commands.run(["doctor", "-o", "table", *args])
    out, err = capsys.readouterr()
    lines: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        if not line.strip() or line.startswith("doctor: "):
            continue
        status, check, rest = (part.strip() for part in line.split("  ", 2))
        if check in lines:
            raise AssertionError(f"two lines for {check}")
        lines[check] = (status, rest.strip())
    return code, lines, err


def test_a_registered_check_gets_its_own_line_and_fails_the_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    registry: None,
    engines: list[str],
) -> None:
    """A check is one registered function; here one replacing the MPS check."""
    monkeypatch.setenv("GPUHOOK_CONFIG", str(paper_node(tmp_path)))
    code, lines, _ = run_doctor(capsys, *engines)
    assert lines["mps"] == ("SKIP", "MPS not configured (no mps.gpus or mps.groups)")

    @doctor.register("mps")
    def mps_down(node: doctor.Node) -> doctor.Result:
        return doctor.Result(
            "mps",
            doctor.FAIL,
            f"GPU 0: MPS control daemon down (pipe dir {node.need_config().state_dir}/mps/0)",
            "gpuhook mps start",
        )

    @doctor.register("first", needs_config=False, before="config")
    def first(_node: doctor.Node) -> list[doctor.Result]:
        return [
            doctor.Result("first", doctor.PASS, "one"),
            doctor.Result("second", doctor.WARN, "two", "do it"),
        ]

    code, lines, err = run_doctor(capsys, *engines)
    assert code == 1
    state = tmp_path / "state"
    assert lines["mps"] == (
        "FAIL",
        f"GPU 0: MPS control daemon down (pipe dir {state}/mps/0); fix: gpuhook mps start",
    )
    assert list(lines)[:3] == ["first", "second", "config"]
    assert lines["second"] == ("WARN", "two; fix: do it")
    assert err.startswith("gpuhook: doctor: ") and err.rstrip().endswith(", mps")
    assert err.count("\n") == 1


def test_a_crashing_check_is_a_failure_line_not_a_traceback(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    registry: None,
    engines: list[str],
) -> None:
    monkeypatch.setenv("GPUHOOK_CONFIG", str(paper_node(tmp_path)))

    @doctor.register("broken", before="runtime")
    def broken(_node: doctor.Node) -> doctor.Result:
        return doctor.Result("broken", "maybe", "?")

    code, lines, _ = run_doctor(capsys, *engines)
    assert code == 1
    assert lines["broken"] == (
        "FAIL",
        "the check itself failed: internal error (ValueError): unknown check status 'maybe'; "
        "please report this",
    )
    assert lines["runtime"][0] == "PASS"  # the others still ran


def test_an_invalid_config_fails_with_its_fix_and_skips_what_needs_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    engines: list[str],
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("log:\n  level: loud\n")
    monkeypatch.setenv("GPUHOOK_CONFIG", str(bad))
    code, lines, err = run_doctor(capsys, *engines)
    assert code == 1
    status, rest = lines["config"]
    assert status == "FAIL" and rest.startswith(f"invalid config {bad}: log.level: 'loud'")
    assert rest.endswith(f"; fix: edit {bad} (check it with: gpuhook config validate {bad})")
    for check in ("inventory", "device nodes", "libraries", "runtime", "state dir"):
        assert lines[check] == ("SKIP", "needs a valid config (see the config check)")
    assert lines["docker"][0] == "PASS" and lines["containerd"][0] == "PASS"
    assert err == "gpuhook: doctor: 1 failed: config\n"


def test_json_output(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    engines: list[str],
) -> None:
    monkeypatch.setenv("GPUHOOK_CONFIG", str(paper_node(tmp_path)))
    code = commands.run(["doctor", "--output", "json", *engines])
    view = json.loads(capsys.readouterr().out)
    failed = [c["check"] for c in view["checks"] if c["status"] == "fail"]
    assert code == (1 if failed else 0) and view["ok"] is (not failed)
    assert view["summary"]["fail"] == len(failed)
    assert {c["check"] for c in view["checks"]} >= {"config", "inventory", "docker", "mps"}
    assert all(set(c) == {"check", "status", "message", "fix"} for c in view["checks"])


def test_colour_only_on_a_terminal_and_never_with_no_color(
    tmp_path: Path, engines: list[str]
) -> None:
    env = {**session_env(), "GPUHOOK_CONFIG": str(paper_node(tmp_path))}
    argv = [testbed.GPUHOOK, "doctor", "-o", "table", *engines]

    def on_a_terminal(extra: dict[str, str]) -> str:
        leader, follower = pty.openpty()
        proc = subprocess.Popen(argv, stdout=follower, stderr=follower, env={**env, **extra})
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        proc.wait(timeout=60)
        return b"".join(chunks).decode()

    assert "\x1b[32mPASS\x1b[0m" in on_a_terminal({})
    plain = on_a_terminal({"NO_COLOR": "1"})
    assert "PASS" in plain and "\x1b[" not in plain
    piped = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    assert "PASS" in piped.stdout and "\x1b[" not in piped.stdout + piped.stderr


def test_podman_reader(tmp_path: Path) -> None:
    reg = read(
        "podman",
        tmp_path,
        '[engine]\nruntime = "gh"\n[engine.runtimes]\n'
        f'gh = ["/nowhere/gpuhook-runtime", "{RUNTIME}"]\nrunc = ["/usr/bin/runc"]\n',
    )
    assert (reg.error, reg.default, reg.default_is_gpuhook) == ("", "gh", True)
    assert reg.runtimes == {"gh": "/nowhere/gpuhook-runtime", "runc": "/usr/bin/runc"}
    assert (reg.cdi, reg.cdi_dirs) == (True, ("/etc/cdi", "/var/run/cdi"))
    plain = read("podman", tmp_path, "[containers]\n")
    assert (plain.default, plain.gpuhook_runtimes) == ("crun", {})
    assert read("podman", tmp_path, "[engine\n").error.startswith("not valid TOML: ")


def test_containerd_reader_cdi_settings(tmp_path: Path) -> None:
    v3 = read("containerd", tmp_path, "version = 3\n")
    assert (v3.cdi, v3.cdi_dirs) == (True, ("/etc/cdi", "/var/run/cdi"))  # on in 2.x
    v2 = read("containerd", tmp_path, "version = 2\n")
    assert v2.cdi is False  # off in 1.7
    custom = read(
        "containerd",
        tmp_path,
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n'
        'enable_cdi = true\ncdi_spec_dirs = ["/srv/cdi"]\n',
    )
    assert (custom.cdi, custom.cdi_dirs) == (True, ("/srv/cdi",))


def test_cdi_checks(tmp_path: Path) -> None:
    from gpuhook.engines import cdi
    from gpuhook.inventory import store

    spec_dir = tmp_path / "cdi"
    output = spec_dir / "gpuhook-nvidia.json"
    config_file = paper_node(tmp_path, cdi={"output": str(output)})
    containerd = tmp_path / "config.toml"
    containerd.write_text(f"version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n"
                          f"cdi_spec_dirs = ['{spec_dir}']\n")  # fmt: skip
    podman = tmp_path / "containers.conf"  # absent: podman reads /etc/cdi, /var/run/cdi

    def node() -> doctor.Node:
        return doctor.Node(
            str(config_file),
            docker_config=str(tmp_path / "none.json"),
            containerd_config=str(containerd),
            podman_config=str(podman),
        )

    def containerd_lines(n: doctor.Node) -> list[doctor.Result]:
        return [r for r in doctor_engines.check_engine_cdi(n) if r.message.startswith("containerd")]

    first = node()
    missing = doctor_engines.check_cdi(first)
    assert missing.status == doctor.WARN and "does not exist" in missing.message
    assert missing.fix == "gpuhook inventory refresh"
    [engine] = containerd_lines(first)
    assert engine.status == doctor.WARN
    assert engine.message.startswith(f"containerd resolves CDI devices from {spec_dir}, but")

    config = first.need_config()
    cdi.export(store.read(config), config)
    assert doctor_engines.check_cdi(node()).status == doctor.PASS
    assert [r.status for r in containerd_lines(node())] == [doctor.PASS]

    data = json.loads(output.read_text())
    data["devices"] = data["devices"][2:]  # GPU 0 gone: another node's, or an old driver's
    output.write_text(json.dumps(data))
    stale = doctor_engines.check_cdi(node())
    assert (stale.status, stale.message) == (
        doctor.WARN,
        f"{output}: differs from what the inventory and config make (stale: gpuhook inventory "
        "refresh)",
    )
    cdi.export(store.read(config), config)
    data = json.loads(output.read_text())
    data["containerEdits"]["mounts"] = []  # the driver libraries gone: same devices, no libraries
    output.write_text(json.dumps(data))
    assert doctor_engines.check_cdi(node()).status == doctor.WARN
    output.write_text('{"kind": 1}')
    assert "unreadable or invalid" in doctor_engines.check_cdi(node()).message


@pytest.mark.parametrize("first", ["doctor", "doctor_node", "doctor_engines", "doctor_host"])
def test_the_checks_are_reported_in_one_order_whichever_module_comes_first(first: str) -> None:
    """The node, then what runs containers, then the shared state: each module of checks goes
    ahead of the next one's first check, so no import order changes the report."""
    import sys

    src = Path(__file__).resolve().parents[2] / "src"
    code = (
        f"import sys; sys.path.insert(0, {str(src)!r});"
        f"import gpuhook.cli.{first}; from gpuhook.cli import doctor;"
        "print(','.join(c.name for c in doctor.CHECKS))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ",".join(c.name for c in doctor.CHECKS)
    assert doctor.CHECKS[0].name == "config" and doctor.CHECKS[-1].name == "kubelet DRA state"


@pytest.mark.parametrize(
    ("sample", "version"),
    [
        ("containerd-2.0-v3.toml", "config version 3: containerd 2.0-2.2; 2.3 migrates it"),
        ("containerd-2.3.4-default.toml", "config version 4: containerd 2.3+"),
    ],
)
def test_doctor_reads_containerd_2x_configs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    sample: str,
    version: str,
) -> None:
    """containerd 2.x's configs (version 3, and 4 as 2.3.4's `config default` writes it):
    unregistered, registered but not the default, the default."""
    monkeypatch.setenv("GPUHOOK_CONFIG", str(paper_node(tmp_path)))
    monkeypatch.setenv("PATH", str(tmp_path))  # no containerd to check the edit with
    config = tmp_path / "config.toml"
    text = (Path(__file__).parents[1] / "fixtures" / "registration" / sample).read_text()
    config.write_text(text.replace("imports = ['/etc/containerd/conf.d/*.toml']", "imports = []"))
    args = (
        "--docker-config", str(tmp_path / "none.json"), "--containerd-config", str(config),
        "--podman-config", str(tmp_path / "none.conf"),
    )  # fmt: skip
    status, rest = containerd_line(capsys, args)
    assert status == "fail" and rest.startswith(f"{config} does not register gpuhook-runtime")
    assert f"({version})" in rest
    configure = ["runtime", "configure", "--runtime", "containerd", "--config", str(config)]
    assert commands.run([*configure, "--runtime-path", RUNTIME]) == 0
    status, rest = containerd_line(capsys, args)
    assert status == "warn"
    assert rest.startswith(
        f"runtime gpuhook -> {RUNTIME} is registered in {config}, but the default runtime is runc"
    )
    assert commands.run([*configure, "--runtime-path", RUNTIME, "--set-as-default"]) == 0
    capsys.readouterr()
    assert containerd_line(capsys, args) == (
        "pass",
        f"runtime gpuhook -> {RUNTIME} is the default in {config} ({version})",
    )


def containerd_line(capsys: pytest.CaptureFixture[str], args: tuple[str, ...]) -> tuple[str, str]:
    capsys.readouterr()
    commands.run(["doctor", "--output", "json", *args])
    [check] = [
        c for c in json.loads(capsys.readouterr().out)["checks"] if c["check"] == "containerd"
    ]
    return check["status"], check["message"]
