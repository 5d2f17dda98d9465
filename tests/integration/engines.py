"""Private dockerd and containerd daemons for the end-to-end tests.

Each daemon gets its own data root, exec/state root, socket and pid file under a short folder in
/tmp (unix socket paths are limited to 107 bytes), is started with the environment the test
gives it (GPUHOOK_CONFIG, PATH with build/bin first) and is stopped by its own pid. Nothing global
is touched: no /etc/docker, /var/lib/docker, /run/containerd, docker0 bridge or iptables rules.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import testbed

DOCKERD = "/usr/sbin/dockerd"
DOCKER = "/usr/bin/docker"  # /usr/local/bin/docker may be another client: use Debian's
CONTAINERD = "/usr/bin/containerd"
CTR = "/usr/bin/ctr"
START_TIMEOUT = 120.0
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def short_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def daemon_env(gpuhook_config: str) -> dict[str, str]:
    """What the daemons run with: build/bin first on PATH (dockerd looks up
    nvidia-container-runtime-hook there at start), the fake node's gpuhook config and the
    session's config cache (tests/hostguard.py)."""
    return {
        "PATH": f"{testbed.BUILD_BIN}:{BASE_PATH}",
        "GPUHOOK_CONFIG": gpuhook_config,
        "GPUHOOK_CACHE_DIR": os.environ["GPUHOOK_CACHE_DIR"],
        "HOME": "/root",
    }


class Daemon:
    """A daemon process started by a test, its log file, and how to stop it."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.root = root
        self.log = root / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: Sequence[str], env: Mapping[str, str], socket: Path) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}{self.tail()}")
            if socket.exists() and self.ready():
                return
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within {START_TIMEOUT:.0f}s{self.tail()}")

    def ready(self) -> bool:
        raise NotImplementedError

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- last lines of {self.log}:\n" + "\n".join(text)

    def stop(self) -> None:
        """SIGTERM to our own pid, then SIGKILL to its process group if it lingers."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


class Dockerd(Daemon):
    def __init__(self, root: Path, config_file: Path, env: Mapping[str, str]) -> None:
        super().__init__("dockerd", root)
        self.socket = root / "docker.sock"
        self.client_env = {
            "PATH": BASE_PATH,
            "DOCKER_CONFIG": str(root / "client"),
            "HOME": str(root),
        }
        self.start(
            [
                DOCKERD,
                "--data-root",
                str(root / "data"),
                "--exec-root",
                str(root / "exec"),
                "--pidfile",
                str(root / "docker.pid"),
                "-H",
                f"unix://{self.socket}",
                "--config-file",
                str(config_file),
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
                "--userland-proxy=false",
            ],
            env,
            self.socket,
        )

    def ready(self) -> bool:
        out = self.docker("version", "--format", "{{.Server.Version}}", timeout=30)
        return out.returncode == 0

    def docker(
        self, *args: str, timeout: float = 180, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [DOCKER, "-H", f"unix://{self.socket}", *args],
            capture_output=True,
            text=stdin is None,
            input=stdin,
            env=self.client_env,
            timeout=timeout,
            check=False,
        )


class Containerd(Daemon):
    """A private containerd: Debian's 1.6 (/usr/bin), or the one in ``bin_dir`` (containerd
    2.x, tests/integration/containerd2.py), whose shim comes first on the daemon's PATH."""

    def __init__(
        self, root: Path, config_file: Path, env: Mapping[str, str], bin_dir: Path | None = None
    ) -> None:
        super().__init__("containerd", root)
        self.socket = root / "containerd.sock"
        self.binary = str(bin_dir / "containerd") if bin_dir else CONTAINERD
        self.ctr_binary = str(bin_dir / "ctr") if bin_dir else CTR
        if bin_dir:
            env = {**env, "PATH": f"{bin_dir}:{env['PATH']}"}
        self.start(
            [
                self.binary,
                "--config",
                str(config_file),
                "--root",
                str(root / "root"),
                "--state",
                str(root / "state"),
                "--address",
                str(self.socket),
            ],
            env,
            self.socket,
        )

    def ready(self) -> bool:
        return self.ctr("version", timeout=30).returncode == 0

    def ctr(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.ctr_binary, "--address", str(self.socket), *args],
            capture_output=True,
            text=True,
            env={"PATH": BASE_PATH},
            timeout=timeout,
            check=False,
        )


def write_policy(node_config: Path, policy_file: Path, policy: Mapping[str, object]) -> None:
    """Write ``policy_file``, the gpuhook config a test daemon's runtime reads: the node's config
    with ``policy`` merged into its policy section, replaced atomically."""
    import yaml

    data = yaml.safe_load(node_config.read_text())
    data["policy"] = {**data.get("policy", {}), **policy}
    tmp = policy_file.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data))
    os.replace(tmp, policy_file)


def rootfs_tarball(rootfs: str, dest: Path) -> Path:
    """A plain tarball of a root filesystem (what `docker import` and an OCI layer take)."""
    with tarfile.open(dest, "w") as tar:
        for entry in sorted(os.listdir(rootfs)):
            tar.add(os.path.join(rootfs, entry), arcname=entry)
    return dest


def remove_tree(path: Path) -> None:
    """Lazily unmount whatever a daemon left mounted under ``path``, then remove it."""
    prefix = str(path).rstrip("/") + "/"
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1] for line in fh if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    shutil.rmtree(path, ignore_errors=True)
