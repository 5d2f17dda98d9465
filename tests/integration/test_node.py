"""The DaemonSet's image and installer, end to end, on a fake node that has no Python.

* ``make image`` writes dist/gpuhook-node_<version>.tar, which a private dockerd loads.
* The fake node's root is a debootstrapped bookworm (minbase: no Python at all) with what a GPU
  node has besides: runc (copied in with its libraries), a containerd config, and the fake GPU
  node of tools/fake-node under /node (driver root, device nodes, fake NVML).
* ``gpuhook node install`` runs in the image with ``docker run`` (the root mounted at /host, as
  the DaemonSet does) and puts a self-contained gpuhook under /opt/gpuhook; a GPU container is
  then created through /opt/gpuhook/bin/gpuhook-runtime from inside that root (chroot) and sees
  its GPU. After install, reinstall (the pod killed and started again) and uninstall (SIGTERM),
  a real containerd (private root, state and socket) loads the node's config and its CRI plugin
  comes up; after uninstall the root holds what it held before, apart from the backups.

A bad config stops the install before anything is written. Needs root, network only for the
first debootstrap (cached under build/debian-bookworm/ with the Debian package tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests.conftest import make_fake_node
from tests.integration import engines
from tests.integration.test_deb import base_tarball, debian_version, sh

pytestmark = [pytest.mark.slow, pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
NAME = "gpuhook-node-test"
READY = "/run/gpuhook-node/ready"
BACKUP_MARK = ".gpuhook-backup-"
# Mount points and what the test itself makes in the root (bundles, runc's state), and the
# /dev/char/<major>:<minor> links the inventory refresh makes in the fake node's dev root: they
# stay after an uninstall, as udev's would (on a real node /dev is a devtmpfs, not compared).
NOT_COMPARED = ("proc", "sys", "dev", "bundles", "run/test-runc", "node/dev/dev/char")


class Host:
    """The fake node's root folder, its gpuhook config for the installer and a GPU bundle."""

    def __init__(self, root: Path, config_dir: Path, bundle: str) -> None:
        self.root = root
        self.config_dir = config_dir
        self.bundle = bundle
        self.baseline: dict[str, str] = {}

    @property
    def containerd_config(self) -> Path:
        return self.root / "etc/containerd/config.toml"

    def backups(self) -> list[str]:
        return sorted(p.name for p in self.containerd_config.parent.glob(f"*{BACKUP_MARK}*"))


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its type, mode and content hash (or link target)."""
    found: dict[str, str] = {}
    for folder, dirs, names in os.walk(root):
        rel = os.path.relpath(folder, root)
        dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(rel, d)) not in NOT_COMPARED]
        for name in dirs + names:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    what = hashlib.sha256(fh.read()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                what = "-> " + os.readlink(path)
            else:
                what = ""
            found[os.path.normpath(os.path.join(rel, name))] = f"{st.st_mode:o} {what}"
    return found


def host_config(node_config: Path, host_root: Path) -> str:
    """The fake node's gpuhook config as the node sees it from its own root: its paths without
    the folder the root lives in, state and log at their defaults, the installed hook."""
    import yaml

    data = yaml.safe_load(node_config.read_text())
    for key in ("driver_root", "dev_root"):
        data[key] = "/" + os.path.relpath(data[key], host_root)
    data["cdi"]["output"] = "/" + os.path.relpath(data["cdi"]["output"], host_root)
    for key in ("state_dir", "log"):
        data.pop(key)
    data["runtime"] = {"path": "/usr/sbin/runc"}
    data["hook"] = {"path": "/opt/gpuhook/bin/gpuhook", "ldconfig": "/opt/gpuhook/bin/ldconfig"}
    return yaml.safe_dump(data)


def copy_runc(root: Path) -> None:
    """runc and the libraries it needs, where a Debian node has them."""
    runc = shutil.which("runc", path=SYSTEM_PATH)
    assert runc
    shutil.copy2(runc, root / "usr/sbin/runc")
    for lib in sh("ldd", runc).stdout.split():
        if lib.startswith("/") and not (root / lib.lstrip("/")).exists():
            (root / lib.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(lib), root / lib.lstrip("/"))


@pytest.fixture(scope="module")
def image() -> Path:
    out = sh("make", "image", cwd=REPO, env={"PATH": SYSTEM_PATH, "HOME": "/root"})
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    tar = REPO / "dist" / f"gpuhook-node_{debian_version()}.tar"
    assert tar.is_file()
    return tar


@pytest.fixture(scope="module")
def dockerd(image: Path) -> Iterator[engines.Dockerd]:
    root = engines.short_dir("gh-node-")
    (root / "daemon.json").write_text("{}\n")
    daemon = engines.Dockerd(root, root / "daemon.json", {"PATH": SYSTEM_PATH, "HOME": "/root"})
    try:
        yield daemon
    finally:
        daemon.docker("rm", "-f", NAME)
        daemon.stop()
        sh("umount", "-R", str(root / "data"))
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    base = engines.short_dir("gh-host-")
    root = base / "root"
    root.mkdir()
    assert (
        sh("tar", "--numeric-owner", "-C", str(root), "-xpf", str(base_tarball())).returncode == 0
    )
    packages = sh("chroot", str(root), "dpkg-query", "-W", "-f", "${Package}\n").stdout.split()
    assert packages and not [p for p in packages if "python" in p]
    assert not list((root / "usr/bin").glob("python*"))
    copy_runc(root)
    (root / "etc/containerd").mkdir()
    default = sh(engines.CONTAINERD, "config", "default").stdout
    (root / "etc/containerd/config.toml").write_text(default)
    node = make_fake_node(root / "node", "--gpus", "2", "--runtime", "/usr/sbin/runc")
    # The fake NVML reads its data from the path it was built with (the node as this machine
    # sees it): the same path must lead there from inside the root.
    (root / str(root).lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / str(root).lstrip("/")).symlink_to("/")
    config_dir = base / "config"
    config_dir.mkdir()
    (config_dir / "config.yaml").write_text(host_config(node.config, root))
    rootfs = testbed.build_rootfs(str(base / "rootfs"))
    bundle = str(root / "bundles/gpu")
    testbed.make_bundle(
        bundle, rootfs, args=("/bin/sh", "-c", testbed.PROBE), env=["NVIDIA_VISIBLE_DEVICES=0"]
    )
    h = Host(root, config_dir, "/bundles/gpu")
    h.baseline = snapshot(root)
    try:
        yield h
    finally:
        shutil.rmtree(base, ignore_errors=True)


def docker_run(dockerd: engines.Dockerd, host: Host, *args: str) -> list[str]:
    # The DaemonSet's pod is privileged. Here (a machine that may itself be a container, without
    # every capability) it gets all this machine has and no seccomp or AppArmor filter.
    return [
        "run",
        "--cap-add=ALL",
        *(f"--cap-drop={c}" for c in missing_capabilities()),
        "--security-opt=seccomp=unconfined",
        "--security-opt=apparmor=unconfined",
        "--network",
        "none",
        "-v",
        f"{host.root}:/host",
        "-v",
        f"{host.config_dir}:/etc/gpuhook-node:ro",
        *args,
    ]


def missing_capabilities() -> list[str]:
    """Capabilities this process's bounding set lacks (docker names), of the first 41."""
    have = set(testbed.host_capabilities())
    return [name for name in testbed.CAPABILITIES if f"CAP_{name}" not in have]


