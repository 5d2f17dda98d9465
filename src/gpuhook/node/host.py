"""What the installer runs on the host side: commands chrooted into the host root, and the
engine's restart through the host's PID 1 (``hostPID: true``): ``nsenter`` into its mount, UTS,
IPC, network and PID namespaces, then ``systemctl restart``."""

from __future__ import annotations

import os
import subprocess

from gpuhook.engines import configure, readers
from gpuhook.errors import NodeInstallError

NSENTER = ("nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--")
BIN_DIRS = ("usr/local/bin", "usr/bin", "usr/local/sbin", "usr/sbin", "bin")
TIMEOUT = 300
# What commands started in the host root get: nothing of the pod's environment.
HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


def host_path(host_root: str, path: str) -> str:
    """``path`` as the host sees it, under ``host_root`` as this process sees it."""
    return os.path.join(host_root, path.lstrip("/"))


def chroot_run(host_root: str, argv: list[str], what: str) -> str:
    """Run ``argv`` (host paths) chrooted into the host root; its stdout. Raises with one line."""
    try:
        out = subprocess.run(
            ["chroot", host_root, *argv],
            capture_output=True,
            text=True,
            env=HOST_ENV,
            timeout=TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise NodeInstallError(f"{what}: {exc}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        raise NodeInstallError(f"{what} failed on the host: {last}")
    return out.stdout


def containerd_major(host_root: str) -> int:
    """The major version of the host's containerd (1 when it has none that answers)."""
    daemon = readers.DAEMON[readers.CONTAINERD]
    for folder in BIN_DIRS:
        if os.access(os.path.join(host_root, folder, daemon), os.X_OK):
            try:
                out = chroot_run(host_root, [f"/{folder}/{daemon}", "--version"], daemon)
            except NodeInstallError:
                return 1
            return configure.major_of(out)
    return 1


def restart(engine: str) -> str:
    """Restart the engine's service in the host's namespaces; the line to log."""
    service = readers.SERVICE[engine]
    argv = [*NSENTER, "systemctl", "restart", service]
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, env=HOST_ENV, timeout=TIMEOUT, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise NodeInstallError(f"restarting {service} through the host's PID 1: {exc}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        raise NodeInstallError(f"systemctl restart {service} on the host failed: {last}")
    return f"restarted {service} on the host"
