"""End to end with Debian's containerd 1.6: a private containerd whose config.toml (a copy of
`containerd config default`) was registered by `gpuhook runtime configure --runtime containerd
--set-as-default`, and containers started with `ctr run` through gpuhook-runtime.

What ctr can and cannot exercise: ctr talks to containerd's core API, not to the CRI plugin, so
the CRI runtime table (`runtimes.gpuhook`, `default_runtime_name`) is not consulted by `ctr run`.
ctr selects the runtime binary of the io.containerd.runc.v2 shim with `--runc-binary`, which sets
the same runc option (`BinaryName`) that the registration writes, and it can set annotations
(`--annotation`), so the Kubernetes identity annotations the CRI plugin would add
(`io.kubernetes.cri.*`) are given by hand. The registration text itself is checked by the real
containerd: `containerd config dump` (which merges imports) must show gpuhook's runtime as the
CRI default, and the registered config must start a daemon whose CRI plugin loads.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests import factories as f
from tests.conftest import FakeNode
from tests.integration import engines
from tests.integration.test_leak_matrix import write_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.root]

# compute and utility (the default capabilities): no /dev/nvidia-modeset
CONTROL = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]
NS = "gpuhook-test"
IMAGE_ALL = "docker.io/gpuhook-test/env-all:1"
IMAGE_PLAIN = "docker.io/gpuhook-test/plain:1"
CRI = ("plugins", "io.containerd.grpc.v1.cri", "containerd")


def gpus(*indices: int) -> list[str]:
    return sorted(CONTROL + [f"/dev/nvidia{i}" for i in indices])


def default_config(root: Path) -> str:
    """`containerd config default`, made private: plugin folders under ``root``, and
    SystemdCgroup on for runc (registration must copy it to gpuhook's runtime)."""
    text = subprocess.run(
        [engines.CONTAINERD, "config", "default"], capture_output=True, text=True, check=True
    ).stdout
    assert 'path = "/opt/containerd"' in text and "SystemdCgroup = false" in text
    return text.replace('path = "/opt/containerd"', f'path = "{root / "opt"}"').replace(
        "SystemdCgroup = false", "SystemdCgroup = true"
    )


def config_dump(config: Path) -> dict[str, Any]:
    import tomllib

    out = subprocess.run(
        [engines.CONTAINERD, "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return tomllib.loads(out.stdout)


def oci_archive(
    rootfs: str, dest: Path, name: str, env: list[str], cmd: list[str] | None = None
) -> Path:
    """An OCI image layout tarball (one uncompressed layer: the rootfs) for `ctr image import`;
    the image runs ``cmd`` (default /bin/sh)."""
    work = dest.with_suffix(".d")
    blobs = work / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layer = engines.rootfs_tarball(rootfs, work / "layer.tar")
    layer_digest = hashlib.sha256(layer.read_bytes()).hexdigest()
    layer.rename(blobs / layer_digest)

    def blob(doc: dict[str, Any]) -> tuple[str, int]:
        data = json.dumps(doc).encode()
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    config_digest, config_size = blob(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": env, "Cmd": cmd or ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        }
    )
    manifest_digest, manifest_size = blob(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{layer_digest}",
                    "size": (blobs / layer_digest).stat().st_size,
                }
            ],
        }
    )
    (work / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (work / "index.json").write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": manifest_digest,
                        "size": manifest_size,
                        "annotations": {"io.containerd.image.name": name},
                        "platform": {"architecture": "amd64", "os": "linux"},
                    }
                ],
            }
        )
    )
    with tarfile.open(dest, "w") as tar:
        for entry in ("oci-layout", "index.json", "blobs"):
            tar.add(work / entry, arcname=entry)
    return dest


class Ctr:
    def __init__(self, daemon: engines.Containerd, node: FakeNode, policy_file: Path) -> None:
        self.daemon = daemon
        self.node = node
        self.policy_file = policy_file

    def set_policy(self, **policy: Any) -> None:
        engines.write_policy(self.node.config, self.policy_file, policy)

    def run(
        self,
        image: str = IMAGE_PLAIN,
        env: tuple[str, ...] = (),
        annotations: dict[str, str] | None = None,
        privileged: bool = False,
    ) -> dict[str, Any]:
        args = ["--runtime", "io.containerd.runc.v2", "--runc-binary", testbed.RUNTIME]
        args += [f"--env={e}" for e in env]
        args += [f"--annotation={k}={v}" for k, v in (annotations or {}).items()]
        if privileged:
            args.append("--privileged")
        cid = f"gh-{uuidlib.uuid4().hex[:10]}"
        out = self.daemon.ctr(
            "-n", NS, "run", "--rm", *args, image, cid, "/bin/sh", "-c", testbed.PROBE
        )
        seen = testbed.parse_probe(out.stdout)
        seen.update(returncode=out.returncode, stderr=out.stderr)
        return seen

    def why(self, seen: dict[str, Any]) -> str:
        return f"{seen['stderr']}{self.daemon.tail(20)}"

    def k8s_policy(self, tmp_path: Path, allocations: list[tuple[str, str, list[str]]]) -> None:
        cp = write_checkpoint(tmp_path / "kubelet_internal_checkpoint", allocations)
        self.set_policy(kubernetes={"checkpoint": str(cp)})

    def uuid(self, index: int) -> str:
        return str(self.node.truth["gpus"][index]["uuid"])


