"""The DaemonSet's metrics: ``gpuhook node install --metrics-listen ADDR`` runs the installed
copy's ``gpuhook metrics serve`` chrooted into the host root (so it reads the host's records,
inventory and NVML as the .deb's gpuhook-metrics.service does; the pod shares the host's pid
namespace, so /proc shows the containers' processes), in the pod's network namespace on
``ADDR`` (the pod port Prometheus' Kubernetes discovery scrapes). It is restarted when it
exits, and stopped before the uninstall."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import TYPE_CHECKING

from gpuhook.node import host

if TYPE_CHECKING:
    from collections.abc import Mapping


class MetricsChild:
    """The chrooted ``gpuhook metrics serve`` (nothing when ``listen`` is empty), run with
    ``env`` (the host's minimal environment by default, as the inventory refresh)."""

    def __init__(
        self,
        host_root: str,
        gpuhook: str,
        config: str,
        listen: str,
        env: Mapping[str, str] = host.HOST_ENV,
    ) -> None:
        self.argv = ["chroot", host_root, gpuhook, "--config", config, "metrics", "serve"]
        self.argv += ["--listen", listen]
        self.listen = listen
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None

    def ensure(self) -> str:
        """Start it when it is not running; a line saying so, "" when nothing was done."""
        if not self.listen or (self.proc is not None and self.proc.poll() is None):
            return ""
        why = "" if self.proc is None else f" (it exited with {self.proc.returncode})"
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdin=subprocess.DEVNULL, start_new_session=True
        )
        return f"metrics on {self.listen} (pid {self.proc.pid}){why}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
