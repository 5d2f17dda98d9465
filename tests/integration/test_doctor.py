"""`gpuhook doctor` on fake GPU nodes: a healthy node passes; each broken part (missing
inventory, a device node removed, runc not found, docker without gpuhook, an unwritable state
folder, a malformed kubelet checkpoint) gives its own failing line with the fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests.conftest import FakeNode
from tests.integration.test_leak_matrix import uuid, write_checkpoint
from tests.integration.test_mps import Mps, mnode, mps  # noqa: F401 - fixtures

pytestmark = pytest.mark.root

CONTAINERD_V2 = f"""version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "gpuhook"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook.options]
    BinaryName = "{testbed.RUNTIME}"
"""


class Engines:
    def __init__(self, folder: Path) -> None:
        self.docker = folder / "daemon.json"
        self.containerd = folder / "config.toml"
        self.docker.write_text(
            json.dumps(
                {"runtimes": {"gpuhook": {"path": testbed.RUNTIME}}, "default-runtime": "gpuhook"},
                indent=2,
            )
        )
        self.containerd.write_text(CONTAINERD_V2)

    @property
    def args(self) -> list[str]:
        return ["--docker-config", str(self.docker), "--containerd-config", str(self.containerd)]


@pytest.fixture
def engines(tmp_path: Path) -> Engines:
    return Engines(tmp_path)


def healthy_env(node: FakeNode, folder: Path, **sections: Any) -> dict[str, str]:
    """The node's config plus a kubelet folder with a readable checkpoint."""
    kubelet = folder / "kubelet" / "device-plugins"
    kubelet.mkdir(parents=True, exist_ok=True)
    cp = write_checkpoint(
        kubelet / "kubelet_internal_checkpoint", [("pod-uid-1", "main", [uuid(node, 0)])]
    )
    policy = {"kubernetes": {"checkpoint": str(cp)}}
    return node.variant(folder, policy=policy, **sections)


def doctor(
    node: FakeNode, env: dict[str, str], engines: Engines
) -> tuple[int, dict[str, tuple[str, str]]]:
    out = node.gpuhook("doctor", "-o", "table", *engines.args, env=env)
    lines: dict[str, tuple[str, str]] = {}
    for line in out.stdout.splitlines():
        if line.strip() and not line.startswith("doctor: "):
            status, check, rest = (p.strip() for p in line.split("  ", 2))
            lines[check] = (status, rest)
    failed = [c for c, (s, _) in lines.items() if s == "FAIL"]
    if failed:
        assert out.stderr == f"gpuhook: doctor: {len(failed)} failed: {', '.join(failed)}\n"
    else:
        assert out.stderr == ""
    return out.returncode, lines


def test_a_healthy_node_passes(node: FakeNode, engines: Engines, tmp_path: Path) -> None:
    env = healthy_env(node, tmp_path)
    code, lines = doctor(node, env, engines)
    assert code == 0, lines
    assert [c for c, (s, _) in lines.items() if s == "FAIL"] == []
    for check in (
        "config",
        "inventory",
        "device nodes",
        "dev char links",
        "libraries video",
        "runtime",
        "hook",
        "docker",
        "containerd",
        "state dir",
        "log dir",
        "kubelet checkpoint",
    ):
        assert lines[check][0] == "PASS", (check, lines[check])
    root = node.root
    assert lines["inventory"][1].startswith(
        f"{root}/state/inventory.json: 8 GPUs, 6 MIG devices, driver 550.54.15, built "
    )
    assert lines["device nodes"] == (
        "PASS",
        f"24 present under {root}/dev/dev (GPUs, MIG, control)",
    )
    assert lines["docker"] == (
        "PASS",
        f"runtime gpuhook -> {testbed.RUNTIME} is the default in {engines.docker}",
    )
    assert lines["kubelet checkpoint"][1].endswith("is readable (1 nvidia.com/* allocations)")
    assert lines["mps"] == ("SKIP", "MPS not configured (no mps.gpus or mps.groups)")
    # the fake driver leaves out a few optional libraries (as real drivers do): a warning
    assert lines["libraries utility"] == (
        "WARN",
        "2 found; not found: libnvidia-nscq.so (optional: not every driver or system ships them)",
    )
    out = node.gpuhook("doctor", "--output", "json", *engines.args, env=env)
    view = json.loads(out.stdout)
    assert out.returncode == 0 and view["ok"] is True and view["summary"]["fail"] == 0


