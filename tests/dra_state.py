"""The kubelet's DRA checkpoint (``<root-dir>/dra_manager_state``) as tests write it: the shape
kubelet 1.36 wrote on the cluster of ../shared/k8s (README there), one claim per tuple."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

# (claim uid, claim name, namespace, pod uids, [device names of gpu.nvidia.com])
ClaimSpec = tuple[str, str, str, list[str], list[str]]


def claim(
    uid: str, name: str, pod_uids: list[str], devices: list[str], namespace: str = "ml",
    driver: str = "gpu.nvidia.com", share_id: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    kind = "k8s.gpu.nvidia.com/claim" if driver == "gpu.nvidia.com" else f"k8s.{driver}/gpu"
    return {
        "ClaimUID": uid,
        "ClaimName": name,
        "Namespace": namespace,
        "PodUIDs": {p: {} for p in pod_uids},
        "DriverState": {
            driver: {
                "Devices": [
                    {
                        "PoolName": "localhost",
                        "DeviceName": d,
                        "ShareID": share_id,
                        "RequestNames": ["gpu"],
                        "CDIDeviceIDs": [f"{kind}={uid}-{d}"],
                    }
                    for d in devices
                ]
            }
        },
    }


def state_bytes(claims: list[dict[str, Any]], key: str = "ClaimInfoStateList") -> bytes:
    data = json.dumps(
        {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1", key: claims},
        separators=(",", ":"),
    )
    checksum = zlib.crc32(data.encode())
    return json.dumps({"Data": data, "Checksum": checksum}, separators=(",", ":")).encode()


def write(kubelet_dir: Path, claims: list[dict[str, Any]], key: str = "ClaimInfoStateList") -> Path:
    kubelet_dir.mkdir(parents=True, exist_ok=True)
    path = kubelet_dir / "dra_manager_state"
    path.write_bytes(state_bytes(claims, key))
    return path
