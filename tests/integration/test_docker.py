"""End to end with Debian's docker.io: a private dockerd whose daemon.json (a copy with other
keys) was registered by `gpuhook runtime configure --runtime docker --set-as-default`, on the
fake GPU node. Each test asserts what a real container sees."""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests.conftest import FakeNode
from tests.integration import engines

pytestmark = [pytest.mark.slow, pytest.mark.root]

# compute and utility (the default capabilities): no /dev/nvidia-modeset
CONTROL = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]
IMAGE_ALL = "gpuhook-test/env-all:1"
IMAGE_PLAIN = "gpuhook-test/plain:1"
IMAGE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# A daemon.json with other keys that must survive the registration (and suit a private dockerd:
# no data-root/exec-opts/ports of its own, which the test gives as flags or must not bind).
OTHER_KEYS: dict[str, Any] = {
    "storage-driver": "vfs",
    "log-driver": "json-file",
    "log-opts": {"max-size": "1m", "max-file": "2"},
    "max-concurrent-downloads": 2,
    "runtimes": {"crun": {"path": "/usr/bin/crun"}},
    "shutdown-timeout": 5,
    "features": {"buildkit": False},
}


def gpus(*indices: int) -> list[str]:
    return sorted(CONTROL + [f"/dev/nvidia{i}" for i in indices])


class Docker:
    def __init__(self, daemon: engines.Dockerd, node: FakeNode, policy_file: Path) -> None:
        self.daemon = daemon
        self.node = node
        self.policy_file = policy_file

    def set_policy(self, **policy: Any) -> None:
        """Swap the gpuhook config the daemon's runtime reads (a new file: a new cache key)."""
        engines.write_policy(self.node.config, self.policy_file, policy)

    def run(self, *args: str, image: str = IMAGE_PLAIN) -> Any:
        name = f"gh-{uuidlib.uuid4().hex[:10]}"
        out = self.daemon.docker(
            "run", "--rm", "--network", "none", "--name", name, *args,
            image, "/bin/sh", "-c", testbed.PROBE,
        )  # fmt: skip
        seen = testbed.parse_probe(out.stdout)
        seen.update(returncode=out.returncode, stderr=out.stderr)
        return seen

    def why(self, seen: dict[str, Any]) -> str:
        return f"{seen['stderr']}{self.daemon.tail(20)}"


