"""A private containerd 2.x (``../shared/k8s``'s containerd 2.3.4) with NRI on and gpuhook's NRI
plugin, driven through its CRI plugin as the kubelet drives it. No gpuhook runtime is
registered: containerd runs plain runc; every GPU edit comes from the plugin's adjustments.

The daemon: its own root, state, sockets and NRI socket under a short folder in /tmp, and NRI's
default validator requiring the plugin ``gpuhook`` (fail closed). The plugin: ``gpuhook nri``
as a process of the suite (:class:`PluginProcess`), with gpuhook's config of the CRI suites
(the fake GPU node, a kubelet folder whose checkpoint the tests write).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests.conftest import FakeNode, mps_daemons_under
from tests.integration import containerd2, engines
from tests.integration.cri import client as cri_client
from tests.integration.cri.conftest import Cri
from tests.integration.cri.daemon import ENGINES, PAUSE, build_images, kill_shims

PLUGIN = "gpuhook"
INDEX = "10"


def config_toml(root: Path) -> str:
    """The containerd 2.x suites' config (:func:`containerd2.cri_config`: CRI with plain runc,
    everything under ``root``) with NRI's timeouts as containerd's defaults and its default
    validator refusing a container create while the plugin ``gpuhook`` is not registered."""
    base = containerd2.cri_config(root, PAUSE, root / "runc", f"{root}/cdi")
    # the NRI table is the template's last: these keys join it, the validator is its subtable
    return base + f"""    plugin_registration_timeout = '5s'
    plugin_request_timeout = '2s'

    [plugins.'io.containerd.nri.v1.nri'.default_validator]
      enable = true
      required_plugins = ['{PLUGIN}']
"""


class Containerd2(engines.Daemon):
    """containerd 2.x with the config above; ``restart`` stops and starts it on the same
    state (its containers' shims live on)."""

    def __init__(self, root: Path, bin_dir: Path, env: dict[str, str]) -> None:
        super().__init__("containerd2", root)
        self.bin_dir = bin_dir
        self.socket = root / "containerd.sock"
        self.nri_socket = root / "nri" / "nri.sock"
        self.config = root / "config.toml"
        self.env = {**env, "PATH": f"{bin_dir}:{env['PATH']}"}
        self.restart()

    def restart(self) -> None:
        self.stop()
        self.start([str(self.bin_dir / "containerd"), "--config", str(self.config)], self.env,
                   self.socket)  # fmt: skip

    def ready(self) -> bool:
        return self.ctr("version", timeout=30).returncode == 0

    def ctr(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "ctr"), "--address", str(self.socket), *args],
            capture_output=True,
            text=True,
            env={"PATH": engines.BASE_PATH},
            timeout=timeout,
            check=False,
        )

    def registrations(self) -> int:
        """How many times the plugin registered (containerd's log lines)."""
        text = self.log.read_text(errors="replace")
        return text.count(f'registered as \\"{INDEX}-{PLUGIN}\\"')

    def closings(self) -> int:
        """How many times containerd saw the plugin's connection close."""
        text = self.log.read_text(errors="replace")
        return text.count(f'connection to plugin \\"{INDEX}-{PLUGIN}\\" closed')


class PluginProcess:
    """``gpuhook nri`` on the daemon's NRI socket, its stderr in ``<root>/nri-plugin.log``."""

    def __init__(self, cri: Cri, daemon: Containerd2) -> None:
        self.cri = cri
        self.daemon = daemon
        self.log = cri.root / "nri-plugin.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> None:
        before = self.daemon.registrations()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [testbed.GPUHOOK, "nri", "--socket", str(self.daemon.nri_socket), "--index", INDEX],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.cri.env},
                start_new_session=True,
            )
        if wait:
            self.wait_registered(before)

    def wait_registered(self, before: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.daemon.registrations() <= before:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            assert time.monotonic() < deadline, "the plugin did not register" + self.tail()
            time.sleep(0.1)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=30)

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- {self.log}:\n" + "\n".join(text) + self.daemon.tail(lines)


class NriCri(Cri):
    """The CRI suites' helpers on containerd 2.x, with the plugin."""

    plugin: PluginProcess

    def __init__(self, node: FakeNode, root: Path, daemon: Containerd2, api: Any) -> None:
        super().__init__(node, root, daemon, api, ENGINES[1])  # type: ignore[arg-type]
        self.ctd = daemon
        self.plugin = PluginProcess(self, daemon)

    def configure(self, **sections: Any) -> None:
        """The CRI suites' config with a state folder of this suite's own (the plugin's records
        and status stay out of the session's node), the node's inventory file."""
        inventory = str(self.node.root / "state" / "inventory.json")
        super().configure(
            state_dir=str(self.root / "gpuhook-state"), inventory={"path": inventory}, **sections
        )

    def bundle(self, container_id: str) -> Path:
        return self.root / "state" / "io.containerd.runtime.v2.task" / "k8s.io" / container_id

    def why(self) -> str:
        return self.plugin.tail()


@pytest.fixture(scope="session")
def nri_cri(
    node: FakeNode, rootfs_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NriCri]:
    root = engines.short_dir("gh-nri-")
    daemon = None
    c = None
    try:
        (root / "config.toml").write_text(config_toml(root))
        bin_dir = containerd2.unpack()
        api = cri_client.compile_api(tmp_path_factory.mktemp("cri-api"))
        daemon = Containerd2(root, bin_dir, engines.daemon_env(str(root / "gpuhook.yaml")))
        c = NriCri(node, root, daemon, api)
        version = c.client.version()
        assert (version.runtime_name, version.runtime_version) == ("containerd", "v2.3.4")
        c.configure()
        build_images(daemon, rootfs_template, tmp_path_factory.mktemp("nri-images"))  # type: ignore[arg-type]
        c.plugin.start()
        yield c
        c.client.close()
    finally:
        if c is not None:
            c.plugin.kill(signal.SIGTERM)
        if daemon is not None:
            daemon.stop()
            kill_shims(daemon.socket)
        for pid in mps_daemons_under(root):
            os.kill(pid, 9)
        engines.remove_tree(root)


@pytest.fixture
def nri(nri_cri: NriCri) -> NriCri:
    """The suite's daemon and a running plugin, gpuhook's default config, an empty checkpoint."""
    nri_cri.configure()
    nri_cri.allocate()
    proc = nri_cri.plugin.proc
    if proc is None or proc.poll() is not None:
        nri_cri.plugin.start()
    return nri_cri
