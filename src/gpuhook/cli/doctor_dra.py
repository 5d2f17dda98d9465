"""doctor's check of the kubelet's DRA state (docs/dra.md): why a pod's claim cannot start.

``<kubelet_dir>/dra_manager_state`` is read as the runtime reads it (:mod:`gpuhook.pipeline.dra`)
and each prepared claim of NVIDIA's driver is looked at: its devices must be GPUs of this node's
inventory, its CDI names must be in a CDI spec of ``cdi.spec_dirs`` (the driver's per-claim spec
lives on a tmpfs, /var/run/cdi: after a reboot the checkpoint persists and the spec is gone,
kubernetes#141433, and the engine cannot resolve the names), and it must be prepared for a pod
the kubelet still has (``<kubelet_dir>/pods/<uid>``), else the checkpoint is stale.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import yaml

from gpuhook.cli.doctor_check import FAIL, PASS, SKIP, WARN, Node, Result, section
from gpuhook.errors import CheckpointError
from gpuhook.pipeline import dra

if TYPE_CHECKING:
    from gpuhook.model.inventory import Inventory

register = section()
NAME = "kubelet DRA state"
SPEC_SUFFIXES = (".json", ".yaml", ".yml")


@register(NAME)
def check_dra(node: Node) -> list[Result]:
    config = node.need_config()
    path = os.path.join(config.policy.kubelet_dir, dra.STATE_IN_KUBELET_DIR)
    if not os.path.lexists(path):
        return [Result(NAME, SKIP, f"no DRA state ({path} not found)")]
    try:
        state = dra.read_state(path)
    except CheckpointError as exc:
        fix = "the kubelet rewrites it at its next claim change; until then GPUs the engine "
        return [Result(NAME, FAIL, str(exc), fix + "injects into pods are refused")]
    claims = [c for c in state.claims if any(d.driver == dra.NVIDIA_DRIVER for d in c.devices)]
    if not claims:
        return [Result(NAME, PASS, f"{path}: no claim of {dra.NVIDIA_DRIVER} prepared")]
    names = cdi_names(config.cdi_spec_dirs)
    inventory = node.inventory()
    problems = [p for c in claims for p in _claim(c, config.policy.kubelet_dir, names, inventory)]
    if not problems:
        return [Result(NAME, PASS, f"{path}: {len(claims)} claims of {dra.NVIDIA_DRIVER}, each "
                       "with its CDI spec and GPUs of this node")]  # fmt: skip
    return problems


def _claim(
    claim: dra.Claim, kubelet_dir: str, names: set[str], inventory: Inventory | None
) -> list[Result]:
    return [Result(NAME, *p) for p in claim_problems(claim, kubelet_dir, names, inventory)]


def claim_problems(
    claim: dra.Claim, kubelet_dir: str, names: set[str], inventory: Inventory | None
) -> list[tuple[str, str, str]]:
    """What keeps a prepared claim's pods from starting: (status, message, fix) each.
    ``names``: the CDI names of the CDI folders (:func:`cdi_names`)."""
    what = f"claim {claim.display} ({claim.uid})"
    out: list[tuple[str, str, str]] = []
    live = [p for p in claim.pod_uids if os.path.isdir(os.path.join(kubelet_dir, "pods", p))]
    if not live:
        pods = ", ".join(claim.pod_uids) or "no pod"
        out.append((WARN, f"{what} is prepared for {pods}, which the kubelet no longer has: "
                    "a stale checkpoint", "it goes when the kubelet unprepares the claim; "
                    "restart the kubelet if it stays"))  # fmt: skip
    for device in claim.devices:
        if device.driver != dra.NVIDIA_DRIVER:
            continue
        if inventory is not None and not dra.nvidia_device(device.name, inventory):
            out.append((FAIL, f"{what}: device {device.name} is no GPU of this node's "
                        "inventory (a stale checkpoint or inventory)",
                        "gpuhook inventory refresh"))  # fmt: skip
        lost = [n for n in device.cdi_ids if n not in names]
        if lost:
            out.append((FAIL, f"{what}: CDI device {lost[0]} is in no spec of the CDI folders "
                        "(the driver's spec was lost, e.g. a reboot emptied /var/run/cdi while "
                        "the checkpoint persisted): its pods cannot start",
                        "restart the DRA driver's kubelet plugin so that it writes its claim "
                        "specs again, or delete the pods"))  # fmt: skip
    return out


def cdi_names(folders: tuple[str, ...]) -> set[str]:
    """Every fully-qualified CDI device name (``kind=name``) of the specs in ``folders``
    (unreadable or malformed files are skipped: the engine skips them too)."""
    found: set[str] = set()
    for folder in folders:
        try:
            files = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in (n for n in files if n.endswith(SPEC_SUFFIXES)):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as fh:
                    text = fh.read(16 << 20)
                spec = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
            except (OSError, ValueError, yaml.YAMLError):
                continue
            kind = spec.get("kind") if isinstance(spec, dict) else None
            devices = spec.get("devices") if isinstance(spec, dict) else None
            if isinstance(kind, str) and isinstance(devices, list):
                found |= {f"{kind}={d['name']}" for d in devices if isinstance(d, dict)
                          and isinstance(d.get("name"), str)}  # fmt: skip
    return found