@pytest.fixture(scope="module")
def docker(
    node: FakeNode, rootfs_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Docker]:
    root = engines.short_dir("gh-dockerd-")
    try:
        daemon_json = root / "daemon.json"
        daemon_json.write_text(json.dumps(OTHER_KEYS, indent=2) + "\n")
        out = node.gpuhook(
            "runtime", "configure", "--runtime", "docker", "--config", str(daemon_json),
            "--set-as-default", "--runtime-path", testbed.RUNTIME,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[-1] == "restart docker to apply: systemctl restart docker"
        registered = json.loads(daemon_json.read_text())
        assert registered == {
            **OTHER_KEYS,
            "runtimes": {**OTHER_KEYS["runtimes"], "gpuhook": {"path": testbed.RUNTIME}},
            "default-runtime": "gpuhook",
        }
        policy_file = root / "gpuhook.yaml"
        daemon = engines.Dockerd(root, daemon_json, engines.daemon_env(str(policy_file)))
        d = Docker(daemon, node, policy_file)
        d.set_policy()
        try:
            tarball = engines.rootfs_tarball(
                rootfs_template, tmp_path_factory.mktemp("img") / "rootfs.tar"
            )
            for image, changes in (
                (IMAGE_ALL, ["ENV NVIDIA_VISIBLE_DEVICES=all", f"ENV PATH={IMAGE_PATH}"]),
                (IMAGE_PLAIN, [f"ENV PATH={IMAGE_PATH}"]),
            ):
                flags = [f"--change={c}" for c in changes]
                imported = daemon.docker("import", *flags, str(tarball), image)
                assert imported.returncode == 0, imported.stderr + daemon.tail()
            yield d
        finally:
            daemon.stop()
    finally:
        engines.remove_tree(root)


def test_docker_runs_gpuhook_as_default_runtime(docker: Docker) -> None:
    info = docker.daemon.docker("info", "--format", "{{json .}}")
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    assert data["DefaultRuntime"] == "gpuhook"
    assert data["Runtimes"]["gpuhook"]["path"] == testbed.RUNTIME
    assert "crun" in data["Runtimes"]  # the other keys survived registration
    assert data["Driver"] == "vfs"


def test_image_env_all_is_ignored_when_env_requests_are_ignored(docker: Docker) -> None:
    """The default-all leak, closed: the image says NVIDIA_VISIBLE_DEVICES=all, the container
    asked for nothing, so it gets no GPU."""
    docker.set_policy(standalone={"env_requests": "ignore"})
    seen = docker.run(image=IMAGE_ALL)
    assert seen["returncode"] == 0, docker.why(seen)
    assert seen["dev"] == []
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert seen["ldconfig"] == []


def test_env_request_under_trust_gets_that_gpu_only(docker: Docker) -> None:
    docker.set_policy(standalone={"env_requests": "trust"})
    seen = docker.run("-e", "NVIDIA_VISIBLE_DEVICES=1")
    assert seen["returncode"] == 0, docker.why(seen)
    assert seen["dev"] == gpus(1)
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == docker.node.truth["gpus"][1]["uuid"]


def test_gpus_device_0_gets_gpu_0_and_nvidia_smi_runs(docker: Docker) -> None:
    """docker --gpus is trusted even where env requests are ignored: only the engine adds its
    prestart hook. gpuhook removes that hook (the compatibility executable would fail the
    container if it ran)."""
    docker.set_policy(standalone={"env_requests": "ignore"})
    seen = docker.run("--gpus", "device=0", image=IMAGE_ALL)
    assert seen["returncode"] == 0, docker.why(seen)
    assert seen["dev"] == gpus(0)
    gpu = docker.node.truth["gpus"][0]
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == gpu["uuid"]
    assert seen["smi"] == [f"GPU 0: {gpu['name']} (UUID: {gpu['uuid']})", "rc=0"]


@pytest.mark.parametrize(
    ("flag", "want"), [("2", [0, 1]), ("all", list(range(8))), ('"device=3,5"', [3, 5])]
)
def test_gpus_count_all_and_lists(docker: Docker, flag: str, want: list[int]) -> None:
    """dockerd writes NVIDIA_VISIBLE_DEVICES=0,1 for a count of 2, all for all, the ids for
    device=: gpuhook grants exactly those."""
    docker.set_policy(standalone={"env_requests": "ignore"})
    seen = docker.run("--gpus", flag)
    assert seen["returncode"] == 0, docker.why(seen)
    assert seen["dev"] == gpus(*want)


def test_unknown_gpu_fails_docker_run_with_gpuhooks_line(docker: Docker) -> None:
    docker.set_policy(standalone={"env_requests": "trust"})
    seen = docker.run("--gpus", "device=9")
    assert seen["returncode"] != 0
    line = (
        "gpuhook: docker --gpus (NVIDIA's prestart hook); env NVIDIA_VISIBLE_DEVICES: "
        "unknown GPU index 9 (this node has GPUs 0-7)"
    )
    assert line in seen["stderr"], docker.why(seen)


def test_compat_hook_fails_clearly_when_gpuhook_is_bypassed(docker: Docker) -> None:
    """--runtime runc skips gpuhook: then dockerd's hook really runs, and the compatibility
    executable refuses with one clear line instead of starting a container without its GPU."""
    seen = docker.run("--runtime", "runc", "--gpus", "device=0")
    assert seen["returncode"] != 0
    assert (
        "nvidia-container-runtime-hook (gpuhook): docker --gpus needs gpuhook-runtime"
        in seen["stderr"]
    ), docker.why(seen)