def test_missing_inventory(node: FakeNode, engines: Engines, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "inventory.json"
    env = healthy_env(node, tmp_path, inventory={"path": str(missing)})
    code, lines = doctor(node, env, engines)
    assert code == 1
    assert lines["inventory"] == (
        "FAIL",
        f"no inventory at {missing}; fix: gpuhook inventory refresh",
    )
    assert lines["device nodes"] == ("SKIP", "needs the inventory (see the inventory check)")


def test_a_device_node_removed(fake_node_factory: Any, engines: Engines, tmp_path: Path) -> None:
    node: FakeNode = fake_node_factory("--gpus", "2")
    node.refresh()
    gone = node.root / "dev" / "dev" / "nvidia1"
    gone.unlink()
    code, lines = doctor(node, healthy_env(node, tmp_path), engines)
    assert code == 1
    assert lines["device nodes"] == (
        "FAIL",
        f"missing: {gone} (GPU 1); fix: load the NVIDIA kernel modules and create the device "
        "nodes (nvidia-modprobe -c 0 -u, or run nvidia-smi once), then: gpuhook inventory "
        "refresh",
    )
    assert lines["inventory"][0] == "PASS"  # the inventory itself is still current


def test_dev_char_links_missing_or_wrong(
    fake_node_factory: Any, engines: Engines, tmp_path: Path
) -> None:
    node: FakeNode = fake_node_factory("--gpus", "2")
    node.refresh()
    char = node.root / "dev" / "dev" / "char"
    code, lines = doctor(node, healthy_env(node, tmp_path), engines)
    assert lines["dev char links"] == ("PASS", "6 NVIDIA device nodes linked under /dev/char")
    (char / "195:0").unlink()
    (char / "195:1").unlink()
    (char / "195:1").symlink_to("../nvidia0")  # the wrong node
    code, lines = doctor(node, healthy_env(node, tmp_path), engines)
    assert code == 0  # a warning: only the systemd cgroup driver needs them
    assert lines["dev char links"] == (
        "WARN",
        f"2 of 6 NVIDIA device nodes lack a correct /dev/char link: {char}/195:0 (/dev/nvidia0), "
        f"{char}/195:1 (/dev/nvidia1); with the systemd cgroup driver their containers lose the "
        "GPU at the next systemctl daemon-reload; fix: gpuhook inventory refresh (it makes the "
        "links)",
    )
    node.refresh()
    assert doctor(node, healthy_env(node, tmp_path), engines)[1]["dev char links"][0] == "PASS"


def test_runc_not_found(node: FakeNode, engines: Engines, tmp_path: Path) -> None:
    env = healthy_env(node, tmp_path, runtime={"path": "/nonexistent/runc"})
    code, lines = doctor(node, env, engines)
    assert code == 1
    assert lines["runtime"] == (
        "FAIL",
        "low-level OCI runtime /nonexistent/runc not found: gpuhook-runtime cannot start any "
        f"container; fix: install runc (apt-get install runc) or set runtime.path in "
        f"{env['GPUHOOK_CONFIG']}",
    )


def test_docker_without_gpuhook(node: FakeNode, engines: Engines, tmp_path: Path) -> None:
    engines.docker.write_text(
        json.dumps({"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}})
    )
    code, lines = doctor(node, healthy_env(node, tmp_path), engines)
    assert code == 1
    assert lines["docker"] == (
        "FAIL",
        f"{engines.docker} does not register gpuhook-runtime (runtimes: nvidia; default runc): "
        "its containers bypass gpuhook; fix: gpuhook runtime configure --runtime docker "
        "--set-as-default, then: systemctl restart docker",
    )
    assert lines["containerd"][0] == "PASS" and "engines" not in lines
    # registered but not the default: a warning, and doctor passes
    engines.docker.write_text(json.dumps({"runtimes": {"gpuhook": {"path": testbed.RUNTIME}}}))
    code, lines = doctor(node, healthy_env(node, tmp_path), engines)
    assert code == 0
    assert lines["docker"] == (
        "WARN",
        f"runtime gpuhook -> {testbed.RUNTIME} is registered in {engines.docker}, but the "
        "default runtime is runc: only containers that name runtime gpuhook go through "
        "gpuhook; fix: gpuhook runtime configure --runtime docker --set-as-default, then: "
        "systemctl restart docker",
    )


def test_no_engine_registers_gpuhook(node: FakeNode, tmp_path: Path) -> None:
    out = node.gpuhook(
        "doctor",
        "-o",
        "json",
        "--docker-config",
        str(tmp_path / "absent.json"),
        "--containerd-config",
        str(tmp_path / "absent.toml"),
        env=healthy_env(node, tmp_path),
    )
    view = json.loads(out.stdout)
    by = {c["check"]: c for c in view["checks"]}
    assert by["engines"]["status"] == "fail"
    assert by["engines"]["fix"] == (
        "gpuhook runtime configure --runtime docker|containerd|podman --set-as-default"
    )
    assert by["docker"]["status"] in ("skip", "warn")  # warn where dockerd is installed


def test_unwritable_state_dir_and_bad_checkpoint(
    node: FakeNode, engines: Engines, tmp_path: Path
) -> None:
    state = tmp_path / "ro"
    state.mkdir()
    env = healthy_env(node, tmp_path, state_dir=str(state))
    cp = tmp_path / "kubelet" / "device-plugins" / "kubelet_internal_checkpoint"
    cp.write_text('{"Data": {"PodDeviceEntries": [{"PodUID": ')
    subprocess.run(["mount", "--bind", str(state), str(state)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(state)], check=True)
        code, lines = doctor(node, env, engines)
    finally:
        subprocess.run(["umount", str(state)], check=True)
    assert code == 1
    assert lines["state dir"] == (
        "FAIL",
        f"cannot create files in {state}: Read-only file system: no decision records are "
        f"written (containers still start); fix: make {state} a writable folder, or set "
        f"state_dir in {env['GPUHOOK_CONFIG']}",
    )
    status, rest = lines["kubelet checkpoint"]
    assert status == "FAIL"
    assert rest.startswith(f"kubelet checkpoint {cp} is not valid JSON")
    assert rest.endswith("until then Kubernetes env requests are refused")
    assert os.listdir(state) == []  # doctor leaves nothing behind


def test_an_mps_daemon_down(
    mnode: FakeNode,  # noqa: F811 - the fixture of test_mps
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    engines: Engines,
    tmp_path: Path,
) -> None:
    """A shared GPU's daemon running passes; killed by hand it fails with the fix, and its GPU
    left in EXCLUSIVE_PROCESS (usable by no one) is a warning with the fix. The MPS root under
    pytest's 0700 temp folder is a warning too: non-root clients could not be served."""
    env = mps.configure(gpus=[1])
    env = {
        **env,
        **{k: v for k, v in healthy_env(mnode, tmp_path).items() if k != "GPUHOOK_CONFIG"},
    }

    def mps_checks() -> list[tuple[str, str, str]]:
        out = mnode.gpuhook("doctor", "-o", "json", *engines.args, env=env)
        checks = json.loads(out.stdout)["checks"]
        failed = [c["check"] for c in checks if c["status"] == "fail"]
        assert out.returncode == (1 if failed else 0), out.stderr
        return [(c["status"], c["message"], c["fix"]) for c in checks if c["check"] == "mps"]

    mps.start()
    running = mps_checks()
    assert [c[0] for c in running] == ["pass", "warn"], running
    assert running[0][1].startswith("MPS control daemon of group gpu1 (GPU 1) running, pid ")
    assert running[1][1].startswith("group gpu1: /tmp/pytest-of-root is not searchable by other")
    for pid in mps.daemons():
        os.kill(pid, signal.SIGKILL)
    assert mps_checks() == [
        (
            "fail",
            f"MPS control daemon of group gpu1 (GPU 1) is down ({mps.pipe('gpu1')}); containers "
            "granted these GPUs are refused",
            "gpuhook mps start gpu1 (or: systemctl start gpuhook-mps@gpu1)",
        ),
        running[1],
        (
            "warn",
            "GPU 1 is in EXCLUSIVE_PROCESS compute mode with no MPS daemon: no CUDA process can "
            "use it",
            "gpuhook mps start gpu1 (or gpuhook mps stop gpu1: back to DEFAULT)",
        ),
    ]


def test_another_cdi_spec_of_the_same_devices(
    fake_node_factory: Any, engines: Engines, tmp_path: Path
) -> None:
    """nvidia-ctk's spec in a CDI folder the engines read, beside gpuhook's: engines refuse both
    (podman 4.3 here: "conflicting device"). The refresh does not write gpuhook's, and says why;
    doctor fails with the fix; `cdi generate --output` refuses."""
    node: FakeNode = fake_node_factory("--gpus", "2")
    spec_dir = tmp_path / "run-cdi"
    spec_dir.mkdir()
    ours = spec_dir / "gpuhook-nvidia.json"
    theirs = spec_dir / "nvidia.yaml"
    theirs.write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        "- {name: '0', containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}}\n"
        "containerEdits: {}\n"
    )
    env = healthy_env(node, tmp_path, cdi={"output": str(ours), "spec_dirs": [str(spec_dir)]})
    out = node.gpuhook("inventory", "refresh", env=env)
    assert out.returncode == 0, out.stderr
    assert "CDI spec" not in out.stdout and not ours.exists()
    assert out.stderr.splitlines() == [
        f"warning: {ours} not written: {theirs} also defines nvidia.com/gpu=0: engines that "
        "read both refuse these devices (conflicting device)",
        "fix: keep one spec of kind nvidia.com/gpu: remove the other (nvidia-ctk's nvidia.yaml: "
        'also stop its nvidia-cdi-refresh service), or set cdi.output to "" in gpuhook\'s config',
    ]
    code, lines = doctor(node, env, engines)
    assert code == 1
    assert lines["cdi"][0] == "FAIL"
    assert lines["cdi"][1].startswith(f"{theirs} also defines nvidia.com/gpu=0: engines")
    assert lines["cdi"][1].endswith("fix: keep one spec of kind nvidia.com/gpu: remove the "
                                    "other (nvidia-ctk's nvidia.yaml: also stop its "
                                    'nvidia-cdi-refresh service), or set cdi.output to "" in '
                                    "gpuhook's config")  # fmt: skip
    out = node.gpuhook("cdi", "generate", "--output", str(ours), env=env)
    assert out.returncode == 1 and not ours.exists()
    assert out.stderr.startswith(f"gpuhook: {ours} not written: {theirs} also defines")
    theirs.unlink()
    out = node.gpuhook("inventory", "refresh", env=env)
    assert out.returncode == 0 and f"{ours}: CDI spec (kind nvidia.com/gpu) regenerated" in (
        out.stdout
    )
    assert doctor(node, env, engines)[1]["cdi"][0] == "PASS"
