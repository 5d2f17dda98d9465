"""The .deb's maintainer-script checks: is gpuhook still an engine's default runtime?"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhook.engines import maintscript as m

CONTAINERD_V2 = """
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "gpuhook"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook.options]
      BinaryName = "/usr/bin/gpuhook-runtime"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""

CONTAINERD_V3_RENAMED = """
version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = 'gpu'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpu.options]
    BinaryName = '/usr/bin/gpuhook-runtime'
"""


@pytest.mark.parametrize(
    ("daemon", "expected"),
    [
        ({}, ""),
        ({"default-runtime": "runc"}, ""),
        ({"runtimes": {"gpuhook": {"path": "/usr/bin/gpuhook-runtime"}}}, ""),
        (
            {"default-runtime": "gpuhook", "runtimes": {"gpuhook": {"path": "gpuhook-runtime"}}},
            'default-runtime "gpuhook" -> gpuhook-runtime',
        ),
        (  # a stock name pointing at gpuhook counts by its executable
            {
                "default-runtime": "nvidia",
                "runtimes": {"nvidia": {"path": "/usr/bin/gpuhook-runtime"}},
            },
            'default-runtime "nvidia" -> /usr/bin/gpuhook-runtime',
        ),
        (  # docker 23+ shim form
            {
                "default-runtime": "x",
                "runtimes": {
                    "x": {
                        "runtimeType": "io.containerd.runc.v2",
                        "options": {"BinaryName": "/usr/bin/gpuhook-runtime"},
                    }
                },
            },
            'default-runtime "x" -> /usr/bin/gpuhook-runtime',
        ),
        (
            {
                "default-runtime": "nvidia",
                "runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}},
            },
            "",
        ),
    ],
)
def test_docker_default(tmp_path: Path, daemon: dict[str, object], expected: str) -> None:
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps(daemon))
    found = m.findings(str(path), str(tmp_path / "none.toml"))
    assert [f.detail for f in found] == ([expected] if expected else [])


def test_docker_default_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    for text in ('{"default-runtime": ', "[1, 2]"):
        path.write_text(text)
        (finding,) = m.findings(str(path), str(tmp_path / "none.toml"))
        assert finding.problem and not finding.detail
    path.write_text("  \n")
    assert m.findings(str(path), str(tmp_path / "none.toml"))[0].problem  # not JSON either


def test_containerd_default_layouts(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"

    def details(text: str) -> list[str]:
        path.write_text(text)
        return [f.detail or f.problem for f in m.findings(str(tmp_path / "none"), str(path))]

    assert details(CONTAINERD_V2) == ['default_runtime_name "gpuhook" -> /usr/bin/gpuhook-runtime']
    assert details(CONTAINERD_V3_RENAMED) == [
        'default_runtime_name "gpu" -> /usr/bin/gpuhook-runtime'
    ]
    assert details(CONTAINERD_V2.replace('= "gpuhook"', '= "runc"', 1)) == []
    # A version 1 file cannot be read reliably: the warning asks for a check by hand.
    legacy = (
        "[plugins.cri.containerd.default_runtime.options]\n"
        'BinaryName = "/usr/bin/gpuhook-runtime"\n'
    )
    assert details(legacy) == [
        "config version 1 is not supported (gpuhook reads versions 2, 3 and 4; containerd config "
        "migrate converts older files)"
    ]
    assert details("[plugins\n")[0].startswith("not valid TOML: ")


def test_findings_follow_containerd_imports(tmp_path: Path) -> None:
    main = tmp_path / "config.toml"
    (tmp_path / "conf.d").mkdir()
    main.write_text('version = 2\nimports = ["conf.d/*.toml"]\n')
    (tmp_path / "conf.d" / "50-gpuhook.toml").write_text(CONTAINERD_V2)
    found = m.findings(str(tmp_path / "daemon.json"), str(main))
    assert [(f.engine, f.path, f.problem) for f in found] == [("containerd", str(main), "")]
    assert found[0].detail == 'default_runtime_name "gpuhook" -> /usr/bin/gpuhook-runtime'


def test_removal_warning_and_hint_lines(tmp_path: Path) -> None:
    daemon = tmp_path / "daemon.json"
    containerd = tmp_path / "config.toml"
    assert m.findings(str(daemon), str(containerd)) == []
    assert m.configure_hint([])[2:] == [f"  {c}" for c in m.CONFIGURE_COMMANDS]

    daemon.write_text(json.dumps({"default-runtime": "gpuhook"}))
    containerd.write_text("version = = 2")
    found = m.findings(str(daemon), str(containerd))
    assert m.removal_warnings(found) == [
        f"gpuhook: WARNING: {daemon} still makes gpuhook the default runtime of docker "
        '(default-runtime "gpuhook"); without gpuhook every docker container will fail to '
        'start: remove "default-runtime" (or set it to "runc") and restart docker (this '
        "package does not edit it)",
        f"gpuhook: warning: cannot parse {containerd} (not valid TOML: Invalid value (at line 1, "
        "column 11)); "
        "check by hand that containerd does not use gpuhook as its default runtime",
    ]
    assert m.configure_hint(found) == []  # already the default somewhere: no hint


def test_main_exit_codes_and_streams() -> None:
    for verb in ("default-runtime-warning", "configure-hint"):
        out = subprocess.run(
            [sys.executable, "-m", "gpuhook.engines.maintscript", verb],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0, out.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "gpuhook.engines.maintscript", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("usage:")


def test_podman_default_runtime_is_found(tmp_path: Path) -> None:
    podman = tmp_path / "containers.conf"
    podman.write_text(
        '[engine]\nruntime = "gpuhook"\n[engine.runtimes]\ngpuhook = ["/usr/bin/gpuhook-runtime"]\n'
    )
    found = m.findings(str(tmp_path / "d.json"), str(tmp_path / "c.toml"), str(podman))
    assert [(f.engine, f.detail) for f in found] == [
        ("podman", '[engine] runtime "gpuhook" -> /usr/bin/gpuhook-runtime')
    ]
    [line] = m.removal_warnings(found)
    assert line.endswith(
        "remove runtime from [engine] (podman's own default applies again) (this package does "
        "not edit it)"
    )


def test_the_maintainer_scripts_run_this_module() -> None:
    """postinst and prerm name the module by its path: a rename must not silence them."""
    debian = Path(__file__).resolve().parents[2] / "packaging" / "deb" / "debian"
    for script in ("gpuhook.postinst", "gpuhook.prerm"):
        text = (debian / script).read_text()
        assert "python3 -I -m gpuhook.engines.maintscript " in text, script
        assert m.__name__ == "gpuhook.engines.maintscript"
