#!/usr/bin/env python3
"""`make demo`: a fake 8-GPU node, real runc containers through gpuhook-runtime, and what
`gpuhook inspect` says about them.

1. build the fake node (mknod device nodes, stand-in driver libraries, a C libnvidia-ml)
2. gpuhook inventory refresh, gpuhook inspect node; gpuhook runtime serve (the runtime service
   the .deb runs: the GPU creates below start no interpreter)
3. three containers: one asks for GPU 1; a Kubernetes pod whose image says
   NVIDIA_VISIBLE_DEVICES=all without any GPU allocated (the stock runtime's default-"all" leak);
   the same pod once the kubelet allocated GPU 2 to it. Each prints the /dev/nvidia* nodes it
   sees and runs nvidia-smi -L.
4. gpuhook inspect spec on the leak case: the decision and its reasons.
5. gpuhook selftest: every GPU and MIG device, the leak case and a plain container, each in a
   throwaway container of its own (through the runtime service), judged and timed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import testbed

DEMO = os.environ.get("GPUHOOK_DEMO_DIR", "/tmp/gpuhook-demo")
BOLD = "\x1b[1m" if sys.stdout.isatty() else ""
RESET = "\x1b[0m" if sys.stdout.isatty() else ""

POD = {
    "io.kubernetes.cri.container-type": "container",
    "io.kubernetes.cri.sandbox-uid": "7f1c1f2e-demo-pod",
    "io.kubernetes.cri.sandbox-name": "trainer",
    "io.kubernetes.cri.sandbox-namespace": "ml",
    "io.kubernetes.cri.container-name": "main",
}
SHOW = (
    "echo \"/dev nodes: $(ls /dev | grep '^nvidia' | tr '\\n' ' ')\"; "
    'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; '
    "if [ -x /usr/bin/nvidia-smi ]; then nvidia-smi -L; else echo 'no nvidia-smi'; fi"
)


def step(title: str) -> None:
    print(f"\n{BOLD}== {title}{RESET}", flush=True)


def sh(cmd: list[str], env: dict[str, str], check: bool = True) -> int:
    print(f"$ {' '.join(cmd)}", flush=True)
    code = subprocess.run(cmd, env=env, check=False).returncode
    if check and code != 0:
        raise SystemExit(f"demo: {cmd[0]} failed with exit code {code}")
    return code


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("demo: run as root (it creates device nodes and runs runc)")
    shutil.rmtree(DEMO, ignore_errors=True)
    os.makedirs(DEMO)
    step("1. A fake GPU node: 8 GPUs, GPUs 6 and 7 in MIG mode with 3 MIG devices each")
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(testbed.REPO, "tools", "fake-node"),
            f"{DEMO}/node",
            "--gpus",
            "8",
            "--mig-gpus",
            "6,7",
            "--mig-devices",
            "3",
            "--hook-path",
            testbed.GPUHOOK,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    env = dict(os.environ)
    for line in out.stdout.splitlines():
        if line.startswith("export "):
            key, _, value = line[7:].partition("=")
            env[key] = value.strip("'\"")
            print(line)
    checkpoint = f"{DEMO}/kubelet_internal_checkpoint"
    with open(env["GPUHOOK_CONFIG"], "a") as fh:
        fh.write(f"policy:\n  kubernetes:\n    checkpoint: {checkpoint}\n")
    with open(checkpoint, "w") as fh:
        json.dump({"Data": {"PodDeviceEntries": [], "RegisteredDevices": {}}, "Checksum": 0}, fh)

    step("2. Inventory from NVML (the fake libnvidia-ml) and the driver root")
    sh([testbed.GPUHOOK, "inventory", "refresh"], env)
    sh([testbed.GPUHOOK, "inspect", "node", "--output", "table"], env)

    step("2b. The runtime service: GPU creates are decided without starting an interpreter")
    print(f"$ {testbed.GPUHOOK} runtime serve &", flush=True)
    service = subprocess.Popen(
        [testbed.GPUHOOK, "runtime", "serve"], env=env, stdout=subprocess.PIPE, text=True
    )
    if service.stdout is not None:
        print(service.stdout.readline(), end="", flush=True)
    try:
        containers(env, checkpoint)
        step("5. gpuhook selftest: the node end to end, with containers of its own")
        sh([testbed.GPUHOOK, "selftest", "--output", "table"], env)
    finally:
        service.terminate()
        service.wait(timeout=30)
    print(
        f"\nDemo files are in {DEMO}. Use: export GPUHOOK_CONFIG={env['GPUHOOK_CONFIG']} "
        f"GPUHOOK_CACHE_DIR={env['GPUHOOK_CACHE_DIR']}"
    )


def containers(env: dict[str, str], checkpoint: str) -> None:
    """Steps 3a-3c: real runc containers through gpuhook-runtime, then what was decided."""
    rootfs = testbed.build_rootfs(f"{DEMO}/rootfs")
    state = f"{DEMO}/runc-state"
    os.makedirs(state, exist_ok=True)

    step("3a. docker-style container with NVIDIA_VISIBLE_DEVICES=1")
    b1 = testbed.make_bundle(
        f"{DEMO}/gpu1", rootfs, ("/bin/sh", "-c", SHOW), env=["NVIDIA_VISIBLE_DEVICES=1"]
    )
    print(f"$ gpuhook-runtime --root {state} run --bundle {b1} demo-gpu1")
    print(testbed.run_container(b1, "demo-gpu1", state, env).stdout, end="")

    step("3b. Kubernetes pod ml/trainer, image ENV NVIDIA_VISIBLE_DEVICES=all, no GPU allocated")
    b2 = testbed.make_bundle(
        f"{DEMO}/leak",
        rootfs,
        ("/bin/sh", "-c", SHOW),
        env=["NVIDIA_VISIBLE_DEVICES=all"],
        annotations=POD,
    )
    sh([testbed.GPUHOOK, "inspect", "spec", "--bundle", b2, "--output", "table"], env)
    print(f"$ gpuhook-runtime --root {state} run --bundle {b2} demo-leak")
    print(testbed.run_container(b2, "demo-leak", state, env).stdout, end="")

    step("3c. The same pod after the kubelet allocated GPU 2 to it")
    with open(f"{DEMO}/node/state/inventory.json") as fh:
        inventory = json.load(fh)
    gpu2 = inventory["gpus"][2]["uuid"]
    with open(checkpoint, "w") as fh:
        json.dump(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {
                            "PodUID": POD["io.kubernetes.cri.sandbox-uid"],
                            "ContainerName": "main",
                            "ResourceName": "nvidia.com/gpu",
                            "DeviceIDs": {"0": [gpu2]},
                            "AllocResp": "",
                        }
                    ],
                    "RegisteredDevices": {"nvidia.com/gpu": [gpu2]},
                },
                "Checksum": 0,
            },
            fh,
        )
    b3 = testbed.make_bundle(
        f"{DEMO}/alloc",
        rootfs,
        ("/bin/sh", "-c", SHOW),
        env=["NVIDIA_VISIBLE_DEVICES=all"],
        annotations=POD,
    )
    print(f"$ gpuhook-runtime --root {state} run --bundle {b3} demo-alloc")
    print(testbed.run_container(b3, "demo-alloc", state, env).stdout, end="")
    # What was decided, from the decision records the creates wrote: the pod, then one container.
    sh([testbed.GPUHOOK, "inspect", "pod", "ml/trainer", "--output", "table"], env)
    sh([testbed.GPUHOOK, "inspect", "container", "demo-alloc", "--output", "table"], env)


if __name__ == "__main__":
    main()
