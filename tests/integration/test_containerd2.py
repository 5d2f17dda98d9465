"""`gpuhook runtime configure --runtime containerd` on a real containerd 2.x (2.3.4, ../shared/k8s)
as an operator runs it: register in a drop-in, restart, run a GPU container through CRI, undo,
restart; the root file byte for byte as it was, every check made by containerd's own
`containerd config dump`. The node's runc options (its runc state Root, SystemdCgroup) are in a
drop-in of their own and the root file has no default_runtime_name, as on many 2.x nodes: the
two defects seen with 2.3.4 (a runtime with only BinaryName; `default_runtime_name = 'runc'`
left behind by undo) show here.

Each test has its own daemon folder in /tmp (engines.py): nothing of the host's containerd.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import testbed
import yaml

from tests.conftest import REPO, FakeNode, mps_daemons_under
from tests.integration import containerd2, engines
from tests.integration.cri import client as cri_client
from tests.integration.cri.conftest import IMAGE_ALL, Cri
from tests.integration.cri.daemon import PAUSE, build_images, kill_shims, runc_root
from tests.integration.cri.kubelet import Allocation, Pod
from tests.integration.test_leak_matrix import gpus

pytestmark = [pytest.mark.slow, pytest.mark.root]

CRI3 = "io.containerd.cri.v1.runtime"
RUNC_OPTIONS = f"[plugins.'{CRI3}'.containerd.runtimes.runc.options]"


class Node2:
    """A containerd 2.x node: its root config.toml, conf.d drop-ins, the daemon once started."""

    def __init__(self, node: FakeNode, bin_dir: Path, root: Path) -> None:
        self.node = node
        self.bin_dir = bin_dir
        self.root = root
        self.config = root / "config.toml"
        self.conf_d = root / "conf.d"
        self.dropin = self.conf_d / "99-gpuhook.toml"
        self.daemon: engines.Containerd | None = None
        self.env = {**node.env, "GPUHOOK_CONFIG": str(root / "gpuhook.yaml")}

    def write(self) -> bytes:
        """The node's files: a v3 root file without default_runtime_name that imports
        conf.d/*.toml, and conf.d/10-runc.toml with runc's options. Returns the root file."""
        [cdi_dir] = yaml.safe_load(self.node.config.read_text())["cdi"]["spec_dirs"]
        runc = runc_root(self.root).parent
        text = containerd2.cri_config(self.root, PAUSE, runc, cdi_dir)
        for line in ("      default_runtime_name = 'runc'\n", f"          Root = '{runc}'\n"):
            assert text.count(line) == 1, line
            text = text.replace(line, "")
        text = text.replace("SystemdCgroup = false", "SystemdCgroup = true")  # the drop-in wins
        text = text.replace("imports = []", f"imports = ['{self.conf_d}/*.toml']")
        self.conf_d.mkdir()
        (self.conf_d / "10-runc.toml").write_text(
            f"version = 3\n{RUNC_OPTIONS}\n  Root = '{runc}'\n  SystemdCgroup = false\n"
        )
        self.config.write_text(text)
        return self.config.read_bytes()

    def gpuhook(self, action: str, *args: str) -> Any:
        return self.node.gpuhook(
            "runtime", action, "--runtime", "containerd", "--config", str(self.config),
            "--containerd", str(self.bin_dir / "containerd"), *args, env=self.env,
        )  # fmt: skip

    def restart(self) -> engines.Containerd:
        if self.daemon is not None:
            self.daemon.stop()
        env = engines.daemon_env(str(self.root / "gpuhook.yaml"))
        self.daemon = engines.Containerd(self.root, self.config, env, self.bin_dir)
        return self.daemon

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            kill_shims(self.daemon.socket)


@pytest.fixture
def node2(node: FakeNode, containerd2_bin: Path) -> Iterator[Node2]:
    n = Node2(node, containerd2_bin, engines.short_dir("gh-ctd2-"))
    try:
        yield n
    finally:
        n.stop()
        for pid in mps_daemons_under(n.root):
            os.kill(pid, 9)
        engines.remove_tree(n.root)


def gpuhook_runtime(node2: Node2) -> dict[str, Any]:
    data = tomllib.loads(node2.dropin.read_text())
    assert data["version"] == 3  # the root file's version (a higher one stops containerd)
    runtime: dict[str, Any] = data["plugins"][CRI3]["containerd"]["runtimes"]["gpuhook"]
    return runtime


def test_register_restart_run_a_gpu_container_undo(
    node2: Node2, rootfs_template: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    original = node2.write()
    daemon = node2.restart()  # the node runs with runc first
    build_images(daemon, rootfs_template, tmp_path_factory.mktemp("ctd2-images"))

    out = node2.gpuhook(
        "configure", "--drop-in", str(node2.dropin), "--set-as-default",
        "--runtime-path", testbed.RUNTIME,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        f"checked: {node2.bin_dir}/containerd config dump reads runtime gpuhook -> "
        f"{testbed.RUNTIME} as the default runtime"
    ) in out.stdout.splitlines()
    assert node2.config.read_bytes() == original  # its conf.d glob imports the drop-in
    runtime = gpuhook_runtime(node2)
    assert runtime["runtime_type"] == "io.containerd.runc.v2"
    # runc's options as the merged config has them (10-runc.toml), not the root file's
    assert runtime["options"]["Root"] == str(runc_root(node2.root).parent)
    assert runtime["options"]["SystemdCgroup"] is False

    daemon = node2.restart()
    api = cri_client.compile_api(tmp_path_factory.mktemp("ctd2-api"))
    cri = Cri(node2.node, node2.root, daemon, api, f"containerd-{containerd2.VERSION}")
    try:
        cri.configure()
        p = Pod()
        uuid = cri.uuid(1)
        grant = Allocation("main", "nvidia.com/gpu", (uuid,), envs={"NVIDIA_VISIBLE_DEVICES": uuid})
        cri.allocate((p, grant))
        with cri.pod(p) as pod:
            cid = pod.container(image=IMAGE_ALL, allocations=(grant,))
            seen = pod.probe(cid)
            record = cri.record(cid)
            state = runc_root(node2.root) / cid
            assert state.is_dir(), "runc's state is not under the Root of 10-runc.toml"
        assert seen["dev"] == gpus(1)
        assert [d["uuid"] for d in record["decision"]["devices"]] == [uuid]
    finally:
        cri.client.close()

    out = node2.gpuhook("unconfigure", "--drop-in", str(node2.dropin))
    assert out.returncode == 0, out.stderr
    assert f"checked: {node2.bin_dir}/containerd config dump loads {node2.config}" in out.stdout
    assert not node2.dropin.exists()
    assert node2.config.read_bytes() == original
    daemon = node2.restart()
    assert daemon.ctr("version").returncode == 0


def test_register_in_the_root_file_and_undo_byte_for_byte(node2: Node2) -> None:
    """No drop-in: the runtime and the default go into the root file (which had no
    default_runtime_name); undo gives the file back byte for byte; containerd 2.x loads both."""
    original = node2.write()
    out = node2.gpuhook("configure", "--set-as-default", "--runtime-path", testbed.RUNTIME)
    assert out.returncode == 0, out.stderr
    assert "as the default runtime" in out.stdout.splitlines()[-2]
    data = tomllib.loads(node2.config.read_text())
    cri = data["plugins"][CRI3]["containerd"]
    assert cri["default_runtime_name"] == "gpuhook"
    assert cri["runtimes"]["gpuhook"]["options"]["Root"] == str(runc_root(node2.root).parent)
    assert cri["runtimes"]["gpuhook"]["options"]["SystemdCgroup"] is False
    assert cri["runtimes"]["runc"]["options"]["SystemdCgroup"] is True  # the root file's: kept
    node2.restart()
    out = node2.gpuhook("unconfigure")
    assert out.returncode == 0, out.stderr
    assert node2.config.read_bytes() == original
    backups = sorted(p.name for p in node2.root.glob("config.toml.gpuhook-backup-*"))
    assert len(backups) == 2


def test_a_drop_in_containerd_does_not_read_as_meant_is_never_left(node2: Node2) -> None:
    """A later drop-in of another tool makes runc the default again: containerd would load
    gpuhook's drop-in and never use it. configure says so in one line and leaves every file as
    it was (no drop-in, no backup)."""
    original = node2.write()
    other = node2.conf_d / "zz-other.toml"
    other.write_text(
        f"version = 3\n[plugins.'{CRI3}'.containerd]\n  default_runtime_name = 'runc'\n"
    )
    before = sorted(p.name for p in node2.root.rglob("*"))
    out = node2.gpuhook(
        "configure", "--drop-in", str(node2.dropin), "--set-as-default",
        "--runtime-path", testbed.RUNTIME,
    )  # fmt: skip
    assert out.returncode == 1
    [line] = out.stderr.splitlines()
    assert line == (
        f"gpuhook: {node2.config}: after the edit, containerd config dump shows the default "
        "runtime is runc, not gpuhook (another file overrides it); every file restored as it "
        "was, nothing changed"
    )
    assert node2.config.read_bytes() == original
    assert sorted(p.name for p in node2.root.rglob("*")) == before


def test_a_config_of_a_higher_drop_in_version_is_refused(node2: Node2) -> None:
    """aicr#1688: a version-4 drop-in under a version-3 root stops containerd. Such a node
    cannot be edited safely: nothing is written, the line says containerd's reason."""
    original = node2.write()
    (node2.conf_d / "50-v4.toml").write_text("version = 4\n")
    out = node2.gpuhook("configure", "--set-as-default", "--runtime-path", testbed.RUNTIME)
    assert out.returncode == 1
    [line] = out.stderr.splitlines()
    assert line == (
        f"gpuhook: {node2.config}: containerd config dump: containerd: drop-in config version 4 "
        "higher than root config version 3: containerd cannot load the config as it is; "
        "nothing written"
    )
    assert node2.config.read_bytes() == original


@pytest.mark.parametrize("drop_in", [False, True])
def test_a_version_2_config_under_containerd_2(node2: Node2, tmp_path: Path, drop_in: bool) -> None:
    """containerd 1.6's `config default` (version 2) read by containerd 2.x, which migrates it:
    gpuhook edits it at version 2 (a drop-in too) and 2.x's dump shows the runtime and the
    default; undo gives the file back byte for byte."""
    fixture = REPO / "tests" / "fixtures" / "registration" / "containerd-1.6-default.toml"
    config = tmp_path / "config.toml"
    dropin = tmp_path / "conf.d" / "gpuhook.toml"
    config.write_text(fixture.read_text())
    extra = ["--drop-in", str(dropin)] if drop_in else []
    base = [
        "runtime", "--runtime", "containerd", "--config", str(config),
        "--containerd", str(node2.bin_dir / "containerd"), *extra,
    ]  # fmt: skip
    out = node2.node.gpuhook(
        base[0], "configure", *base[1:], "--set-as-default", "--runtime-path", testbed.RUNTIME,
        env=node2.env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "as the default runtime" in out.stdout
    if drop_in:
        assert tomllib.loads(dropin.read_text())["version"] == 2
    out = node2.node.gpuhook(base[0], "unconfigure", *base[1:], env=node2.env)
    assert out.returncode == 0, out.stderr
    assert config.read_text() == fixture.read_text()
    assert not dropin.exists()
    assert json.dumps(tomllib.loads(config.read_text()))  # still TOML


def test_a_new_config_for_containerd_2(node2: Node2, tmp_path: Path) -> None:
    """No config.toml yet: gpuhook writes one of version 3 (the containerd given is 2.x), which
    that containerd's dump reads with gpuhook as the default runtime."""
    config = tmp_path / "config.toml"
    out = node2.node.gpuhook(
        "runtime", "configure", "--runtime", "containerd", "--config", str(config),
        "--containerd", str(node2.bin_dir / "containerd"), "--set-as-default",
        "--runtime-path", testbed.RUNTIME, env=node2.env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert config.read_text().startswith("version = 3\n")
    assert f"wrote {config} (new file)" in out.stdout.splitlines()
    assert "as the default runtime" in out.stdout
