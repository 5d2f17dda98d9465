"""End to end with Debian's podman 4.3 on the fake GPU node: podman resolves gpuhook's CDI spec
itself (``--device nvidia.com/gpu=1``), with runc and with gpuhook-runtime registered by
`gpuhook runtime configure --runtime podman --set-as-default`. Each test asserts what a real
container sees.

Facts of this machine the setup follows: podman's default ulimits exceed the VM's hard nofile
limit (``default_ulimits = []``), crun fails here (runc), conmon hands the runtime only the
variables in ``conmon_env_vars`` (so GPUHOOK_CONFIG goes there), and podman 4.3 reads CDI specs
only from /etc/cdi and /var/run/cdi: the spec goes there under a unique name, removed after.
Storage, run root, temp folder and locks are private to the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid as uuidlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests.conftest import FakeNode
from tests.integration import engines

pytestmark = [pytest.mark.slow, pytest.mark.root]

# compute and utility (the default capabilities): no /dev/nvidia-modeset
CONTROL = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]
IMAGE_PLAIN = "localhost/gpuhook-test/plain:1"
IMAGE_ALL = "localhost/gpuhook-test/env-all:1"
IMAGE_PAUSE = "localhost/gpuhook-test/pause:1"  # a pod's infra container: sleeps
CDI_FOLDER = Path("/var/run/cdi")


def gpus(*nodes: str) -> list[str]:
    return sorted(CONTROL + list(nodes))


class Podman:
    """A podman with private storage and its own containers.conf (``CONTAINERS_CONF``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "containers.conf"

    def write_conf(self, gpuhook_config: str) -> None:
        self.conf.write_text(
            "# a test's containers.conf: private folders, runc, no ulimits\n"
            "[containers]\n"
            "default_ulimits = []\n"
            'netns = "none"\n\n'
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "none"\n'
            'lock_type = "file"\n'
            f'tmp_dir = "{self.folder / "tmp"}"\n'
            "conmon_env_vars = [\n"
            '  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",\n'
            f'  "GPUHOOK_CONFIG={gpuhook_config}",\n'
            f'  "GPUHOOK_CACHE_DIR={os.environ["GPUHOOK_CACHE_DIR"]}",\n'
            "]\n"
        )

    def __call__(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        argv = [
            "podman",
            "--root", str(self.folder / "root"),
            "--runroot", str(self.folder / "runroot"),
            "--storage-driver", "vfs",
            *args,
        ]  # fmt: skip
        env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}
        env.pop("GPUHOOK_CONFIG", None)  # only conmon_env_vars reach the runtime
        env.pop("GPUHOOK_CACHE_DIR", None)
        out = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=180, check=False
        )
        if check:
            assert out.returncode == 0, out.stderr
        return out

    def run(self, *args: str, image: str = IMAGE_PLAIN) -> dict[str, Any]:
        """Run the probe in a container (kept until the test's end, for its decision record)."""
        name = f"gh-{uuidlib.uuid4().hex[:10]}"
        out = self("run", "--name", name, *args, image, "/bin/sh", "-c", testbed.PROBE)
        seen = testbed.parse_probe(out.stdout)
        ident = self("inspect", "--format", "{{.Id}}", name).stdout.strip()
        seen.update(returncode=out.returncode, stderr=out.stderr, id=ident, name=name)
        return seen


@pytest.fixture(scope="module")
def podman(
    node: FakeNode, rootfs_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Podman]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (scripts/bootstrap installs it)")
    p = Podman(engines.short_dir("gh-podman"))
    p.write_conf(node.env["GPUHOOK_CONFIG"])
    tarball = engines.rootfs_tarball(rootfs_template, p.folder / "rootfs.tar")
    p("import", "-q", str(tarball), IMAGE_PLAIN, check=True)
    p("import", "-q", "--change", "ENV NVIDIA_VISIBLE_DEVICES=all", str(tarball), IMAGE_ALL,
      check=True)  # fmt: skip
    p("import", "-q", "--change", 'ENTRYPOINT ["/bin/sleep", "3600"]', str(tarball), IMAGE_PAUSE,
      check=True)  # fmt: skip
    spec = CDI_FOLDER / f"gpuhook-test-{uuidlib.uuid4().hex[:12]}.json"
    # the spec podman reads, checked against the specs podman reads (not against the fake node's
    # own cdi.output, which podman never sees)
    env = node.variant(p.folder, cdi={"output": "", "spec_dirs": ["/etc/cdi", str(CDI_FOLDER)]})
    out = node.gpuhook("cdi", "generate", "--output", str(spec), env=env)
    assert out.returncode == 0, out.stderr
    try:
        yield p
    finally:
        spec.unlink(missing_ok=True)
        p("rm", "-a", "-f")
        shutil.rmtree(p.folder, ignore_errors=True)