@pytest.fixture(scope="module")
def ctr(
    node: FakeNode, rootfs_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ctr]:
    root = engines.short_dir("gh-ctrd-")
    try:
        config = root / "config.toml"
        original = default_config(root)
        config.write_text(original)
        out = node.gpuhook(
            "runtime", "configure", "--runtime", "containerd", "--config", str(config),
            "--set-as-default", "--runtime-path", testbed.RUNTIME,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[-1] == (
            "restart containerd to apply: systemctl restart containerd"
        )
        policy_file = root / "gpuhook.yaml"
        daemon = engines.Containerd(root, config, engines.daemon_env(str(policy_file)))
        c = Ctr(daemon, node, policy_file)
        c.set_policy()
        try:
            images = tmp_path_factory.mktemp("oci")
            for name, env in (
                (IMAGE_ALL, ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "NVIDIA_VISIBLE_DEVICES=all"]),
                (IMAGE_PLAIN, ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]),
            ):
                archive = oci_archive(
                    rootfs_template, images / f"{uuidlib.uuid4().hex[:6]}.tar", name, env
                )
                imported = daemon.ctr("-n", NS, "image", "import", str(archive))
                assert imported.returncode == 0, imported.stderr + daemon.tail()
            yield c
        finally:
            daemon.stop()
    finally:
        engines.remove_tree(root)


# --- the registration, as containerd reads it ---------------------------------------------------


def test_registered_config_is_what_containerd_loads(ctr: Ctr) -> None:
    dump = config_dump(ctr.daemon.root / "config.toml")
    cri = dump
    for key in CRI:
        cri = cri[key]
    assert cri["default_runtime_name"] == "gpuhook"
    runtime = cri["runtimes"]["gpuhook"]
    assert runtime["runtime_type"] == "io.containerd.runc.v2"
    assert runtime["options"]["BinaryName"] == testbed.RUNTIME
    assert runtime["options"]["SystemdCgroup"] is True  # copied from runc
    assert runtime["container_annotations"] == ["cdi.k8s.io/*"]
    assert runtime["pod_annotations"] == ["gpuhook.io/*"]
    plugins = ctr.daemon.ctr("plugins", "ls")
    assert plugins.returncode == 0
    cri_line = next(line for line in plugins.stdout.splitlines() if " cri " in f" {line} ")
    assert cri_line.split()[-1] == "ok", plugins.stdout + ctr.daemon.tail()


