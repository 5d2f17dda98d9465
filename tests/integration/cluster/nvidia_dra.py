"""NVIDIA's DRA driver (its GPU kubelet plugin, ../shared/k8s/nvidia-dra-gpu-kubelet-plugin) on
the fake node, run as ../shared/k8s/README.md ("What it needs from a node") says, outside its
Helm chart:

- a container driver root (``--container-driver-root``) in the plugin's own mount namespace:
  the fake driver's usr/, etc/ (its ld.so.cache) and lib/ and the fake node's dev/ bound in, so
  go-nvml loads the fake libnvidia-ml (with tools/fakenode/fake_nvml_dra.c's GPU instance API)
  and nvcdi finds the libraries and device nodes;
- a host driver root (``--nvidia-driver-root``) that holds dev/ as a host's / does: a folder of
  links to the fake driver's folders and the fake node's dev/ (the fake node itself is left as
  it is); the CDI specs' host paths are rewritten to it;
- the node's /proc/driver bound on /proc/driver (a MIG device's nvidia-caps minors), and
  ``ALT_PROC_DEVICES_PATH``: /proc/devices plus nvidia, nvidia-caps and nvidia-uvm (MIG claims);
- a stand-in nvidia-cdi-hook (the CDI spec's createContainer hooks) that logs and exits 0;
- its RBAC (the chart's kubelet-plugin ClusterRole, bound to a ServiceAccount whose token is its
  kubeconfig) and the chart's DeviceClasses ``gpu.nvidia.com`` and ``mig.nvidia.com``.

Its pid goes to WORK/pids/dra-plugin, so ``cluster.sh down`` stops it before the kubelet.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import FakeNode
from tests.integration.cluster.stack import BIN, NODE, Cluster

PLUGIN = "nvidia-dra-gpu-kubelet-plugin"
DRIVER = "gpu.nvidia.com"
NAMESPACE = "nvidia-dra-driver-gpu"
ACCOUNT = "nvidia-dra-driver-gpu-kubelet-plugin"


def rbac() -> list[dict[str, Any]]:
    """The chart's kubelet-plugin ClusterRole (cluster part) bound to the plugin's account."""

    def rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
        return {"apiGroups": [group], "resources": resources, "verbs": verbs}

    read = ["get", "list", "watch"]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": ACCOUNT},
         "rules": [
             rule("resource.k8s.io", ["resourceclaims"], read),
             rule("resource.k8s.io", ["resourceslices"],
                  [*read, "create", "update", "delete", "deletecollection"]),
             rule("", ["nodes"], [*read, "update"]),
             rule("", ["pods"], read),
             rule("resource.nvidia.com", ["computedomains"], read),
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": ACCOUNT},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": ACCOUNT},
         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]},
    ]  # fmt: skip


def device_classes() -> list[dict[str, Any]]:
    def cls(name: str, kind: str) -> dict[str, Any]:
        cel = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": cel}}]},
        }

    gpu = cls("gpu.nvidia.com", "gpu")
    # DRAExtendedResource (on by default in 1.36): nvidia.com/gpu limits served by this class
    gpu["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    return [gpu, cls("mig.nvidia.com", "mig")]


def _token_kubeconfig(cluster: Cluster, path: Path) -> Path:
    token = cluster.kubectl("create", "token", ACCOUNT, "-n", NAMESPACE, "--duration=2h").stdout
    ca = cluster.work / "pki" / "ca.crt"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "stack",
        "clusters": [{"name": "stack", "cluster": {
            "server": "https://127.0.0.1:16443", "certificate-authority": str(ca)}}],
        "users": [{"name": "plugin", "user": {"token": token.strip()}}],
        "contexts": [{"name": "stack", "context": {"cluster": "stack", "user": "plugin"}}],
    }))  # fmt: skip
    return path


def _roots(node: FakeNode, folder: Path) -> tuple[Path, Path]:
    """(host driver root: links, with dev/; the plugin's container driver root: mount points)."""
    truth = node.truth
    driver = Path(truth["driver_root"])
    host = folder / "host-driver-root"
    proot = folder / "proot"
    host.mkdir(parents=True)
    for name in ("usr", "etc", "lib", "lib64", "bin", "sbin", "opt"):
        if (driver / name).is_dir():
            (host / name).symlink_to(driver / name)
            (proot / name).mkdir(parents=True)
    (host / "dev").symlink_to(Path(truth["dev_root"]) / "dev")
    (proot / "dev").mkdir(parents=True)
    return host, proot


def _proc_devices(node: FakeNode, path: Path) -> Path:
    truth = node.truth
    host = Path("/proc/devices").read_text()
    extra = [(truth["gpu_major"], "nvidia"), (truth["uvm_major"], "nvidia-uvm"),
             (truth["caps_major"], "nvidia-caps")]  # fmt: skip
    chars, _, block = host.partition("\n\nBlock devices:")
    added = "".join(f"\n{m:3d} {n}" for m, n in extra)
    path.write_text(f"{chars}{added}\n\nBlock devices:{block}")
    return path


def start(cluster: Cluster, node: FakeNode, folder: Path) -> Path:
    """Start the plugin (RBAC, DeviceClasses, roots, hook); returns its CDI hook's log."""
    cluster.apply(rbac())
    cluster.apply(device_classes())
    folder.mkdir(parents=True, exist_ok=True)
    host, proot = _roots(node, folder)
    hook_log = folder / "cdi-hook.log"
    hook = folder / "nvidia-cdi-hook"
    hook.write_text(f'#!/bin/sh\necho "$*" >> {hook_log}\nexit 0\n')
    hook.chmod(0o755)
    driver = Path(node.truth["driver_root"])
    binds = [f"mount --bind {driver / n} {proot / n}" for n in os.listdir(proot) if n != "dev"]
    binds.append(f"mount --bind {Path(node.truth['dev_root']) / 'dev'} {proot / 'dev'}")
    binds.append(f"mount --bind {driver / 'proc' / 'driver'} /proc/driver")
    root = cluster.kubelet_root
    argv = [
        str(BIN / PLUGIN), "--node-name", NODE, "--namespace", NAMESPACE,
        "--cdi-root", str(cluster.cdi_dir), "--nvidia-driver-root", str(host),
        "--container-driver-root", str(proot), "--nvidia-cdi-hook-path", str(hook),
        "--image-name", "gpuhook-test.local/unused:1",
        "--kubeconfig", str(_token_kubeconfig(cluster, folder / "plugin.kubeconfig")),
        "--kubelet-registrar-directory-path", str(root / "plugins_registry"),
        "--kubelet-plugins-directory-path", str(root / "plugins"), "-v", "4",
    ]  # fmt: skip
    script = "set -e; " + "; ".join(binds) + '; exec "$@"'
    env = {
        **cluster.env,
        "NODE_NAME": NODE,
        "ALT_PROC_DEVICES_PATH": str(_proc_devices(node, folder / "proc-devices")),
    }
    log = open(cluster.work / "logs" / "dra-plugin.log", "w")  # noqa: SIM115 (the child's)
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", *argv],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        start_new_session=True,
    )  # fmt: skip
    log.close()
    (cluster.work / "pids" / "dra-plugin").write_text(str(proc.pid))
    cluster.wait_for(
        f"the ResourceSlice of {DRIVER}\n{cluster.log('dra-plugin')}",
        lambda: slices(cluster) or proc.poll() is not None,
        90,
    )
    if proc.poll() is not None:
        raise AssertionError(f"{PLUGIN} exited {proc.returncode}:\n{cluster.log('dra-plugin')}")
    return hook_log


def slices(cluster: Cluster) -> list[dict[str, Any]]:
    """The devices NVIDIA's driver published on the node."""
    items = cluster.get("resourceslices")["items"]
    return [d for s in items if s["spec"]["driver"] == DRIVER for d in s["spec"].get("devices", [])]


def claim_template(name: str, device_class: str, count: int = 1, avoid: str = "") -> dict[str, Any]:
    """A ResourceClaimTemplate of ``count`` devices of ``device_class``, never the GPU whose
    UUID is ``avoid``."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if count > 1:
        exactly.update(allocationMode="ExactCount", count=count)
    if avoid:
        cel = f"device.attributes['{DRIVER}'].uuid != '{avoid}'"
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def shared_claim(name: str, uuid: str) -> dict[str, Any]:
    """A ResourceClaim of the GPU with ``uuid`` (pods that name it share the GPU)."""
    cel = f"device.attributes['{DRIVER}'].uuid == '{uuid}'"
    request = {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": cel}}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }
