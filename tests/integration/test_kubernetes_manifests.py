"""deploy/kubernetes renders with ``kubectl kustomize`` into objects the Kubernetes API types take
(python3-kubernetes' models), with what the installer needs and nothing more; the ConfigMap's
config.yaml is one `gpuhook node install` accepts. Also the installer's pieces that need no root:
the relocated dispatchers and the config checks."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhook.errors import ConfigError, NodeInstallError, describe
from gpuhook.node import bundle, install
from gpuhook.runtime import dispatch

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
kubernetes = pytest.importorskip("kubernetes", reason="python3-kubernetes (scripts/bootstrap)")


class _Response:
    """What ApiClient.deserialize reads: a body in ``data``."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.data = json.dumps(doc)


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (scripts/bootstrap)")
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    client = kubernetes.client.ApiClient()
    objects: dict[str, Any] = {}
    for doc in docs:
        kind = doc["kind"]
        version = doc["apiVersion"].split("/")[-1].capitalize()
        objects[kind] = client.deserialize(_Response(doc), f"{version}{kind}")
    return objects


def test_the_manifests_render_into_api_objects(rendered: dict[str, Any]) -> None:
    assert sorted(rendered) == ["ConfigMap", "DaemonSet", "Namespace"]
    assert rendered["Namespace"].metadata.name == "gpuhook"
    for kind in ("ConfigMap", "DaemonSet"):
        assert rendered[kind].metadata.namespace == "gpuhook"


def test_the_daemonset(rendered: dict[str, Any]) -> None:
    ds = rendered["DaemonSet"]
    pod = ds.spec.template.spec
    assert ds.spec.update_strategy.type == "RollingUpdate"
    assert pod.host_pid is True
    assert pod.node_selector == {"nvidia.com/gpu.present": "true"}
    assert {t.key for t in pod.tolerations} >= {"nvidia.com/gpu"}
    (container,) = pod.containers
    assert container.security_context.privileged is True
    assert container.command[:3] == ["/usr/bin/gpuhook", "node", "install"]
    assert "--host-root=/host" in container.command
    assert container.readiness_probe._exec.command == ["test", "-f", "/run/gpuhook-node/ready"]
    assert "--ready-file=/run/gpuhook-node/ready" in container.command
    # The host mounts: its root (for the install, the chrooted refresh and the engine config)
    # and the ConfigMap; nothing else.
    volumes = {v.name: v for v in pod.volumes}
    assert sorted(volumes) == ["config", "host-root"]
    assert volumes["host-root"].host_path.path == "/"
    assert volumes["config"].config_map.name == rendered["ConfigMap"].metadata.name
    mounts = {m.name: m.mount_path for m in container.volume_mounts}
    assert mounts == {"host-root": "/host", "config": "/etc/gpuhook-node"}
    assert f"--config={mounts['config']}/config.yaml" in container.command
    # the metrics (gpuhook metrics serve) on the pod port Prometheus' discovery scrapes
    (port,) = container.ports
    assert (port.name, port.container_port, port.protocol) == ("metrics", 9479, "TCP")
    assert f"--metrics-listen=0.0.0.0:{port.container_port}" in container.command
    annotations = ds.spec.template.metadata.annotations
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port.container_port),
        "prometheus.io/path": "/metrics",
    }
    assert pod.termination_grace_period_seconds >= 60


def test_the_configmap_is_a_config_the_installer_takes(
    rendered: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(rendered["ConfigMap"].data["config.yaml"])
    raw, data = install.validated_config(str(path))
    assert raw == path.read_bytes()
    assert data["hook"]["path"] == install.HOOK_PATH
    assert data["hook"]["ldconfig"] == install.LDCONFIG


def test_a_config_with_another_hook_path_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("hook:\n  path: /usr/bin/gpuhook\n")
    with pytest.raises(ConfigError) as info:
        install.validated_config(str(path))
    code, line = describe(info.value)
    assert code == 2
    assert line == (
        f"invalid config {path}: hook.path: must be /opt/gpuhook/bin/gpuhook on a node "
        "installed by the DaemonSet"
    )


def test_a_config_without_hook_path_takes_the_gpuhook_beside_the_runtime(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("log:\n  level: info\n")
    raw, data = install.validated_config(str(path))
    assert raw == path.read_bytes() and data["hook"]["path"] is None


def test_no_config_gives_the_minimal_one() -> None:
    raw, data = install.validated_config(None)
    assert raw == install.DEFAULT_CONFIG
    assert data["hook"]["path"] == install.HOOK_PATH


def test_the_dispatchers_are_relocated_to_the_bundled_loader() -> None:
    source = bundle.Source(
        python="/usr/bin/python3.11",
        stdlib="/usr/lib/python3.11",
        site="/usr/lib/python3/dist-packages",
        bin_dir="/usr/bin",
        ldconfig="/sbin/ldconfig",
        python_cmd="/usr/bin/python3",
    )
    # as the .deb's build makes them (debian/rules), then as the installer relocates them
    sh = (REPO / "packaging" / "gpuhook.in").read_text()
    text = dispatch.render(sh, source.python_cmd, source.site).encode()
    out = bundle.dispatcher("gpuhook", text, source, "ld-linux-x86-64.so.2").decode()
    assert "/usr/bin/python3" not in out and "/usr/lib/python3/" not in out
    assert (
        "exec /opt/gpuhook/lib/ld-linux-x86-64.so.2 --library-path /opt/gpuhook/lib "
        "/opt/gpuhook/bin/python3 -I -S /opt/gpuhook/lib/python3/dist-packages/gpuhook/"
    ) in out
    binary = (REPO / "build" / "bin" / "gpuhook-runtime").read_bytes()
    built = dispatch.relocate(binary, dispatch.python_command(source.python_cmd, source.site))
    moved = bundle.dispatcher("gpuhook-runtime", built, source, "ld-linux-x86-64.so.2")
    assert dispatch.command_of(moved) == [
        "/opt/gpuhook/lib/ld-linux-x86-64.so.2",
        "--library-path",
        "/opt/gpuhook/lib",
        "/opt/gpuhook/bin/python3",
        "-I",
        "-S",
        "/opt/gpuhook/lib/python3/dist-packages/gpuhook/_shim_entry.py",
    ]
    assert len(moved) == len(binary)
    with pytest.raises(NodeInstallError, match="starts"):
        bundle.dispatcher("gpuhook-runtime", binary, source, "ld-linux-x86-64.so.2")


def test_the_interpreter_of_this_python() -> None:
    import os
    import sys

    loader = bundle.interpreter_of(os.path.realpath(sys.executable))
    assert loader.startswith("/") and "ld-linux" in loader
