"""A real one-node Kubernetes 1.36 cluster for the suite: etcd, kube-apiserver (TLS, service
accounts, RBAC), kube-scheduler, kube-controller-manager, the kubelet registered as a Node and
containerd 2.3.4 with gpuhook-runtime as its default runtime, all from ../shared/k8s.

It is brought up and down by ../shared/k8s/src/cluster/cluster.sh (called, not copied: its
README says what each flag is for), in a short folder under /tmp (containerd's shim sockets live
there), with the binaries unpacked once into build/k8s/bin by ../shared/k8s/unpack and checked
against its SHA256SUMS. Only one kubelet may run on the host: everything that starts one holds
/tmp/gpuhook-kubelet.lock (flock) for as long as it runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import REPO

SHARED = REPO.parent / "shared" / "k8s"
CLUSTER_SH = SHARED / "src" / "cluster" / "cluster.sh"
BIN = REPO / "build" / "k8s" / "bin"
LOCK = Path("/tmp/gpuhook-kubelet.lock")
LOCK_TIMEOUT = 900.0
KUBELET_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
BINARIES = (
    "containerd", "containerd-shim-runc-v2", "ctr", "etcd", "kube-apiserver",
    "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet",
)  # fmt: skip
NODE = "localhost"


class Missing(Exception):
    """A binary or script the cluster needs is not there: one line."""


def binaries(extra: tuple[str, ...] = ()) -> Path:
    """build/k8s/bin with every binary the cluster needs (unpacked on first use). Raises
    :class:`Missing` with one line naming what is missing."""
    if not CLUSTER_SH.is_file():
        raise Missing(f"no {CLUSTER_SH}: the cluster suite runs ../shared/k8s beside the clone")
    wanted = (*BINARIES, *extra)
    if not all((BIN / b).is_file() for b in wanted):
        out = subprocess.run(
            ["sh", str(SHARED / "unpack"), str(BIN)], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["failed"])[-1]
            raise Missing(f"{SHARED / 'unpack'} {BIN}: {last}")
    absent = [b for b in wanted if not (BIN / b).is_file()]
    if absent:
        raise Missing(f"the cluster needs {', '.join(absent)} in {BIN} (from {SHARED})")
    return BIN


@contextmanager
def kubelet_lock() -> Iterator[None]:
    """One kubelet at a time on this host: /tmp/gpuhook-kubelet.lock (flock(1) compatible) and
    the lock the real-kubelet suite takes (on ../shared/k8s/kubelet), held while this suite's
    kubelet runs; then no other kubelet's device-plugin socket may answer (cluster.sh would
    refuse to start)."""
    with _flocked(LOCK, "a"), _flocked(SHARED / "kubelet", "rb"):
        deadline = time.monotonic() + LOCK_TIMEOUT
        while _kubelet_answers():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{KUBELET_SOCKET}: another kubelet runs")
            time.sleep(1)
        yield


@contextmanager
def _flocked(path: Path, mode: str) -> Iterator[None]:
    with open(path, mode) as fh:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path}: another kubelet ran too long") from None
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _kubelet_answers() -> bool:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(KUBELET_SOCKET))
        except OSError:
            return False
    return True


class Cluster:
    """The running cluster: ``work`` (cluster.sh's WORK), kubectl, and its timings."""

    def __init__(self, work: Path, env: Mapping[str, str]) -> None:
        self.work = work
        self.env = dict(env)
        self.kubeconfig = work / "kubeconfigs" / "admin.kubeconfig"
        self.kubelet_root = work / "kubelet" / "root"
        self.cdi_dir = work / "cdi"
        self.gpuhook_config = env.get("GPUHOOK_CONFIG", "")
        self.up_seconds = 0.0
        self.down_seconds = 0.0

    def script(self, action: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(CLUSTER_SH), str(BIN), str(self.work), action],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def up(self) -> None:
        start = time.monotonic()
        out = self.script("up")
        self.up_seconds = time.monotonic() - start
        if out.returncode != 0:
            raise RuntimeError(f"cluster.sh up failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")

    def down(self) -> str:
        start = time.monotonic()
        out = self.script("down")
        self.down_seconds = time.monotonic() - start
        return out.stdout + out.stderr

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        return out

    def apply(self, doc: dict[str, Any] | list[dict[str, Any]]) -> None:
        docs = doc if isinstance(doc, list) else [doc]
        self.kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in docs))

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def wait_for(self, what: str, check: Any, timeout: float = 120, every: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got = check()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not after {timeout:.0f}s")
            time.sleep(every)

    def log(self, name: str, tail: int = 40) -> str:
        path = self.work / "logs" / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-tail:])

    def pod_phase(self, name: str, namespace: str = "default") -> str:
        out = self.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
        if out.returncode != 0:
            return ""
        return str(json.loads(out.stdout).get("status", {}).get("phase", ""))

    def pod_uid(self, name: str, namespace: str = "default") -> str:
        return str(self.get("pod", name, "-n", namespace)["metadata"]["uid"])

    def logs(self, name: str, namespace: str = "default") -> str:
        return self.kubectl("logs", name, "-n", namespace).stdout

    def events(self, name: str, namespace: str = "default") -> str:
        out = self.kubectl(
            "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}",
            "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}", check=False,
        )  # fmt: skip
        return out.stdout


def env_for(gpuhook_config: str, images: list[Path], pause: str, configure: Path) -> dict[str, str]:
    """What cluster.sh (and so containerd, its shims and gpuhook-runtime) runs with."""
    from tests.integration import engines

    return {
        **engines.daemon_env(gpuhook_config),
        "NODE": NODE,
        "PAUSE": pause,
        "IMAGES": " ".join(str(i) for i in images),
        "PYTHON": "/usr/bin/python3",
        "CTD_CONFIGURE": str(configure),
    }


def write_configure(path: Path, gpuhook: str, runtime: str, containerd: Path, env: str) -> Path:
    """The CTD_CONFIGURE script: gpuhook registers itself as containerd's default runtime."""
    path.write_text(
        "#!/bin/sh\nset -e\n"
        f"GPUHOOK_CONFIG={env} exec {gpuhook} runtime configure --runtime containerd "
        f'--config "$1" --set-as-default --runtime-path {runtime} --containerd {containerd}\n'
    )
    path.chmod(0o755)
    return path


def wait_pod_gone(cluster: Cluster, name: str, namespace: str = "default") -> None:
    cluster.wait_for(f"pod {name} gone", lambda: not cluster.pod_phase(name, namespace), 120)


def ready_uptime(started: float) -> float:
    return round(time.monotonic() - started, 1)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
