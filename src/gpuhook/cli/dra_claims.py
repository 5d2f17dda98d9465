"""``gpuhook inspect pod``'s DRA part: the claims the kubelet prepared for a pod and what keeps
them from starting (docs/dra.md), from the kubelet's DRA checkpoint as the runtime reads it. A
pod whose create gpuhook refused has no record; given its UID, this still says why."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gpuhook.cli import doctor_dra
from gpuhook.errors import CheckpointError
from gpuhook.inventory import store
from gpuhook.pipeline import dra

if TYPE_CHECKING:
    from gpuhook.config.types import Config


def of_pods(config: Config, pod_uids: set[str]) -> list[dict[str, Any]]:
    """The claims prepared for any of ``pod_uids``, each with its devices and problems; a
    damaged checkpoint is one entry saying so."""
    path = os.path.join(config.policy.kubelet_dir, dra.STATE_IN_KUBELET_DIR)
    try:
        state = dra.read_state(path)
    except CheckpointError as exc:
        return [{"claim": "", "uid": "", "pods": [], "devices": [], "problems": [str(exc)]}]
    claims = [c for c in state.claims if pod_uids & set(c.pod_uids)]
    if not claims:
        return []
    names = doctor_dra.cdi_names(config.cdi_spec_dirs)
    inventory = store.status(config).inventory
    return [
        {
            "claim": c.display,
            "uid": c.uid,
            "pods": list(c.pod_uids),
            "devices": [f"{d.name} ({d.driver})" for d in c.devices],
            "problems": [
                msg
                for _, msg, _ in doctor_dra.claim_problems(
                    c, config.policy.kubelet_dir, names, inventory
                )
            ],
        }
        for c in claims
    ]


def table(claims: list[dict[str, Any]]) -> str:
    """The claims as lines under the pod's table."""
    if not claims:
        return ""
    lines = ["", "DRA claims (the kubelet's dra_manager_state):"]
    for c in claims:
        if c["claim"]:
            lines.append(f"  {c['claim']} ({c['uid']}): {', '.join(c['devices']) or 'no device'}")
        lines += [f"    ! {p}" for p in c["problems"]]
    return "\n".join(lines) + "\n"