def tag() -> str:
    return f"gpuhook-node:{debian_version()}"


def install_args() -> list[str]:
    """The DaemonSet's command, without the restart (no systemd behind this root)."""
    config = "--config=/etc/gpuhook-node/config.yaml"
    return [tag(), "node", "install", "--host-root=/host", config, "--no-restart"]


def wait_ready(dockerd: engines.Dockerd, starts: int = 1) -> None:
    """Until the installer's ``starts``-th run has written its readiness file."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        runs = dockerd.docker("logs", NAME).stdout.count(f"ready ({READY})")
        if runs >= starts and dockerd.docker("exec", NAME, "test", "-f", READY).returncode == 0:
            return
        state = dockerd.docker("inspect", "-f", "{{.State.Running}}", NAME).stdout.strip()
        assert state == "true", dockerd.docker("logs", NAME).stderr
        time.sleep(0.5)
    raise AssertionError("installer not ready: " + dockerd.docker("logs", NAME).stdout)


def containerd_loads(config: Path) -> str:
    """Start a private containerd with ``config`` (own root, state, socket); the status of its
    CRI plugin, which reads the runtimes."""
    root = engines.short_dir("gh-ctd-")
    daemon = engines.Containerd(root, config, {"PATH": SYSTEM_PATH, "HOME": "/root"})
    try:
        plugins = daemon.ctr("plugins", "ls").stdout.splitlines()
        cri = [line.split() for line in plugins if " cri " in f" {line} "]
        return cri[0][-1] if cri else "missing"
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


def run_gpu_container(host: Host) -> dict[str, Any]:
    """The probe bundle run through the node's /opt/gpuhook/bin/gpuhook-runtime, chrooted into
    the node's root (a mount point, with /proc, /sys and /dev, as runc needs)."""
    root = str(host.root)
    mounts = [root, *(f"{root}/{d}" for d in ("proc", "sys", "dev"))]
    assert sh("mount", "--bind", root, root).returncode == 0
    try:
        for d in ("proc", "sys", "dev"):
            assert sh("mount", "--rbind", f"/{d}", f"{root}/{d}").returncode == 0
        argv = ["/opt/gpuhook/bin/gpuhook-runtime", "--root", "/run/test-runc", "run"]
        out = sh(
            "chroot", root, *argv, "--bundle", host.bundle, "gpu-1",
            env={"PATH": SYSTEM_PATH}, stdin=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
    finally:
        for m in reversed(mounts):
            sh("umount", "-R", m)
        shutil.rmtree(host.root / "run/test-runc", ignore_errors=True)
    seen = testbed.parse_probe(out.stdout)
    seen.update(returncode=out.returncode, stderr=out.stderr)
    return seen


def test_image_loads_with_the_installer_as_entrypoint(
    dockerd: engines.Dockerd, image: Path
) -> None:
    out = dockerd.docker("load", "-i", str(image))
    assert out.returncode == 0, out.stderr
    assert f"Loaded image: {tag()}" in out.stdout
    entry = dockerd.docker("image", "inspect", "-f", "{{json .Config.Entrypoint}}", tag())
    assert entry.stdout.strip() == '["/usr/bin/gpuhook"]'
    version = dockerd.docker("run", "--rm", "--network", "none", tag(), "--version")
    assert version.stdout.strip() == f"gpuhook {debian_version()}"


def test_a_bad_config_leaves_the_node_untouched(
    dockerd: engines.Dockerd, host: Host, loaded: str
) -> None:
    bad = host.config_dir / "bad.yaml"
    bad.write_text("driver_root: 5\n")
    try:
        args = [a.replace("config.yaml", "bad.yaml") for a in install_args()]
        out = dockerd.docker(*docker_run(dockerd, host, "--rm", *args))
    finally:
        bad.unlink()
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert out.stderr.startswith("gpuhook: invalid config /etc/gpuhook-node/bad.yaml: driver_root")
    assert snapshot(host.root) == host.baseline


@pytest.fixture
def loaded(dockerd: engines.Dockerd, image: Path) -> str:
    """The image's tag, the image loaded into the private dockerd (unless a test before this
    one loaded it)."""
    if dockerd.docker("image", "inspect", tag()).returncode != 0:
        out = dockerd.docker("load", "-i", str(image))
        assert out.returncode == 0, out.stderr
    return tag()


@pytest.fixture
def installer(dockerd: engines.Dockerd, host: Host, loaded: str) -> str:
    """The DaemonSet's pod (container NAME) running ``node install``, ready: the one an earlier
    test left running, else one started here (so a test that needs it runs alone, or after one
    that stopped it). Its name."""
    running = dockerd.docker("inspect", "-f", "{{.State.Running}}", NAME).stdout.strip()
    if running != "true":
        dockerd.docker("rm", "-f", NAME)
        out = dockerd.docker(*docker_run(dockerd, host, "-d", "--name", NAME, *install_args()))
        assert out.returncode == 0, out.stderr
        wait_ready(dockerd)
    return NAME


def ready_runs(dockerd: engines.Dockerd) -> int:
    """How many times the installer's pod has said it is ready (once each start)."""
    return dockerd.docker("logs", NAME).stdout.count(f"ready ({READY})")


def test_install_then_a_gpu_container_on_the_node_without_python(
    dockerd: engines.Dockerd, host: Host, installer: str
) -> None:
    logs = dockerd.docker("logs", installer).stdout
    assert "/var/lib/gpuhook/inventory.json: 2 GPUs" in logs
    toml = host.containerd_config.read_text()
    assert 'BinaryName = "/opt/gpuhook/bin/gpuhook-runtime"' in toml
    assert 'default_runtime_name = "gpuhook"' in toml
    assert len(host.backups()) == 1
    assert containerd_loads(host.containerd_config) == "ok"
    assert not (host.root / "usr/bin/python3").exists()
    # What docs/operations.md's `kubectl exec POD -- chroot /host /opt/gpuhook/bin/gpuhook inspect
    # node` does.
    inspect = ["chroot", "/host", "/opt/gpuhook/bin/gpuhook", "inspect", "node", "-o", "json"]
    out = dockerd.docker("exec", NAME, *inspect)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["gpus"]) == 2
    seen = run_gpu_container(host)
    assert seen["returncode"] == 0, seen["stderr"]
    control = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]  # compute, utility: no modeset
    assert seen["dev"] == [*control, "/dev/nvidia0", "/dev/nvidiactl"]
    assert seen["smi"][0].startswith("GPU 0: NVIDIA")


