"""The fake GPU nodes of a run (tools/fake-node) with a production-like gpuhook config, the
runtime service on them, and the kubelet checkpoint of the leak case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from bundles import BenchError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_NODE = os.path.join(REPO, "tools", "fake-node")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def make_node(
    folder: str, hook: str, runc: str, checkpoint: str, service: str, *args: str
) -> dict[str, Any]:
    """A fake GPU node (tools/fake-node) with a production-like gpuhook config (log level info,
    the bench's kubelet checkpoint, the bench's runtime service), its inventory refreshed; and a
    copy of that config without the service (``bench_config_python``)."""
    out = subprocess.run(
        [
            sys.executable,
            FAKE_NODE,
            folder,
            "--force",
            "--hook-path",
            hook,
            "--runtime",
            runc,
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise BenchError(f"tools/fake-node failed: {out.stderr.strip()}")
    with open(os.path.join(folder, "node.json")) as fh:
        truth: dict[str, Any] = json.load(fh)
    config = os.path.join(folder, "bench-config.yaml")
    cdi_dir = os.path.join(folder, "cdi")  # never the host's CDI folders
    for path, socket in ((config, service), (os.path.join(folder, "bench-python.yaml"), "")):
        with open(path, "w") as fh:
            fh.write(
                "# gpuhook config of the bench's fake node (as an operator's: log level info)\n"
                f"driver_root: {json.dumps(truth['driver_root'])}\n"
                f"dev_root: {json.dumps(truth['dev_root'])}\n"
                f"state_dir: {json.dumps(truth['state_dir'])}\n"
                f"runtime:\n  path: {json.dumps(runc)}\n  service: {json.dumps(socket)}\n"
                f"log:\n  level: info\n  file: {json.dumps(truth['log_file'])}\n"
                f"hook:\n  path: {json.dumps(hook)}\n"
                f"cdi:\n  output: {json.dumps(os.path.join(cdi_dir, 'gpuhook-nvidia.json'))}\n"
                f"  spec_dirs: [{json.dumps(cdi_dir)}]\n"
                "policy:\n  kubernetes:\n    env_requests: verify\n"
                f"    checkpoint: {json.dumps(checkpoint)}\n"
            )
    refresh = subprocess.run(
        [hook, "inventory", "refresh"],
        env={"PATH": BASE_PATH, "GPUHOOK_CONFIG": config, **cache_env(truth)},
        capture_output=True,
        text=True,
        check=False,
    )
    if refresh.returncode != 0:
        raise BenchError(f"gpuhook inventory refresh failed: {refresh.stderr.strip()}")
    truth["bench_config"] = config
    truth["bench_config_python"] = os.path.join(folder, "bench-python.yaml")
    return truth


def cache_env(truth: dict[str, Any]) -> dict[str, str]:
    """The fake node's own gpuhook config cache (GPUHOOK_CACHE_DIR), never the host's /run."""
    return {"GPUHOOK_CACHE_DIR": truth["env"]["GPUHOOK_CACHE_DIR"]}


def start_service(
    hook: str, socket: str, truth: dict[str, Any], output: str, timeout_s: float = 60.0
) -> subprocess.Popen[bytes]:
    """``gpuhook runtime serve`` on ``socket`` for the fake node ``truth``, once it listens. Its
    stdout and stderr go to the file ``output`` (a pipe nobody reads would block it once full)."""
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [hook, "runtime", "serve", "--socket", socket],
            env={"PATH": BASE_PATH, "GPUHOOK_CONFIG": truth["bench_config"], **cache_env(truth)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + timeout_s
    while True:
        with open(output, "rb") as fh:
            first, newline, _ = fh.read().partition(b"\n")
        if newline and b"listening" in first:
            return proc
        if newline or proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise BenchError(f"gpuhook runtime serve did not start: {tail(output)}")
        time.sleep(0.02)


def tail(path: str, lines: int = 5) -> str:
    """The last ``lines`` lines of the file ``path``, on one line."""
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError as exc:
        return f"({path}: {exc.strerror})"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"


def write_checkpoint(path: str, gpu_uuids: list[str]) -> None:
    """A kubelet device checkpoint in which other pods hold every GPU (nothing for the bench's
    pod), in the NUMA-map layout of Kubernetes >= 1.20."""
    entries = [
        {
            "PodUID": f"7a1e0c55-0000-4000-8000-{i:012d}",
            "ContainerName": "worker",
            "ResourceName": "nvidia.com/gpu",
            "DeviceIDs": {"0": [gpu]},
            "AllocResp": "CiQKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSCkdQVS0wMDAwMDA=",
        }
        for i, gpu in enumerate(gpu_uuids)
    ]
    with open(path, "w") as fh:
        json.dump(
            {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 1}, fh
        )
