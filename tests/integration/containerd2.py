"""containerd 2.x for the suites: the v2.3.4 binaries of ../shared/k8s (``containerd``,
``containerd-shim-runc-v2``, ``ctr``, built from containerd's source), unpacked once into
build/k8s/containerd-<version>/ and checked against ../shared/k8s/SHA256SUMS, and the private
config (version 3, what containerd 2.0-2.2 write and most 2.x nodes carry; 2.3 migrates it at
each start) of a daemon that touches nothing of the host's: its root, state, sockets, shim
sockets, NRI socket, CDI folder and runc state all live under the daemon's folder in /tmp.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.conftest import REPO

VERSION = "2.3.4"
SHARED = REPO.parent / "shared" / "k8s"
TARBALL = SHARED / f"containerd-{VERSION}.tar.xz"
BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
DEST = REPO / "build" / "k8s" / f"containerd-{VERSION}"


class Missing(Exception):
    """The shared tarball is not there, or its binaries do not match SHA256SUMS: one line."""


def _sums() -> dict[str, str]:
    sums = {}
    for line in (SHARED / "SHA256SUMS").read_text().splitlines():
        digest, _, name = line.partition("  ")
        sums[name.strip()] = digest
    return sums


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verified(folder: Path, sums: dict[str, str]) -> bool:
    return all((folder / b).is_file() and _digest(folder / b) == sums.get(b) for b in BINARIES)


def unpack(dest: Path = DEST) -> Path:
    """The folder with containerd 2.x's binaries (unpacked on first use). Raises Missing."""
    if not TARBALL.is_file():
        raise Missing(f"no {TARBALL}: the containerd 2.x suites run its binaries")
    sums = _sums()
    if _verified(dest, sums):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        with lzma.open(TARBALL) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
            for member in tar:  # only the named regular files, whatever else the tar holds
                source = tar.extractfile(member) if member.isfile() else None
                if source is not None and member.name.lstrip("./") in BINARIES:
                    target = tmp / member.name.lstrip("./")
                    with source, open(target, "wb") as out:
                        shutil.copyfileobj(source, out)
                    target.chmod(0o755)
        if not _verified(tmp, sums):
            raise Missing(f"{TARBALL}: its binaries do not match {SHARED / 'SHA256SUMS'}")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def cri_config(
    root: Path, pause: str, runc_root: Path, cdi_dir: str, more_cdi_dirs: Sequence[str] = ()
) -> str:
    """A private containerd 2.x config (version 3) with the CRI settings of the suites:
    ``restrict_oom_score_adj`` (no CAP_SYS_RESOURCE here), no AppArmor, runc with cgroupfs and
    its own state root, an empty CNI folder (host-network pods only), CDI on (containerd 2.x's
    default) with the fake node's CDI folder, where gpuhook's spec is, instead of /etc/cdi and
    /var/run/cdi (and ``more_cdi_dirs``: a device plugin's, where it writes its own spec); NRI's
    socket under ``root``."""
    cdi_dirs = ", ".join(f"'{d}'" for d in (cdi_dir, *more_cdi_dirs))
    for sub in ("cni", "nri/plugins", "nri/conf.d"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return f"""version = 3
root = '{root}/root'
state = '{root}/state'
temp = '{root}/tmp'
imports = []

[grpc]
  address = '{root}/containerd.sock'

[ttrpc]
  address = '{root}/containerd.sock.ttrpc'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{pause}'

  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    disable_apparmor = true
    enable_cdi = true
    cdi_spec_dirs = [{cdi_dirs}]

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'

        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '/usr/sbin/runc'
          Root = '{runc_root}'
          SystemdCgroup = false

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{root}/cni']
      conf_dir = '{root}/cni'

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

  [plugins.'io.containerd.internal.v1.opt']
    path = '{root}/opt'

  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '{root}/opt/image-verifier/bin'

  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = '{root}/s'

  [plugins.'io.containerd.nri.v1.nri']
    socket_path = '{root}/nri/nri.sock'
    plugin_path = '{root}/nri/plugins'
    plugin_config_path = '{root}/nri/conf.d'
"""