def test_drop_in_is_merged_by_containerd(tmp_path: Path, node: FakeNode) -> None:
    """containerd 1.x replaces a whole plugin section from an import: the drop-in carries the
    main file's CRI section, so the merged config keeps the user's settings and adds gpuhook."""
    config = tmp_path / "config.toml"
    config.write_text(
        default_config(tmp_path).replace(
            "max_concurrent_downloads = 3", "max_concurrent_downloads = 7"
        )
    )
    dropin = tmp_path / "conf.d" / "gpuhook.toml"
    out = node.gpuhook(
        "runtime", "configure", "--runtime", "containerd", "--config", str(config),
        "--drop-in", str(dropin), "--set-as-default", "--runtime-path", testbed.RUNTIME,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    dump = config_dump(config)
    cri = dump["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["max_concurrent_downloads"] == 7
    assert cri["containerd"]["default_runtime_name"] == "gpuhook"
    assert cri["containerd"]["runtimes"]["gpuhook"]["options"]["BinaryName"] == testbed.RUNTIME
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    out = node.gpuhook(
        "runtime", "unconfigure", "--runtime", "containerd", "--config", str(config),
        "--drop-in", str(dropin),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    cri = config_dump(config)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    assert "gpuhook" not in cri["containerd"]["runtimes"]


# --- containers through gpuhook-runtime: the leak matrix ----------------------------------------


def test_plain_env_request_under_trust(ctr: Ctr) -> None:
    ctr.set_policy(standalone={"env_requests": "trust"})
    seen = ctr.run(env=("NVIDIA_VISIBLE_DEVICES=1",))
    assert seen["returncode"] == 0, ctr.why(seen)
    assert seen["dev"] == gpus(1)
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == ctr.uuid(1)
    gpu = ctr.node.truth["gpus"][1]
    assert seen["smi"] == [f"GPU 0: {gpu['name']} (UUID: {ctr.uuid(1)})", "rc=0"]


def test_image_env_all_ignored_without_kubernetes(ctr: Ctr) -> None:
    ctr.set_policy(standalone={"env_requests": "ignore"})
    seen = ctr.run(image=IMAGE_ALL)
    assert seen["returncode"] == 0, ctr.why(seen)
    assert seen["dev"] == [] and seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_k8s_all_without_allocation_gets_nothing(ctr: Ctr, tmp_path: Path) -> None:
    ctr.k8s_policy(tmp_path, [("other-pod", "main", [ctr.uuid(0)])])
    seen = ctr.run(image=IMAGE_ALL, annotations=f.k8s())
    assert seen["returncode"] == 0, ctr.why(seen)
    assert seen["dev"] == []
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert seen["ldconfig"] == []


def test_k8s_all_with_allocation_gets_only_it(ctr: Ctr, tmp_path: Path) -> None:
    ctr.k8s_policy(tmp_path, [("pod-uid-1", "main", [ctr.uuid(2)])])
    seen = ctr.run(image=IMAGE_ALL, annotations=f.k8s())
    assert seen["returncode"] == 0, ctr.why(seen)
    assert seen["dev"] == gpus(2)


def test_k8s_env_naming_another_pods_gpu(ctr: Ctr, tmp_path: Path) -> None:
    ctr.k8s_policy(
        tmp_path, [("pod-uid-1", "main", [ctr.uuid(2)]), ("pod-uid-2", "main", [ctr.uuid(5)])]
    )
    seen = ctr.run(env=(f"NVIDIA_VISIBLE_DEVICES={ctr.uuid(5)}",), annotations=f.k8s())
    assert seen["returncode"] == 0, ctr.why(seen)
    assert seen["dev"] == []
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"  # refused by gpuhook


def test_k8s_init_container_of_gpu_pod(ctr: Ctr, tmp_path: Path) -> None:
    ctr.k8s_policy(tmp_path, [("pod-uid-1", "main", [ctr.uuid(2)])])
    seen = ctr.run(image=IMAGE_ALL, annotations=f.k8s(container="init"))
    assert seen["returncode"] == 0, ctr.why(seen)
    assert seen["dev"] == []
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"  # refused by gpuhook


def test_k8s_pod_sandbox(ctr: Ctr, tmp_path: Path) -> None:
    ctr.k8s_policy(tmp_path, [("pod-uid-1", "", [ctr.uuid(2)])])
    seen = ctr.run(image=IMAGE_ALL, annotations=f.k8s(ctype="sandbox", container=""))
    assert seen["returncode"] == 0, ctr.why(seen)
    assert seen["dev"] == []
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"  # refused by gpuhook


def test_k8s_privileged_all(ctr: Ctr, tmp_path: Path) -> None:
    ctr.k8s_policy(tmp_path, [])
    seen = ctr.run(image=IMAGE_ALL, annotations=f.k8s(), privileged=True)
    assert seen["returncode"] == 0, ctr.why(seen)
    assert seen["dev"] == gpus(*range(8))


def test_k8s_cdi_annotation(ctr: Ctr, tmp_path: Path) -> None:
    ctr.k8s_policy(tmp_path, [("pod-uid-1", "main", [ctr.uuid(1)])])
    seen = ctr.run(annotations={**f.k8s(), "cdi.k8s.io/nvidia-device-plugin_x": "nvidia.com/gpu=1"})
    assert seen["returncode"] == 0, ctr.why(seen)
    assert seen["dev"] == gpus(1)


def test_unknown_gpu_fails_ctr_run_with_gpuhooks_line(ctr: Ctr) -> None:
    ctr.set_policy(standalone={"env_requests": "trust"})
    seen = ctr.run(env=("NVIDIA_VISIBLE_DEVICES=9",))
    assert seen["returncode"] != 0
    line = "gpuhook: env NVIDIA_VISIBLE_DEVICES: unknown GPU index 9 (this node has GPUs 0-7)"
    assert line in seen["stderr"], ctr.why(seen)
