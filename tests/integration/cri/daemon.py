"""The private containerds of the CRI suites (tests/integration/cri, tests/integration/kubelet):
Debian's 1.6 and containerd 2.x (tests/integration/containerd2.py, its own config).

Its config.toml is ``containerd config default`` made private (plugin folders, an empty CNI
folder, its own runc state root), with the CRI settings a node without CAP_SYS_RESOURCE and
without CNI needs (``restrict_oom_score_adj``, ``disable_apparmor``, host-network pods only) and
the sandbox image of these suites; the suites then register it with ``gpuhook runtime configure
--runtime containerd --set-as-default``. Images are built from the busybox rootfs and imported
with ``ctr -n k8s.io images import``: nothing is pulled.
"""

from __future__ import annotations

import os
import subprocess
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from tests.integration import containerd2, engines
from tests.integration.test_containerd import oci_archive

NS = "k8s.io"
PAUSE = "gpuhook-test.local/pause:1"
IMAGE = "gpuhook-test.local/busybox:1"
IMAGE_ALL = "gpuhook-test.local/busybox-env-all:1"
PATH_ENV = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
SLEEP = ["/bin/sleep", "3600"]


def cri_config(root: Path) -> str:
    """`containerd config default`, private, with the CRI settings of these suites."""
    text = subprocess.run(
        [engines.CONTAINERD, "config", "default"], capture_output=True, text=True, check=True
    ).stdout
    (root / "cni").mkdir()
    edits = {
        'path = "/opt/containerd"': f'path = "{root / "opt"}"',
        "restrict_oom_score_adj = false": "restrict_oom_score_adj = true",
        "disable_apparmor = false": "disable_apparmor = true",
        'sandbox_image = "registry.k8s.io/pause:3.6"': f'sandbox_image = "{PAUSE}"',
        'conf_dir = "/etc/cni/net.d"': f'conf_dir = "{root / "cni"}"',
        'bin_dir = "/opt/cni/bin"': f'bin_dir = "{root / "cni"}"',
        'Root = ""': f'Root = "{runc_root(root).parent}"',  # runc's state: not /run/containerd/runc
    }
    for old, new in edits.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


# The containerds the CRI suites run on: Debian's 1.6 and containerd 2.x (../shared/k8s).
ENGINES = ("containerd-1.6", f"containerd-{containerd2.VERSION}")


def private_config(
    root: Path, bin_dir: Path | None, node_config: Path, plugin_cdi: Sequence[str] = ()
) -> str:
    """The suites' config of Debian's containerd 1.6 (``bin_dir`` None) or of containerd 2.x,
    which resolves CDI devices itself from the fake node's CDI folder (``node_config``'s
    cdi.spec_dirs, where gpuhook's spec is) and from ``plugin_cdi``, the folders where device
    plugins write their own specs (a real node's /var/run/cdi)."""
    if bin_dir is None:
        return cri_config(root)
    [cdi_dir] = yaml.safe_load(node_config.read_text())["cdi"]["spec_dirs"]
    return containerd2.cri_config(root, PAUSE, runc_root(root).parent, cdi_dir, plugin_cdi)


def register(config: Path, bin_dir: Path | None, runtime: str) -> list[str]:
    """``gpuhook runtime configure`` as the suites register gpuhook, checked by that
    containerd's own ``config dump``."""
    containerd = str(bin_dir / "containerd") if bin_dir else engines.CONTAINERD
    return [
        "runtime", "configure", "--runtime", "containerd", "--config", str(config),
        "--set-as-default", "--runtime-path", runtime, "--containerd", containerd,
    ]  # fmt: skip


def runc_root(root: Path) -> Path:
    """runc's state folder (its --root) for the containers of the k8s.io namespace."""
    return root / "runc" / NS


def build_images(daemon: engines.Containerd, rootfs: str, folder: Path) -> None:
    """The sandbox (pause) image and the test images, from the busybox rootfs. The pause image
    carries NVIDIA_VISIBLE_DEVICES=all, so every sandbox of the suites takes gpuhook's full path
    and must be refused (a real pause image has no such env: its sandbox takes the fast path)."""
    images: Mapping[str, tuple[list[str], list[str]]] = {
        PAUSE: ([PATH_ENV, "NVIDIA_VISIBLE_DEVICES=all"], SLEEP),
        IMAGE: ([PATH_ENV], ["/bin/sh"]),
        IMAGE_ALL: ([PATH_ENV, "NVIDIA_VISIBLE_DEVICES=all"], ["/bin/sh"]),
    }
    for name, (env, cmd) in images.items():
        archive = oci_archive(rootfs, folder / f"{uuidlib.uuid4().hex[:8]}.tar", name, env, cmd)
        out = daemon.ctr("-n", NS, "images", "import", str(archive))
        assert out.returncode == 0, out.stderr + daemon.tail()


def kill_shims(socket: Path) -> list[int]:
    """containerd's shims outlive the daemon: SIGKILL the ones of this daemon (a test that
    failed before its pod was removed leaves one), found by the socket in their argv. Returns
    their pids."""
    killed = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.isdigit() and b"-address" in argv and str(socket).encode() in argv:
            os.kill(int(entry), 9)
            killed.append(int(entry))
    return killed