def test_reinstall_after_the_pod_was_killed(
    dockerd: engines.Dockerd, host: Host, installer: str
) -> None:
    """The restarted pod installs again over what the first left: the same files, modes and
    contents under /opt/gpuhook, no new backup of the engine's config."""
    runs = ready_runs(dockerd)
    backups = host.backups()
    before = snapshot(host.root / "opt/gpuhook")
    assert dockerd.docker("kill", "-s", "KILL", installer).returncode == 0
    assert dockerd.docker("start", installer).returncode == 0
    wait_ready(dockerd, starts=runs + 1)
    logs = dockerd.docker("logs", installer).stdout
    assert "/etc/containerd/config.toml: gpuhook is already registered" in logs
    assert host.backups() == backups
    assert snapshot(host.root / "opt/gpuhook") == before
    assert containerd_loads(host.containerd_config) == "ok"
    assert run_gpu_container(host)["returncode"] == 0


def test_sigterm_uninstalls_and_leaves_the_node_as_it_was(
    dockerd: engines.Dockerd, host: Host, installer: str
) -> None:
    out = dockerd.docker("stop", "-t", "120", installer)
    assert out.returncode == 0, out.stderr
    state = dockerd.docker("inspect", "-f", "{{.State.ExitCode}}", installer).stdout.strip()
    logs = dockerd.docker("logs", installer).stdout
    assert state == "0", logs
    assert "SIGTERM: uninstalling" in logs and "removed /opt/gpuhook" in logs
    assert containerd_loads(host.containerd_config) == "ok"
    after = snapshot(host.root)
    backups = {p for p in after if BACKUP_MARK in p}
    assert len(backups) == 2  # the file before install, and the registered one before uninstall
    assert {k: v for k, v in after.items() if k not in backups} == host.baseline
    dockerd.docker("rm", "-f", installer)


def test_uninstall_when_nothing_is_installed(
    dockerd: engines.Dockerd, host: Host, loaded: str
) -> None:
    args = [tag(), "node", "uninstall", "--host-root=/host", "--no-restart"]
    out = dockerd.docker(*docker_run(dockerd, host, "--rm", *args))
    assert out.returncode == 0, out.stderr
    assert "not installed here" in out.stdout