@contextmanager
def gpuhook_as_runtime(podman: Podman, node: FakeNode, env: dict[str, str]) -> Iterator[str]:
    """podman with gpuhook-runtime registered as its default runtime (`gpuhook runtime configure`)
    and ``env``'s gpuhook config; yields configure's output. Afterwards the module's conf again."""
    podman.write_conf(env["GPUHOOK_CONFIG"])
    out = node.gpuhook(
        "runtime", "configure", "--runtime", "podman", "--set-as-default",
        "--config", str(podman.conf), "--runtime-path", testbed.RUNTIME,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    try:
        yield out.stdout
    finally:
        out = node.gpuhook(
            "runtime", "unconfigure", "--runtime", "podman", "--config", str(podman.conf)
        )
        podman.write_conf(node.env["GPUHOOK_CONFIG"])  # the module's conf, as the fixture wrote it
        assert out.returncode == 0, out.stderr


def record(node: FakeNode, env: dict[str, str], container_id: str) -> dict[str, Any]:
    out = node.gpuhook("inspect", "container", container_id, "-o", "json", env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_cdi_generate_and_list_name_every_device(node: FakeNode, tmp_path: Path) -> None:
    out = node.gpuhook("cdi", "list", "-o", "json")
    assert out.returncode == 0, out.stderr
    names = [d["name"] for d in json.loads(out.stdout)["devices"]]
    gpu6 = node.truth["gpus"][6]
    assert "nvidia.com/gpu=0" in names and "nvidia.com/gpu=all" in names
    assert [n for n in names if n.startswith("nvidia.com/gpu=6:")] == [
        "nvidia.com/gpu=6:0", "nvidia.com/gpu=6:1", "nvidia.com/gpu=6:2",
    ]  # fmt: skip
    assert f"nvidia.com/gpu={gpu6['uuid']}" in names
    out = node.gpuhook("cdi", "generate", "--format", "yaml")
    assert out.returncode == 0 and out.stdout.startswith(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n"
    )


def test_podman_injects_exactly_the_requested_gpu_from_the_spec(
    podman: Podman, node: FakeNode
) -> None:
    seen = podman.run("--device", "nvidia.com/gpu=1")
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == gpus("/dev/nvidia1")
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"  # runc: nobody else acts on it
    assert "libcuda.so.1 => /usr/local/gpuhook/lib/libcuda.so.1" in seen["ldconfig"]
    assert "libnvidia-ml.so.1 => /usr/local/gpuhook/lib/libnvidia-ml.so.1" in seen["ldconfig"]
    mig = podman.run("--device", "nvidia.com/gpu=6:1")
    assert mig["returncode"] == 0, mig["stderr"]
    caps = [d for d in mig["dev"] if d.startswith("/dev/nvidia-caps/")]
    assert len(caps) == 2 and "/dev/nvidia6" in mig["dev"] and "/dev/nvidia1" not in mig["dev"]


def test_gpuhook_as_podmans_runtime_closes_the_leak_and_honours_cdi(
    podman: Podman, node: FakeNode, tmp_path: Path
) -> None:
    env = node.variant(tmp_path, policy={"standalone": {"env_requests": "ignore"}})
    with gpuhook_as_runtime(podman, node, env) as configured:
        assert "nothing to restart" in configured
        leak = podman.run(image=IMAGE_ALL)
        assert leak["returncode"] == 0, leak["stderr"]
        assert leak["dev"] == [] and leak["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert leak["ldconfig"] == []

        uuid1 = node.truth["gpus"][1]["uuid"]
        seen = podman.run("--device", "nvidia.com/gpu=1", image=IMAGE_ALL)
        assert seen["returncode"] == 0, seen["stderr"]
        assert seen["dev"] == gpus("/dev/nvidia1")
        assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid1
        assert "libcuda.so.1 => /usr/local/gpuhook/lib/libcuda.so.1" in seen["ldconfig"]
        rec = record(node, env, seen["id"])
        assert rec["decision"]["channel"] == "mount-marker"
        assert rec["edits"]["engineInjected"] == [uuid1]
        assert rec["edits"]["deviceNodes"] == [] and rec["edits"]["hooks"] == []
        assert rec["edits"]["mounts"] == []


def test_a_podman_pod_container_is_no_cri_o_sandbox(
    podman: Podman, node: FakeNode, tmp_path: Path
) -> None:
    """`podman run --pod` writes CRI-O's container type and sandbox id (and no other CRI-O key)
    into the spec. Before, gpuhook took it for a CRI-O container of unknown identity and
    refused it as a pod sandbox: no GPU under standalone.env_requests: trust."""
    env = node.variant(tmp_path, policy={"standalone": {"env_requests": "trust"}})
    pod = f"gh-pod-{uuidlib.uuid4().hex[:8]}"
    with gpuhook_as_runtime(podman, node, env):
        podman("pod", "create", "--name", pod, "--infra-image", IMAGE_PAUSE, check=True)
        try:
            seen = podman.run("--pod", pod, "-e", "NVIDIA_VISIBLE_DEVICES=0")
            assert seen["returncode"] == 0, seen["stderr"]
            assert seen["dev"] == gpus("/dev/nvidia0")
            rec = record(node, env, seen["id"])
            assert rec["kubernetes"] is None and rec["decision"]["channel"] == "env"
            spec = json.loads(Path(rec["bundle"], "config.json").read_text())
            assert spec["annotations"]["io.kubernetes.cri-o.ContainerType"] == "container"
            assert "io.kubernetes.cri-o.SandboxID" in spec["annotations"]
        finally:
            podman("pod", "rm", "-f", pod)
